//! The running VMM is confined (docs/security.md): every thread of a launch has a non-root
//! uid, no capabilities, no_new_privs and a seccomp filter while the guest runs; a thread
//! that makes a call outside its filter ends the VMM with status 5 and says which; bad
//! sandbox input is refused; `--no-sandbox` says loudly what it gives up. And a state
//! directory root cannot trust is refused before anything in it is touched.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A probe guest on core `core` that holds (with a disk, so a queue worker runs), started
/// with `extra` arguments; returns once it holds.
fn hold(dir: &Scratch, name: &str, extra: &[&str]) -> Child {
    let console = dir.path(&format!("{name}.console"));
    let disk = dir.file(&format!("{name}.img"), &vec![0u8; 1 << 20]);
    let core = (host_cores() - 1).to_string();
    let child = partition()
        .args([
            "launch", "--cores", &core, "--memory", "64M", "--probe", "--json",
        ])
        .args(["--cmdline", "probe.hold=1 probe.memtest=0", "--console"])
        .arg(&console)
        .arg("--disk")
        .arg(format!("path={}", disk.display()))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_holding(child, &console, name, LIMIT)
}

fn stop(child: Child, name: &str) -> Output {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    wait_output(child, LIMIT, name)
}

#[test]
fn every_thread_of_a_running_vmm_is_confined() {
    let name = "every_thread_of_a_running_vmm_is_confined";
    if !kvm_available(name) {
        return;
    }
    if !is_root() {
        skip(name, "dropping to another user needs root");
        return;
    }
    let dir = Scratch::new("sandbox-threads");
    let child = hold(&dir, "confined", &[]);
    // A second VMM beside it: each runs as an identity of its own (LAUNCH_ID_BASE + its
    // pid), so one taken over by its guest shares no uid with the other.
    let other = hold(&dir, "beside", &[]);
    let other_pid = other.id();
    let other_uid = partition::sys::sandbox::threads_of(other_pid)[0].uid[0];
    let threads = partition::sys::sandbox::threads_of(child.id());
    // Every thread's root is an empty, read-only tmpfs of the VMM's own mount namespace,
    // not the host's root (`/proc/PID/task/TID/root`).
    let roots: Vec<(String, usize, u64, bool)> =
        std::fs::read_dir(format!("/proc/{}/task", child.id()))
            .unwrap()
            .flatten()
            .map(|t| {
                let root = t.path().join("root");
                let entries = std::fs::read_dir(&root)
                    .map(|d| d.count())
                    .unwrap_or(usize::MAX);
                let dev = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(&root).unwrap());
                let ro = std::fs::write(root.join("x"), b"x").is_err();
                (
                    t.file_name().to_string_lossy().into_owned(),
                    entries,
                    dev,
                    ro,
                )
            })
            .collect();
    // The vCPU thread has its core to itself: every other thread of the VMM (its main
    // thread, the queue worker, ...) keeps off it where the host has another core.
    let core = host_cores() - 1;
    let affinity: Vec<(String, String)> = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .flatten()
        .map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            let allowed = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap_or("")
                .trim()
                .to_string();
            (comm.trim().to_string(), allowed)
        })
        .collect();
    for (comm, allowed) in &affinity {
        let cores = partition::config::cores::parse(allowed).unwrap_or_default();
        if comm.starts_with("vcpu") {
            assert_eq!(cores, vec![core], "{comm}: {affinity:?}");
        } else if host_cores() > 1 && !comm.starts_with("kvm") {
            // (KVM's own kernel workers for the VM are the kernel's to place.)
            assert!(
                !cores.contains(&core),
                "{comm} may run on the vCPU's core: {affinity:?}"
            );
        }
    }
    let host_root = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata("/").unwrap());
    let mount_ns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    let (vmm_ns, our_ns) = (mount_ns(child.id()), mount_ns(std::process::id()));
    let _ = stop(other, "beside");
    assert_ne!(vmm_ns, our_ns, "the VMM is in the host's mount namespace");
    assert!(roots.len() >= 3, "{roots:?}");
    for (tid, entries, dev, ro) in &roots {
        assert_eq!(*entries, 0, "thread {tid}'s root is not empty");
        assert_ne!(*dev, host_root, "thread {tid}'s root is the host's");
        assert!(ro, "thread {tid}'s root is writable");
    }
    assert_eq!(
        other_uid,
        partition::sys::sandbox::LAUNCH_ID_BASE + other_pid,
        "the second VMM's uid"
    );
    assert_eq!(
        threads[0].uid[0],
        partition::sys::sandbox::LAUNCH_ID_BASE + child.id()
    );
    assert_ne!(threads[0].uid[0], other_uid);
    let out = stop(child, "confined");
    assert_eq!(out.code(), 128 + libc::SIGTERM, "{}", out.stderr);
    let names: Vec<&str> = threads.iter().map(|t| t.name.as_str()).collect();
    assert!(
        names.contains(&"vcpu0") && names.contains(&"blk-q0") && names.contains(&"partition"),
        "{names:?}"
    );
    for t in &threads {
        assert!(t.uid.iter().all(|u| *u != 0), "{t:?}");
        assert_eq!(t.cap_eff, 0, "{t:?}");
        assert!(t.no_new_privs, "{t:?}");
        assert_eq!(t.seccomp, 2, "{t:?}");
    }
    // The report says who it ran as.
    let r = report(&out.stdout);
    assert_eq!(
        r["sandbox"]["user"].as_str(),
        Some(
            format!(
                "partition-{}",
                threads[0].uid[0] - partition::sys::sandbox::LAUNCH_ID_BASE
            )
            .as_str()
        ),
        "{r}"
    );
    assert_eq!(r["sandbox"]["uid"], threads[0].uid[0], "{r}");
    assert!(
        out.stderr
            .contains("partition: sandbox: once set up the VMM runs as partition-"),
        "{}",
        out.stderr
    );
}

#[test]
fn no_sandbox_says_what_it_gives_up() {
    let name = "no_sandbox_says_what_it_gives_up";
    if !kvm_available(name) {
        return;
    }
    if !is_root() {
        skip(name, "needs root to compare");
        return;
    }
    let dir = Scratch::new("sandbox-off");
    let child = hold(&dir, "open", &["--no-sandbox"]);
    let threads = partition::sys::sandbox::threads_of(child.id());
    let out = stop(child, "open");
    assert!(
        out.stderr.contains("WARNING: --no-sandbox"),
        "{}",
        out.stderr
    );
    assert!(
        threads.iter().all(|t| t.seccomp == 0 && t.uid[0] == 0),
        "{threads:?}"
    );
    assert_eq!(report(&out.stdout)["sandbox"], serde_json::Value::Null);
}

#[test]
fn a_forbidden_system_call_ends_the_vmm_with_status_5() {
    let name = "a_forbidden_system_call_ends_the_vmm_with_status_5";
    if !kvm_available(name) {
        return;
    }
    if !cfg!(debug_assertions) {
        skip(name, "the violation hook exists in debug builds only");
        return;
    }
    let dir = Scratch::new("sandbox-violation");
    let disk = dir.file("d.img", &vec![0u8; 1 << 20]);
    let core = (host_cores() - 1).to_string();
    // Each kind of thread, right after it installed its filter, calls execve (59).
    for role in ["vcpu", "blk-worker", "main"] {
        let child = partition()
            .args(["launch", "--cores", &core, "--memory", "64M", "--probe"])
            .args(["--cmdline", "probe.memtest=0 probe.hold=1"])
            .arg("--disk")
            .arg(format!("path={}", disk.display()))
            .env(partition::sys::seccomp::TEST_VIOLATION_ENV, role)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_output(child, LIMIT, role);
        assert_eq!(out.code(), 5, "{role}: {}", out.stderr);
        assert!(
            out.stderr.contains(&format!(
                "partition: seccomp: a {role} thread made system call 59, which its filter does not allow"
            )),
            "{role}: {}",
            out.stderr
        );
    }
}

#[test]
fn bad_sandbox_arguments_exit_2() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["--uid", "no-such-user-here"],
            "--uid \"no-such-user-here\": no such user",
        ),
        (&["--uid", "0"], "does not run as root"),
        (&["--uid", "root"], "does not run as root"),
        (
            &["--uid", "65534", "--gid", "no-such-group-here"],
            "no such group",
        ),
        (&["--uid", "65534", "--no-sandbox"], "cannot be used with"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["launch", "--cores", "0", "--memory", "64M", "--probe"];
        args.extend_from_slice(extra);
        let out = run(&args, LIMIT);
        assert_eq!(out.code(), 2, "{extra:?}: {}", out.stderr);
        assert!(out.stderr.contains(want), "{extra:?}: {}", out.stderr);
    }
}

/// Each verb, on state directory `state`, exits 2 saying `why`.
fn refused(verbs: &[&[&str]], state: &str, why: &str) {
    for v in verbs {
        let mut args = v.to_vec();
        args.extend_from_slice(&["--state-dir", state]);
        let out = run(&args, LIMIT);
        assert_eq!(out.code(), 2, "{v:?}: {}", out.stderr);
        assert!(out.stderr.contains(why), "{v:?}: {}", out.stderr);
    }
}

/// Bytes and mode of each of `paths`.
fn snapshot(paths: &[&std::path::Path]) -> Vec<(Vec<u8>, u32)> {
    paths
        .iter()
        .map(|p| {
            let m = std::fs::symlink_metadata(p).unwrap();
            (std::fs::read(p).unwrap_or_default(), m.permissions().mode())
        })
        .collect()
}

#[test]
fn a_state_directory_root_cannot_trust_is_refused_and_nothing_outside_it_changes() {
    let name = "a_state_directory_root_cannot_trust_is_refused";
    if !is_root() {
        skip(name, "the attack is on root");
        return;
    }
    let dir = Scratch::new("untrusted-state");
    // What a hostile local user would aim at: root-only files, and an unrelated process.
    let secret = dir.file("secret", b"root only\n");
    let target = dir.file("target", b"do not overwrite\n");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut bystander = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let start = partition::host::ledger::pid_start_time(bystander.id()).unwrap();
    // A forged ledger naming them, in a directory owned by nobody, with the temporary file
    // a symlink to the target.
    let evil = dir.path("evil");
    std::fs::create_dir(&evil).unwrap();
    let forged = serde_json::json!({
        "version": 1, "reserved_at": 0,
        "plan": {"memory": 4096, "page_size": 4096, "node": null, "cores": [1]},
        "pool": {"file": secret, "size": 4096, "page_size": 4096,
                 "hugepage_dir": "/sys/kernel/mm/hugepages/hugepages-2048kB",
                 "hugepages_added": 0, "mount": dir.path(""), "mounted_by_us": false},
        "cores": {"reserved": [1], "housekeeping": [0], "isolation": {"kind": "none", "reason": "x"}},
        "irqs": [{"file": target, "old": "pwned"}],
        "partitions": [{"name": "x", "pid": bystander.id(), "pid_start": start, "cores": [1],
                        "extent": {"offset": 0, "len": 4096}, "idle": "hlt", "state": "running",
                        "started_at": 0, "kernel": "k"}],
    });
    std::fs::write(evil.join("ledger.json"), forged.to_string()).unwrap();
    std::os::unix::fs::symlink(&target, evil.join("ledger.json.tmp")).unwrap();
    let c = std::ffi::CString::new(evil.to_str().unwrap()).unwrap();
    // SAFETY: chown of a directory this test made, to nobody.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
    let before = snapshot(&[&secret, &target]);
    let state = evil.to_str().unwrap();
    let verbs: [&[&str]; 5] = [
        &["release", "x"],
        &["status"],
        &["unreserve"],
        &["reserve", "--memory", "4M", "--cores", "1"],
        &[
            "launch", "--name", "x", "--cores", "1", "--memory", "16M", "--probe",
        ],
    ];
    refused(&verbs, state, "belongs to uid 65534, not root");
    assert_eq!(
        snapshot(&[&secret, &target]),
        before,
        "a file outside changed"
    );
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "the bystander was signalled"
    );
    // Root's own directory, but writable by others: refused too.
    // SAFETY: chown back to root.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 0, 0) }, 0);
    std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = run(&["status", "--state-dir", state], LIMIT);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("lets group or others write"),
        "{}",
        out.stderr
    );
    // Root's and private, with the ledger's own mode tightened: the forged ledger itself is
    // refused for what it names (its page size, its pool file), the symlink is never
    // followed, and the bystander lives on.
    std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        evil.join("ledger.json"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let fc = std::ffi::CString::new(evil.join("ledger.json").to_str().unwrap()).unwrap();
    // SAFETY: chown of a file this test made, to root.
    assert_eq!(unsafe { libc::chown(fc.as_ptr(), 0, 0) }, 0);
    refused(
        &[&["release", "x"], &["unreserve"]],
        state,
        "is not a ledger this version understands",
    );
    assert_eq!(
        snapshot(&[&secret, &target]),
        before,
        "a file outside changed"
    );
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "the bystander was signalled"
    );
    let _ = bystander.kill();
    let _ = bystander.wait();

    // `--state-dir LINK/a/b`, LINK a symlink (planted by someone) to a root-only directory:
    // refused at the link, and nothing made behind it (a/b were made there as root before
    // the path was checked).
    let private = dir.path("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = dir.path("link");
    std::os::unix::fs::symlink(&private, &link).unwrap();
    let through = link.join("a/b");
    refused(
        &[
            &["status"],
            &["unreserve"],
            &["release", "x"],
            &["reserve", "--memory", "4M", "--cores", "1"],
        ],
        through.to_str().unwrap(),
        "is a symlink",
    );
    assert_eq!(
        std::fs::read_dir(&private).unwrap().count(),
        0,
        "something was made behind the link"
    );
    // Readers and a launch on a state directory nobody made create none (status used to
    // leave it, with a ledger.lock in it).
    let fresh = dir.path("never-made/state");
    let out = run(
        &["status", "--json", "--state-dir", fresh.to_str().unwrap()],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let out = run(
        &["unreserve", "--state-dir", fresh.to_str().unwrap()],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let out = run(
        &[
            "launch",
            "--name",
            "x",
            "--cores",
            "1",
            "--memory",
            "16M",
            "--probe",
            "--state-dir",
            fresh.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        !dir.path("never-made").exists(),
        "a reader or a failed launch made the state directory"
    );
}
