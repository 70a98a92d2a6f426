//! Confinement of a running VMM (docs/security.md).
//!
//! Everything that needs root happens first: opening /dev/kvm, the disks, the console and
//! the pool, mapping guest memory, creating the VM, its devices and vCPUs, opening the
//! reserved cores' cpuset. Then, while the launcher is still one thread, [`drop_privileges`]
//! makes it an unprivileged identity of its own (by default one no other running VMM has:
//! [`launch_identity`]) with no capabilities and
//! `no_new_privs`; then every thread installs the seccomp filter of its [`Role`] before it
//! touches anything the guest controls: the vCPU threads before their first `KVM_RUN`, the
//! block queue workers before they serve a queue, the launcher's main thread once it has
//! started them. A system call outside a thread's list raises SIGSYS; the handler names the
//! thread and the call on stderr and ends the process with [`EXIT_SECCOMP`].
//!
//! The lists are what each thread was seen to call on this VMM's paths (docs/security.md
//! says how they were found), ioctls by number where the thread uses KVM.

use std::cell::Cell;
use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The first uid (and gid) of the per-launch range: a VMM runs as `LAUNCH_ID_BASE + its
/// pid`. Far above system users, systemd's dynamic users and the usual subordinate id
/// ranges; `pid_max` is at most 2^22, so the range ends below 3,004,194,304.
pub const LAUNCH_ID_BASE: u32 = 3_000_000_000;
/// The launcher's exit status when a thread broke its seccomp filter.
pub const EXIT_SECCOMP: i32 = 5;

/// Errors setting up the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// 4294967295, which is `(uid_t)-1`: "no change" to the kernel, nobody to run as.
    #[error("{0} 4294967295 is (uid_t)-1, which names nobody: give a real user or group")]
    InvalidId(&'static str),
    /// The user to run as does not exist.
    #[error(
        "--uid {0:?}: no such user (without --uid the VMM runs as an identity of its own, \
         which needs no user)"
    )]
    NoSuchUser(String),
    /// The group does not exist.
    #[error("--gid {0:?}: no such group")]
    NoSuchGroup(String),
    /// The user asked to run as root.
    #[error("--uid {0}: the VMM does not run as root (--no-sandbox keeps root, for debugging)")]
    Root(String),
    /// An unprivileged launcher was asked to become someone else.
    #[error("--uid/--gid: only root can run the VMM as another user (this is uid {0})")]
    NotRoot(u32),
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What failed.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// A filter could not be built or installed.
    #[error("seccomp filter for {role}: {why}")]
    Filter {
        /// The thread kind.
        role: &'static str,
        /// Why.
        why: String,
    },
    /// The drop did not take.
    #[error("after dropping privileges: {0}")]
    StillPrivileged(String),
}

impl SandboxError {
    /// Whether the user's input is at fault (the CLI exits with status 2).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Self::NoSuchUser(_)
                | Self::NoSuchGroup(_)
                | Self::Root(_)
                | Self::NotRoot(_)
                | Self::InvalidId(_)
        )
    }
}

fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> SandboxError {
    move |source| SandboxError::Os { what, source }
}

/// Who the VMM becomes after setup.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Identity {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// The user's name, for messages.
    pub user: String,
}

/// Whether, and as whom, the VMM is confined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sandbox {
    /// `--no-sandbox`: root, every capability, no filters (debugging).
    Off,
    /// Confined.
    On(Identity),
}

fn lookup_user(name: &str) -> Option<(u32, u32, String)> {
    let c = std::ffi::CString::new(name).ok()?;
    let mut pw: libc::passwd = unsafe_zeroed_passwd();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwnam_r writes into `pw` and `buf` (its length given) and sets `out` to
    // `&pw` or null; nothing is kept beyond this call but the copied fields.
    let r = unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    (r == 0 && !out.is_null()).then(|| (pw.pw_uid, pw.pw_gid, name.to_string()))
}

fn lookup_uid(uid: u32) -> Option<(u32, u32, String)> {
    let mut pw: libc::passwd = unsafe_zeroed_passwd();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: as in lookup_user; pw_name points into `buf`, read before it goes.
    let r = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if r != 0 || out.is_null() {
        return None;
    }
    // SAFETY: pw_name is a NUL-terminated string in `buf`, which is alive.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) }
        .to_string_lossy()
        .into_owned();
    Some((pw.pw_uid, pw.pw_gid, name))
}

fn lookup_group(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    let mut gr: libc::group = {
        // SAFETY: `group` is plain data (integers and pointers); all-zero is a valid value
        // that getgrnam_r overwrites.
        unsafe { std::mem::zeroed() }
    };
    let mut buf = vec![0 as libc::c_char; 64 * 1024];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: as for getpwnam_r.
    let r = unsafe { libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr(), buf.len(), &mut out) };
    (r == 0 && !out.is_null()).then_some(gr.gr_gid)
}

fn unsafe_zeroed_passwd() -> libc::passwd {
    // SAFETY: `passwd` is plain data (integers and pointers); all-zero is a valid value that
    // the lookup overwrites.
    unsafe { std::mem::zeroed() }
}

/// The identity a VMM runs as when `--uid` names none: uid and gid `LAUNCH_ID_BASE + pid`,
/// which no other running process (so no other partition's VMM) has, with no passwd entry.
/// One VMM taken over by its guest then shares nothing with another: not its processes,
/// not its files, not its API socket.
pub fn launch_identity() -> Identity {
    let n = LAUNCH_ID_BASE + std::process::id();
    Identity {
        uid: n,
        gid: n,
        user: format!("partition-{}", std::process::id()),
    }
}

/// The identity for `--uid` (a name or number; default [`launch_identity`]) and `--gid` (a
/// name or number; default the user's group).
pub fn resolve(uid: Option<&str>, gid: Option<&str>) -> Result<Identity, SandboxError> {
    let Some(spec) = uid else {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if me != 0 {
            return Err(SandboxError::NotRoot(me));
        }
        let mut who = launch_identity();
        if let Some(g) = gid {
            who.gid = match g.parse::<u32>() {
                Ok(u32::MAX) => return Err(SandboxError::InvalidId("--gid")),
                Ok(n) => n,
                Err(_) => {
                    lookup_group(g).ok_or_else(|| SandboxError::NoSuchGroup(g.to_string()))?
                }
            };
            if who.gid == 0 {
                return Err(SandboxError::Root(format!("{} (group 0)", who.user)));
            }
        }
        return Ok(who);
    };
    let (uid_n, user_gid, user) = match spec.parse::<u32>() {
        // (uid_t)-1 is "no change" to setresuid, never an id to run as.
        Ok(u32::MAX) => return Err(SandboxError::InvalidId("--uid")),
        Ok(n) => lookup_uid(n).unwrap_or((n, n, format!("uid {n}"))),
        Err(_) => lookup_user(spec).ok_or_else(|| SandboxError::NoSuchUser(spec.to_string()))?,
    };
    if uid_n == 0 {
        return Err(SandboxError::Root(spec.to_string()));
    }
    let gid_n = match gid {
        None => user_gid,
        Some(g) => match g.parse::<u32>() {
            Ok(u32::MAX) => return Err(SandboxError::InvalidId("--gid")),
            Ok(n) => n,
            Err(_) => lookup_group(g).ok_or_else(|| SandboxError::NoSuchGroup(g.to_string()))?,
        },
    };
    if gid_n == 0 {
        return Err(SandboxError::Root(format!("{spec} (group 0)")));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if me != 0 && me != uid_n {
        return Err(SandboxError::NotRoot(me));
    }
    Ok(Identity {
        uid: uid_n,
        gid: gid_n,
        user,
    })
}

/// Makes the calling process `who`: supplementary groups dropped, real, effective and saved
/// ids changed (which empties the capability sets), `no_new_privs` set, no core dumps.
/// Call while the process has one thread. Checked afterwards: an error if anything stayed.
pub fn drop_privileges(who: &Identity) -> Result<(), SandboxError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let groups = [who.gid];
        // SAFETY: one gid from a local array.
        if unsafe { libc::setgroups(1, groups.as_ptr()) } != 0 {
            return Err(os("setgroups")(std::io::Error::last_os_error()));
        }
        // SAFETY: plain id changes of the calling process.
        if unsafe { libc::setresgid(who.gid, who.gid, who.gid) } != 0 {
            return Err(os("setresgid")(std::io::Error::last_os_error()));
        }
        // SAFETY: as above; leaving uid 0 for good clears the capability sets.
        if unsafe { libc::setresuid(who.uid, who.uid, who.uid) } != 0 {
            return Err(os("setresuid")(std::io::Error::last_os_error()));
        }
    }
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(os("PR_SET_NO_NEW_PRIVS")(std::io::Error::last_os_error()));
    }
    // SAFETY: as above.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let (r, e, s) = resuid();
    if [r, e, s] != [who.uid; 3] {
        return Err(SandboxError::StillPrivileged(format!(
            "uids are {r}/{e}/{s}, not {}",
            who.uid
        )));
    }
    let caps = capabilities().map_err(os("capget"))?;
    if caps != (0, 0) {
        return Err(SandboxError::StillPrivileged(format!(
            "capabilities effective {:#x} permitted {:#x}",
            caps.0, caps.1
        )));
    }
    Ok(())
}

fn resuid() -> (u32, u32, u32) {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: three out-pointers to locals.
    unsafe { libc::getresuid(&mut r, &mut e, &mut s) };
    (r, e, s)
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_V3: u32 = 0x2008_0522;

/// The calling thread's (effective, permitted) capability sets.
pub fn capabilities() -> std::io::Result<(u64, u64)> {
    let mut h = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut d = [CapData::default(); 2];
    // SAFETY: capget with a version-3 header and room for its two data words.
    if unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| (hi as u64) << 32 | lo as u64;
    Ok((
        join(d[0].effective, d[1].effective),
        join(d[0].permitted, d[1].permitted),
    ))
}

/// Empties the calling process's capability sets while keeping its uid (the keeper stays
/// uid 0 so it can write the root-owned ledger and pool, with no capability beyond a file
/// owner's), and locks root's special treatment away (`SECBIT_NOROOT`).
pub fn drop_capabilities() -> Result<(), SandboxError> {
    const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
    const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
    // SAFETY: prctl with integer arguments (needs CAP_SETPCAP, which root still has).
    unsafe {
        libc::prctl(
            libc::PR_SET_SECUREBITS,
            SECBIT_NOROOT | SECBIT_NOROOT_LOCKED,
            0,
            0,
            0,
        )
    };
    let mut h = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let d = [CapData::default(); 2];
    // SAFETY: capset with a version-3 header and two zeroed data words.
    if unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) } != 0 {
        return Err(os("capset")(std::io::Error::last_os_error()));
    }
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(os("PR_SET_NO_NEW_PRIVS")(std::io::Error::last_os_error()));
    }
    match capabilities().map_err(os("capget"))? {
        (0, 0) => Ok(()),
        (e, p) => Err(SandboxError::StillPrivileged(format!(
            "capabilities effective {e:#x} permitted {p:#x}"
        ))),
    }
}

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
            libc::SYS_fsync,
            libc::SYS_fdatasync,
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
pub fn filter(role: Role, ioctls: &[u64]) -> Result<BpfProgram, SandboxError> {
    filter_with(role, ioctls, &[])
}

/// [`filter`] with `syscalls` allowed too (a vCPU thread that reaches a passed-through
/// device's regions with pread/pwrite).
pub fn filter_with(
    role: Role,
    ioctls: &[u64],
    syscalls: &[i64],
) -> Result<BpfProgram, SandboxError> {
    let err = |why: String| SandboxError::Filter {
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
pub fn apply(role: Role, prog: &BpfProgram) -> Result<(), SandboxError> {
    ROLE.with(|r| r.set(role.name()));
    seccompiler::apply_filter(prog).map_err(|e| SandboxError::Filter {
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
pub fn install_violation_handler() -> Result<(), SandboxError> {
    // SAFETY: sigaction is plain data; all-zero is a valid empty action.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigsys as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO;
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    if unsafe { libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) } != 0 {
        return Err(os("sigaction(SIGSYS)")(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// One thread's view of its own confinement, from /proc/self/task/TID/status.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ThreadConfinement {
    /// Thread name.
    pub name: String,
    /// Real, effective, saved, filesystem uid.
    pub uid: [u32; 4],
    /// Effective capabilities (hex as the kernel prints it, parsed).
    pub cap_eff: u64,
    /// `NoNewPrivs`.
    pub no_new_privs: bool,
    /// `Seccomp`: 0 off, 1 strict, 2 filter.
    pub seccomp: u32,
}

/// Parses one /proc/.../status text.
pub fn parse_status(text: &str) -> Option<ThreadConfinement> {
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':').map(str::trim))
    };
    let mut uid = [0u32; 4];
    let ids: Vec<u32> = field("Uid")?
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    if ids.len() != 4 {
        return None;
    }
    uid.copy_from_slice(&ids);
    Some(ThreadConfinement {
        name: field("Name")?.to_string(),
        uid,
        cap_eff: u64::from_str_radix(field("CapEff")?, 16).ok()?,
        no_new_privs: field("NoNewPrivs")? == "1",
        seccomp: field("Seccomp")?.parse().ok()?,
    })
}

/// Every thread of process `pid`, as its status says.
pub fn threads_of(pid: u32) -> Vec<ThreadConfinement> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| parse_status(&s))
        .collect()
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
    fn status_lines_parse() {
        let text = "Name:\tvcpu0\nUmask:\t0022\nUid:\t999\t999\t999\t999\nGid:\t998\t998\t998\t998\n\
                    CapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";
        let t = parse_status(text).unwrap();
        assert_eq!(t.name, "vcpu0");
        assert_eq!(t.uid, [999; 4]);
        assert_eq!((t.cap_eff, t.no_new_privs, t.seccomp), (0, true, 2));
        assert_eq!(parse_status("Name:\tx\n"), None);
        // This test process: not confined.
        let me = threads_of(std::process::id());
        assert!(!me.is_empty());
    }

    #[test]
    fn users_resolve_or_are_refused_clearly() {
        // No --uid: this launch's own identity, as root; refused otherwise.
        match resolve(None, None) {
            Ok(who) => {
                assert_eq!(who.uid, LAUNCH_ID_BASE + std::process::id());
                assert_eq!(
                    (who.gid, who.user),
                    (who.uid, format!("partition-{}", std::process::id()))
                );
                assert!(matches!(
                    resolve(None, Some("0")),
                    Err(SandboxError::Root(_))
                ));
            }
            Err(SandboxError::NotRoot(_)) => assert!(unsafe_not_root()),
            Err(e) => panic!("{e}"),
        }
        assert!(matches!(
            resolve(Some("no-such-user-xyz"), None),
            Err(SandboxError::NoSuchUser(_))
        ));
        assert!(matches!(
            resolve(Some("0"), None),
            Err(SandboxError::Root(_))
        ));
        assert!(matches!(
            resolve(Some("root"), None),
            Err(SandboxError::Root(_))
        ));
        assert!(matches!(
            resolve(Some("4294967295"), None),
            Err(SandboxError::InvalidId("--uid"))
        ));
        assert!(matches!(
            resolve(Some("65534"), Some("4294967295")),
            Err(SandboxError::InvalidId("--gid"))
        ));
        assert!(matches!(
            resolve(Some("65534"), Some("no-such-group-xyz")),
            Err(SandboxError::NoSuchGroup(_))
        ));
        assert!(matches!(
            resolve(Some("65534"), Some("0")),
            Err(SandboxError::Root(_))
        ));
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let who = resolve(Some("65534"), None).unwrap();
            assert_eq!((who.uid, who.gid), (65534, 65534));
        }
        assert!(resolve(Some("nobody"), None).is_ok() || unsafe_not_root());
    }

    fn unsafe_not_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() != 0 }
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
