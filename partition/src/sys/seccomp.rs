//! The seccomp filters of a confined VMM: one allow-list per thread role (vCPU, block
//! worker, submission engine, API, launcher), compiled with seccompiler, and the SIGSYS
//! handler that names a violation before the process dies.

use std::cell::Cell;
use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// A filter that could not be built or installed.
#[derive(Debug, thiserror::Error)]
#[error("seccomp filter for {role}: {why}")]
pub struct SeccompError {
    /// The thread kind.
    pub role: &'static str,
    /// Why.
    pub why: String,
}

/// The launcher's exit status when a thread broke its seccomp filter.
pub const EXIT_SECCOMP: i32 = 5;

/// The kinds of thread, each with its own list of system calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A vCPU thread: KVM_RUN and the vCPU ioctls, device register access.
    Vcpu,
    /// A virtio-blk queue worker: io_uring and eventfds.
    BlockWorker,
    /// The launcher's main thread once the guest runs: waiting, kicking, joining, reporting.
    Main,
    /// The keeper process of a pool partition: the ledger and the pool file.
    Keeper,
    /// The local API's thread: accepting and answering connections on its socket.
    Api,
    /// The submission engine's thread (`--device engine`): waiting on its eventfd or
    /// polling its doorbell page, writing fences, raising its MSI-X vector.
    Engine,
}

impl Role {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Vcpu => "vcpu",
            Self::BlockWorker => "blk-worker",
            Self::Main => "main",
            Self::Keeper => "keeper",
            Self::Api => "api",
            Self::Engine => "engine",
        }
    }
}

/// System calls every thread makes: memory (without PROT_EXEC), futexes, signals returning,
/// reading and writing fds it holds, time, exiting.
const COMMON: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_futex,
    libc::SYS_brk,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
    libc::SYS_sched_yield,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getrandom,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// `fcntl(fd, F_GETFD)`: the standard library's check, in debug builds, that a descriptor
/// it closes is open.
const F_GETFD: u64 = libc::F_GETFD as u64;

/// What a role may call beyond [`COMMON`] and mmap/mprotect without PROT_EXEC.
fn extra(role: Role) -> &'static [i64] {
    match role {
        // KVM_RUN and friends are ioctls (checked by number below); the kick is a signal.
        Role::Vcpu => &[],
        // Its ring was made before the filter (devices' `worker::ring`, restricted to the
        // worker's operations): no io_uring_setup or io_uring_register after it, so no
        // ring without those restrictions.
        Role::BlockWorker => &[libc::SYS_io_uring_enter, libc::SYS_pwrite64],
        Role::Main => &[
            libc::SYS_poll,
            libc::SYS_ppoll,
            libc::SYS_pread64,
            libc::SYS_tgkill,
            libc::SYS_wait4,
            libc::SYS_waitid,
        ],
        Role::Api => &[
            libc::SYS_poll,
            libc::SYS_ppoll,
            libc::SYS_accept4,
            libc::SYS_recvfrom,
            libc::SYS_sendto,
            libc::SYS_shutdown,
            libc::SYS_pread64,
            libc::SYS_tgkill,
        ],
        Role::Engine => &[libc::SYS_poll, libc::SYS_ppoll],
        Role::Keeper => &[
            libc::SYS_poll,
            libc::SYS_openat,
            libc::SYS_open,
            libc::SYS_fstat,
            libc::SYS_newfstatat,
            libc::SYS_statx,
            libc::SYS_lseek,
            libc::SYS_flock,
            libc::SYS_rename,
            libc::SYS_renameat,
            libc::SYS_renameat2,
            libc::SYS_unlink,
            libc::SYS_unlinkat,
            libc::SYS_mkdir,
            libc::SYS_mkdirat,
            libc::SYS_ftruncate,
            libc::SYS_fstatfs,
            libc::SYS_statfs,
            libc::SYS_fcntl,
            libc::SYS_getdents64,
            libc::SYS_pread64,
            libc::SYS_pwrite64,
        ],
    }
}

fn cond(arg: u8, op: SeccompCmpOp, v: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, v).map_err(|e| e.to_string())
}

/// The filter of `role`. `ioctls` are the request numbers it may pass to ioctl (the vCPU
/// ioctls for [`Role::Vcpu`]; none otherwise).
pub fn filter(role: Role, ioctls: &[u64]) -> Result<BpfProgram, SeccompError> {
    filter_with(role, ioctls, &[])
}

/// [`filter`] with `syscalls` allowed too (a vCPU thread that reaches a passed-through
/// device's regions with pread/pwrite).
pub fn filter_with(
    role: Role,
    ioctls: &[u64],
    syscalls: &[i64],
) -> Result<BpfProgram, SeccompError> {
    let err = |why: String| SeccompError {
        role: role.name(),
        why,
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &nr in COMMON.iter().chain(extra(role)).chain(syscalls) {
        rules.insert(nr, Vec::new());
    }
    // Memory may be mapped and protected, never executable.
    let no_exec = || -> Result<Vec<SeccompRule>, String> {
        let c = cond(2, SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64), 0)?;
        Ok(vec![SeccompRule::new(vec![c]).map_err(|e| e.to_string())?])
    };
    if let std::collections::btree_map::Entry::Vacant(v) = rules.entry(libc::SYS_fcntl) {
        let c = cond(1, SeccompCmpOp::Eq, F_GETFD).map_err(err)?;
        v.insert(vec![
            SeccompRule::new(vec![c]).map_err(|e| err(e.to_string()))?,
        ]);
    }
    // Signals only within this process (its vCPU kicks): every VMM runs as the same user,
    // so an unrestricted tgkill could stop another partition's VMM.
    if let std::collections::btree_map::Entry::Occupied(mut o) = rules.entry(libc::SYS_tgkill) {
        let c = cond(0, SeccompCmpOp::Eq, u64::from(std::process::id())).map_err(err)?;
        *o.get_mut() = vec![SeccompRule::new(vec![c]).map_err(|e| err(e.to_string()))?];
    }
    rules.insert(libc::SYS_mmap, no_exec().map_err(err)?);
    rules.insert(libc::SYS_mprotect, no_exec().map_err(err)?);
    if !ioctls.is_empty() {
        let mut r = Vec::new();
        for &n in ioctls {
            let c = cond(1, SeccompCmpOp::Eq, n).map_err(err)?;
            r.push(SeccompRule::new(vec![c]).map_err(|e| err(e.to_string()))?);
        }
        rules.insert(libc::SYS_ioctl, r);
    }
    // `PARTITION_SECCOMP_LOG=1` (developers, docs/security.md): calls outside a list are
    // allowed and logged by the kernel (`SECCOMP_RET_LOG`) instead of stopping the VMM.
    let mismatch = if std::env::var_os("PARTITION_SECCOMP_LOG").is_some_and(|v| v == "1") {
        SeccompAction::Log
    } else {
        SeccompAction::Trap
    };
    let f = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, TargetArch::x86_64)
        .map_err(|e| err(e.to_string()))?;
    f.try_into()
        .map_err(|e: seccompiler::BackendError| err(e.to_string()))
}

/// Environment variable naming a thread kind (`vcpu`, `blk-worker`, `main`) that makes a
/// forbidden system call right after installing its filter, so tests can watch a
/// violation end the VMM. Only debug builds (the test builds) have the hook.
pub const TEST_VIOLATION_ENV: &str = "PARTITION_TEST_SECCOMP_VIOLATION";

#[cfg(debug_assertions)]
fn test_violation(role: Role) {
    if std::env::var(TEST_VIOLATION_ENV).as_deref() == Ok(role.name()) {
        // SAFETY: a raw execve with null arguments: the filter refuses it before the kernel
        // looks at them.
        unsafe { libc::syscall(libc::SYS_execve, 0usize, 0usize, 0usize) };
    }
}

#[cfg(not(debug_assertions))]
fn test_violation(_: Role) {}

thread_local! {
    /// The role this thread's filter was installed for (for the SIGSYS message).
    static ROLE: Cell<&'static str> = const { Cell::new("unconfined") };
}

/// Installs `prog` on the calling thread, which is `role`.
pub fn apply(role: Role, prog: &BpfProgram) -> Result<(), SeccompError> {
    ROLE.with(|r| r.set(role.name()));
    seccompiler::apply_filter(prog).map_err(|e| SeccompError {
        role: role.name(),
        why: e.to_string(),
    })?;
    test_violation(role);
    Ok(())
}

/// Writes `n` in decimal into `buf` at `at`; returns the new end.
fn put_num(buf: &mut [u8], mut at: usize, n: i64) -> usize {
    let mut digits = [0u8; 20];
    let mut k = 0;
    let neg = n < 0;
    let mut v = n.unsigned_abs();
    loop {
        digits[k] = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if neg && at < buf.len() {
        buf[at] = b'-';
        at += 1;
    }
    while k > 0 && at < buf.len() {
        k -= 1;
        buf[at] = digits[k];
        at += 1;
    }
    at
}

fn put(buf: &mut [u8], at: usize, s: &[u8]) -> usize {
    let n = s.len().min(buf.len() - at);
    buf[at..at + n].copy_from_slice(&s[..n]);
    at + n
}

/// The SIGSYS message for a call of `nr` by a thread of `role`.
fn violation_message(buf: &mut [u8; 256], role: &str, nr: i64) -> usize {
    let mut at = put(buf, 0, b"partition: seccomp: a ");
    at = put(buf, at, role.as_bytes());
    at = put(buf, at, b" thread made system call ");
    at = put_num(buf, at, nr);
    at = put(
        buf,
        at,
        b", which its filter does not allow; the process stops (exit status ",
    );
    at = put_num(buf, at, EXIT_SECCOMP as i64);
    put(buf, at, b")\n")
}

extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // The system call number is `_sigsys._syscall`: 24 bytes into siginfo on x86-64 (three
    // ints, padding, then the call address before it).
    // SAFETY: the kernel passes a valid siginfo for SIGSYS with SA_SIGINFO: offset 24 is
    // inside it and aligned for an i32.
    let at = unsafe { (info as *const u8).add(24).cast::<i32>() };
    // SAFETY: as above.
    let nr = unsafe { at.read() };
    let role = ROLE.with(|r| r.get());
    let mut buf = [0u8; 256];
    let n = violation_message(&mut buf, role, nr as i64);
    // SAFETY: write(2) is async-signal-safe and in every filter; the buffer is local.
    unsafe { libc::write(2, buf.as_ptr().cast(), n) };
    // SAFETY: _exit(2) is async-signal-safe and in every filter.
    unsafe { libc::_exit(EXIT_SECCOMP) }
}

/// Installs the SIGSYS handler that reports a filter violation and ends the process.
pub fn install_violation_handler() -> Result<(), SeccompError> {
    // SAFETY: sigaction is plain data; all-zero is a valid empty action.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigsys as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO;
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    if unsafe { libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) } != 0 {
        return Err(SeccompError {
            role: "every thread",
            why: format!("sigaction(SIGSYS): {}", std::io::Error::last_os_error()),
        });
    }
    Ok(())
}

/// Test support: runs `calls` in a forked child confined by `prog` as `role`.
#[cfg(test)]
/// Runs `calls` in a child confined by `prog` as `role`; its exit status (0: every
/// call was let through, whatever it returned).
pub(crate) fn confined_child(role: Role, prog: &BpfProgram, calls: impl Fn()) -> i32 {
    // SAFETY: the child only makes raw system calls and seccomp before it exits; the
    // test harness's other threads are not touched.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: closing stderr in the child (the handler's message is not read here).
        unsafe { libc::close(2) };
        install_violation_handler().unwrap();
        apply(role, prog).unwrap();
        calls();
        // SAFETY: ending the child.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "{status:#x}");
    libc::WEXITSTATUS(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_has_a_filter_and_only_the_vcpu_one_takes_ioctls() {
        for role in [
            Role::Vcpu,
            Role::BlockWorker,
            Role::Main,
            Role::Keeper,
            Role::Api,
            Role::Engine,
        ] {
            let p = filter(role, &[]).unwrap();
            assert!(!p.is_empty(), "{role:?}");
        }
        let with = filter(Role::Vcpu, &[0xae80, 0x8090_ae81]).unwrap();
        let without = filter(Role::Vcpu, &[]).unwrap();
        assert!(with.len() > without.len());
        // The worker's list is not the main thread's.
        assert_ne!(
            filter(Role::BlockWorker, &[]).unwrap(),
            filter(Role::Main, &[]).unwrap()
        );
    }

    #[test]
    fn the_violation_message_names_the_thread_and_the_call() {
        let mut buf = [0u8; 256];
        let n = violation_message(&mut buf, "vcpu", 59);
        let s = std::str::from_utf8(&buf[..n]).unwrap();
        assert_eq!(
            s,
            "partition: seccomp: a vcpu thread made system call 59, which its filter does not allow; the process stops (exit status 5)\n"
        );
        let n = put_num(&mut buf, 0, -12);
        assert_eq!(&buf[..n], b"-12");
        let n = put_num(&mut buf, 0, 0);
        assert_eq!(&buf[..n], b"0");
    }

    #[test]
    fn a_vmm_signals_only_its_own_threads() {
        // The filter is built here (this test's pid); the confined child may signal that
        // process, not another one (pid 1 here: another partition's VMM in real life).
        let prog = filter(Role::Main, &[]).unwrap();
        let me = std::process::id() as libc::c_long;
        let own = move || {
            // SAFETY: signal 0 to this test's own main thread id: only a permission check.
            unsafe { libc::syscall(libc::SYS_tgkill, me, me, 0) };
        };
        assert_eq!(confined_child(Role::Main, &prog, own), 0);
        let other = || {
            // SAFETY: refused by the filter before the kernel looks at it.
            unsafe { libc::syscall(libc::SYS_tgkill, 1 as libc::c_long, 1 as libc::c_long, 0) };
        };
        assert_eq!(confined_child(Role::Main, &prog, other), EXIT_SECCOMP);
    }

    #[test]
    fn a_confined_block_worker_cannot_make_or_change_an_io_uring() {
        // io_uring_setup (a fresh ring without the worker's restrictions) and
        // io_uring_register (changing a ring's) end a confined worker; io_uring_enter on
        // the ring it already has is its job.
        let prog = filter(Role::BlockWorker, &[]).unwrap();
        let setup = || {
            let mut params = [0u8; 120];
            // SAFETY: io_uring_setup with a local parameter block; refused by the filter.
            unsafe { libc::syscall(libc::SYS_io_uring_setup, 8u32, params.as_mut_ptr()) };
        };
        assert_eq!(
            confined_child(Role::BlockWorker, &prog, setup),
            EXIT_SECCOMP
        );
        let register = || {
            // SAFETY: io_uring_register on fd -1; refused by the filter before EBADF.
            unsafe { libc::syscall(libc::SYS_io_uring_register, -1, 0u32, 0usize, 0u32) };
        };
        assert_eq!(
            confined_child(Role::BlockWorker, &prog, register),
            EXIT_SECCOMP
        );
        let enter = || {
            // SAFETY: io_uring_enter on fd -1 fails with EBADF once the filter lets it by.
            unsafe { libc::syscall(libc::SYS_io_uring_enter, -1, 0u32, 0u32, 0u32, 0usize) };
        };
        assert_eq!(confined_child(Role::BlockWorker, &prog, enter), 0);
    }

    #[test]
    fn a_forbidden_call_in_a_confined_child_is_reported_and_ends_it() {
        // A child process installs the worker filter and calls execve (59), which no role
        // allows: the handler must say so and exit with EXIT_SECCOMP.
        let prog = filter(Role::BlockWorker, &[]).unwrap();
        let mut fds = [0i32; 2];
        // SAFETY: a pipe into a local array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only calls async-signal-safe functions and seccomp (through
        // apply, which allocates nothing on this path but the thread-local's access) before
        // it exits; the test harness's other threads are not touched.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: redirecting stderr to the pipe's write end in the child.
            unsafe { libc::dup2(fds[1], 2) };
            install_violation_handler().unwrap();
            apply(Role::BlockWorker, &prog).unwrap();
            // SAFETY: a raw execve with null arguments: refused by the filter before the
            // kernel looks at them.
            unsafe { libc::syscall(libc::SYS_execve, 0usize, 0usize, 0usize) };
            // SAFETY: not reached if the filter works.
            unsafe { libc::_exit(77) };
        }
        // SAFETY: closing our copy of the write end.
        unsafe { libc::close(fds[1]) };
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "{status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), EXIT_SECCOMP);
        let mut buf = [0u8; 512];
        // SAFETY: reading the pipe into a local buffer.
        let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
        // SAFETY: closing the read end.
        unsafe { libc::close(fds[0]) };
        let msg = String::from_utf8_lossy(&buf[..n.max(0) as usize]).into_owned();
        assert!(
            msg.contains("blk-worker thread made system call 59"),
            "{msg}"
        );
    }
}
