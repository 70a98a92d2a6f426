//! The keeper of a partition from the pool.
//!
//! A sandboxed launcher gives up root before its guest runs (`crate::sys::sandbox`), but a
//! partition's claim must still be written to the root-owned ledger while it runs and given
//! back — its extent zeroed first — when it ends. So, right after the claim is taken and
//! before anything the guest can reach exists, the launcher forks a keeper. The keeper
//! stays uid 0 but drops every capability and sets `no_new_privs` (it can write the files
//! root owns, nothing more), runs under its own seccomp filter, ignores the stop signals
//! the launcher handles, closes every descriptor but three, and waits on a pipe:
//!
//! - `running`: the guest is about to run (the ledger says so; the keeper answers `ok`);
//! - `stats <json>`: the vCPUs' exit counters, where `partition status` reads them;
//! - `stopped`: the guest is gone: scrub, free, answer `released <json>`, exit.
//!
//! If the pipe closes without `stopped` (the launcher was killed, or broke its seccomp
//! filter), the keeper scrubs and frees all the same, says so on stderr and exits. The
//! keeper shares the launcher's partition lock (the same open file), so the partition is
//! alive for `status` and `release` until both are gone. Everything the keeper reads from
//! the launcher is bounded and parsed as data: a compromised launcher can make it record
//! wrong counters, nothing else.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::Duration;

use crate::cpu::exits::VcpuCounters;
use crate::host::claim::{ClaimError, ExtentClaim, Released};
use crate::host::ledger::PartitionLock;

/// Longest message line the keeper reads.
const MAX_LINE: u64 = 1 << 20;

/// Errors talking to the keeper.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What failed.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The keeper answered something else than a release.
    #[error("the partition's keeper: {0}")]
    Release(String),
}

/// What the keeper reports back after `stopped`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleasedMsg {
    name: String,
    offset: u64,
    len: u64,
    scrub_ns: u64,
}

fn pipe() -> Result<(File, File), KeeperError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 into a local array; both fds are owned below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(KeeperError::Os {
            what: "pipe",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: a fresh fd we own.
    let r = unsafe { File::from_raw_fd(fds[0]) };
    // SAFETY: as above.
    let w = unsafe { File::from_raw_fd(fds[1]) };
    Ok((r, w))
}

/// The launcher's end of a running keeper.
#[derive(Debug)]
pub struct Keeper {
    pid: libc::pid_t,
    to: Option<File>,
    from: File,
    /// The launcher's share of the partition lock, held until the launcher exits.
    _lock: PartitionLock,
}

/// How the keeper confines itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeeperMode {
    /// Capabilities dropped, `no_new_privs`, its seccomp filter.
    Confined,
    /// As root, unfiltered (`--no-sandbox`).
    Unconfined,
}

impl Keeper {
    /// Forks the keeper, which takes `claim` over. Call while the process has one thread.
    pub fn spawn(
        claim: ExtentClaim,
        mode: KeeperMode,
    ) -> Result<Self, Box<(KeeperError, ExtentClaim)>> {
        let (to_keeper, from_keeper) = match pipe().and_then(|a| pipe().map(|b| (a, b))) {
            Ok(p) => p,
            Err(e) => return Err(Box::new((e, claim))),
        };
        let ((k_rx, l_tx), (l_rx, k_tx)) = (to_keeper, from_keeper);
        // A filter compiled before the fork: the child allocates nothing it need not.
        let filter = match mode {
            KeeperMode::Confined => {
                match crate::sys::seccomp::filter(
                    crate::sys::seccomp::Role::KEEPER,
                    &crate::sys::seccomp::Grants::default(),
                ) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        return Err(Box::new((
                            KeeperError::Os {
                                what: "the keeper's seccomp filter",
                                source: std::io::Error::other(e.to_string()),
                            },
                            claim,
                        )));
                    }
                }
            }
            KeeperMode::Unconfined => None,
        };
        // The stop signals are blocked across the fork, so the keeper cannot be stopped by
        // one (a Ctrl-C to the process group) before it has set them to be ignored.
        let held = StopSignalsHeld::new();
        // SAFETY: the launcher is single-threaded here (before any vCPU or worker thread),
        // so the child may run ordinary code.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(Box::new((
                KeeperError::Os {
                    what: "fork",
                    source: std::io::Error::last_os_error(),
                },
                claim,
            )));
        }
        if pid == 0 {
            // The child's copy of the guard must not restore the mask: `keep` ignores the
            // stop signals first, then clears the mask itself.
            std::mem::forget(held);
            drop(l_tx);
            drop(l_rx);
            keep(claim, k_rx, k_tx, filter)
        }
        drop(held);
        drop(k_rx);
        drop(k_tx);
        Ok(Self {
            pid,
            to: Some(l_tx),
            from: l_rx,
            _lock: claim.disarm(),
        })
    }

    /// The keeper's pid.
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    fn send(&mut self, line: &str) {
        if let Some(t) = self.to.as_mut() {
            if t.write_all(line.as_bytes()).is_err() {
                log::warn!("the partition's keeper (pid {}) is gone", self.pid);
                self.to = None;
            }
        }
    }

    /// Tells the keeper the guest is about to run, and waits until the ledger says so.
    pub fn running(&mut self) {
        self.send("running\n");
        if self.to.is_some() {
            let mut line = String::new();
            let _ = BufReader::new((&self.from).take(64)).read_line(&mut line);
            if line.trim_end() != "ok" {
                log::warn!("the partition's keeper did not record the launch as running");
            }
        }
    }

    /// Passes the vCPUs' counters on.
    pub fn record(&mut self, vcpus: &[VcpuCounters]) {
        if let Ok(j) = serde_json::to_string(vcpus) {
            self.send(&format!("stats {j}\n"));
        }
    }

    /// The guest is gone: the keeper scrubs the extent and frees it and the cores; what it
    /// did.
    pub fn finish(mut self) -> Result<Released, KeeperError> {
        self.send("stopped\n");
        self.to = None;
        let mut line = String::new();
        let r = BufReader::new((&self.from).take(MAX_LINE)).read_line(&mut line);
        let mut st = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(self.pid, &mut st, 0) };
        r.map_err(|source| KeeperError::Os {
            what: "reading the keeper's answer",
            source,
        })?;
        let Some(j) = line.trim_end().strip_prefix("released ") else {
            return Err(KeeperError::Release(if line.is_empty() {
                "ended without an answer (see its message above)".into()
            } else {
                line.trim_end().to_string()
            }));
        };
        let m: ReleasedMsg =
            serde_json::from_str(j).map_err(|e| KeeperError::Release(e.to_string()))?;
        Ok(Released {
            name: m.name,
            offset: m.offset,
            len: m.len,
            scrub: Duration::from_nanos(m.scrub_ns),
        })
    }
}

/// The stop signals blocked until dropped (the previous mask put back).
struct StopSignalsHeld(libc::sigset_t);

impl StopSignalsHeld {
    fn new() -> Self {
        let set = crate::sys::signals::stop_set();
        // SAFETY: sigset_t is plain data; all-zero is valid.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: blocking signals for the calling thread, the old mask saved locally.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        Self(old)
    }
}

impl Drop for StopSignalsHeld {
    fn drop(&mut self) {
        // SAFETY: restoring the mask saved by `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Closes every descriptor but `keep`.
fn close_others(keep: &[RawFd]) {
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds {
        if !keep.contains(&fd) {
            // SAFETY: closing a descriptor of ours nothing in this process uses any more
            // (the directory stream's own is already closed, and closing it twice fails
            // harmlessly).
            unsafe { libc::close(fd) };
        }
    }
}

/// The keeper process: never returns.
fn keep(claim: ExtentClaim, rx: File, mut tx: File, filter: Option<seccompiler::BpfProgram>) -> ! {
    // SAFETY: prctl with a static NUL-terminated name.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"partition-keep".as_ptr(), 0, 0, 0) };
    // The stop signals are the launcher's to handle: a Ctrl-C to the process group must not
    // stop the keeper before it has scrubbed.
    for sig in crate::sys::signals::STOP_SIGNALS {
        // SAFETY: setting a signal disposition to SIG_IGN.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    // The launcher's blocked stop signals are inherited: unblock them so SIG_IGN decides.
    // SAFETY: sigset_t is plain data; all-zero is the empty set.
    let set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: an empty signal mask for this single-threaded process.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) };
    close_others(&[2, rx.as_raw_fd(), tx.as_raw_fd(), claim.lock_fd()]);
    let crash_at = crash_at();
    if let Some(f) = &filter {
        let confined = crate::sys::sandbox::drop_capabilities()
            .and_then(|()| Ok(crate::sys::seccomp::install_violation_handler()?))
            .and_then(|()| {
                Ok(crate::sys::seccomp::apply(
                    crate::sys::seccomp::Role::KEEPER,
                    f,
                )?)
            });
        if let Err(e) = confined {
            eprintln!("partition: keeper: {e}; it carries on unconfined");
        }
    }
    let name = claim.name().to_string();
    let mut clean = false;
    let mut r = BufReader::new(rx);
    loop {
        let mut line = String::new();
        match (&mut r).take(MAX_LINE).read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let line = line.trim_end();
        if line == "running" {
            claim.running();
            crash(crash_at, "keeper-running");
            let _ = tx.write_all(b"ok\n");
        } else if let Some(j) = line.strip_prefix("stats ") {
            if let Ok(v) = serde_json::from_str::<Vec<VcpuCounters>>(j) {
                claim.record(v);
            }
        } else if line == "stopped" {
            clean = true;
            break;
        }
    }
    crash(crash_at, "keeper-releasing");
    let released = claim.release();
    let code = match (&released, clean) {
        (Ok(rel), true) => {
            let m = ReleasedMsg {
                name: rel.name.clone(),
                offset: rel.offset,
                len: rel.len,
                scrub_ns: rel.scrub.as_nanos() as u64,
            };
            let text = serde_json::to_string(&m).unwrap_or_default();
            let _ = writeln!(tx, "released {text}");
            0
        }
        (Ok(rel), false) => {
            eprintln!(
                "partition: {name}: its launcher ended without stopping the guest cleanly; \
                 the keeper scrubbed its {} of memory in {:.1} ms and gave it and its cores back",
                crate::config::size::format(rel.len),
                rel.scrub.as_secs_f64() * 1e3
            );
            0
        }
        (Err(e), _) => {
            let msg = release_error(e);
            let _ = writeln!(tx, "error {msg}");
            eprintln!("partition: {name}: keeper: {msg}");
            1
        }
    };
    // SAFETY: ending the keeper without running the launcher's destructors or atexit
    // handlers (they belong to the launcher).
    unsafe { libc::_exit(code) }
}

/// Where the keeper dies on purpose ([`crate::host::claim::CRASH_ENV`] `keeper-running`:
/// once the ledger says running, before it answers; `keeper-releasing`: once the guest is
/// gone, before it scrubs), read before its filter is on. Debug builds only.
#[cfg(debug_assertions)]
fn crash_at() -> Option<&'static str> {
    match std::env::var(crate::host::claim::CRASH_ENV).as_deref() {
        Ok("keeper-running") => Some("keeper-running"),
        Ok("keeper-releasing") => Some("keeper-releasing"),
        _ => None,
    }
}

#[cfg(not(debug_assertions))]
fn crash_at() -> Option<&'static str> {
    None
}

/// Dies at once if `point` is where `at` says (as a SIGKILL would leave it: no answer, no
/// scrub, its descriptors closed by the kernel; `_exit`, which its filter allows).
fn crash(at: Option<&str>, point: &str) {
    if at == Some(point) {
        eprintln!("partition: keeper: dying on purpose at {point}");
        // SAFETY: ending the keeper at once, running nothing of the launcher's.
        unsafe { libc::_exit(137) }
    }
}

fn release_error(e: &ClaimError) -> String {
    format!("giving the partition back: {e}; `partition release` finishes it")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_messages_parse_strictly() {
        let m = ReleasedMsg {
            name: "a".into(),
            offset: 0,
            len: 2 << 20,
            scrub_ns: 1_500_000,
        };
        let t = serde_json::to_string(&m).unwrap();
        let back: ReleasedMsg = serde_json::from_str(&t).unwrap();
        assert_eq!((back.name.as_str(), back.len), ("a", 2 << 20));
        assert!(
            serde_json::from_str::<ReleasedMsg>(
                r#"{"name":"a","offset":0,"len":1,"scrub_ns":1,"x":2}"#
            )
            .is_err()
        );
        // Counters from the launcher are data: anything else is dropped.
        assert!(serde_json::from_str::<Vec<VcpuCounters>>("[{\"vcpu\":0}]").is_err());
    }
}
