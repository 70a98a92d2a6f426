//! The local API of a running partition (docs/kubernetes.md): HTTP/1.1 and JSON on a Unix
//! socket (`partition launch --api-socket PATH`), as Firecracker and Cloud Hypervisor serve
//! theirs, for an orchestrator that must not parse stderr.
//!
//! | request | answer |
//! |---|---|
//! | `GET /partition` | what runs: cores, memory, kernel, command line, idle policy, CPU model, sandbox, pid |
//! | `GET /state` | `{"state": "running" \| "paused" \| "stopping", "ran_for_s": ...}` |
//! | `PUT /state` `{"state": "paused" \| "running"}` | pauses (every vCPU leaves the guest and waits) or resumes |
//! | `GET /counters` | per vCPU: exits by reason, instruction assists, KVM's statistics |
//! | `GET /idle` | the idle plan and what KVM reads back about it now |
//! | `PUT /actions` `{"action": "stop"}` | a clean stop: the launcher tears down and exits 0 |
//!
//! One thread serves it, one connection at a time (`Connection: close`), under its own
//! seccomp filter. It never takes a lock a vCPU holds: counters are atomics, KVM's
//! statistics are read from their own descriptors, pausing sets a flag and pulls each vCPU
//! out of `KVM_RUN`. Requests are bounded (8 KiB of head, 4 KiB of body, 2 s to arrive);
//! anything malformed gets a 4xx with the reason and changes nothing. The socket is bound
//! by the launcher while it is root, owned by the sandbox's user, mode 0600.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vmm_sys_util::eventfd::EventFd;

use crate::cpu::exits::ExitCounters;
use crate::cpu::idle::IdlePlan;
use crate::kvm::stats::Stats;
use crate::kvm::vcpu::{Kicker, PauseControl};

/// Longest request head (request line and headers).
const MAX_HEAD: usize = 8 << 10;
/// Longest request body.
const MAX_BODY: usize = 4 << 10;
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
        Ok(Self { listener, path })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// One vCPU as the API sees it.
pub struct ApiVcpu {
    /// Index.
    pub index: usize,
    /// Host core.
    pub core: usize,
    /// Exit and assist counters.
    pub counters: Arc<ExitCounters>,
    /// To pull it out of the guest.
    pub kicker: Arc<Kicker>,
    /// KVM's statistics.
    pub stats: Option<Arc<Stats>>,
}

/// What the API serves and controls.
pub struct ApiState {
    /// `GET /partition`.
    pub description: Value,
    /// The vCPUs.
    pub vcpus: Vec<ApiVcpu>,
    /// The idle plan in force.
    pub idle: IdlePlan,
    /// The CPUID KVM reported back for vCPU 0.
    pub cpuid_back: Option<Vec<kvm_bindings::kvm_cpuid_entry2>>,
    /// Pausing the vCPUs.
    pub pause: Arc<PauseControl>,
    /// Written to ask the launcher for a clean stop.
    pub stop: Arc<EventFd>,
    /// Set once the launcher is tearing down.
    pub stopping: Arc<AtomicBool>,
    /// When the vCPUs started.
    pub started: Instant,
}

/// An HTTP answer.
#[derive(Debug, PartialEq)]
pub struct Response {
    /// Status code.
    pub code: u16,
    /// JSON body.
    pub body: Value,
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

fn err(code: u16, why: impl Into<String>) -> Response {
    Response {
        code,
        body: json!({ "error": why.into() }),
    }
}

/// The state `PUT /state` asks for: read by `FromStr`, as every value a user writes is
/// (`crate::config::keyvalue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wanted {
    Paused,
    Running,
}

impl std::str::FromStr for Wanted {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "paused" => Ok(Self::Paused),
            "running" => Ok(Self::Running),
            _ => Err("state must be \"paused\" or \"running\""),
        }
    }
}

impl ApiState {
    fn state_name(&self) -> &'static str {
        if self.stopping.load(Ordering::SeqCst) {
            "stopping"
        } else if self.pause.is_paused() {
            "paused"
        } else {
            "running"
        }
    }

    fn state(&self) -> Value {
        json!({
            "state": self.state_name(),
            "ran_for_s": self.started.elapsed().as_secs_f64(),
        })
    }

    fn kvm(&self, v: &ApiVcpu) -> std::collections::BTreeMap<String, u64> {
        v.stats
            .as_ref()
            .map(|s| s.idle_counters())
            .unwrap_or_default()
    }

    fn counters(&self) -> Value {
        json!({
            "updated_at": crate::host::ledger::now(),
            "vcpus": self.vcpus.iter().map(|v| json!({
                "vcpu": v.index,
                "core": v.core,
                "exits": v.counters.snapshot().iter().map(|(k, n)| (k.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
                "assists": v.counters.assist_snapshot().iter().map(|(k, n)| (k.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
                "kvm": self.kvm(v),
            })).collect::<Vec<_>>(),
        })
    }

    fn idle(&self) -> Value {
        let kvm: Vec<_> = self.vcpus.iter().map(|v| (v.index, self.kvm(v))).collect();
        let rb = crate::cpu::readback::Readback::new(
            &self.idle,
            self.cpuid_back.as_deref(),
            crate::cpu::cpuid::host_leaf5().is_some(),
            kvm.iter().map(|(i, m)| (*i, m)),
        );
        json!({ "policy": self.idle.policy.name(), "reason": self.idle.reason, "readback": rb })
    }

    /// The answer to one parsed request.
    pub fn handle(&self, method: &str, path: &str, body: &[u8]) -> Response {
        let json_body = || -> Result<Value, Response> {
            serde_json::from_slice::<Value>(body)
                .map_err(|e| err(400, format!("the body is not JSON: {e}")))
        };
        let ok = |body| Response { code: 200, body };
        match (method, path) {
            ("GET", "/partition") => ok(self.description.clone()),
            ("GET", "/state") => ok(self.state()),
            ("GET", "/counters") => ok(self.counters()),
            ("GET", "/idle") => ok(self.idle()),
            ("PUT" | "PATCH", "/state") => {
                let v = match json_body() {
                    Ok(v) => v,
                    Err(r) => return r,
                };
                if self.stopping.load(Ordering::SeqCst) {
                    return err(400, "the partition is stopping");
                }
                match v
                    .get("state")
                    .and_then(Value::as_str)
                    .map(str::parse::<Wanted>)
                {
                    Some(Ok(Wanted::Paused)) => {
                        let kickers: Vec<_> = self.vcpus.iter().map(|v| v.kicker.clone()).collect();
                        self.pause.pause(&kickers);
                        ok(self.state())
                    }
                    Some(Ok(Wanted::Running)) => {
                        self.pause.resume();
                        ok(self.state())
                    }
                    Some(Err(why)) => err(400, why),
                    None => err(400, "state must be \"paused\" or \"running\""),
                }
            }
            ("PUT" | "POST", "/actions") => {
                let v = match json_body() {
                    Ok(v) => v,
                    Err(r) => return r,
                };
                match v.get("action").and_then(Value::as_str) {
                    Some("stop") => {
                        self.pause.resume();
                        let _ = self.stop.write(1);
                        Response {
                            code: 202,
                            body: json!({ "state": "stopping" }),
                        }
                    }
                    _ => err(400, "action must be \"stop\""),
                }
            }
            (_, "/partition" | "/state" | "/counters" | "/idle" | "/actions") => {
                err(405, format!("{method} {path} is not served"))
            }
            _ => err(404, format!("no resource {path}")),
        }
    }
}

/// A parsed request: method, path, body.
#[derive(Debug, PartialEq)]
pub struct Request {
    /// Method.
    pub method: String,
    /// Path (without a query).
    pub path: String,
    /// Body.
    pub body: Vec<u8>,
}

/// Parses a request head (up to and without the blank line) and says how long its body is.
pub fn parse_head(head: &[u8]) -> Result<(String, String, usize), Response> {
    let text = std::str::from_utf8(head).map_err(|_| err(400, "the request is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(err(400, format!("not an HTTP request line: {line:?}")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(err(400, format!("not HTTP/1.x: {version:?}")));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(err(400, format!("not a method: {method:?}")));
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    if !path.starts_with('/') {
        return Err(err(400, format!("not a path: {target:?}")));
    }
    let mut len = 0usize;
    for h in lines {
        let Some((k, v)) = h.split_once(':') else {
            return Err(err(400, format!("not a header: {h:?}")));
        };
        if k.trim().eq_ignore_ascii_case("content-length") {
            len = v
                .trim()
                .parse()
                .map_err(|_| err(400, format!("Content-Length {:?}", v.trim())))?;
        } else if k.trim().eq_ignore_ascii_case("transfer-encoding") {
            return Err(err(400, "chunked bodies are not accepted"));
        }
    }
    if len > MAX_BODY {
        return Err(err(
            413,
            format!("a body of {len} bytes; at most {MAX_BODY}"),
        ));
    }
    Ok((method.to_string(), path, len))
}

/// A whole request in `buf`, if it has arrived: Ok(None) while it is incomplete, the 4xx
/// to answer when it breaks the limits or does not parse.
pub fn parse_request(buf: &[u8]) -> Result<Option<Request>, Response> {
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD {
            return Err(err(413, format!("a request head over {MAX_HEAD} bytes")));
        }
        return Ok(None);
    };
    let (method, path, len) = parse_head(&buf[..head_end])?;
    let body = &buf[head_end + 4..];
    if body.len() < len {
        return Ok(None);
    }
    Ok(Some(Request {
        method,
        path,
        body: body[..len].to_vec(),
    }))
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

fn respond(s: &mut UnixStream, r: &Response) {
    let body = r.body.to_string();
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        r.code,
        reason(r.code),
        body.len() + 1
    );
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body.as_bytes());
    let _ = s.write_all(b"\n");
}

/// A serving API thread; [`ApiServer::stop`] ends it.
pub struct ApiServer {
    quit: Arc<EventFd>,
    thread: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
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
        let path = socket.path.clone();
        let thread = std::thread::Builder::new()
            .name("api".into())
            .spawn(move || {
                if let Err(e) = confine() {
                    log::error!("api: {e}; the API is not served");
                    return;
                }
                serve(&socket.listener, &state, &q);
            })?;
        Ok(Self {
            quit,
            thread: Some(thread),
            path,
        })
    }

    /// Stops serving and joins the thread. The socket file stays (the VMM may no longer
    /// remove it); the next launch on the same path replaces it.
    pub fn stop(mut self) {
        let _ = self.quit.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
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

    #[test]
    fn request_heads_parse_or_get_4xx() {
        assert_eq!(
            parse_head(b"GET /state HTTP/1.1\r\nHost: x").unwrap(),
            ("GET".into(), "/state".into(), 0)
        );
        assert_eq!(
            parse_head(b"PUT /state?x=1 HTTP/1.0\r\ncontent-length: 20").unwrap(),
            ("PUT".into(), "/state".into(), 20)
        );
        for (bad, code) in [
            (&b"GET /state"[..], 400),
            (b"get /state HTTP/1.1", 400),
            (b"GET state HTTP/1.1", 400),
            (b"GET /state SPDY/3", 400),
            (b"GET /state HTTP/1.1\r\nContent-Length: -1", 400),
            (b"GET /state HTTP/1.1\r\nContent-Length: 99999", 413),
            (b"GET /state HTTP/1.1\r\nTransfer-Encoding: chunked", 400),
            (b"GET /state HTTP/1.1\r\nno colon", 400),
            (b"\xff\xfe", 400),
        ] {
            assert_eq!(parse_head(bad).unwrap_err().code, code, "{bad:?}");
        }
    }

    fn state() -> ApiState {
        ApiState {
            description: json!({"cores": [1]}),
            vcpus: Vec::new(),
            idle: crate::cpu::idle::resolve(
                crate::cpu::idle::IdlePolicy::Shared,
                &crate::cpu::idle::IdleCaps::default(),
            )
            .unwrap(),
            cpuid_back: None,
            pause: Arc::new(PauseControl::default()),
            stop: Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()),
            stopping: Arc::new(AtomicBool::new(false)),
            started: Instant::now(),
        }
    }

    #[test]
    fn resources_answer_and_bad_requests_change_nothing() {
        let s = state();
        assert_eq!(s.handle("GET", "/partition", b"").body["cores"], json!([1]));
        assert_eq!(s.handle("GET", "/state", b"").body["state"], "running");
        assert_eq!(s.handle("GET", "/counters", b"").code, 200);
        assert_eq!(s.handle("GET", "/idle", b"").body["policy"], "shared");
        assert_eq!(s.handle("GET", "/nothing", b"").code, 404);
        assert_eq!(s.handle("DELETE", "/state", b"").code, 405);
        assert_eq!(s.handle("PUT", "/state", b"{").code, 400);
        assert_eq!(
            s.handle("PUT", "/state", br#"{"state":"asleep"}"#).code,
            400
        );
        assert_eq!(
            s.handle("PUT", "/actions", br#"{"action":"explode"}"#).code,
            400
        );
        assert!(!s.pause.is_paused() && s.stop.read().is_err());
        assert_eq!(
            s.handle("PUT", "/state", br#"{"state":"paused"}"#).body["state"],
            "paused"
        );
        assert!(s.pause.is_paused());
        assert_eq!(
            s.handle("PUT", "/state", br#"{"state":"running"}"#).body["state"],
            "running"
        );
        assert_eq!(
            s.handle("PUT", "/actions", br#"{"action":"stop"}"#).code,
            202
        );
        assert_eq!(s.stop.read().unwrap(), 1);
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
        server.stop();
        // A stale socket is replaced.
        let again = ApiSocket::bind(ApiPlace::check(&path).unwrap(), None).unwrap();
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
