//! A partition's launcher seen from outside: whether the pid in the ledger is still the
//! process that claimed (its start time in /proc), and signalling it only then.

use super::PartitionRecord;
use std::os::fd::AsRawFd;

/// Sends `sig` to partition `p`'s launcher through a pidfd, only if the process behind the
/// pid is still the one the ledger recorded (same start time) once the pidfd holds it: a
/// pid recycled before or during the call is never signalled. Returns whether it was sent.
pub fn signal_launcher(p: &PartitionRecord, sig: i32) -> bool {
    // SAFETY: pidfd_open with a pid and no flags; the fd is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, p.pid as libc::pid_t, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: a fresh fd we own.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    if pid_start_time(p.pid) != Some(p.pid_start) {
        return false;
    }
    // SAFETY: pidfd_send_signal on our pidfd, no siginfo, no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

/// The fields of /proc/PID/stat this project reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// State letter (field 3): R, S, D, Z, ...
    pub state: char,
    /// Parent pid (field 4).
    pub ppid: u32,
    /// Start time in clock ticks after boot (field 22): with the pid, names a process.
    pub start_time: u64,
}

/// Reads /proc/PID/stat; None if there is no such process.
pub fn proc_stat(pid: u32) -> Option<ProcStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let f: Vec<&str> = s.get(s.rfind(')')? + 1..)?.split_whitespace().collect();
    // f[0] is field 3 (state), f[1] field 4 (ppid), f[19] field 22 (start time).
    Some(ProcStat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        start_time: f.get(19)?.parse().ok()?,
    })
}

/// Start time of `pid` (field 22 of /proc/PID/stat), if it is running (not a zombie).
pub fn pid_start_time(pid: u32) -> Option<u64> {
    proc_stat(pid)
        .filter(|st| st.state != 'Z')
        .map(|st| st.start_time)
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
