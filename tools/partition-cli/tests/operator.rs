//! What an operator meets when things are not as they should be (issue 33, point 7 of its
//! audit): a local API that hangs or prints escape sequences, guest memory the host cannot
//! back, a relative state directory, a refused `reserve`, a lock file that is a directory,
//! a results file that is not one, a socket path taken by a file, the quit and pipe
//! signals, a console that is `/dev/null` or a terminal. Each is a clear answer with the
//! right exit status, in bounded time, leaving nothing behind.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

const PROBE_16M: [&str; 6] = ["launch", "--cores", "0", "--memory", "16M", "--probe"];

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A local "API" that answers each connection with `answer` one byte every `gap`.
fn fake_api(path: &Path, answer: &'static [u8], gap: Duration) {
    let l = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut c = c;
                let mut req = [0u8; 4096];
                let _ = c.read(&mut req);
                if gap.is_zero() {
                    let _ = c.write_all(answer);
                    return;
                }
                for b in answer.iter().cycle() {
                    if c.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(gap);
                }
            });
        }
    });
}

#[test]
fn status_of_an_api_that_hangs_or_speaks_escapes_is_bounded_and_shown_escaped() {
    let dir = Scratch::new("operator-api");
    // One byte every 2 s, for ever: `status` gives up within its deadline.
    let slow = dir.path("slow.sock");
    fake_api(&slow, b"HTTP/1.1 200 OK\r\n", Duration::from_secs(2));
    let t = Instant::now();
    let out = run(
        &["status", "--api-socket", slow.to_str().unwrap()],
        Duration::from_secs(30),
    );
    let took = t.elapsed();
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("no answer in time"), "{}", out.stderr);
    assert!(took < Duration::from_secs(15), "{took:?}");
    // Escape sequences and NULs in what it answers reach the terminal escaped.
    let loud = dir.path("loud.sock");
    fake_api(
        &loud,
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"name\":\"\\u001b[2J\\u001b]0;owned\\u0007x\\u0000\",\"pid\":1,\"cores\":[0],\"memory\":{\"bytes\":1,\"backing\":\"\\u009b31m\"},\"kernel\":\"k\",\"state\":\"running\",\"vcpus\":[{\"vcpu\":0,\"core\":0,\"exits\":{\"\\u001b[1mio\":3}}]}",
        Duration::ZERO,
    );
    let out = run(
        &["status", "--api-socket", loud.to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(
        !out.stdout.contains('\u{1b}')
            && !out.stdout.contains('\0')
            && !out.stdout.contains('\u{9b}'),
        "raw control characters printed: {:?}",
        out.stdout
    );
    assert!(out.stdout.contains("\\u{1b}[2J"), "{}", out.stdout);
    assert!(out.stdout.contains("\\u{1b}[1mio=3"), "{}", out.stdout);
}

/// `partition ARGS` refused (exit 2) with `want` in what it says, before a VM was built.
fn refused_unbuilt(args: &[&str], want: &str) {
    let out = run(args, LIMIT);
    assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr);
    assert!(
        out.stderr.contains(want) && !out.stderr.contains("booting"),
        "{args:?}: want {want:?} in {}",
        out.stderr
    );
}

/// `/proc/meminfo`'s value for `key`, in bytes.
fn meminfo(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap()
}

#[test]
fn guest_memory_the_host_cannot_back_is_refused_before_anything_is_built() {
    let name = "guest_memory_the_host_cannot_back_is_refused_before_anything_is_built";
    if !kvm_available(name) {
        return;
    }
    // Twice the host's memory.
    let total_mib = meminfo("MemTotal") / 1024;
    let big = format!("{}M", 2 * total_mib);
    refused_unbuilt(
        &["launch", "--cores", "0", "--memory", &big, "--probe"],
        "more than this host's",
    );
    // More hugepages than the kernel has free (none on a host that reserved nothing).
    let free = meminfo("HugePages_Free");
    let want = format!("{}M", (free + 8) * (meminfo("Hugepagesize") / 1024));
    let out = run(
        &[
            "launch",
            "--cores",
            "0",
            "--memory",
            &want,
            "--probe",
            "--hugepages",
        ],
        LIMIT,
    );
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("the kernel has"), "{}", out.stderr);
}

/// A memory cgroup of this test's own with `limit` bytes, v1 or v2, that a child can join:
/// its `cgroup.procs` path and the directory to remove. None where neither exists.
fn memory_cgroup(tag: &str, limit: u64) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let v1 = Path::new("/sys/fs/cgroup/memory");
    let (dir, file) = if v1.join("memory.limit_in_bytes").exists() {
        (v1.join(tag), "memory.limit_in_bytes")
    } else {
        let v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(Path::new)
            .find(|p| {
                std::fs::read_to_string(p.join("cgroup.subtree_control"))
                    .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"))
            })?;
        (v2.join(tag), "memory.max")
    };
    std::fs::create_dir(&dir).ok()?;
    if std::fs::write(dir.join(file), limit.to_string()).is_err() {
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    Some((dir.join("cgroup.procs"), dir))
}

#[test]
fn guest_memory_over_the_memory_cgroups_limit_is_refused() {
    let name = "guest_memory_over_the_memory_cgroups_limit_is_refused";
    if !kvm_available(name) {
        return;
    }
    if !is_root() {
        skip(name, "making a memory cgroup needs root");
        return;
    }
    let tag = format!("partition-test-{}", std::process::id());
    let Some((procs, dir)) = memory_cgroup(&tag, 64 << 20) else {
        skip(name, "no memory cgroup controller to make a cgroup with");
        return;
    };
    // The launcher starts inside it (a shell joins, then becomes partition).
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "echo $$ > {} && exec \"$0\" \"$@\"",
            procs.display()
        ))
        .arg(env!("CARGO_BIN_EXE_partition"))
        .args(["launch", "--cores", "0", "--memory", "128M", "--probe"]);
    let out = output_of(cmd, LIMIT, name);
    let _ = std::fs::remove_dir(&dir);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("memory cgroup") && out.stderr.contains(&tag),
        "{}",
        out.stderr
    );
}

#[test]
fn a_relative_state_directory_is_refused_and_nothing_is_made() {
    let dir = Scratch::new("operator-relative");
    for args in [
        &["status", "--state-dir", "rel/state"][..],
        &[
            "reserve",
            "--memory",
            "64M",
            "--cores",
            "1",
            "--state-dir",
            "rel/state",
        ],
    ] {
        let mut cmd = partition();
        cmd.current_dir(&dir.0).args(args);
        let out = output_of(cmd, LIMIT, args[0]);
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("is relative"), "{}", out.stderr);
        assert!(!dir.path("rel").exists(), "{args:?} made a directory");
    }
    // The environment variable is held to the same rule.
    let mut cmd = partition();
    cmd.current_dir(&dir.0)
        .env("PARTITION_STATE_DIR", "rel")
        .args(["status"]);
    let out = output_of(cmd, LIMIT, "status");
    assert_eq!(out.code(), 2, "{}", out.stderr);
}

#[test]
fn a_refused_reserve_leaves_nothing_and_bad_state_files_exit_2() {
    let name = "a_refused_reserve_leaves_nothing_and_bad_state_files_exit_2";
    if !is_root() {
        skip(name, "reserve needs root");
        return;
    }
    if host_cores() < 2 {
        skip(name, "needs a second core");
        return;
    }
    let dir = Scratch::new("operator-reserve");
    // A pool larger than the host's memory: refused (exit 2) after the ledger's lock was
    // taken in a new state directory, which goes again with everything made under it.
    let state = dir.path("new/a/b");
    let total_mib = meminfo("MemTotal") / 1024;
    let huge = format!("{}M", (total_mib + 1024) & !1);
    let hugepages_before = std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap();
    let out = run(
        &[
            "reserve",
            "--memory",
            &huge,
            "--cores",
            "1",
            "--state-dir",
            state.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("more than this host can spare"),
        "{}",
        out.stderr
    );
    assert!(
        !dir.path("new").exists(),
        "the refused reserve left its state directory"
    );
    assert_eq!(
        std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap(),
        hugepages_before
    );
    assert!(
        !Path::new("/run/partition-cores/core-1").exists() || {
            // Another reservation of the host's may hold it; ours must not.
            let holder = std::fs::read_to_string("/run/partition-cores/core-1").unwrap_or_default();
            !holder.contains(dir.0.to_str().unwrap())
        }
    );
    // A ledger.lock that is a directory: exit 2, not a VMM failure.
    let odd = dir.path("odd");
    std::fs::create_dir_all(odd.join("ledger.lock")).unwrap();
    for args in [
        vec!["status", "--state-dir", odd.to_str().unwrap()],
        vec!["unreserve", "--state-dir", odd.to_str().unwrap()],
    ] {
        let out = run(&args, LIMIT);
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("not a regular file"), "{}", out.stderr);
    }
}

#[test]
fn a_file_at_the_api_socket_is_refused_before_the_vm_is_built() {
    let name = "a_file_at_the_api_socket_is_refused_before_the_vm_is_built";
    if !kvm_available(name) {
        return;
    }
    let dir = Scratch::new("operator-socket");
    let f = dir.file("api.sock", b"not a socket");
    refused_unbuilt(
        &[&PROBE_16M[..], &["--api-socket", f.to_str().unwrap()]].concat(),
        "not a stale socket",
    );
    assert_eq!(std::fs::read(&f).unwrap(), b"not a socket");
}

#[test]
fn sigquit_and_sigpipe_stop_a_launch_cleanly() {
    let name = "sigquit_and_sigpipe_stop_a_launch_cleanly";
    if !kvm_available(name) {
        return;
    }
    let dir = Scratch::new("operator-signals");
    for sig in [libc::SIGQUIT, libc::SIGPIPE] {
        let console = dir.path(&format!("console-{sig}"));
        let child = partition()
            .args(PROBE_16M)
            .args(["--cmdline", "probe.hold=1 probe.memtest=0", "--console"])
            .arg(&console)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let child = wait_holding(child, &console, name, LIMIT);
        // SAFETY: signalling the launcher this test started.
        unsafe { libc::kill(child.id() as i32, sig) };
        let out = wait_output(child, LIMIT, name);
        assert_eq!(out.code(), 128 + sig, "{sig}: {}", out.stderr);
        assert!(
            out.stderr.contains("stopped by signal"),
            "{sig}: {}",
            out.stderr
        );
    }
}

#[test]
fn the_console_may_be_dev_null_or_a_terminal() {
    let name = "the_console_may_be_dev_null_or_a_terminal";
    if !kvm_available(name) {
        return;
    }
    let out = run(
        &[
            &PROBE_16M[..],
            &["--console", "/dev/null", "--cmdline", "probe.memtest=0"],
        ]
        .concat(),
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // A pseudo-terminal's other end: the guest's lines arrive there.
    // SAFETY: posix_openpt and its companions on a fresh master descriptor.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    assert!(master >= 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::grantpt(master) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::unlockpt(master) }, 0);
    let mut name_buf = [0 as libc::c_char; 128];
    // SAFETY: ptsname_r into a local buffer of its size.
    let named = unsafe { libc::ptsname_r(master, name_buf.as_mut_ptr(), name_buf.len()) };
    assert_eq!(named, 0);
    // SAFETY: ptsname_r wrote a NUL-terminated string.
    let pts = unsafe { std::ffi::CStr::from_ptr(name_buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: the master descriptor is ours alone from here.
    let mut m = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(master) };
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = m.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            // The whole result line: "probe: result ok status=0".
            let text = String::from_utf8_lossy(&seen);
            if text.contains("probe: result") && text.contains("status=") {
                break;
            }
        }
        String::from_utf8_lossy(&seen).into_owned()
    });
    let out = run(
        &[
            &PROBE_16M[..],
            &["--console", &pts, "--cmdline", "probe.memtest=0"],
        ]
        .concat(),
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let seen = reader.join().unwrap();
    assert!(seen.contains("probe: result ok"), "{seen}");
}

#[test]
fn a_results_file_that_is_not_one_is_refused_at_once() {
    let dir = Scratch::new("operator-results");
    let fifo = dir.path("fifo.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let big = dir.path("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(65 << 20)
        .unwrap();
    let bad = dir.file("bad.json", b"{ not json");
    let cases = [
        (fifo.clone(), "not a regular file"),
        ("/dev/zero".into(), "not a regular file"),
        (big.clone(), "larger than"),
        (dir.0.clone(), "not a regular file"),
        (dir.path("missing.json"), "No such file"),
        (bad.clone(), "key must be a string"),
    ];
    for (p, want) in cases {
        let out = run(
            &["bench", "--report", "--results", p.to_str().unwrap()],
            Duration::from_secs(30),
        );
        assert_eq!(out.code(), 2, "{}: {}", p.display(), out.stderr);
        assert!(out.stderr.contains(want), "{}: {}", p.display(), out.stderr);
    }
}

/// The VMM binary carries no benchmark code: the benchmarks crate and the embedded hotpaths
/// program are in `partition-bench` (which `partition bench` runs), and not in `partition`.
/// Read from the binaries' symbols (Rust's mangled names start with the crate's length and
/// name), which the test build keeps.
#[test]
fn the_vmm_binary_carries_no_benchmark_code() {
    // Searched as text (std's search, optimized even in a test build).
    let read = |p| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
    let vmm = read(env!("CARGO_BIN_EXE_partition"));
    let bench = read(env!("CARGO_BIN_EXE_partition-bench"));
    let has = |bin: &str, what: &str| bin.contains(what);
    for what in ["_ZN10benchmarks", "_ZN8hotpaths"] {
        assert!(
            has(&bench, what),
            "partition-bench lacks {what}: the check would prove nothing"
        );
        assert!(!has(&vmm, what), "the partition binary carries {what}");
    }
    // And `partition bench` reaches it.
    let out = partition().args(["bench", "--list"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("memsetup"));
}
