//! Walls between tenants of one host (issue 52): guest memory no local user can map, and a
//! reservation no other reservation's recovery can wreck.
//!
//! - A user (uid 4242, a forked child) who can write to a pod's hugetlbfs volume plants the
//!   names a launch's memory file once had (`partition-<pid>.mem`, for the next 2,000 pids)
//!   and watches the volume while root launches the probe from it: not one page of any
//!   planted file is ever allocated and no other name appears.
//! - The same user with a world-writable hugetlbfs mount on the host plants the pool file's
//!   name there: root's reserve makes its own private mount instead, and after a partition
//!   has written all its memory, the planted file still has no page.
//! - A reserve killed once its pool exists, a second reservation (another state directory)
//!   on the same core with a partition running, then the first one's recovery, a stale
//!   record in a third that claims more hugepages than it added and IRQs spanning the
//!   second's core, and a copy of the second's ledger given back from the third: the
//!   second's pool, hugepages, mounts, IRQ affinities, cpusets, core claim and partition are
//!   untouched, and it releases and unreserves cleanly.

mod common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::host::{Host, hold_in, run_in, settings};
use common::*;

/// The local user the tenant runs as (nobody on the host has it).
const USER: u32 = 4242;

/// What the tenant saw.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    /// Files it planted.
    planted: u64,
    /// Planted files with any page allocated in them (guest memory put there).
    with_pages: u64,
    /// The most names beside its own it saw in the directory at once.
    foreign_max: u64,
}

/// A local user in a forked child that plants files in a directory it can write to,
/// watches that directory, and, told to stop, reports what became of its files. Only raw
/// system calls run in the child (it is forked from a threaded test harness), on data
/// prepared before the fork.
struct Tenant {
    pid: libc::pid_t,
    stop: OwnedFd,
    report: OwnedFd,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0i32; 2];
    // SAFETY: a pipe into a local array; both ends owned below.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: a fresh descriptor, ours alone.
    let r = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    // SAFETY: as above.
    let w = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    (r, w)
}

impl Tenant {
    /// Plants each of `names` in `dir` (`O_EXCL`, sized `size`, no page touched) as
    /// [`USER`], and returns once they are all there.
    fn start(dir: &Path, names: &[String], size: i64) -> Self {
        let dir = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let names: Vec<CString> = names
            .iter()
            .map(|n| CString::new(n.as_str()).unwrap())
            .collect();
        let mut fds = vec![-1i32; names.len()];
        let (stop_r, stop_w) = pipe();
        let (report_r, report_w) = pipe();
        // SAFETY: the child makes only raw system calls on data prepared above, then
        // _exits; it touches nothing the harness's other threads hold.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            tenant_child(
                &dir,
                &names,
                &mut fds,
                size,
                stop_r.as_raw_fd(),
                report_w.as_raw_fd(),
            );
        }
        drop((stop_r, report_w));
        let t = Tenant {
            pid,
            stop: stop_w,
            report: report_r,
        };
        let mut b = [0u8; 1];
        // SAFETY: reading one byte from our pipe into a local array.
        let n = unsafe { libc::read(t.report.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
        assert_eq!(
            (n, b[0]),
            (1, b'R'),
            "the tenant did not get ready (3: setuid, 4: open)"
        );
        t
    }

    /// Tells it to stop; what it saw.
    fn finish(mut self) -> Seen {
        // SAFETY: one byte from a static to our pipe.
        let n = unsafe { libc::write(self.stop.as_raw_fd(), b"S".as_ptr().cast(), 1) };
        assert_eq!(n, 1);
        let mut b = [0u8; 24];
        let mut got = 0;
        while got < b.len() {
            // SAFETY: reading into the rest of a local array.
            let n = unsafe {
                libc::read(
                    self.report.as_raw_fd(),
                    b[got..].as_mut_ptr().cast(),
                    b.len() - got,
                )
            };
            assert!(n > 0, "the tenant's report ended after {got} bytes");
            got += n as usize;
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(self.pid, &mut status, 0) }, self.pid);
        self.pid = 0;
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        Seen {
            planted: word(0),
            with_pages: word(1),
            foreign_max: word(2),
        }
    }
}

impl Drop for Tenant {
    /// A test that failed before [`Tenant::finish`]: the child goes (it holds the
    /// directory open, which would keep its mount busy).
    fn drop(&mut self) {
        if self.pid <= 0 {
            return;
        }
        // SAFETY: signalling our own child, not yet reaped (so its pid is still its own).
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        // SAFETY: reaping it.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
    }
}

/// Names in directory `d` other than `.` and `..`, counted with raw `getdents64`.
fn count_entries(d: i32) -> Option<u64> {
    // SAFETY: a fresh descriptor of the same directory, read from its start.
    let fd = unsafe { libc::openat(d, c".".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 8192];
    let mut count = 0;
    loop {
        // SAFETY: getdents64 into a local buffer of its length.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if n <= 0 {
            break;
        }
        let mut at = 0usize;
        while at + 19 < n as usize {
            let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            let name = &buf[at + 19..];
            let dot = name[0] == b'.' && (name[1] == 0 || (name[1] == b'.' && name[2] == 0));
            if !dot {
                count += 1;
            }
            if reclen == 0 {
                break;
            }
            at += reclen;
        }
    }
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
    Some(count)
}

/// The forked tenant's whole life (see [`Tenant::start`]): only raw system calls.
fn tenant_child(
    dir: &CString,
    names: &[CString],
    fds: &mut [i32],
    size: i64,
    stop: i32,
    report: i32,
) -> ! {
    let quit = |code: i32| -> ! {
        // SAFETY: ending the forked child without running the harness's exit handlers.
        unsafe { libc::_exit(code) }
    };
    // SAFETY: setgroups with an empty list, then the ids of every kind: raw calls that
    // change only this (single-threaded) child.
    let ok = unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<u32>()) } == 0
        // SAFETY: as above.
        && unsafe { libc::syscall(libc::SYS_setresgid, USER, USER, USER) } == 0
        // SAFETY: as above.
        && unsafe { libc::syscall(libc::SYS_setresuid, USER, USER, USER) } == 0;
    if !ok {
        quit(3);
    }
    // Asks for SIGKILL if the test dies first (after the change of user, which clears it).
    // SAFETY: no memory is passed.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    // SAFETY: opening the directory by a NUL-terminated path.
    let d = unsafe { libc::open(dir.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY) };
    if d < 0 {
        quit(4);
    }
    let mut planted = 0u64;
    for (name, slot) in names.iter().zip(fds.iter_mut()) {
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
        // SAFETY: openat within our directory descriptor, a NUL-terminated name.
        let fd = unsafe { libc::openat(d, name.as_ptr(), flags, 0o666) };
        if fd < 0 {
            continue;
        }
        // SAFETY: sizing our own new file; no page is allocated by it.
        unsafe { libc::ftruncate(fd, size) };
        *slot = fd;
        planted += 1;
    }
    // SAFETY: one byte from a static to our pipe.
    unsafe { libc::write(report, b"R".as_ptr().cast(), 1) };
    let mut foreign_max = 0u64;
    loop {
        let mut p = libc::pollfd {
            fd: stop,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one local pollfd.
        if unsafe { libc::poll(&mut p, 1, 5) } > 0 {
            break;
        }
        if let Some(n) = count_entries(d) {
            foreign_max = foreign_max.max(n.saturating_sub(planted));
        }
    }
    let mut with_pages = 0u64;
    for &fd in fds.iter().filter(|&&fd| fd >= 0) {
        // SAFETY: stat is plain data; fstat fills it for our own descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_blocks > 0 {
            with_pages += 1;
        }
    }
    let mut out = [0u8; 24];
    out[..8].copy_from_slice(&planted.to_le_bytes());
    out[8..16].copy_from_slice(&with_pages.to_le_bytes());
    out[16..].copy_from_slice(&foreign_max.to_le_bytes());
    // SAFETY: 24 bytes from a local array to our pipe.
    unsafe { libc::write(report, out.as_ptr().cast(), out.len()) };
    quit(0)
}

/// A hugetlbfs mount of 2 MiB pages, mode 1777 (anyone may make files in it: a pod's
/// volume, or a host's careless mount), unmounted on drop.
struct OpenMount(PathBuf);

impl OpenMount {
    fn new(at: PathBuf) -> Self {
        std::fs::create_dir_all(&at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "hugetlbfs", "-o", "pagesize=2M,mode=1777", "none"])
            .arg(&at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting hugetlbfs at {}", at.display());
        Self(at)
    }
}

impl Drop for OpenMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The host's 2 MiB hugepage count, raised by some and put back on drop.
struct MoreHugepages(String);

const NR_HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";

impl MoreHugepages {
    fn add(n: u64) -> Option<Self> {
        let before = std::fs::read_to_string(NR_HUGEPAGES).ok()?;
        let b: u64 = before.trim().parse().ok()?;
        let g = Self(before);
        std::fs::write(NR_HUGEPAGES, (b + n).to_string()).ok()?;
        let now: u64 = std::fs::read_to_string(NR_HUGEPAGES)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (now >= b + n).then_some(g)
    }
}

impl Drop for MoreHugepages {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, &self.0);
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_user_planting_in_the_volume_never_sees_a_guest_byte() {
    let name = "a_user_planting_in_the_volume_never_sees_a_guest_byte";
    let _one = common::host::SERIAL
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if !kvm_available(name) {
        return;
    }
    if !is_root() {
        skip(
            name,
            "mounting hugetlbfs and becoming another user need root",
        );
        return;
    }
    let Some(_pages) = MoreHugepages::add(8) else {
        skip(name, "the kernel would not give 8 more 2 MiB hugepages");
        return;
    };
    let dir = Scratch::new("tenancy-volume");
    let vol = OpenMount::new(dir.path("volume"));
    // Every name a launch's memory file once had, for the pids coming next.
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let names: Vec<String> = (last + 1..=last + 2000)
        .map(|p| format!("partition-{p}.mem"))
        .collect();
    let tenant = Tenant::start(&vol.0, &names, 16 << 20);
    let out = run(
        &[
            "launch",
            "--cores",
            "0",
            "--memory",
            "16M",
            "--probe",
            "--memory-from",
            vol.0.to_str().unwrap(),
            "--json",
        ],
        Duration::from_secs(120),
    );
    let seen = tenant.finish();
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // The guest ran from the volume and wrote every byte of its memory (the memtest).
    assert!(
        out.stdout.contains("probe: memtest range"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("\"volume\""), "{}", out.stdout);
    assert_eq!(
        seen,
        Seen {
            planted: names.len() as u64,
            with_pages: 0,
            foreign_max: 0
        },
        "a planted file got guest pages, or a name appeared the user could open"
    );
    // Nothing is left in the volume but the user's own files.
    assert_eq!(std::fs::read_dir(&vol.0).unwrap().count(), names.len());
}

#[test]
fn a_world_writable_hugetlbfs_mount_never_holds_a_pool() {
    let name = "a_world_writable_hugetlbfs_mount_never_holds_a_pool";
    let Some(h) = Host::new(name) else {
        return;
    };
    // Mounted before the reserve: the first hugetlbfs mount the host lists.
    let open = OpenMount::new(h.dir.with_extension("open-hugetlbfs"));
    let canonical = std::fs::canonicalize(h.dir.parent().unwrap())
        .unwrap()
        .join(h.dir.file_name().unwrap());
    let mut names: Vec<String> = [&h.dir, &canonical]
        .iter()
        .map(|d| format!("{}-pool", partition::host::ledger::state_tag(d)))
        .collect();
    names.dedup();
    let tenant = Tenant::start(&open.0, &names, 64 << 20);
    h.reserve("64M");
    let pool = h.ledger_json()["pool"].clone();
    let file = PathBuf::from(pool["file"].as_str().unwrap());
    assert!(file.starts_with(&h.dir), "{pool}");
    assert_eq!(pool["mounted_by_us"], true, "{pool}");
    let m = std::fs::symlink_metadata(&file).unwrap();
    assert_eq!(
        (m.uid(), m.mode() & 0o7777, m.nlink()),
        (0, 0o600, 1),
        "{}",
        file.display()
    );
    let mount = std::fs::symlink_metadata(file.parent().unwrap()).unwrap();
    assert_eq!((mount.uid(), mount.mode() & 0o7777), (0, 0o700));
    // A partition writes all its memory (the memtest), from the pool.
    let out = h.run(&[
        "launch", "--name", "p", "--cores", "1", "--memory", "32M", "--probe",
    ]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let seen = tenant.finish();
    assert_eq!(
        seen,
        Seen {
            planted: names.len() as u64,
            with_pages: 0,
            foreign_max: 0
        }
    );
    let out = h.run(&["unreserve"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
}

/// Another state directory of this test's, given back and removed on drop.
struct OtherDir(PathBuf);

impl OtherDir {
    fn new(h: &Host, tag: &str) -> Self {
        use std::os::unix::fs::DirBuilderExt;
        let d = h.dir.with_extension(tag);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        Self(d)
    }
}

impl Drop for OtherDir {
    fn drop(&mut self) {
        if let Ok(t) = std::fs::read_to_string(self.0.join("ledger.json")) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&t) {
                for p in v["partitions"].as_array().into_iter().flatten() {
                    let _ = run_in(&self.0, &["release", p["name"].as_str().unwrap_or("")], &[]);
                }
            }
        }
        let _ = run_in(&self.0, &["unreserve"], &[]);
        let _ = Command::new("umount")
            .arg(self.0.join("hugetlbfs-2048k"))
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `text` with every state tag of `from` (as given and canonical) and its path made `to`'s.
fn moved(text: &str, from: &Path, to: &Path) -> String {
    use partition::host::ledger::state_tag;
    let canon = |d: &Path| std::fs::canonicalize(d).unwrap();
    text.replace(&state_tag(&canon(from)), &state_tag(&canon(to)))
        .replace(&state_tag(from), &state_tag(to))
        .replace(canon(from).to_str().unwrap(), canon(to).to_str().unwrap())
        .replace(from.to_str().unwrap(), to.to_str().unwrap())
}

#[test]
fn one_reservations_recovery_leaves_another_whole() {
    let name = "one_reservations_recovery_leaves_another_whole";
    let Some(x) = Host::new(name) else {
        return;
    };
    let y = OtherDir::new(&x, "y");
    let z = OtherDir::new(&x, "z");
    let reserve = ["reserve", "--memory", "64M", "--cores", "1"];

    // X is killed once its hugepages, its mount and its pool file exist.
    let out = x.run_env(
        &reserve,
        &[(partition::host::reserve::FAIL_ENV, "kill-after-pool")],
    );
    assert_eq!(out.code(), -1, "expected death by SIGKILL: {}", out.stderr);
    assert!(x.dir.join("unfinished.json").exists());
    let x_mount = x.dir.join("hugetlbfs-2048k");
    assert!(pool::hugetlbfs::is_hugetlbfs(&x_mount));

    // Y reserves the same core: its pool goes into a mount of its own, never X's.
    let out = run_in(&y.0, &reserve, &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let y_ledger = std::fs::read_to_string(y.0.join("ledger.json")).unwrap();
    let y_pool: serde_json::Value =
        serde_json::from_str::<serde_json::Value>(&y_ledger).unwrap()["pool"].clone();
    let y_file = PathBuf::from(y_pool["file"].as_str().unwrap());
    assert!(y_file.starts_with(&y.0), "{y_pool}");
    assert!(std::fs::read_dir(&x_mount).unwrap().all(|e| {
        let e = e.unwrap();
        e.file_name().to_string_lossy().ends_with("-pool") && !y_file.starts_with(e.path())
    }));
    let mut held = hold_in(&y.0, "y1", "32M", "");
    let with_y = settings();
    let y_status = |y: &Path| {
        let out = run_in(y, &["status", "--json"], &[]);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        (
            v["pool"]["free_bytes"].clone(),
            v["partitions"][0]["alive"].clone(),
        )
    };
    assert_eq!(y_status(&y.0), (serde_json::json!(32 << 20), true.into()));
    // What the host should look like with Y alone: X's leftover mount gone.
    let mut y_alone = with_y.clone();
    y_alone
        .hugetlbfs_mounts
        .retain(|m| !m.contains(x_mount.to_str().unwrap()));
    let y_hugepages: u64 = with_y.nr_hugepages.trim().parse().unwrap();

    // X's recovery (what `status` recommends): everything of X's goes, nothing of Y's.
    let out = x.run(&["unreserve"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(!x.dir.join("unfinished.json").exists());
    assert!(!x_mount.exists());
    let after_x = settings();
    assert_eq!(
        after_x.nr_hugepages.trim().parse::<u64>().unwrap(),
        y_hugepages - 32,
        "X gave back its own 32 pages only"
    );
    let mut expect = y_alone.clone();
    expect.nr_hugepages = after_x.nr_hugepages.clone();
    assert_eq!(after_x, expect);
    assert!(y_file.exists());
    assert_eq!(y_status(&y.0), (serde_json::json!(32 << 20), true.into()));

    // A stale record in Z: more hugepages than any reserve added, and the IRQs as they were
    // before Y moved them off core 1. Its recovery leaves Y's pages and IRQs alone.
    let y_irqs = serde_json::from_str::<serde_json::Value>(&y_ledger).unwrap()["irqs"].clone();
    let stale = serde_json::json!({
        "page_size": 2 << 20,
        "node": null,
        "hugepages": {"before": 0, "added": 1000},
        "mount": null,
        "pool_file": null,
        "irqbalance": null,
        "irqs": y_irqs,
    });
    std::fs::write(z.0.join("unfinished.json"), stale.to_string()).unwrap();
    let out = run_in(&z.0, &["unreserve"], &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(settings(), after_x, "a stale record took Y's pages or IRQs");

    // Y's ledger copied into Z under Z's own names (no partition in it, so that it can be
    // unreserved): its give-back holds none of Y's cores and changes nothing of Y's.
    let mut copy: serde_json::Value = serde_json::from_str(&moved(&y_ledger, &y.0, &z.0)).unwrap();
    copy["partitions"] = serde_json::json!([]);
    std::fs::write(z.0.join("ledger.json"), copy.to_string()).unwrap();
    let out = run_in(&z.0, &["unreserve"], &[]);
    // It says what it would not take (exit 1: something was not given back).
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("only 0 of 32 hugepages could be given back (the others are in use"),
        "{}",
        out.stderr
    );
    assert_eq!(
        settings(),
        after_x,
        "a copied ledger gave back Y's host state"
    );
    let claim = std::fs::read("/run/partition-cores/core-1").unwrap();
    assert_eq!(
        claim,
        std::fs::canonicalize(&y.0).unwrap().as_os_str().as_bytes()
    );
    assert_eq!(y_status(&y.0), (serde_json::json!(32 << 20), true.into()));

    // Y is whole: its partition stops, and it gives everything back.
    let out = run_in(&y.0, &["release", "y1"], &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let _ = held.wait();
    let out = run_in(&y.0, &["unreserve"], &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(settings(), x.before);
}
