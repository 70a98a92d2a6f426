//! The API's socket and its one serving thread: where the socket may be bound (nothing
//! planted there is replaced), the bind, and the loop that reads requests within their
//! bounds and answers each through [`super::routes`].

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

use super::http::{MAX_BODY, MAX_HEAD, Request, Response, err, parse_request, respond};
use super::routes::ApiState;

/// How long a request may take to arrive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Errors setting up the API socket.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Something other than a stale socket of root's or a VMM's is in the way.
    #[error(
        "--api-socket {0}: exists and is not a stale socket of root or a VMM; not replacing it"
    )]
    InTheWay(PathBuf),
    /// What was bound there went (or was replaced) before it could be handed over: someone
    /// else changes that directory.
    #[error(
        "--api-socket {0}: the socket was removed or replaced as it was made (someone else \
         controls that directory); nothing of theirs was touched"
    )]
    Replaced(PathBuf),
    /// A VMM is serving on it.
    #[error("--api-socket {0}: a running VMM serves on it (stop that one, or choose another path)")]
    InUse(PathBuf),
    /// The path cannot be a socket's address, or its directory cannot be used.
    #[error("--api-socket {}: {why}", path.display())]
    Place {
        /// The socket path.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A system call failed.
    #[error("--api-socket {path}: {what}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// What failed.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

impl ApiError {
    /// Whether the user's request is at fault (exit 2).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Self::InTheWay(_) | Self::Replaced(_) | Self::InUse(_) | Self::Place { .. }
        )
    }
}

/// Where the API socket will be bound: its directory opened once, by descriptor
/// (`crate::sys::files`: no link the trust rule forbids is followed), and what is there now
/// checked. Made by the launch's check, before anything is built; the bind uses the same
/// directory descriptor, whatever was renamed or linked since.
#[derive(Debug)]
pub struct ApiPlace {
    entry: crate::sys::files::DirEntry,
    path: PathBuf,
}

/// Whether `uid` is one a VMM's socket can belong to: root, or a launch's own identity.
fn vmm_owned(uid: u32) -> bool {
    uid == 0 || uid >= crate::sys::sandbox::LAUNCH_ID_BASE
}

impl ApiPlace {
    /// Checks `path`: it fits a socket address, its directory opens by the trust rule, and
    /// nothing is there but (at most) a stale socket of root's or a VMM's.
    pub fn check(path: &Path) -> Result<Self, ApiError> {
        let place = |why: String| ApiError::Place {
            path: path.to_path_buf(),
            why,
        };
        // sun_path holds 108 bytes with the terminating zero.
        if path.as_os_str().len() > 107 {
            return Err(place(
                "longer than the 107 bytes a Unix socket address holds".into(),
            ));
        }
        let entry = crate::sys::files::DirEntry::of(path).map_err(|e| {
            place(match e.io().map(std::io::Error::kind) {
                Some(std::io::ErrorKind::NotFound) => "its directory does not exist".into(),
                _ => format!("its directory: {e}"),
            })
        })?;
        // The bind goes through /proc/self/fd/N/NAME, which must fit too.
        if entry.fd_path().as_os_str().len() > 107 {
            return Err(place(
                "its last component is too long for a socket address".into(),
            ));
        }
        let me = Self {
            entry,
            path: path.to_path_buf(),
        };
        me.stale()?;
        Ok(me)
    }

    /// Whether a stale socket is there to remove (refusing anything else).
    fn stale(&self) -> Result<bool, ApiError> {
        let st = self.entry.lstat().map_err(|source| ApiError::Io {
            path: self.path.clone(),
            what: "stat",
            source,
        })?;
        let Some(st) = st else {
            return Ok(false);
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK || !vmm_owned(st.st_uid) {
            return Err(ApiError::InTheWay(self.path.clone()));
        }
        // Someone listening: a live VMM's API, not ours to take.
        if UnixStream::connect(self.entry.fd_path()).is_ok() {
            return Err(ApiError::InUse(self.path.clone()));
        }
        Ok(true)
    }

    /// The socket's path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A bound API socket, not yet served.
#[derive(Debug)]
pub struct ApiSocket {
    listener: UnixListener,
    path: PathBuf,
    /// Its directory, held open, and its name there: where it is unlinked when served no
    /// more.
    entry: crate::sys::files::DirEntry,
    /// The socket's (device, inode): only that is unlinked, never what replaced it.
    inode: (u64, u64),
}

impl ApiSocket {
    /// Binds the socket at `place` (a stale socket of root's or a VMM's there is removed;
    /// anything else is refused), created with mode 0600 and then given to `owner` (uid,
    /// gid), all through the directory's descriptor: nothing planted there is replaced,
    /// chmodded or chowned. Call while root, before the sandbox, while no other thread
    /// creates files (the mode comes from the umask).
    pub fn bind(place: ApiPlace, owner: Option<(u32, u32)>) -> Result<Self, ApiError> {
        let path = place.path.clone();
        let io = |what| {
            let p = path.clone();
            move |source| ApiError::Io {
                path: p,
                what,
                source,
            }
        };
        if place.stale()? {
            match place.entry.unlink() {
                // Gone meanwhile: the bind below sees what is there now.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                r => r.map_err(io("removing the stale socket"))?,
            }
        }
        // SAFETY: umask has no preconditions; restored at once below.
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(place.entry.fd_path());
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let listener = bound.map_err(|e| match e.raw_os_error() {
            Some(libc::EADDRINUSE) => ApiError::InTheWay(path.clone()),
            _ => io("bind")(e),
        })?;
        // The serving thread takes every pending connection until none is left (and may
        // not call ioctl or fcntl to change this once confined).
        listener
            .set_nonblocking(true)
            .map_err(io("making the socket non-blocking"))?;
        // Replaced between the bind and now (or gone): nothing of it is touched.
        let made = place
            .entry
            .open_path()
            .map_err(|_| ApiError::Replaced(path.clone()))?;
        let m = made.metadata().map_err(io("stat"))?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if !m.file_type().is_socket() || m.uid() != me || m.mode() & 0o077 != 0 {
            return Err(ApiError::Replaced(path));
        }
        let inode = (m.dev(), m.ino());
        if let Some((uid, gid)) = owner {
            // SAFETY: fchownat on the O_PATH descriptor of the socket we bound, with
            // AT_EMPTY_PATH: that inode and no other.
            let r = unsafe {
                libc::fchownat(
                    made.as_raw_fd(),
                    c"".as_ptr(),
                    uid,
                    gid,
                    libc::AT_EMPTY_PATH,
                )
            };
            if r != 0 {
                return Err(io("chown")(std::io::Error::last_os_error()));
            }
        }
        Ok(Self {
            listener,
            path,
            entry: place.entry,
            inode,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// One client connection being read.
struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    deadline: Instant,
}

impl Conn {
    /// Reads what has arrived: Some once the request is whole (Ok) or broken (the answer).
    fn read(&mut self) -> Option<Result<Request, Response>> {
        let mut chunk = [0u8; 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    return Some(Err(err(
                        400,
                        "the connection closed before the request ended",
                    )));
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    match parse_request(&self.buf) {
                        Ok(None) if self.buf.len() <= MAX_HEAD + MAX_BODY + 4 => continue,
                        Ok(None) => return Some(Err(err(413, "the request is too large"))),
                        Ok(Some(req)) => return Some(Ok(req)),
                        Err(r) => return Some(Err(r)),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Some(Err(err(400, e.to_string()))),
            }
        }
    }
}

/// A serving API thread; [`ApiServer::stop`] ends it.
pub struct ApiServer {
    quit: Arc<EventFd>,
    thread: Option<std::thread::JoinHandle<()>>,
    socket: Arc<ApiSocket>,
}

impl ApiServer {
    /// Serves `socket` on a new thread named `api`, which first calls `confine` (its
    /// seccomp filter).
    pub fn start(
        socket: ApiSocket,
        state: ApiState,
        confine: impl FnOnce() -> Result<(), crate::sys::seccomp::SeccompError> + Send + 'static,
    ) -> std::io::Result<Self> {
        let quit = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let q = quit.clone();
        let socket = Arc::new(socket);
        let served = socket.clone();
        let thread = std::thread::Builder::new()
            .name("api".into())
            .spawn(move || {
                if let Err(e) = confine() {
                    log::error!("api: {e}; the API is not served");
                    return;
                }
                serve(&served.listener, &state, &q);
                // Nobody connects from now on: a shut-down listening socket refuses every
                // connection, through any copy of its descriptor (a forked child's
                // included), until it is closed. Done here, under this thread's own
                // filter, which allows it.
                // SAFETY: shutdown on the listening socket we hold; no memory is passed.
                unsafe { libc::shutdown(served.listener.as_raw_fd(), libc::SHUT_RDWR) };
            })?;
        Ok(Self {
            quit,
            thread: Some(thread),
            socket,
        })
    }

    /// Stops serving. When it returns, no connection is served (the thread has ended and
    /// closed every one) and nobody can connect (the serving thread shut the listening
    /// socket down as it ended, which holds for every copy of its descriptor, a forked
    /// child's included), so a launch on the same path may start at once. With `unlink`
    /// (a VMM that is not confined: a confined one may call neither `newfstatat` nor
    /// `unlinkat`, and may not write to the directory), the socket file is unlinked too,
    /// through its directory's held descriptor, if it is still the one bound; otherwise it
    /// stays, a stale socket the next launch on the path replaces.
    pub fn stop(mut self, unlink: bool) {
        let _ = self.quit.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if !unlink {
            return;
        }
        let s = &self.socket;
        let still_ours = s
            .entry
            .lstat()
            .ok()
            .flatten()
            .is_some_and(|st| (st.st_dev, st.st_ino) == s.inode);
        if still_ours {
            if let Err(e) = s.entry.unlink() {
                log::debug!("api: {} left behind: {e}", s.path.display());
            }
        }
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.socket.path
    }
}

/// Serves connections side by side on this one thread (its filter allows no new threads):
/// up to [`MAX_CONNECTIONS`] at once, each with [`REQUEST_TIMEOUT`] to send its request
/// (408 after it); a new one past the cap closes the oldest that has sent nothing (503 if
/// every one is mid-request). So idle or slow clients cannot keep a real
/// request waiting (issue 24: 200 idle connections starved `GET /state` for over 60 s).
fn serve(listener: &UnixListener, state: &ApiState, quit: &EventFd) {
    let log = devices::ratelimit::RateLimiter::new(5, Duration::from_secs(1));
    let mut conns: Vec<Conn> = Vec::new();
    loop {
        let now = Instant::now();
        let mut fds = vec![
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: quit.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        fds.extend(conns.iter().map(|c| libc::pollfd {
            fd: c.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        let wait = conns
            .iter()
            .map(|c| c.deadline.saturating_duration_since(now))
            .min()
            .map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as i32 + 1);
        // SAFETY: polling valid fds in a local vector of its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        // Whole, broken or late requests are answered and closed.
        let now = Instant::now();
        let mut keep = Vec::with_capacity(conns.len());
        let mut done = Vec::new();
        for (i, mut c) in conns.drain(..).enumerate() {
            let got = if fds[2 + i].revents != 0 {
                c.read()
            } else {
                None
            };
            let got = got.or_else(|| {
                (now >= c.deadline).then(|| Err(err(408, "the request did not arrive in time")))
            });
            match got {
                Some(g) => done.push((c.stream, g)),
                None => keep.push(c),
            }
        }
        conns = keep;
        for (mut stream, got) in done {
            let r = match got {
                Ok(req) => state.handle(&req.method, &req.path, &req.body),
                Err(r) => r,
            };
            if r.code >= 400 {
                devices::warn_ratelimited!(log, "api: answered {}: {}", r.code, r.body);
            }
            respond(&mut stream, &r);
        }
        if fds[0].revents != 0 {
            accept_all(listener, &mut conns);
        }
    }
}

/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Takes every pending connection, non-blocking, as [`serve`] says.
fn accept_all(listener: &UnixListener, conns: &mut Vec<Conn>) {
    use std::os::fd::FromRawFd;
    loop {
        // SAFETY: accept4 on our listening socket, no peer address wanted.
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        if fd < 0 {
            return;
        }
        // SAFETY: a fresh descriptor accept4 gave us, owned from here on.
        let mut stream = unsafe { UnixStream::from_raw_fd(fd) };
        if conns.len() >= MAX_CONNECTIONS {
            // Full: the oldest connection that has sent nothing yet makes room (idle ones
            // cannot crowd a real request out); when every one is mid-request, 503.
            match conns.iter().position(|c| c.buf.is_empty()) {
                Some(i) => {
                    let mut old = conns.remove(i);
                    respond(
                        &mut old.stream,
                        &err(408, "closed for a newer connection: nothing was sent"),
                    );
                }
                None => {
                    respond(
                        &mut stream,
                        &err(
                            503,
                            format!("{MAX_CONNECTIONS} requests are arriving; try again"),
                        ),
                    );
                    continue;
                }
            }
        }
        conns.push(Conn {
            stream,
            buf: Vec::with_capacity(1024),
            deadline: Instant::now() + REQUEST_TIMEOUT,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::api_client::request;
    use serde_json::json;
    use std::io::Write;

    fn state() -> ApiState {
        super::super::routes::tests::state()
    }

    #[test]
    fn the_socket_serves_over_http_and_refuses_to_replace_a_file() {
        let dir = std::env::temp_dir().join(format!("api-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("not-a-socket");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(ApiPlace::check(&file), Err(ApiError::InTheWay(_))));
        assert_eq!(std::fs::read(&file).unwrap(), b"x");
        assert!(matches!(
            ApiPlace::check(&dir.join("none/api.sock")),
            Err(ApiError::Place { .. })
        ));
        let path = dir.join("api.sock");
        let sock = ApiSocket::bind(ApiPlace::check(&path).unwrap(), None).unwrap();
        // A live socket is not taken over.
        assert!(matches!(ApiPlace::check(&path), Err(ApiError::InUse(_))));
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let server = ApiServer::start(sock, state(), || Ok(())).unwrap();
        let (code, v) = request(&path, "GET", "/state", None).unwrap();
        assert_eq!((code, v["state"].as_str()), (200, Some("running")));
        let (code, _) = request(&path, "PUT", "/state", Some(&json!({"state": 5}))).unwrap();
        assert_eq!(code, 400);
        // Garbage on the socket gets a 400 and the server carries on.
        {
            let mut s = UnixStream::connect(&path).unwrap();
            s.write_all(b"\x00\x01 nonsense\r\n\r\n").unwrap();
            let mut t = String::new();
            s.read_to_string(&mut t).unwrap();
            assert!(t.starts_with("HTTP/1.1 400"), "{t}");
        }
        let (code, _) = request(&path, "GET", "/partition", None).unwrap();
        assert_eq!(code, 200);
        // 200 idle connections (more than the cap) and one half-sent request: a real
        // request is still answered (one connection at a time, it waited behind 200
        // two-second deadlines), and so are the idle ones, each with a 4xx.
        let idle: Vec<UnixStream> = (0..200)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let mut half = UnixStream::connect(&path).unwrap();
        half.write_all(b"GET /state HTTP/1.1\r\n").unwrap();
        let (code, v) = request(&path, "GET", "/state", None).unwrap();
        assert_eq!((code, v["state"].as_str()), (200, Some("running")));
        for mut c in idle.into_iter().take(5) {
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut t = String::new();
            c.read_to_string(&mut t).unwrap();
            assert!(t.starts_with("HTTP/1.1 408"), "{t}");
        }
        half.write_all(b"\r\n").unwrap();
        half.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut t = String::new();
        half.read_to_string(&mut t).unwrap();
        assert!(
            t.starts_with("HTTP/1.1 200") || t.starts_with("HTTP/1.1 408"),
            "{t}"
        );
        // A child forked meanwhile holds a copy of every descriptor, the listening socket's
        // included (as any fork between a bind and an exec does, on a busy machine for as
        // long as it likes): once `stop` returns, nobody can connect all the same, with the
        // idle connections still open on the client side.
        // SAFETY: the child only waits for its signal (raw calls), then _exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: as above.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            // SAFETY: as above.
            unsafe { libc::pause() };
            // SAFETY: as above.
            unsafe { libc::_exit(0) }
        }
        let still_open: Vec<UnixStream> = (0..100)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        server.stop(false);
        assert!(UnixStream::connect(&path).is_err());
        // The file stays (a confined VMM may not unlink it), stale: replaced at once.
        assert!(path.exists());
        let again = ApiSocket::bind(ApiPlace::check(&path).unwrap(), None).unwrap();
        // An unconfined VMM's stop unlinks it.
        let server = ApiServer::start(again, state(), || Ok(())).unwrap();
        assert_eq!(request(&path, "GET", "/state", None).unwrap().0, 200);
        server.stop(true);
        assert!(!path.exists());
        drop(still_open);
        // SAFETY: ending our own child.
        unsafe { libc::kill(child, libc::SIGKILL) };
        // SAFETY: reaping it.
        unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
