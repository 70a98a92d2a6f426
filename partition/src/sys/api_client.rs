//! The client side of a running partition's local API (`crate::api` serves it):
//! one request over its Unix socket, for `partition status`, `release` and tests.
//!
//! Every request has a deadline for the whole exchange (connecting, sending, reading the
//! answer): a server that never answers, or answers a byte at a time, costs the caller that
//! long and no longer (issue 33: `status` waited for ever on such a server).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long one request may take in all, unless the caller says otherwise.
pub const DEADLINE: Duration = Duration::from_secs(5);

/// Largest answer read.
const MAX_ANSWER: usize = 1 << 20;

/// Asks a running partition's API: `method path` with `body`; the answer's status and
/// JSON, within [`DEADLINE`].
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, Value)> {
    request_by(socket, method, path, body, Instant::now() + DEADLINE)
}

fn timed_out(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer in time ({what})"),
    )
}

/// [`request`], all of it done by `deadline` (a `TimedOut` error otherwise).
pub fn request_by(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
    deadline: Instant,
) -> std::io::Result<(u16, Value)> {
    let mut s = connect_by(socket, deadline)?;
    let left = |what: &str| {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| timed_out(what))
    };
    s.set_write_timeout(Some(left("sending")?))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => timed_out("sending"),
        _ => e,
    })?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        s.set_read_timeout(Some(left("reading the answer")?))?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.len() > MAX_ANSWER {
                    return Err(std::io::Error::other("an answer larger than 1 MiB"));
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(timed_out("reading the answer"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP answer"))?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {:?}", printable(head, 80))))?;
    let v = serde_json::from_str(body.trim()).map_err(std::io::Error::other)?;
    Ok((code, v))
}

/// Connects to `socket` without waiting past `deadline`: a listener whose queue is full
/// (a server that stopped accepting) makes a blocking connect wait for ever.
fn connect_by(socket: &Path, deadline: Instant) -> std::io::Result<UnixStream> {
    let bytes = socket.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a socket address (too long, or a NUL in it)",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: a new socket; owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    loop {
        // SAFETY: connect with a sockaddr_un of our own and its size.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if r == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            // The listener's queue is full: try again until the deadline.
            Some(libc::EAGAIN) | Some(libc::EINTR) => {
                if Instant::now() >= deadline {
                    return Err(timed_out("connecting: the server accepts nothing"));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => return Err(e),
        }
    }
    let s = UnixStream::from(fd);
    s.set_nonblocking(false)?;
    Ok(s)
}

/// `s` as it may be printed on a terminal: control characters (escape sequences, NULs,
/// the C1 controls) written as `\u{..}` escapes, and cut at `max` characters (with `...`).
/// What a local API answers is another process's text.
pub fn printable(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == max {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_dribbles_or_never_answers_costs_the_deadline_and_no_more() {
        let dir = std::env::temp_dir().join(format!("api-client-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // One byte every 300 ms, for ever (a hostile or wedged server).
        let slow = dir.join("slow.sock");
        let l = std::os::unix::net::UnixListener::bind(&slow).unwrap();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut c = c;
                    while c.write_all(b"H").is_ok() {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                });
            }
        });
        let t = Instant::now();
        let r = request_by(
            &slow,
            "GET",
            "/state",
            None,
            Instant::now() + Duration::from_secs(1),
        );
        let took = t.elapsed();
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        assert!(took < Duration::from_secs(3), "{took:?}");
        // A listener that never accepts, its queue full (a backlog of one, taken by a first
        // connection that waited for its answer): the connect gives up too.
        let full = dir.join("full.sock");
        let l = std::os::unix::net::UnixListener::bind(&full).unwrap();
        // SAFETY: listen again on our own socket, to shrink its queue.
        assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 0) }, 0);
        let soon = || Instant::now() + Duration::from_millis(300);
        let first = request_by(&full, "GET", "/", None, soon()).unwrap_err();
        assert!(first.to_string().contains("reading"), "{first}");
        let t = Instant::now();
        let second = request_by(&full, "GET", "/", None, soon()).unwrap_err();
        assert_eq!(second.kind(), std::io::ErrorKind::TimedOut);
        assert!(second.to_string().contains("connecting"), "{second}");
        assert!(t.elapsed() < Duration::from_secs(3));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(printable("ok", 10), "ok");
        assert_eq!(printable("\x1b[2Jx\0", 10), "\\u{1b}[2Jx\\u{0}");
        assert_eq!(printable("a\u{9b}b", 10), "a\\u{9b}b");
        assert_eq!(printable("abcdef", 3), "abc...");
    }
}
