//! The stop signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE) as events, not deaths.
//!
//! SIGQUIT (Ctrl-\\) and a SIGPIPE sent to the process stop a launch as SIGTERM does, with
//! the teardown done: their default (a core dump, or death) would leave the partition's
//! memory to the keeper and its exit status unexplained. A SIGPIPE the kernel raises for a
//! write into a closed pipe goes to the thread that wrote, which keeps it blocked: the write
//! fails with EPIPE instead.
//!
//! A verb that changes the host (launch, reserve, unreserve, release, a benchmark run)
//! blocks them for as long as it holds something it must give back, and reads them from a
//! signalfd when it is ready to act on them. Threads started while a guard lives inherit
//! the block, and so do child processes (std does not clear the mask across exec):
//! [`SignalGuard::unblocked_in`] gives a child the mask the guard found.

use std::time::Duration;

/// The signals a guard blocks.
pub const STOP_SIGNALS: [i32; 5] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGPIPE,
];

/// Blocks the stop signals in the calling thread for the rest of its life: for a thread
/// started before a [`SignalGuard`] exists that must not take them (they go to the guard's
/// signalfd once it does, and kill the process as usual before).
pub fn block_in_this_thread() -> std::io::Result<()> {
    let set = stop_set();
    // SAFETY: a valid sigset_t; no old mask wanted.
    match unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// The set of [`STOP_SIGNALS`].
pub fn stop_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; all-zero is a valid value to start from.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    for s in STOP_SIGNALS {
        // SAFETY: as above; s is a valid signal number.
        unsafe { libc::sigaddset(&mut set, s) };
    }
    set
}

/// Blocks the stop signals in this thread until dropped; pending ones can be taken from
/// its signalfd.
pub struct SignalGuard {
    old: libc::sigset_t,
    fd: i32,
}

impl SignalGuard {
    /// Blocks the [`STOP_SIGNALS`] in this thread (and threads it starts) and opens a
    /// signalfd for them.
    pub fn new() -> std::io::Result<Self> {
        let set = stop_set();
        // SAFETY: sigset_t is plain data; all-zero is a valid value to start from.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are to valid sigset_t values.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        // SAFETY: creates a new fd for a valid set.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: restores the mask saved above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
            return Err(e);
        }
        Ok(Self { old, fd })
    }

    /// The signalfd, readable when a stop signal is pending (to poll with other fds).
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Takes one pending stop signal, if any (it will not be delivered later).
    pub fn take(&self) -> Option<i32> {
        let mut info = [0u8; 128];
        // SAFETY: reading one signalfd_siginfo (128 bytes) into a buffer of that size.
        let n = unsafe { libc::read(self.fd, info.as_mut_ptr().cast(), info.len()) };
        (n == 128).then(|| i32::from_ne_bytes([info[0], info[1], info[2], info[3]]))
    }

    /// Makes `cmd`'s process start with the signal mask this guard replaced, so the stop
    /// signals end it as usual.
    pub fn unblocked_in(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let old = self.old;
        let restore = move || {
            // SAFETY: sets this thread's mask from a valid sigset_t the closure owns;
            // pthread_sigmask is async-signal-safe, so it may run between fork and exec.
            match unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) } {
                0 => Ok(()),
                e => Err(std::io::Error::from_raw_os_error(e)),
            }
        };
        // SAFETY: the closure runs in the forked child before exec; it allocates nothing and
        // only calls an async-signal-safe function.
        unsafe { cmd.pre_exec(restore) };
    }

    /// Waits up to `timeout` for a stop signal and takes it.
    pub fn wait(&self, timeout: Duration) -> Option<i32> {
        let mut fd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: polling one valid fd held in a local.
        unsafe { libc::poll(&mut fd, 1, ms) };
        self.take()
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        // SAFETY: closing the fd this guard owns.
        unsafe { libc::close(self.fd) };
        // SAFETY: restoring the mask saved in new().
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// The signal's name, for messages ("SIGTERM"), or its number.
pub fn name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        libc::SIGPIPE => "SIGPIPE".into(),
        libc::SIGKILL => "SIGKILL".into(),
        n => format!("signal {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_signal_is_taken_not_delivered() {
        let g = SignalGuard::new().unwrap();
        assert_eq!(g.take(), None);
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() };
        // SAFETY: sends SIGHUP to this thread only; the guard has it blocked.
        unsafe { libc::pthread_kill(me, libc::SIGHUP) };
        assert_eq!(g.wait(Duration::from_secs(5)), Some(libc::SIGHUP));
        assert_eq!(g.take(), None);
        // SIGQUIT and SIGPIPE are taken the same way (their defaults would end the process).
        for sig in [libc::SIGQUIT, libc::SIGPIPE] {
            // SAFETY: as above.
            unsafe { libc::pthread_kill(me, sig) };
            assert_eq!(g.wait(Duration::from_secs(5)), Some(sig));
        }
        // A child started through the guard has the stop signals unblocked.
        let mut cmd = std::process::Command::new("grep");
        cmd.args(["^SigBlk:", "/proc/self/status"]);
        let blocked = |cmd: &mut std::process::Command| {
            let out = cmd.output().unwrap();
            let line = String::from_utf8_lossy(&out.stdout).to_string();
            let mask = u64::from_str_radix(line.trim_start_matches("SigBlk:").trim(), 16).unwrap();
            mask & (1 << (libc::SIGTERM - 1)) != 0
        };
        assert!(
            blocked(&mut cmd),
            "std kept the mask; this guard relies on knowing that"
        );
        g.unblocked_in(&mut cmd);
        assert!(!blocked(&mut cmd));
        drop(g);
        assert_eq!(name(libc::SIGTERM), "SIGTERM");
        assert_eq!(name(64), "signal 64");
    }
}
