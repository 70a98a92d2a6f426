//! Bad input gets exit status 2, a message naming the problem, and leaves nothing behind:
//! no process, no mount, no hugepage. One test walks every case in turn, so the host
//! snapshots before and after are not disturbed by other tests of this binary.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(30);

/// An ad hoc launch of the probe on core 0 with 16 MiB, before the argument under test.
const PROBE_16M: [&str; 6] = ["launch", "--cores", "0", "--memory", "16M", "--probe"];

/// The tests here run one at a time: the first compares snapshots of the host that list
/// every `partition` process, and the other's would be in them (seen on the rig, where
/// processes live longer).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn every_bad_input_exits_2_with_a_clear_message_and_leaves_nothing_behind() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("bad-input");
    let text = dir.file("notes.txt", b"this is not a kernel\n");
    let empty = dir.file("empty", b"");
    let fat = dir.file("fat-kernel", &tiny_kernel(&[0xf4], 64 << 20));
    let plain = dir.file("plain-kernel", &tiny_kernel(&[0xf4], 0));
    let big_initrd = dir.file("initrd", &vec![0u8; 20 << 20]);
    let mut truncated = tiny_kernel(&[0xf4; 64], 0);
    truncated.truncate(100);
    let truncated = dir.file("truncated-kernel", &truncated);
    // Both bzImage magics and nothing after the version field: it once panicked the
    // parser (an index past the end of the file).
    let mut stub = vec![0u8; 0x208];
    stub[0x1fe..0x200].copy_from_slice(&[0x55, 0xaa]);
    stub[0x202..0x206].copy_from_slice(b"HdrS");
    stub[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    let stub = dir.file("stub-bzimage", &stub);
    // A disk image nobody may write: root could open it read-write, but must not.
    let sealed = dir.file("sealed.img", &vec![0u8; 1 << 20]);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sealed, std::fs::Permissions::from_mode(0o444)).unwrap();
    }
    let sealed_spec = format!("path={}", sealed.display());
    let s = |p: &std::path::PathBuf| p.to_str().unwrap().to_string();
    let long_cmdline = "a".repeat(3000);
    let base = &PROBE_16M[..5];

    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "missing kernel",
            vec!["--kernel".into(), "/nonexistent/vmlinux".into()],
            "No such file",
        ),
        (
            "directory as kernel",
            vec!["--kernel".into(), "/tmp".into()],
            "not a regular file",
        ),
        (
            "text file as kernel",
            vec!["--kernel".into(), s(&text)],
            "not a kernel image",
        ),
        (
            "empty kernel",
            vec!["--kernel".into(), s(&empty)],
            "not a kernel image",
        ),
        (
            "truncated ELF",
            vec!["--kernel".into(), s(&truncated)],
            "malformed ELF",
        ),
        (
            "bzImage cut after its version field",
            vec!["--kernel".into(), s(&stub)],
            "malformed bzImage",
        ),
        (
            "kernel larger than memory",
            vec!["--kernel".into(), s(&fat)],
            "kernel needs guest memory",
        ),
        (
            "PVH without a PVH note",
            vec!["--kernel".into(), s(&plain), "--boot".into(), "pvh".into()],
            "no PVH entry point",
        ),
        (
            "command line too long",
            vec!["--probe".into(), "--cmdline".into(), long_cmdline],
            "at most 2047",
        ),
        (
            "control character in command line",
            vec!["--probe".into(), "--cmdline".into(), "a\nb".into()],
            "control character",
        ),
        (
            "a command line that is not ASCII",
            vec!["--probe".into(), "--cmdline".into(), "caf\u{e9}".into()],
            "not printable ASCII",
        ),
        (
            "missing initrd",
            vec![
                "--probe".into(),
                "--initrd".into(),
                "/nonexistent/initrd".into(),
            ],
            "--initrd",
        ),
        (
            "initrd larger than memory",
            vec!["--probe".into(), "--initrd".into(), s(&big_initrd)],
            "initrd",
        ),
        (
            "console in a missing directory",
            vec![
                "--probe".into(),
                "--console".into(),
                "/nonexistent/dir/log".into(),
            ],
            "--console",
        ),
        ("no kernel at all", vec![], "required"),
        (
            "kernel and probe both",
            vec!["--probe".into(), "--kernel".into(), s(&plain)],
            "cannot be used with",
        ),
    ];
    let nowhere = dir.path("never-created");
    let nowhere = nowhere.to_str().unwrap();
    let twice = dir.file("twice.img", &vec![0u8; 1 << 20]);
    let twice_spec = format!("path={}", twice.display());
    let twice_ro = format!("{twice_spec},readonly=on");
    let long_socket = format!("{}/{}", dir.0.display(), "s".repeat(120));
    let socket_nowhere = format!("{nowhere}/api.sock");
    let plan = |name: &str, state_dir: &str| {
        s(&dir.file(
            name,
            format!("memory = \"64M\"\ncores = \"1\"\nstate_dir = \"{state_dir}\"\n").as_bytes(),
        ))
    };
    let typed_plan = |name: &str, memory: &str, cores: &str| {
        s(&dir.file(
            name,
            format!("memory = \"{memory}\"\ncores = \"{cores}\"\n").as_bytes(),
        ))
    };
    let plan_bad_size = typed_plan("bad-size.toml", "lots", "1");
    let plan_twice_core = typed_plan("twice-core.toml", "64M", "1,1");
    let disk_key_twice = format!("{twice_spec},readonly=on,readonly=off");
    let relative_plan = plan("relative.toml", "here");
    let empty_plan = plan("empty.toml", "");
    let elsewhere_plan = plan("elsewhere.toml", "/run/partition-elsewhere");
    let explicit_state = s(&dir.path("explicit-state"));
    let other: Vec<(&str, Vec<&str>, &str)> = vec![
        (
            "a plan's relative state_dir",
            vec!["reserve", "--plan", &relative_plan],
            "must be an absolute path",
        ),
        (
            "a plan's empty state_dir",
            vec!["reserve", "--plan", &empty_plan],
            "must be an absolute path",
        ),
        (
            "a plan's state_dir against another --state-dir",
            vec![
                "reserve",
                "--plan",
                &elsewhere_plan,
                "--state-dir",
                &explicit_state,
            ],
            "give one",
        ),
        (
            "(uid_t)-1 as --uid",
            [&PROBE_16M[..], &["--uid", "4294967295"]].concat(),
            "names nobody",
        ),
        (
            "an API socket path longer than a Unix socket address",
            [&PROBE_16M[..], &["--api-socket", &long_socket]].concat(),
            "longer than the 107 bytes",
        ),
        (
            "an API socket in a directory that does not exist",
            [&PROBE_16M[..], &["--api-socket", &socket_nowhere]].concat(),
            "its directory does not exist",
        ),
        (
            "the same disk twice, read-write",
            [
                &PROBE_16M[..],
                &["--disk", &twice_spec, "--disk", &twice_ro],
            ]
            .concat(),
            "already attached, and read-write",
        ),
        (
            "a --disk key given twice",
            [&PROBE_16M[..], &["--disk", &disk_key_twice]].concat(),
            "readonly= given twice",
        ),
        (
            "a --device key given twice",
            [
                &PROBE_16M[..],
                &["--device", "engine,doorbell=trap,doorbell=mapped"],
            ]
            .concat(),
            "doorbell= given twice",
        ),
        (
            "two submission engines",
            [
                &PROBE_16M[..],
                &["--device", "engine", "--device", "engine,doorbell=trap"],
            ]
            .concat(),
            "one submission engine per partition",
        ),
        (
            "a kubelet checkpoint without cores from the cgroup",
            [
                &PROBE_16M[..],
                &["--kubelet-cpu-state", "/var/lib/kubelet/cpu_manager_state"],
            ]
            .concat(),
            "--kubelet-cpu-state goes with --cores from-cgroup",
        ),
        (
            "a plan whose memory is not a size",
            vec!["reserve", "--plan", &plan_bad_size],
            "\"lots\" is not a size",
        ),
        (
            "a plan listing a core twice",
            vec!["reserve", "--plan", &plan_twice_core],
            "listed more than once",
        ),
        (
            "endless plan file",
            vec!["reserve", "--plan", "/dev/zero", "--state-dir", nowhere],
            "not a regular file",
        ),
        (
            "endless bzImage",
            vec!["extract-vmlinux", "/dev/zero", "-o", nowhere],
            "not a regular file",
        ),
        (
            "0444 disk image without readonly=on",
            vec![
                "launch",
                "--cores",
                "0",
                "--memory",
                "16M",
                "--probe",
                "--disk",
                &sealed_spec,
            ],
            "the file is read-only",
        ),
        (
            "nonexistent core",
            vec!["launch", "--cores", "4095", "--memory", "16M", "--probe"],
            "core 4095 does not exist",
        ),
        (
            "duplicate core",
            vec!["launch", "--cores", "0,0", "--memory", "16M", "--probe"],
            "listed more than once",
        ),
        (
            "core list syntax",
            vec!["launch", "--cores", "zero", "--memory", "16M", "--probe"],
            "not a core number",
        ),
        (
            "backwards range",
            vec!["launch", "--cores", "1-0", "--memory", "16M", "--probe"],
            "runs backwards",
        ),
        (
            "size not a page multiple",
            vec!["launch", "--cores", "0", "--memory", "16777217", "--probe"],
            "not a multiple of 4 KiB",
        ),
        (
            "size too small",
            vec!["launch", "--cores", "0", "--memory", "1M", "--probe"],
            "too small",
        ),
        (
            "size too large",
            vec!["launch", "--cores", "0", "--memory", "100G", "--probe"],
            "too large",
        ),
        (
            "size syntax",
            vec!["launch", "--cores", "0", "--memory", "12Q", "--probe"],
            "is not a size",
        ),
        (
            "hugepage size multiple",
            vec![
                "launch",
                "--cores",
                "0",
                "--memory",
                "17M",
                "--probe",
                "--hugepages",
            ],
            "not a multiple of the 2097152 byte pages",
        ),
        (
            "unknown boot protocol",
            vec![
                "launch", "--cores", "0", "--memory", "16M", "--probe", "--boot", "bios",
            ],
            "invalid value",
        ),
        (
            "bzImage extraction of a non-bzImage",
            vec!["extract-vmlinux", text.to_str().unwrap(), "-o", "/dev/null"],
            "not a bzImage",
        ),
    ];

    let before = host_state();
    let mut failures = Vec::new();
    let mut check = |what: &str, args: Vec<String>, want: &str| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&refs, LIMIT);
        if out.code() != 2 {
            failures.push(format!(
                "{what}: exit {} (want 2); stderr: {}",
                out.code(),
                out.stderr
            ));
        } else if !out.stderr.contains(want) {
            failures.push(format!("{what}: stderr lacks {want:?}: {}", out.stderr));
        } else if out.stderr.lines().count() > 8 {
            failures.push(format!("{what}: message is not short: {}", out.stderr));
        }
        if !out.stdout.is_empty() {
            failures.push(format!("{what}: printed to stdout: {}", out.stdout));
        }
    };
    for (what, extra, want) in cases {
        let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        args.extend(extra);
        check(what, args, want);
    }
    for (what, args, want) in other {
        check(what, args.iter().map(|s| s.to_string()).collect(), want);
    }
    let after = host_state();
    assert!(
        !std::path::Path::new(nowhere).exists(),
        "{nowhere} was created"
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    assert_eq!(before, after, "host state changed");
}

/// A report piped into a reader that has gone (`partition status | head -1`) ends quietly,
/// as a Unix filter does, not with a panic and a backtrace.
#[test]
fn a_closed_pipe_ends_a_report_quietly() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("closed-pipe");
    let state = dir.path("state");
    for args in [
        vec!["caps".to_string()],
        vec![
            "status".to_string(),
            "--state-dir".to_string(),
            state.display().to_string(),
        ],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = partition()
            .args(&args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {stderr}"
        );
    }
}

/// A FIFO given as any input (kernel, initrd, console, a read-only disk, a host plan) is
/// refused as bad input (exit 2): opening one for reading or writing waits for its other
/// end, which never comes (issue 24: each hung the command forever). No reader or writer
/// is ever attached here; a hang fails the test at its limit.
#[test]
fn a_fifo_as_any_input_is_refused_without_waiting() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("fifo-inputs");
    let fifo = dir.path("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let kernel = dir.file("plain-kernel", &tiny_kernel(&[0xf4], 0));
    let f = fifo.to_str().unwrap();
    let k = kernel.to_str().unwrap();
    let base = &PROBE_16M[..5];
    let disk = format!("path={f},readonly=on");
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("--kernel", [base, &["--kernel", f]].concat()),
        ("--initrd", [base, &["--kernel", k, "--initrd", f]].concat()),
        ("--console", [&PROBE_16M[..], &["--console", f]].concat()),
        (
            "--disk readonly",
            [&PROBE_16M[..], &["--disk", &disk]].concat(),
        ),
        ("--plan", vec!["reserve", "--plan", f]),
    ];
    // The ledger itself a FIFO: status, release, unreserve and reserve refuse it at once.
    let ledger_dir = dir.path("fifo-ledger");
    std::fs::create_dir(&ledger_dir).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ledger_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let lf = std::ffi::CString::new(
        ledger_dir
            .join("ledger.json")
            .as_os_str()
            .as_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(lf.as_ptr(), 0o600) }, 0);
    let ld = ledger_dir.to_str().unwrap();
    for args in [
        vec!["status", "--state-dir", ld],
        vec!["release", "x", "--state-dir", ld],
        vec!["unreserve", "--state-dir", ld],
        vec![
            "reserve",
            "--memory",
            "64M",
            "--cores",
            "1",
            "--state-dir",
            ld,
        ],
    ] {
        let out = partition()
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_output(out, Duration::from_secs(30), args[0]);
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("not a regular file"),
            "{args:?}: {}",
            out.stderr
        );
    }
    let state = dir.path("state");
    for (what, args) in cases {
        let out = partition()
            .env("PARTITION_STATE_DIR", &state)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_output(out, Duration::from_secs(30), what);
        assert_eq!(out.code(), 2, "{what}: {}", out.stderr);
        assert!(
            out.stderr.contains("not a regular file") || out.stderr.contains("regular"),
            "{what}: {}",
            out.stderr
        );
    }
}

/// Root follows no symbolic link a local user planted: `--console DIR/serial.log` and
/// `--disk path=DIR/disk.img` in a directory owned by another user, each a link to a file
/// only root may write, are refused with exit 2 and the files are untouched (they were
/// truncated or overwritten before). So are `--kernel` and `--initrd` links there.
#[test]
fn links_in_another_users_directory_are_refused_and_their_targets_untouched() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let name = "links_in_another_users_directory_are_refused_and_their_targets_untouched";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(name, "only root follows links it should not");
        return;
    }
    let dir = Scratch::new("planted-links");
    let secret = dir.file("root-only", b"precious root data\n");
    let image = dir.file("root-image", &[0x5a; 1 << 20]);
    let kernel = dir.file("root-kernel", &tiny_kernel(&[0xf4], 0));
    let user_dir = dir.path("user");
    std::fs::create_dir(&user_dir).unwrap();
    for (link, target) in [
        ("serial.log", &secret),
        ("disk.img", &image),
        ("vmlinux", &kernel),
        ("initrd", &secret),
    ] {
        std::os::unix::fs::symlink(target, user_dir.join(link)).unwrap();
    }
    std::os::unix::fs::chown(&user_dir, Some(4242), Some(4242)).unwrap();
    let console = user_dir.join("serial.log");
    let disk = format!("path={}", user_dir.join("disk.img").display());
    let planted_kernel = user_dir.join("vmlinux");
    let planted_initrd = user_dir.join("initrd");
    let base = &PROBE_16M[..5];
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (
            "--console",
            [&PROBE_16M[..], &["--console", console.to_str().unwrap()]].concat(),
        ),
        ("--disk", [&PROBE_16M[..], &["--disk", &disk]].concat()),
        (
            "--kernel",
            [base, &["--kernel", planted_kernel.to_str().unwrap()]].concat(),
        ),
        (
            "--initrd",
            [
                base,
                &[
                    "--kernel",
                    kernel.to_str().unwrap(),
                    "--initrd",
                    planted_initrd.to_str().unwrap(),
                ],
            ]
            .concat(),
        ),
    ];
    for (what, args) in cases {
        let out = run(&args, Duration::from_secs(60));
        assert_eq!(out.code(), 2, "{what}: {}", out.stderr);
        assert!(
            out.stderr.contains("symbolic link") && out.stderr.contains("uid 4242"),
            "{what}: {}",
            out.stderr
        );
        assert_eq!(
            std::fs::read(&secret).unwrap(),
            b"precious root data\n",
            "{what} changed the root-only file"
        );
        assert_eq!(
            std::fs::read(&image).unwrap(),
            vec![0x5a; 1 << 20],
            "{what}"
        );
    }
    // Root's own links are followed as ever.
    let own = dir.path("own-console");
    std::os::unix::fs::symlink(dir.path("console.out"), &own).unwrap();
    let out = run(
        &[
            &PROBE_16M[..],
            &[
                "--console",
                own.to_str().unwrap(),
                "--cmdline",
                "probe.memtest=0",
            ],
        ]
        .concat(),
        Duration::from_secs(120),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let log = std::fs::read_to_string(dir.path("console.out")).unwrap();
    assert!(log.contains("probe: result ok"), "{log}");
}

/// `--cores from-cgroup` from the root cpuset (a plain host's shell) would take every core
/// (the v1 root is `cpu_exclusive`): refused with exit 2, saying why.
#[test]
fn from_cgroup_in_the_root_cpuset_is_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let name = "from_cgroup_in_the_root_cpuset_is_refused";
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let Some(dir) = partition::host::pod::cgroup_dir(
        "cpuset",
        &read("/proc/self/cgroup"),
        &read("/proc/self/mountinfo"),
    ) else {
        skip(
            name,
            "this process is in no cgroup with the cpuset controller",
        );
        return;
    };
    if !partition::host::pod::is_root_cgroup(&dir) {
        skip(
            name,
            &format!("this process is in cpuset {} (not the root)", dir.display()),
        );
        return;
    }
    let out = run(
        &[
            "launch",
            "--cores",
            "from-cgroup",
            "--memory",
            "16M",
            "--probe",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("root cpuset"), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "the guest ran: {}", out.stdout);
}
