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

/// The first uid (and gid) of the per-launch range: a VMM runs as `LAUNCH_ID_BASE + its
/// pid`. Far above system users, systemd's dynamic users and the usual subordinate id
/// ranges; `pid_max` is at most 2^22, so the range ends below 3,004,194,304.
pub const LAUNCH_ID_BASE: u32 = 3_000_000_000;
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

impl From<crate::sys::seccomp::SeccompError> for SandboxError {
    fn from(e: crate::sys::seccomp::SeccompError) -> Self {
        Self::Filter {
            role: e.role,
            why: e.why,
        }
    }
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

/// The user and group databases, read as files: the VMM is linked statically
/// (.cargo/config.toml), and glibc's name service cannot load its modules into a static
/// program (`getpwnam_r` crashed there). Users and groups that only a name service such as
/// LDAP knows are given to `--uid`/`--gid` as numbers.
const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";
/// Largest database read.
const DB_LIMIT: u64 = 16 << 20;

fn read_db(path: &str) -> String {
    crate::sys::files::read_limited(std::path::Path::new(path), DB_LIMIT)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Which passwd(5) entry.
#[derive(Clone, Copy)]
enum UserKey<'a> {
    Name(&'a str),
    Uid(u32),
}

/// The first passwd(5) entry matching `key`: (uid, gid, name). Comments and lines without
/// numeric uid and gid are skipped.
fn find_user(passwd: &str, key: UserKey<'_>) -> Option<(u32, u32, String)> {
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if line.starts_with('#') || f.len() < 4 || f[0].is_empty() {
            return None;
        }
        let (uid, gid) = (f[2].parse::<u32>().ok()?, f[3].parse::<u32>().ok()?);
        let hit = match key {
            UserKey::Name(n) => f[0] == n,
            UserKey::Uid(u) => uid == u,
        };
        hit.then(|| (uid, gid, f[0].to_string()))
    })
}

/// The gid of the first group(5) entry named `name`.
fn find_group(group: &str, name: &str) -> Option<u32> {
    group.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if line.starts_with('#') || f.len() < 3 || f[0] != name {
            return None;
        }
        f[2].parse().ok()
    })
}

fn lookup_user(name: &str) -> Option<(u32, u32, String)> {
    find_user(&read_db(PASSWD), UserKey::Name(name))
}

fn lookup_uid(uid: u32) -> Option<(u32, u32, String)> {
    find_user(&read_db(PASSWD), UserKey::Uid(uid))
}

fn lookup_group(name: &str) -> Option<u32> {
    find_group(&read_db(GROUP), name)
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
/// glibc changes the ids of every thread of the process; `no_new_privs` and the check are
/// the calling thread's, so a thread that already existed confirms its own with
/// [`confirm_thread`] (the vCPU threads, started early to take their cores). Checked
/// afterwards: an error if anything stayed.
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
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    no_new_privs_as(who.uid, "")
}

/// The number of threads of this process (`/proc/self/status`).
fn threads() -> Option<usize> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

fn mount(
    src: Option<&std::ffi::CStr>,
    target: &std::ffi::CStr,
    fstype: Option<&std::ffi::CStr>,
    flags: libc::c_ulong,
    data: Option<&std::ffi::CStr>,
) -> std::io::Result<()> {
    let p = |c: Option<&std::ffi::CStr>| c.map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: mount(2) with NUL-terminated strings (or null where the call allows it).
    let r = unsafe { libc::mount(p(src), target.as_ptr(), p(fstype), flags, p(data).cast()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// First step of the private root, while the launcher is still one thread (its keeper
/// already forked, no other thread started): a mount namespace of the VMM's own, every
/// mount in it private (nothing made in it reaches the host's). Every thread started
/// afterwards is in it. The host's files stay reachable until [`empty_root`].
///
/// Without `CAP_SYS_ADMIN` (a container's default capabilities: no mount namespace can be
/// made in it) there is none: the container's own mount namespace and root are the VMM's,
/// and the answer says so ([`PrivateRoot::NotMade`]); [`empty_root`] then does nothing.
pub fn private_mounts() -> Result<PrivateRoot, SandboxError> {
    const CAP_SYS_ADMIN: u32 = 21;
    let (effective, _) = capabilities().map_err(os("capget"))?;
    if effective & (1 << CAP_SYS_ADMIN) == 0 {
        NO_PRIVATE_ROOT.store(true, std::sync::atomic::Ordering::Relaxed);
        return Ok(PrivateRoot::NotMade(
            "no CAP_SYS_ADMIN here (a container's default capabilities): the container's \
             own root is the VMM's",
        ));
    }
    if threads() != Some(1) {
        return Err(SandboxError::Os {
            what: "a mount namespace of the VMM's own",
            source: std::io::Error::other(format!(
                "the launcher must be one thread here, it is {:?}",
                threads()
            )),
        });
    }
    // SAFETY: unshare with a flag set; affects this (single-threaded) process only.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(os("unshare(CLONE_NEWNS)")(std::io::Error::last_os_error()));
    }
    mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(os("making every mount private"))?;
    Ok(PrivateRoot::Made)
}

/// Whether the VMM has a root of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrivateRoot {
    /// A mount namespace of its own, its root an empty tmpfs once [`empty_root`] ran.
    Made,
    /// None could be made, and why.
    NotMade(&'static str),
}

/// Set when [`private_mounts`] made none: [`empty_root`] has nothing to do.
static NO_PRIVATE_ROOT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Second step, once everything the VMM needs is open and before root is given up: the
/// root of every thread becomes an empty, read-only tmpfs (as Firecracker's jailer makes a
/// chroot, but empty), and the host's file system is detached from the namespace. After
/// it, no path of the host names anything for the VMM (`/proc/PID/root` shows an empty
/// directory); it works only through the descriptors it holds.
pub fn empty_root() -> Result<(), SandboxError> {
    if NO_PRIVATE_ROOT.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    // A directory of the host's to mount the new root over, in this namespace only.
    let over: &std::ffi::CStr = if std::path::Path::new("/tmp").is_dir() {
        c"/tmp"
    } else {
        c"/proc"
    };
    mount(
        Some(c"partition-root"),
        over,
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(c"size=16k,nr_inodes=8,mode=0755"),
    )
    .map_err(os("mounting the empty root"))?;
    // SAFETY: chdir to a NUL-terminated path.
    if unsafe { libc::chdir(over.as_ptr()) } != 0 {
        return Err(os("entering the empty root")(
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: mkdir of a relative NUL-terminated name in the new tmpfs.
    if unsafe { libc::mkdir(c"old".as_ptr(), 0o700) } != 0 {
        return Err(os("making the old root's place")(
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: pivot_root with two NUL-terminated relative paths; every thread's root and
    // working directory that were the old root become the new one.
    let pivoted =
        unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c"old".as_ptr()) } == 0;
    if pivoted {
        // SAFETY: detaching the host's tree from this namespace, by a NUL-terminated path.
        if unsafe { libc::umount2(c"/old".as_ptr(), libc::MNT_DETACH) } != 0 {
            return Err(os("detaching the host's file system")(
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: rmdir of a NUL-terminated path.
        if unsafe { libc::rmdir(c"/old".as_ptr()) } != 0 {
            return Err(os("leaving the empty root empty")(
                std::io::Error::last_os_error(),
            ));
        }
    } else {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(os("pivot_root")(e));
        }
        // The host runs from its initramfs (rootfs, which pivot_root will not leave): the
        // empty root is moved over `/` and made the root, as switch_root does. The host's
        // mounts stay in the namespace, under it, where no path reaches them.
        // SAFETY: rmdir of a relative NUL-terminated name in the new tmpfs.
        if unsafe { libc::rmdir(c"old".as_ptr()) } != 0 {
            return Err(os("leaving the empty root empty")(
                std::io::Error::last_os_error(),
            ));
        }
        mount(Some(c"."), c"/", None, libc::MS_MOVE, None)
            .map_err(os("moving the empty root over /"))?;
        // SAFETY: chroot to the working directory (the moved tmpfs), a NUL-terminated path;
        // every thread shares this process's root.
        if unsafe { libc::chroot(c".".as_ptr()) } != 0 {
            return Err(os("chroot")(std::io::Error::last_os_error()));
        }
    }
    // SAFETY: chdir of a NUL-terminated path.
    if unsafe { libc::chdir(c"/".as_ptr()) } != 0 {
        return Err(os("entering the empty root")(
            std::io::Error::last_os_error(),
        ));
    }
    mount(
        None,
        c"/",
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(os("making the empty root read-only"))
}

/// For a thread that existed when the process dropped its privileges: sets its own
/// `no_new_privs` and checks that it runs as `uid` with empty capability sets.
pub fn confirm_thread(uid: u32) -> Result<(), SandboxError> {
    no_new_privs_as(uid, "a thread's ")
}

/// Sets the calling thread's `no_new_privs`, then checks it runs as `uid` (real, effective
/// and saved) with empty capability sets; `whose` starts the messages.
fn no_new_privs_as(uid: u32, whose: &str) -> Result<(), SandboxError> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(os("PR_SET_NO_NEW_PRIVS")(std::io::Error::last_os_error()));
    }
    let (r, e, s) = resuid();
    if [r, e, s] != [uid; 3] {
        return Err(SandboxError::StillPrivileged(format!(
            "{whose}uids are {r}/{e}/{s}, not {uid}"
        )));
    }
    match capabilities().map_err(os("capget"))? {
        (0, 0) => Ok(()),
        (e, p) => Err(SandboxError::StillPrivileged(format!(
            "{whose}capabilities: effective {e:#x} permitted {p:#x}"
        ))),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_kept_its_ids_is_not_confirmed() {
        // This test thread keeps the test process's ids; asked to be someone else, it is
        // refused (and has set only its own no_new_privs).
        let (r, ..) = resuid();
        let other = r.wrapping_add(4242);
        let e = std::thread::spawn(move || confirm_thread(other))
            .join()
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("a thread's uids are"), "{e}");
        if r != 0 {
            return;
        }
        // Root with its capabilities, asked to be root: refused on the capabilities.
        let e = std::thread::spawn(|| confirm_thread(0))
            .join()
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("a thread's capabilities"), "{e}");
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
    fn the_user_and_group_files_parse_and_hostile_lines_are_skipped() {
        let passwd = "# a comment\n\
                      root:x:0:0:root:/root:/bin/bash\n\
                      broken line\n\
                      :x:5:5::/:/bin/sh\n\
                      odd:x:notanumber:7::/:/bin/sh\n\
                      vmm:x:1001:1002:VMM user:/home/vmm:/usr/sbin/nologin\n\
                      vmm:x:2001:2002::/:/bin/sh\n";
        assert_eq!(
            find_user(passwd, UserKey::Name("vmm")),
            Some((1001, 1002, "vmm".into()))
        );
        assert_eq!(
            find_user(passwd, UserKey::Uid(0)),
            Some((0, 0, "root".into()))
        );
        assert_eq!(find_user(passwd, UserKey::Name("odd")), None);
        assert_eq!(find_user(passwd, UserKey::Uid(5)), None);
        assert_eq!(find_user(passwd, UserKey::Name("")), None);
        assert_eq!(find_user(passwd, UserKey::Name("nobody-here")), None);
        assert_eq!(find_user("", UserKey::Uid(0)), None);
        let group = "root:x:0:\nkvm:x:993:vmm,other\n#kvm:x:1:\nbad:x:\n";
        assert_eq!(find_group(group, "kvm"), Some(993));
        assert_eq!(find_group(group, "root"), Some(0));
        assert_eq!(find_group(group, "bad"), None);
        assert_eq!(find_group(group, "#kvm"), None);
        // This host's own databases: root is uid 0 by name and by number.
        assert_eq!(lookup_user("root").map(|u| u.0), Some(0));
        assert_eq!(lookup_uid(0).map(|u| u.2), Some("root".to_string()));
        assert_eq!(lookup_group("root"), Some(0));
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
}
