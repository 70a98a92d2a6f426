//! The seccomp filters of a confined VMM: one allow-list per thread role (the launch's own:
//! vCPU, API, launcher, keeper; a device kind's, declared in the kind's file), compiled
//! with seccompiler, and the SIGSYS handler that names a violation before the process dies.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::os::fd::RawFd;

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

/// A system call and its name.
pub type Call = (i64, &'static str);

/// The [`Call`]s named: `syscalls![poll, ppoll]` (each name one `paste_sys!` knows).
macro_rules! syscalls {
    ($($c:ident),* $(,)?) => {
        &[$(($crate::sys::seccomp::paste_sys!($c), stringify!($c))),*]
    };
}
pub(crate) use syscalls;

macro_rules! paste_sys {
    (read) => {
        libc::SYS_read
    };
    (write) => {
        libc::SYS_write
    };
    (writev) => {
        libc::SYS_writev
    };
    (close) => {
        libc::SYS_close
    };
    (futex) => {
        libc::SYS_futex
    };
    (brk) => {
        libc::SYS_brk
    };
    (munmap) => {
        libc::SYS_munmap
    };
    (mremap) => {
        libc::SYS_mremap
    };
    (madvise) => {
        libc::SYS_madvise
    };
    (rt_sigreturn) => {
        libc::SYS_rt_sigreturn
    };
    (rt_sigprocmask) => {
        libc::SYS_rt_sigprocmask
    };
    (sigaltstack) => {
        libc::SYS_sigaltstack
    };
    (sched_yield) => {
        libc::SYS_sched_yield
    };
    (clock_gettime) => {
        libc::SYS_clock_gettime
    };
    (clock_nanosleep) => {
        libc::SYS_clock_nanosleep
    };
    (nanosleep) => {
        libc::SYS_nanosleep
    };
    (gettid) => {
        libc::SYS_gettid
    };
    (getpid) => {
        libc::SYS_getpid
    };
    (getrandom) => {
        libc::SYS_getrandom
    };
    (getuid) => {
        libc::SYS_getuid
    };
    (geteuid) => {
        libc::SYS_geteuid
    };
    (getgid) => {
        libc::SYS_getgid
    };
    (getegid) => {
        libc::SYS_getegid
    };
    (restart_syscall) => {
        libc::SYS_restart_syscall
    };
    (exit) => {
        libc::SYS_exit
    };
    (exit_group) => {
        libc::SYS_exit_group
    };
    (io_uring_enter) => {
        libc::SYS_io_uring_enter
    };
    (poll) => {
        libc::SYS_poll
    };
    (ppoll) => {
        libc::SYS_ppoll
    };
    (wait4) => {
        libc::SYS_wait4
    };
    (waitid) => {
        libc::SYS_waitid
    };
    (accept4) => {
        libc::SYS_accept4
    };
    (recvfrom) => {
        libc::SYS_recvfrom
    };
    (sendto) => {
        libc::SYS_sendto
    };
    (shutdown) => {
        libc::SYS_shutdown
    };
    (openat) => {
        libc::SYS_openat
    };
    (open) => {
        libc::SYS_open
    };
    (fstat) => {
        libc::SYS_fstat
    };
    (newfstatat) => {
        libc::SYS_newfstatat
    };
    (statx) => {
        libc::SYS_statx
    };
    (lseek) => {
        libc::SYS_lseek
    };
    (flock) => {
        libc::SYS_flock
    };
    (rename) => {
        libc::SYS_rename
    };
    (renameat) => {
        libc::SYS_renameat
    };
    (renameat2) => {
        libc::SYS_renameat2
    };
    (unlink) => {
        libc::SYS_unlink
    };
    (unlinkat) => {
        libc::SYS_unlinkat
    };
    (mkdir) => {
        libc::SYS_mkdir
    };
    (mkdirat) => {
        libc::SYS_mkdirat
    };
    (ftruncate) => {
        libc::SYS_ftruncate
    };
    (fstatfs) => {
        libc::SYS_fstatfs
    };
    (statfs) => {
        libc::SYS_statfs
    };
    (fcntl) => {
        libc::SYS_fcntl
    };
    (getdents64) => {
        libc::SYS_getdents64
    };
    (pread64) => {
        libc::SYS_pread64
    };
    (pwrite64) => {
        libc::SYS_pwrite64
    };
    // A marker `allowed` turns into `tgkill` narrowed to this process.
    (tgkill_own) => {
        -1i64
    };
}
pub(crate) use paste_sys;

/// System calls every thread makes: memory (without PROT_EXEC, below), futexes, signals
/// returning, reading and writing fds it holds, time, exiting.
const COMMON: &[Call] = syscalls![
    read,
    write,
    writev,
    close,
    futex,
    brk,
    munmap,
    mremap,
    madvise,
    rt_sigreturn,
    rt_sigprocmask,
    sigaltstack,
    sched_yield,
    clock_gettime,
    clock_nanosleep,
    nanosleep,
    gettid,
    getpid,
    getrandom,
    getuid,
    geteuid,
    getgid,
    getegid,
    restart_syscall,
    exit,
    exit_group,
];

/// `fcntl(fd, F_GETFD)`: the standard library's check, in debug builds, that a descriptor
/// it closes is open.
const F_GETFD: u64 = libc::F_GETFD as u64;

/// A kind of thread and what it may call beyond the common set with any arguments (the
/// calls tied to descriptors come from its [`Grants`]). The launch's own threads are
/// [`Role::VCPU`], [`Role::API`], [`Role::MAIN`] and [`Role::KEEPER`]; a device kind
/// declares its threads' roles in its own file (`crate::board::kind::Kind::THREADS`), so
/// a new kind's threads bring their filter with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Role {
    /// Its name in messages and in [`TEST_VIOLATION_ENV`] (`vcpu`, `blk-worker`).
    pub name: &'static str,
    /// Its threads as docs/security.md's table names them.
    pub thread: &'static str,
    /// What it may call beyond the common set, with any arguments ([`syscalls!`];
    /// `tgkill_own` is `tgkill` narrowed to this process).
    pub calls: &'static [Call],
}

impl Role {
    /// A vCPU thread: KVM_RUN and the vCPU ioctls on its own vCPU (its grants); the kick is
    /// a signal.
    pub const VCPU: Role = Role {
        name: "vcpu",
        thread: "`vcpu<i>`",
        calls: &[],
    };
    /// The local API's thread: accepting and answering connections on its socket.
    pub const API: Role = Role {
        name: "api",
        thread: "`api` (with `--api-socket`)",
        calls: syscalls![poll, ppoll, accept4, recvfrom, sendto, shutdown, tgkill_own],
    };
    /// The launcher's main thread once the guest runs: waiting, kicking, joining, reporting.
    pub const MAIN: Role = Role {
        name: "main",
        thread: "`partition` (the launcher's main thread, once the guest runs)",
        calls: syscalls![poll, ppoll, tgkill_own, wait4, waitid],
    };
    /// The keeper process of a pool partition: the ledger and the pool file.
    pub const KEEPER: Role = Role {
        name: "keeper",
        thread: "`partition-keep` (the keeper process)",
        calls: syscalls![
            poll, openat, open, fstat, newfstatat, statx, lseek, flock, rename, renameat,
            renameat2, unlink, unlinkat, mkdir, mkdirat, ftruncate, fstatfs, statfs, fcntl,
            getdents64, pread64, pwrite64,
        ],
    };
}

/// Descriptors a grant ties a call to, and what they are in words (docs/security.md).
#[derive(Clone, Debug)]
pub struct Fds {
    /// What they are ("its own vCPU's descriptor").
    pub what: &'static str,
    /// The descriptors.
    pub fds: Vec<RawFd>,
}

/// `ioctl` with these requests, on these descriptors only.
#[derive(Clone, Debug)]
pub struct IoctlGrant {
    /// Where.
    pub on: Fds,
    /// Which requests: (name, number).
    pub requests: Vec<(&'static str, u64)>,
}

/// What a thread's calls are tied to beyond its role's fixed list, known once the machine
/// is built: the descriptors its ioctls, preads and pwrites may name.
#[derive(Clone, Debug, Default)]
pub struct Grants {
    /// ioctls, each set on its own descriptors.
    pub ioctls: Vec<IoctlGrant>,
    /// `pread64` on these.
    pub pread: Option<Fds>,
    /// `pwrite64` on these.
    pub pwrite: Option<Fds>,
}

impl Grants {
    /// Adds `other`'s: its ioctls beside these, its descriptors to these `pread64` and
    /// `pwrite64` lists (described as the first grant of each describes them).
    pub fn merge(&mut self, other: &Grants) {
        self.ioctls.extend(other.ioctls.iter().cloned());
        for (mine, theirs) in [
            (&mut self.pread, &other.pread),
            (&mut self.pwrite, &other.pwrite),
        ] {
            match (mine.as_mut(), theirs) {
                (Some(m), Some(t)) => m.fds.extend(&t.fds),
                (None, Some(t)) => *mine = Some(t.clone()),
                (_, None) => {}
            }
        }
    }
}

/// A condition on one argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// The whole 64-bit argument equals this.
    Eq(u64),
    /// The low 32 bits (an `int` such as a descriptor) equal this.
    Eq32(u32),
    /// These bits are clear.
    Clear(u64),
}

/// A system call a thread may make, and on what arguments.
#[derive(Clone, Debug)]
pub struct Allowed {
    /// Its number.
    pub nr: i64,
    /// Its name.
    pub name: &'static str,
    /// Alternatives: allowed when every condition of one holds; none: any arguments.
    pub when: Vec<Vec<(u8, Cmp)>>,
    /// The conditions in words, for docs/security.md ("" for none).
    pub says: String,
}

/// Everything `role` may call given `grants`: the common set, the role's own calls, and
/// the granted ones, each with its conditions.
pub fn allowed(role: Role, grants: &Grants) -> Vec<Allowed> {
    let plain = |&(nr, name): &Call| Allowed {
        nr,
        name,
        when: Vec::new(),
        says: String::new(),
    };
    let mut out: Vec<Allowed> = COMMON.iter().map(plain).collect();
    out.push(Allowed {
        nr: libc::SYS_fcntl,
        name: "fcntl",
        when: vec![vec![(1, Cmp::Eq(F_GETFD))]],
        says: "`F_GETFD` only".into(),
    });
    for call in [(libc::SYS_mmap, "mmap"), (libc::SYS_mprotect, "mprotect")] {
        out.push(Allowed {
            nr: call.0,
            name: call.1,
            when: vec![vec![(2, Cmp::Clear(libc::PROT_EXEC as u64))]],
            says: "without `PROT_EXEC`".into(),
        });
    }
    for c in role.calls {
        if c.1 == "tgkill_own" {
            // Signals only within this process (its vCPU kicks): every VMM runs as a user
            // of its own, and an unrestricted tgkill could still reach a process it owns.
            out.push(Allowed {
                nr: libc::SYS_tgkill,
                name: "tgkill",
                when: vec![vec![(0, Cmp::Eq(u64::from(std::process::id())))]],
                says: "to its own process only".into(),
            });
        } else {
            // (The keeper's fcntl: any command, over the common F_GETFD-only rule.)
            out.push(plain(c));
        }
    }
    for g in &grants.ioctls {
        let mut when = Vec::new();
        for &fd in &g.on.fds {
            for &(_, req) in &g.requests {
                when.push(vec![(0, Cmp::Eq32(fd as u32)), (1, Cmp::Eq(req))]);
            }
        }
        if when.is_empty() {
            // No descriptor (or no request): nothing is granted.
            continue;
        }
        let names: Vec<&str> = g.requests.iter().map(|&(n, _)| n).collect();
        out.push(Allowed {
            nr: libc::SYS_ioctl,
            name: "ioctl",
            when,
            says: format!("on {}: {}", g.on.what, names.join(", ")),
        });
    }
    for (grant, nr, name) in [
        (&grants.pread, libc::SYS_pread64, "pread64"),
        (&grants.pwrite, libc::SYS_pwrite64, "pwrite64"),
    ] {
        if let Some(f) = grant.as_ref().filter(|f| !f.fds.is_empty()) {
            out.push(Allowed {
                nr,
                name,
                when: f
                    .fds
                    .iter()
                    .map(|&fd| vec![(0, Cmp::Eq32(fd as u32))])
                    .collect(),
                says: format!("on {}", f.what),
            });
        }
    }
    out
}

fn cond(arg: u8, c: Cmp) -> Result<SeccompCondition, String> {
    let (len, op, v) = match c {
        Cmp::Eq(v) => (SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, v),
        Cmp::Eq32(v) => (SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, u64::from(v)),
        Cmp::Clear(mask) => (SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(mask), 0),
    };
    SeccompCondition::new(arg, len, op, v).map_err(|e| e.to_string())
}

/// The filter of `role` with `grants`.
pub fn filter(role: Role, grants: &Grants) -> Result<BpfProgram, SeccompError> {
    let err = |why: String| SeccompError {
        role: role.name,
        why,
    };
    // Per call: None = any arguments; Some(rules) = one of these.
    let mut rules: BTreeMap<i64, Option<Vec<SeccompRule>>> = BTreeMap::new();
    for a in allowed(role, grants) {
        if a.when.is_empty() {
            rules.insert(a.nr, None);
            continue;
        }
        let mut these = Vec::new();
        for alt in &a.when {
            let conds = alt
                .iter()
                .map(|&(arg, c)| cond(arg, c))
                .collect::<Result<Vec<_>, _>>()
                .map_err(err)?;
            these.push(SeccompRule::new(conds).map_err(|e| err(e.to_string()))?);
        }
        if let Some(v) = rules.entry(a.nr).or_insert_with(|| Some(Vec::new())) {
            v.extend(these);
        }
    }
    // A grant with no descriptor (a list left empty) allows nothing: the call is dropped.
    let rules: BTreeMap<i64, Vec<SeccompRule>> = rules
        .into_iter()
        .filter_map(|(nr, r)| match r {
            None => Some((nr, Vec::new())),
            Some(v) if v.is_empty() => None,
            Some(v) => Some((nr, v)),
        })
        .collect();
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

/// One role's list as docs/security.md's table shows it: the calls beyond the common set,
/// each with its conditions.
pub fn describe(role: Role, grants: &Grants) -> String {
    let common: std::collections::BTreeSet<&str> = COMMON.iter().map(|c| c.1).collect();
    // (names, conditions): calls with the same conditions side by side share them.
    let mut groups: Vec<(Vec<&str>, String)> = Vec::new();
    for a in allowed(role, grants) {
        let common_rule = common.contains(a.name)
            || matches!(a.name, "mmap" | "mprotect")
            || (a.name == "fcntl" && !a.when.is_empty());
        if common_rule {
            continue;
        }
        match groups.last_mut() {
            Some((names, says)) if !a.says.is_empty() && *says == a.says => names.push(a.name),
            _ => groups.push((vec![a.name], a.says)),
        }
    }
    let parts: Vec<String> = groups
        .into_iter()
        .map(|(names, says)| {
            let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            if says.is_empty() {
                names.join(", ")
            } else {
                format!("{} {says}", names.join(", "))
            }
        })
        .collect();
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join("; ")
    }
}

/// The common set as docs/security.md lists it.
pub fn describe_common() -> String {
    let mut v: Vec<String> = COMMON.iter().map(|c| format!("`{}`", c.1)).collect();
    v.push("`mmap` and `mprotect` without `PROT_EXEC`".into());
    v.push("`fcntl` with `F_GETFD` only".into());
    v.join(", ")
}

/// Environment variable naming a thread kind (`vcpu`, `blk-worker`, `main`) that makes a
/// forbidden system call right after installing its filter, so tests can watch a
/// violation end the VMM. Only debug builds (the test builds) have the hook.
pub const TEST_VIOLATION_ENV: &str = "PARTITION_TEST_SECCOMP_VIOLATION";

#[cfg(debug_assertions)]
fn test_violation(role: Role) {
    if std::env::var(TEST_VIOLATION_ENV).as_deref() == Ok(role.name) {
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
    ROLE.with(|r| r.set(role.name));
    seccompiler::apply_filter(prog).map_err(|e| SeccompError {
        role: role.name,
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

    /// Grants of one ioctl request (KVM_RUN) on descriptor `fd`.
    fn run_on(fd: RawFd) -> Grants {
        Grants {
            ioctls: vec![IoctlGrant {
                on: Fds {
                    what: "its own vCPU's descriptor",
                    fds: vec![fd],
                },
                requests: vec![("KVM_RUN", 0xae80)],
            }],
            ..Grants::default()
        }
    }

    #[test]
    fn every_role_has_a_filter_and_grants_add_calls_on_their_descriptors_only() {
        for role in [Role::VCPU, Role::API, Role::MAIN, Role::KEEPER] {
            let p = filter(role, &Grants::default()).unwrap();
            assert!(!p.is_empty(), "{role:?}");
        }
        let with = filter(Role::VCPU, &run_on(1000)).unwrap();
        let without = filter(Role::VCPU, &Grants::default()).unwrap();
        assert!(with.len() > without.len());
        // The API's list is not the main thread's.
        assert_ne!(
            filter(Role::API, &Grants::default()).unwrap(),
            filter(Role::MAIN, &Grants::default()).unwrap()
        );
        // A grant whose descriptor list is empty allows nothing.
        let empty = Grants {
            pread: Some(Fds {
                what: "nothing",
                fds: Vec::new(),
            }),
            ..Grants::default()
        };
        assert_eq!(
            filter(Role::MAIN, &empty).unwrap(),
            filter(Role::MAIN, &Grants::default()).unwrap()
        );
    }

    #[test]
    fn a_granted_ioctl_passes_on_its_descriptor_and_nowhere_else() {
        // Descriptor 1000 is not open: the call fails with EBADF once the filter lets it
        // through, and the child exits 0; anywhere else the filter stops it.
        let prog = filter(Role::VCPU, &run_on(1000)).unwrap();
        let on = |fd: i32, req: u64| {
            move || {
                // SAFETY: an ioctl on a descriptor that is not open (EBADF) or refused by
                // the filter before the kernel looks at it.
                unsafe { libc::ioctl(fd, req as _, 0usize) };
            }
        };
        assert_eq!(confined_child(Role::VCPU, &prog, on(1000, 0xae80)), 0);
        assert_eq!(
            confined_child(Role::VCPU, &prog, on(1001, 0xae80)),
            EXIT_SECCOMP
        );
        // Another request on the right descriptor: refused too.
        assert_eq!(
            confined_child(Role::VCPU, &prog, on(1000, 0xae81)),
            EXIT_SECCOMP
        );
        // pread64 only where granted.
        let g = Grants {
            pread: Some(Fds {
                what: "KVM's statistics",
                fds: vec![1002],
            }),
            ..Grants::default()
        };
        let prog = filter(Role::MAIN, &g).unwrap();
        let pread = |fd: i32| {
            move || {
                let mut b = [0u8; 8];
                // SAFETY: a read into a local buffer from a descriptor that is not open
                // (EBADF), or refused by the filter first.
                unsafe { libc::pread(fd, b.as_mut_ptr().cast(), 8, 0) };
            }
        };
        assert_eq!(confined_child(Role::MAIN, &prog, pread(1002)), 0);
        assert_eq!(confined_child(Role::MAIN, &prog, pread(1003)), EXIT_SECCOMP);
    }

    #[test]
    fn the_descriptions_name_the_conditions() {
        let d = describe(Role::VCPU, &run_on(7));
        assert_eq!(d, "`ioctl` on its own vCPU's descriptor: KVM_RUN");
        assert_eq!(describe(Role::VCPU, &Grants::default()), "nothing");
        assert!(
            describe(Role::MAIN, &Grants::default()).contains("`tgkill` to its own process only")
        );
        assert!(describe(Role::KEEPER, &Grants::default()).contains("`fcntl`"));
        assert!(describe_common().contains("`mmap` and `mprotect` without `PROT_EXEC`"));
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
        let prog = filter(Role::MAIN, &Grants::default()).unwrap();
        let me = std::process::id() as libc::c_long;
        let own = move || {
            // SAFETY: signal 0 to this test's own main thread id: only a permission check.
            unsafe { libc::syscall(libc::SYS_tgkill, me, me, 0) };
        };
        assert_eq!(confined_child(Role::MAIN, &prog, own), 0);
        let other = || {
            // SAFETY: refused by the filter before the kernel looks at it.
            unsafe { libc::syscall(libc::SYS_tgkill, 1 as libc::c_long, 1 as libc::c_long, 0) };
        };
        assert_eq!(confined_child(Role::MAIN, &prog, other), EXIT_SECCOMP);
    }

    #[test]
    fn a_forbidden_call_in_a_confined_child_is_reported_and_ends_it() {
        // A child process installs the main thread's filter and calls execve (59), which no
        // role allows: the handler must say so and exit with EXIT_SECCOMP.
        let prog = filter(Role::MAIN, &Grants::default()).unwrap();
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
            apply(Role::MAIN, &prog).unwrap();
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
        assert!(msg.contains("main thread made system call 59"), "{msg}");
    }
}
