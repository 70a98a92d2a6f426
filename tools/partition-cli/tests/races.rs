//! Root never opens what a local user swaps in (issue 33). A process running as another
//! user swaps, as fast as it can, each file root is given (`--kernel`, `--initrd`,
//! `--disk`, `--console`, `--api-socket`) and a directory on the way to them with a
//! symbolic link to a root-only target, while root launches run; inotify watches every
//! target and the directory holding them. Not one event may arrive: no target is opened,
//! read, written, truncated, chmodded, chowned, renamed or unlinked, and no entry appears in
//! or leaves root's directory. The launches end as they should (refused, or run on the
//! user's own file), never on root's.

mod common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// The user the swapping process runs as (nobody on the host has it).
const USER: u32 = 4242;

/// Names swapped in the user's directory: each is exchanged with `.alt-NAME`, a link to the
/// root-only target of the same role (`root/NAME`, or root's directory itself for `sub`
/// and `sockdir`).
const SWAPPED: [&str; 6] = [
    "disk.img",
    "serial.log",
    "vmlinux",
    "initrd",
    "sub",
    "sockdir",
];

/// A name that is either nothing or a link to root's `api.sock` (a root file of mode
/// 0644): the link is moved in and out again (a socket bound there meanwhile is replaced).
const COMES_AND_GOES: &str = "api.sock";

fn cstring(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// The swapping process: a child that becomes `USER` and exchanges each name with its
/// link (`renameat2(RENAME_EXCHANGE)`, atomic) until `deadline_ms` has passed; it writes
/// how many exchanges it made into `report` and exits. Only raw system calls run in the
/// child (it is forked from a threaded test harness).
struct Swapper {
    pid: libc::pid_t,
    report: OwnedFd,
}

impl Swapper {
    fn start(user_dir: &Path, run_for: Duration) -> Self {
        Self::start_with(user_dir, &SWAPPED, COMES_AND_GOES, run_for)
    }

    /// [`Self::start`] swapping `swapped` and moving `comes_and_goes` in and out.
    fn start_with(
        user_dir: &Path,
        swapped: &[&str],
        comes_and_goes: &str,
        run_for: Duration,
    ) -> Self {
        let dir = cstring(user_dir);
        let pair = |n: &str| {
            (
                CString::new(n).unwrap(),
                CString::new(format!(".alt-{n}")).unwrap(),
            )
        };
        let names: Vec<(CString, CString)> = swapped.iter().map(|n| pair(n)).collect();
        let (gone, link) = pair(comes_and_goes);
        let mut fds = [0i32; 2];
        // SAFETY: a pipe into a local array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let ms = run_for.as_millis() as i64;
        // SAFETY: the child makes only raw system calls on data prepared above, then
        // _exits; it touches nothing the harness's other threads hold.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            swap_in_child(&dir, &names, (&gone, &link), fds, ms);
        }
        // SAFETY: closing our copy of the write end; the read end is owned below.
        unsafe { libc::close(fds[1]) };
        Swapper {
            pid,
            // SAFETY: the pipe's read end, ours alone.
            report: unsafe { OwnedFd::from_raw_fd(fds[0]) },
        }
    }

    /// Waits for it; how many exchanges it made.
    fn finish(self) -> u64 {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(self.pid, &mut status, 0) }, self.pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the swapper failed (status {status:#x}: 3 setuid, 4 open)"
        );
        let mut b = [0u8; 8];
        // SAFETY: reading 8 bytes from our pipe into a local array.
        let n = unsafe { libc::read(self.report.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        assert_eq!(n, 8);
        u64::from_le_bytes(b)
    }
}

/// The forked child's whole life (see [`Swapper::start`]): only raw system calls.
fn swap_in_child(
    dir: &CString,
    names: &[(CString, CString)],
    (gone, link): (&CString, &CString),
    fds: [i32; 2],
    ms: i64,
) -> ! {
    let quit = |code: i32| -> ! {
        // SAFETY: ending the forked child without running the harness's exit handlers.
        unsafe { libc::_exit(code) }
    };
    // SAFETY: asks for SIGKILL if the test dies first; no memory is passed.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    // SAFETY: closing the child's copy of the pipe's read end.
    unsafe { libc::close(fds[0]) };
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
    // SAFETY: opening the user's directory by a NUL-terminated path.
    let d = unsafe { libc::open(dir.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY) };
    if d < 0 {
        quit(4);
    }
    let now_ms = || {
        // SAFETY: timespec is plain data; clock_gettime writes one.
        let mut t: libc::timespec = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
        t.tv_sec * 1000 + t.tv_nsec / 1_000_000
    };
    let start = now_ms();
    let mut swaps: u64 = 0;
    while now_ms() - start < ms {
        // SAFETY: renames within the directory descriptor, NUL-terminated names.
        let moved_in = unsafe { libc::renameat(d, link.as_ptr(), d, gone.as_ptr()) } == 0;
        // SAFETY: as above.
        if moved_in && unsafe { libc::renameat(d, gone.as_ptr(), d, link.as_ptr()) } == 0 {
            swaps += 1;
        }
        for (a, b) in names {
            // SAFETY: an atomic exchange within the directory descriptor.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_renameat2,
                    d,
                    a.as_ptr(),
                    d,
                    b.as_ptr(),
                    libc::RENAME_EXCHANGE,
                )
            };
            if r == 0 {
                swaps += 1;
            }
        }
    }
    let b = swaps.to_le_bytes();
    // SAFETY: writing 8 bytes from a local array to our pipe.
    unsafe { libc::write(fds[1], b.as_ptr().cast(), 8) };
    quit(0)
}

/// inotify watches on root's targets and their directory.
struct Watch {
    fd: OwnedFd,
    names: Vec<(i32, PathBuf)>,
}

impl Watch {
    fn new() -> Self {
        // SAFETY: a fresh inotify instance, owned below.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0);
        Watch {
            // SAFETY: ours alone.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            names: Vec::new(),
        }
    }

    fn add(&mut self, p: &Path, mask: u32) {
        let c = cstring(p);
        // SAFETY: a watch on a NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), mask) };
        assert!(
            wd >= 0,
            "{}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
        self.names.push((wd, p.to_path_buf()));
    }

    /// Every event so far, as "PATH: MASK".
    fn events(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: reading events into our buffer.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return out;
            }
            let mut at = 0usize;
            while at + 16 <= n as usize {
                let wd = i32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
                let mask = u32::from_ne_bytes(buf[at + 4..at + 8].try_into().unwrap());
                let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
                let name = String::from_utf8_lossy(&buf[at + 16..at + 16 + len])
                    .trim_end_matches('\0')
                    .to_string();
                let path = self
                    .names
                    .iter()
                    .find(|(w, _)| *w == wd)
                    .map(|(_, p)| p.display().to_string())
                    .unwrap_or_default();
                out.push(format!("{path} {name}: mask {mask:#x}"));
                at += 16 + len;
            }
        }
    }
}

/// What a file looked like: content, mode, owner, mtime.
fn fingerprint(p: &Path) -> (Vec<u8>, u32, u32, i64, i64) {
    let m = std::fs::symlink_metadata(p).unwrap();
    let content = if m.is_file() {
        std::fs::read(p).unwrap()
    } else {
        Vec::new()
    };
    (content, m.mode(), m.uid(), m.mtime(), m.mtime_nsec())
}

#[test]
fn a_user_swapping_files_and_directories_for_links_never_gets_root_to_touch_a_target() {
    let name = "a_user_swapping_files_and_directories_for_links_never_gets_root_to_touch_a_target";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(
            name,
            "only root can be raced into opening what it should not",
        );
        return;
    }
    if !kvm_available(name) {
        return;
    }
    let scratch = Scratch::new("races");
    std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Root's directory and its targets, one per role.
    let root = scratch.path("root");
    std::fs::create_dir(&root).unwrap();
    let kernel_bytes = tiny_kernel(&[0xf4], 0);
    let targets: Vec<(&str, Vec<u8>)> = vec![
        ("disk.img", vec![0x5a; 1 << 20]),
        ("serial.log", b"precious root log\n".to_vec()),
        ("vmlinux", kernel_bytes.clone()),
        ("initrd", b"precious root initrd\n".to_vec()),
        (
            "api.sock",
            b"a root file where a socket would go\n".to_vec(),
        ),
    ];
    for (n, bytes) in &targets {
        std::fs::write(root.join(n), bytes).unwrap();
        std::fs::set_permissions(root.join(n), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    // A stale socket of root's in root's directory (the linked-directory case once deleted
    // and re-made it).
    let stale = root.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
    // The user's directory: each name a real thing of the user's, and its swap partner a
    // link to root's.
    let user = scratch.path("user");
    std::fs::create_dir(&user).unwrap();
    let own = |p: &Path| std::os::unix::fs::lchown(p, Some(USER), Some(USER)).unwrap();
    let user_files: Vec<(&str, Vec<u8>)> = vec![
        ("disk.img", vec![0u8; 1 << 20]),
        ("serial.log", Vec::new()),
        ("vmlinux", kernel_bytes.clone()),
        ("initrd", b"the user's initrd\n".to_vec()),
    ];
    for d in [user.clone(), user.join("sub")] {
        if d != user {
            std::fs::create_dir(&d).unwrap();
            own(&d);
        }
        for (n, bytes) in &user_files {
            std::fs::write(d.join(n), bytes).unwrap();
            own(&d.join(n));
        }
    }
    std::fs::create_dir(user.join("sockdir")).unwrap();
    own(&user.join("sockdir"));
    for n in SWAPPED.iter().chain(&[COMES_AND_GOES]) {
        let target = match *n {
            "sub" | "sockdir" => root.clone(),
            n => root.join(n),
        };
        let alt = user.join(format!(".alt-{n}"));
        std::os::unix::fs::symlink(&target, &alt).unwrap();
        own(&alt);
    }
    own(&user);
    let before: Vec<_> = targets
        .iter()
        .map(|(n, _)| fingerprint(&root.join(n)))
        .collect();
    let stale_before = fingerprint(&stale);
    let root_listing = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let listing_before = root_listing(&root);
    let mut watch = Watch::new();
    for (n, _) in &targets {
        watch.add(&root.join(n), libc::IN_ALL_EVENTS);
    }
    watch.add(&stale, libc::IN_ALL_EVENTS);
    // The directory: entries made, removed, renamed, changed (opening it to read its
    // listing here is not among them).
    watch.add(
        &root,
        libc::IN_CREATE
            | libc::IN_DELETE
            | libc::IN_MOVED_FROM
            | libc::IN_MOVED_TO
            | libc::IN_ATTRIB
            | libc::IN_MODIFY
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF,
    );

    let u = |rel: &str| user.join(rel).to_str().unwrap().to_string();
    let nostate = scratch.path("no-state");
    // Launches that stop right after the check opened everything (no reservation in that
    // state directory), as fast as they come: the files through the swapped names, then
    // through the swapped directory.
    let check_only = |via: &str| -> Vec<String> {
        let p = |n: &str| u(&format!("{via}{n}"));
        vec![
            "launch".into(),
            "--name".into(),
            "racer".into(),
            "--state-dir".into(),
            nostate.to_str().unwrap().into(),
            "--cores".into(),
            "0".into(),
            "--memory".into(),
            "16M".into(),
            "--kernel".into(),
            p("vmlinux"),
            "--initrd".into(),
            p("initrd"),
            "--disk".into(),
            format!("path={}", p("disk.img")),
            "--console".into(),
            p("serial.log"),
        ]
    };
    // Launches that run the probe to its end with the API socket bound in the swapped
    // directory or at the swapped name.
    let full = |sock: &str| -> Vec<String> {
        [
            "launch",
            "--cores",
            "0",
            "--memory",
            "16M",
            "--probe",
            "--cmdline",
            "probe.memtest=0",
            "--api-socket",
            sock,
            "--console",
            &u("sub/serial.log"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let swapper = Swapper::start(&user, Duration::from_secs(30));
    let started = Instant::now();
    let (mut refused_link, mut ran_on_users, mut other_refusals) = (0, 0, 0);
    // Launches that ended otherwise than below: kept, and shown after what matters most.
    let mut unexpected: Vec<String> = Vec::new();
    let mut n = 0;
    let mut tally = |args: Vec<String>, limit: Duration, full_run: bool| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&a, limit);
        let code = out.code();
        let ok = if out
            .stderr
            .contains("symbolic link in a directory controlled by uid 4242")
        {
            refused_link += 1;
            code == 2
        } else if (!full_run && out.stderr.contains("nothing is reserved"))
            || (full_run && code == 0)
        {
            ran_on_users += 1;
            code == 2 || code == 0
        } else {
            // Anything else is refused for what it is (a socket name swapped while the
            // check looked, a file replaced by a directory), never a crash or root's file.
            other_refusals += 1;
            code == 2
        };
        if !ok {
            unexpected.push(format!("exit {code}: {a:?}:\n{}", tail(&out.stderr, 2000)));
        }
    };
    while n < 400 && started.elapsed() < Duration::from_secs(15) {
        tally(
            check_only(if n % 2 == 0 { "" } else { "sub/" }),
            Duration::from_secs(30),
            false,
        );
        n += 1;
    }
    let mut m = 0;
    while m < 30 && started.elapsed() < Duration::from_secs(28) {
        // Through the swapped directory, by the name of root's stale socket there; or at
        // the name that comes and goes.
        let sock = if m % 2 == 0 {
            u("sockdir/stale.sock")
        } else {
            u(COMES_AND_GOES)
        };
        tally(full(&sock), Duration::from_secs(60), true);
        m += 1;
    }
    let swaps = swapper.finish();
    println!(
        "{n} check-only and {m} full launches against {swaps} exchanges: {refused_link} refused at \
         a link, {ran_on_users} used the user's own files, {other_refusals} refused otherwise"
    );
    let events = watch.events();
    assert!(
        events.is_empty(),
        "root's targets were touched:\n{}",
        events.join("\n")
    );
    for ((n, _), b) in targets.iter().zip(&before) {
        assert_eq!(&fingerprint(&root.join(n)), b, "{n} changed");
    }
    assert_eq!(
        fingerprint(&stale),
        stale_before,
        "the stale socket changed"
    );
    assert_eq!(root_listing(&root), listing_before);
    assert!(
        unexpected.is_empty(),
        "launches that ended otherwise:\n{}",
        unexpected.join("\n")
    );
    // The race ran: the swapper swapped, and the launches met the links.
    assert!(swaps > 1000, "only {swaps} exchanges");
    assert!(refused_link > 0, "no launch met a planted link");
    assert!(n >= 20 && m >= 4, "too few launches ({n}, {m})");
}

/// `partition bench --report --results DIR/r.json` as root, where DIR is a user's: the
/// report and every chart are put there by descriptor, never written through a link the
/// user planted (issue 52's audit: `nobody` linked `r.md` to a root-only file, and the
/// report went into it, no race needed); and with the user swapping `r.md`, a chart's name
/// and the results file itself for links to root's files as fast as it can, root's files
/// see no event at all.
#[test]
fn bench_never_writes_or_reads_through_a_users_link() {
    let name = "bench_never_writes_or_reads_through_a_users_link";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(name, "only root can be made to write what it should not");
        return;
    }
    let scratch = Scratch::new("races-bench");
    std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = scratch.path("root");
    std::fs::create_dir(&root).unwrap();
    let results = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benchmarks/results/vm.json"),
    )
    .unwrap();
    let targets = ["r.md", "r-ratios.svg", "r-wake.svg", "r.json"];
    for n in targets {
        std::fs::write(root.join(n), format!("root's {n}\n")).unwrap();
        std::fs::set_permissions(root.join(n), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
    let user = scratch.path("user");
    std::fs::create_dir(&user).unwrap();
    let own = |p: &Path| std::os::unix::fs::lchown(p, Some(USER), Some(USER)).unwrap();
    std::fs::write(user.join("r.json"), &results).unwrap();
    own(&user.join("r.json"));
    // Planted: the report's and two charts' names are links to root's files.
    for n in ["r.md", "r-ratios.svg", "r-wake.svg"] {
        std::os::unix::fs::symlink(root.join(n), user.join(n)).unwrap();
        own(&user.join(n));
    }
    // The swap partners for the race below.
    for n in ["r.md", "r-ratios.svg", "r.json"] {
        let alt = user.join(format!(".alt-{n}"));
        std::os::unix::fs::symlink(root.join(n), &alt).unwrap();
        own(&alt);
    }
    std::os::unix::fs::symlink(root.join("r-wake.svg"), user.join(".alt-r-vanish.svg")).unwrap();
    own(&user.join(".alt-r-vanish.svg"));
    own(&user);
    let before: Vec<_> = targets.iter().map(|n| fingerprint(&root.join(n))).collect();
    let mut watch = Watch::new();
    for n in targets {
        watch.add(&root.join(n), libc::IN_ALL_EVENTS);
    }
    let report = || {
        run(
            &[
                "bench",
                "--report",
                "--results",
                user.join("r.json").to_str().unwrap(),
            ],
            Duration::from_secs(60),
        )
    };
    // No race: the links are simply there.
    let out = report();
    assert_eq!(out.code(), 0, "{}", out.stderr);
    for n in ["r.md", "r-ratios.svg", "r-wake.svg"] {
        let m = std::fs::symlink_metadata(user.join(n)).unwrap();
        assert!(m.is_file(), "{n} is still a link");
    }
    assert!(
        std::fs::read_to_string(user.join("r.md"))
            .unwrap()
            .contains("ratios")
    );
    // The race: every name exchanged with its link while root reports again and again.
    let swapper = Swapper::start_with(
        &user,
        &["r.md", "r-ratios.svg", "r.json"],
        "r-vanish.svg",
        Duration::from_secs(10),
    );
    let started = Instant::now();
    let (mut wrote, mut refused, mut runs) = (0, 0, 0);
    let mut unexpected = Vec::new();
    while started.elapsed() < Duration::from_secs(9) && runs < 200 {
        let out = report();
        match out.code() {
            0 => wrote += 1,
            2 => refused += 1,
            c => unexpected.push(format!("exit {c}: {}", tail(&out.stderr, 1000))),
        }
        runs += 1;
    }
    let swaps = swapper.finish();
    println!(
        "{runs} reports against {swaps} exchanges: {wrote} written, {refused} refused (the \
         results file a link when it was read)"
    );
    let events = watch.events();
    assert!(
        events.is_empty(),
        "root's files were touched:\n{}",
        events.join("\n")
    );
    for (n, b) in targets.iter().zip(&before) {
        assert_eq!(&fingerprint(&root.join(n)), b, "{n} changed");
    }
    assert!(unexpected.is_empty(), "{}", unexpected.join("\n"));
    assert!(swaps > 1000, "only {swaps} exchanges");
    assert!(wrote > 0 && runs >= 5, "{runs} runs, {wrote} written");
}
