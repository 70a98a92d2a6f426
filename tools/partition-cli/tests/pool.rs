//! Reserve once, launch many: the hugepage pool, the ledger, status, release, scrubbing,
//! crash recovery, and giving everything back.
//!
//! These tests change host settings (hugepages, a hugetlbfs mount, cpusets, IRQ affinities),
//! so they run one at a time (a lock), each in its own state directory, and a guard puts
//! every setting back on drop — after a failure too.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

use common::host::*;

/// Every descriptor of process `pid`: (number, what it points at).
fn vmm_fds(pid: u32) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse().ok()?;
            let t = std::fs::read_link(e.path()).ok()?;
            Some((n, t.to_string_lossy().into_owned()))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_one_gib_reservation_goes_back_exactly_as_it_came() {
    let Some(h) = Host::new("lifecycle") else {
        return;
    };
    let before = settings();
    h.reserve("1G");
    let during = settings();
    assert_ne!(
        during.nr_hugepages, before.nr_hugepages,
        "no hugepages were taken"
    );
    let s = h.status();
    assert_eq!(s["reserved"], true);
    assert_eq!(s["pool"]["size"], 1u64 << 30);
    assert_eq!(s["pool"]["free_bytes"], 1u64 << 30);
    assert_eq!(s["cores"]["reserved"], serde_json::json!([1]));
    assert_eq!(s["cores"]["free"], serde_json::json!([1]));
    // Where only cgroup v2 has the cpuset controller (the rig), the core is an isolated
    // cpuset partition, made by reserve and removed by unreserve.
    let iso = h.ledger_json()["cores"]["isolation"].clone();
    let v2 = (cpuset_root().is_none())
        .then(cgroup2_cpuset_root)
        .flatten()
        .map(|_| PathBuf::from(iso["path"].as_str().unwrap_or_default()));
    if let Some(path) = &v2 {
        assert_eq!(iso["kind"], "cgroup-v2", "{iso}");
        let state = std::fs::read_to_string(path.join("cpuset.cpus.partition")).unwrap();
        assert!(state.starts_with("isolated"), "{}: {state}", path.display());
        assert_eq!(
            std::fs::read_to_string(path.join("cpuset.cpus"))
                .unwrap()
                .trim(),
            "1"
        );
        println!(
            "NOTE a_one_gib_reservation_goes_back_exactly_as_it_came: cgroup v2 isolated \
             partition {}",
            path.display()
        );
    }

    // The same plan again changes nothing; the ledger is byte for byte the same.
    let ledger = h.ledger();
    let again = h.run(&["reserve", "--memory", "1G", "--cores", "1"]);
    assert_eq!(again.code(), 0, "{}", again.stderr);
    assert!(again.stderr.contains("nothing changed"), "{}", again.stderr);
    assert_eq!(h.ledger(), ledger);

    // A partition from the pool, seen by status while it runs.
    let child = h.hold("web", "256M", "probe.zerocheck=1");
    // Once running, the VMM holds no descriptor of the pool file (its extent stays mapped;
    // nothing through which another extent could be mapped) and no cgroup file.
    let pool_file = h.ledger_json()["pool"]["file"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!pool_file.is_empty(), "{}", h.ledger());
    let fds = vmm_fds(child.id());
    assert!(!fds.is_empty());
    for (fd, target) in &fds {
        assert!(
            !target.contains(pool_file.as_str())
                && !target.ends_with("/tasks")
                && !target.ends_with("/cgroup.procs"),
            "the running VMM holds fd {fd} -> {target}: {fds:?}"
        );
    }
    assert!(
        partition::sys::sandbox::threads_of(child.id())
            .iter()
            .any(|t| t.name == "vcpu0"),
        "the guest is not running"
    );
    println!(
        "NOTE a_one_gib_reservation_goes_back_exactly_as_it_came: the running VMM's {} fds: {:?}",
        fds.len(),
        fds.iter().map(|f| f.1.as_str()).collect::<Vec<_>>()
    );
    // Its launcher is confined, and so is its keeper (uid 0 kept for root's ledger, but
    // no capability, no_new_privs, its own filter).
    for t in partition::sys::sandbox::threads_of(child.id()) {
        assert!(
            t.uid[0] != 0 && t.cap_eff == 0 && t.no_new_privs && t.seccomp == 2,
            "{t:?}"
        );
    }
    let keeper = keeper_of(child.id()).expect("a keeper beside the launcher");
    let kt = partition::sys::sandbox::threads_of(keeper);
    assert!(!kt.is_empty());
    for t in kt {
        assert!(t.cap_eff == 0 && t.no_new_privs && t.seccomp == 2, "{t:?}");
    }
    let s = h.status();
    let p = &s["partitions"][0];
    assert_eq!(p["name"], "web");
    assert_eq!(p["alive"], true);
    assert_eq!(p["state"], "running");
    assert_eq!(p["cores"], serde_json::json!([1]));
    assert_eq!(p["extent"]["len"], 256u64 << 20);
    assert_eq!(s["pool"]["free_bytes"], 768u64 << 20);
    assert_eq!(s["cores"]["free"], serde_json::json!([]));
    // Exit counters arrive within a couple of seconds.
    let start = Instant::now();
    loop {
        let s = h.status();
        if let Some(n) = s["partitions"][0]["exits"]["vcpus"][0]["exits"]["io_out"].as_u64() {
            assert!(n > 0);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no exit counters: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let console = std::fs::read_to_string(h.dir.join("web.console")).unwrap();
    assert!(
        probe_zero(&console),
        "fresh pool memory was not zero:\n{console}"
    );

    let r = h.run(&["release", "web"]);
    assert_eq!(r.code(), 0, "{}", r.stderr);
    let out = wait_output(child, LIMIT, "web");
    assert_eq!(out.code(), 128 + libc::SIGTERM, "{}", out.stderr);
    assert!(out.stderr.contains("scrubbed"), "{}", out.stderr);
    assert_eq!(
        h.ledger(),
        ledger,
        "the ledger is not back to the reserved state"
    );

    let u = h.run(&["unreserve"]);
    assert_eq!(u.code(), 0, "{}", u.stderr);
    assert_eq!(settings(), before, "unreserve left the host changed");
    if let Some(path) = v2 {
        assert!(!path.exists(), "{} is still there", path.display());
    }
    let s = h.status();
    assert_eq!(s["reserved"], false);
}

#[test]
fn overlapping_cores_or_extents_are_refused_and_the_ledger_is_unchanged() {
    let Some(h) = Host::new("conflicts") else {
        return;
    };
    h.reserve("256M");
    // A second reservation of the same core from another state directory: refused with
    // exit 2 naming the first, nothing of the host touched (it used to succeed with
    // "isolation: none", its pool file inside the first one's mount).
    let other = h.dir.with_extension("other");
    let settings_before = settings();
    let out = h.run_env(
        &["reserve", "--memory", "64M", "--cores", "1"],
        &[("PARTITION_STATE_DIR", other.to_str().unwrap())],
    );
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("core 1 is reserved already")
            && out
                .stderr
                .contains(h.dir.file_name().unwrap().to_str().unwrap()),
        "{}",
        out.stderr
    );
    assert_eq!(settings(), settings_before);
    assert!(!other.join("ledger.json").exists());
    // An ad hoc launch from that other state directory (or any other) on the reserved core:
    // refused with exit 2 naming the reservation (it used to run beside the partitions).
    let out = h.run_env(
        &["launch", "--probe", "--cores", "1", "--memory", "16M"],
        &[("PARTITION_STATE_DIR", other.to_str().unwrap())],
    );
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("core 1 is reserved for partitions by the reservation in")
            && out.stderr.contains(h.dir.to_str().unwrap()),
        "{}",
        out.stderr
    );
    assert!(out.stdout.is_empty(), "the guest ran: {}", out.stdout);
    let _ = std::fs::remove_dir_all(&other);
    let mut a = h.hold("a", "64M@0", "probe.memtest=0");
    // `caps` reports on the reserved core with the idle policy the partition runs there.
    let caps = h.run(&["caps", "--json"]);
    assert_eq!(caps.code(), 0, "{}", caps.stderr);
    let caps: serde_json::Value = serde_json::from_str(&caps.stdout).unwrap();
    let idle = h.status()["partitions"][0]["idle"]
        .as_str()
        .unwrap()
        .to_string();
    let found = caps["host"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["setting"] == "idle-states")
        .cloned()
        .unwrap();
    assert_eq!(caps["host"]["cores"], serde_json::json!([1]), "{caps:#}");
    let v = found["value"].as_str().unwrap();
    assert!(
        v.starts_with("not available here")
            || v.contains(&format!("a partition runs there with --idle {idle}")),
        "{found:#}"
    );
    let ledger = h.ledger();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--name", "b", "--cores", "1", "--memory", "64M@32M"],
            "is (partly) in use",
        ),
        (
            &["--name", "b", "--cores", "1", "--memory", "64M@128M"],
            "core 1 belongs to partition \"a\"",
        ),
        (
            &["--name", "a", "--cores", "1", "--memory", "64M@128M"],
            "a partition named \"a\" exists",
        ),
        (
            &["--name", "b", "--cores", "0", "--memory", "64M@128M"],
            "core 0 is not reserved",
        ),
        (
            &["--name", "b", "--cores", "1", "--memory", "512M"],
            "cannot give this partition 512 MiB",
        ),
        (
            &["--name", "b", "--cores", "1", "--memory", "64M@240M"],
            "runs past the end",
        ),
        (
            &["--name", "b", "--cores", "1", "--memory", "9M@0x1000000"],
            "not a multiple of 2097152",
        ),
        (
            &["--name", "b", "--cores", "1", "--memory", "64M@0x100000"],
            "is not a multiple of 2097152",
        ),
        (
            &["--name", "../evil", "--cores", "1", "--memory", "64M"],
            "--name",
        ),
        (
            &["--cores", "1", "--memory", "64M"],
            "core 1 is reserved for partitions",
        ),
        (&["--cores", "0", "--memory", "64M@0"], "needs --name"),
    ];
    for (args, want) in cases {
        let mut v = vec!["launch", "--probe"];
        v.extend_from_slice(args);
        let out = h.run(&v);
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(want),
            "{args:?}: want {want:?} in {}",
            out.stderr
        );
        assert_eq!(h.ledger(), ledger, "{args:?} changed the ledger");
    }
    // A different plan cannot replace a reservation a partition runs on.
    let out = h.run(&["reserve", "--memory", "512M", "--cores", "1"]);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("partitions exist (a)"),
        "{}",
        out.stderr
    );
    let out = h.run(&["unreserve"]);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert_eq!(h.ledger(), ledger);
    assert_eq!(h.run(&["release", "a"]).code(), 0);
    let _ = a.wait();
    let out = h.run(&["release", "nosuch"]);
    assert_eq!(out.code(), 2);
    assert!(
        out.stderr.contains("no partition named \"nosuch\""),
        "{}",
        out.stderr
    );
}

/// Scribbles on pool extent `[0, len)` through the pool file, as a careless previous owner
/// would have left it.
fn dirty_pool(h: &Host, len: usize) {
    let file = h.ledger_json()["pool"]["file"]
        .as_str()
        .unwrap()
        .to_string();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: maps the first `len` bytes of the pool file, which nothing else uses now.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: 32 MiB is inside the `len`-byte mapping (len is 64 MiB).
    let at = unsafe { p.cast::<u8>().add(32 << 20) };
    // SAFETY: 4 KiB from `at` stays inside the mapping.
    unsafe { std::ptr::write_bytes(at, 0xa5, 4096) };
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(p, len) };
}

#[test]
fn a_reused_extent_sees_only_zeros() {
    let Some(h) = Host::new("scrub") else { return };
    h.reserve("256M");
    let launch = |name: &str| zerocheck_launch(&h, name, "");
    // First owner: fresh pages, then its memory test fills the extent with a pattern.
    let first = launch("first");
    assert!(probe_zero(&first), "{first}");
    assert!(
        parse_probe(&first).total.unwrap().0 > 60 << 20,
        "the memtest did not cover the extent"
    );
    // Second owner of the same extent sees none of it.
    let second = launch("second");
    assert!(
        probe_zero(&second),
        "the second owner saw the first one's data:\n{second}"
    );
    // The check itself can fail: dirt put straight into the pool file is seen.
    dirty_pool(&h, 64 << 20);
    let third = launch("third");
    assert!(
        !probe_zero(&third),
        "zerocheck missed planted data:\n{third}"
    );
    assert!(third.contains("first_nonzero=0x2000000"), "{third}");
    // And the launcher's scrub after that guest cleaned it again.
    let fourth = launch("fourth");
    assert!(probe_zero(&fourth), "{fourth}");
}

#[test]
fn a_failed_reserve_rolls_everything_back() {
    let Some(h) = Host::new("rollback") else {
        return;
    };
    let before = settings();
    // More hugepages than the machine has memory: the kernel must fall short.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    // More than the machine has memory: refused before a page is taken (exit 2).
    let too_much = format!("{}M", ((total_kb >> 10) + 2048) / 2 * 2);
    let out = h.run(&["reserve", "--memory", &too_much, "--cores", "1"]);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("more than this host can spare"),
        "{}",
        out.stderr
    );
    assert_eq!(settings(), before);
    // Nothing is left: not even the state directory it made (and its ledger.lock).
    assert!(
        !h.dir.exists(),
        "the refused reserve left {}",
        h.dir.display()
    );
    // A failure once everything is taken (hugepages, the pool file and its mount, the
    // cpusets, the IRQs): every step rolled back.
    let out = h.run_env(
        &["reserve", "--memory", "256M", "--cores", "1"],
        &[(partition::host::reserve::FAIL_ENV, "after-isolation")],
    );
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("failing on purpose"), "{}", out.stderr);
    assert_eq!(settings(), before);
    for f in ["ledger.json", "narrowing.json", "unfinished.json"] {
        assert!(!h.dir.join(f).exists(), "the failed reserve left {f}");
    }
    // Bad plans are refused before anything is touched.
    std::fs::create_dir_all(&h.dir).unwrap();
    let plan = h.dir.join("host.toml");
    std::fs::write(&plan, "memory = \"256M\"\ncore = \"1\"\n").unwrap();
    let bad_isolation = h.dir.join("isolation.toml");
    std::fs::write(
        &bad_isolation,
        "memory = \"256M\"\ncores = \"1\"\nisolation = \"shared\"\n",
    )
    .unwrap();
    for (args, want) in [
        (
            vec!["reserve", "--plan", bad_isolation.to_str().unwrap()],
            "unknown variant",
        ),
        (
            vec![
                "reserve",
                "--memory",
                "256M",
                "--cores",
                "1",
                "--isolation",
                "shared",
            ],
            "cpusets or none",
        ),
        (
            vec![
                "reserve",
                "--plan",
                plan.to_str().unwrap(),
                "--isolation",
                "none",
            ],
            "cannot be used with",
        ),
        (
            vec!["reserve", "--plan", plan.to_str().unwrap()],
            "unknown field",
        ),
        (
            vec![
                "reserve",
                "--memory",
                "256M",
                "--cores",
                "1",
                "--irqbalance",
                "off",
            ],
            "ban or ignore",
        ),
        (
            vec![
                "reserve",
                "--plan",
                plan.to_str().unwrap(),
                "--irqbalance",
                "ignore",
            ],
            "cannot be used with",
        ),
        (vec!["caps", "--cores", "9"], "does not exist"),
        (vec!["caps", "--cores", "1-"], "--cores 1-"),
        (
            vec!["reserve", "--memory", "256M", "--cores", "0-1"],
            "no core of its own",
        ),
        (
            vec!["reserve", "--memory", "3M", "--cores", "1"],
            "not a positive multiple",
        ),
        (
            vec![
                "reserve",
                "--memory",
                "256M",
                "--cores",
                "1",
                "--page-size",
                "4K",
            ],
            "only 2M and 1G",
        ),
        (
            vec!["reserve", "--memory", "256M", "--cores", "9"],
            "does not exist",
        ),
        (
            vec![
                "reserve", "--memory", "256M", "--cores", "1", "--node", "99",
            ],
            "NUMA node 99",
        ),
    ] {
        let out = h.run(&args);
        assert_ne!(out.code(), 0, "{args:?}");
        assert!(
            out.stderr.contains(want),
            "{args:?}: want {want:?} in {}",
            out.stderr
        );
        assert_eq!(settings(), before, "{args:?} changed the host");
    }
    // A good plan file works, and runs again without change.
    std::fs::write(
        &plan,
        "memory = \"256M\"\npage_size = \"2M\"\ncores = \"1\"\n",
    )
    .unwrap();
    let out = h.run(&["reserve", "--plan", plan.to_str().unwrap()]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let out = h.run(&["reserve", "--plan", plan.to_str().unwrap()]);
    assert!(out.stderr.contains("nothing changed"), "{}", out.stderr);
}

#[test]
fn a_reserve_stopped_half_way_changes_nothing() {
    let Some(h) = Host::new("reserve-stopped") else {
        return;
    };
    let before = settings();
    let hugepages = |s: &HostSettings| s.nr_hugepages.trim().parse::<u64>().unwrap();
    let child = partition()
        .args(["reserve", "--memory", "4G", "--cores", "1"])
        .env("PARTITION_STATE_DIR", &h.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first thing reserve does is ask for the hugepages: once the count moved, it is
    // half-way (2048 pages and a 4 GiB preallocation to go).
    let start = Instant::now();
    while hugepages(&settings()) == hugepages(&before) {
        assert!(start.elapsed() < LIMIT, "reserve never asked for hugepages");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = wait_output(child, LIMIT, "reserve");
    assert_eq!(out.code(), 128 + libc::SIGTERM, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("reserve stopped by SIGTERM; the new reservation was given back"),
        "{}",
        out.stderr
    );
    assert_eq!(
        settings(),
        before,
        "a stopped reserve left the host changed"
    );
    assert_eq!(h.status()["reserved"], false);
}

/// A host that already runs containers (Docker's `docker` cpuset spanning every core, with a
/// nested one, each with a task): reserve takes core 1 from all of them and unreserve gives
/// it back exactly; a cpuset holding nothing but core 1 is in the way (exit 2, named,
/// nothing changed) unless `--isolation none` accepts shared cores; a reserve killed after
/// narrowing leaves a record the next reserve widens from, so what it records is what the
/// cpusets were before.
#[test]
fn a_reservation_takes_its_cores_from_every_other_cpuset() {
    const TEST: &str = "pool::a_reservation_takes_its_cores_from_every_other_cpuset";
    // SAFETY: geteuid has no preconditions.
    if host_cores() < 2 || unsafe { libc::geteuid() } != 0 {
        skip(
            TEST,
            "reserving a core needs root and a second core for the host",
        );
        return;
    }
    let Some(h) = Host::new("foreign") else {
        return;
    };
    let all = partition::config::cores::format(&partition::config::cores::available());
    let Some(docker) = ForeignCpuset::new("partition-test-docker", &all, true) else {
        skip(TEST, "no cpuset hierarchy here");
        return;
    };
    let child = docker.child.clone().unwrap();
    assert!(docker.task_cpus().iter().all(|c| c.contains(&1)));
    let before = settings();
    h.reserve("64M");
    // No task of either foreign cpuset may run on the reserved core now.
    for c in docker.task_cpus() {
        assert!(
            !c.contains(&1) && !c.is_empty(),
            "a foreign task may run on {c:?}"
        );
    }
    let s = h.status();
    let iso = s["cores"]["isolation"].as_str().unwrap().to_string();
    assert!(iso.contains(&docker.dir.display().to_string()), "{iso}");
    let narrowed = h.ledger_json()["cores"]["isolation"]["narrowed"].clone();
    let paths: Vec<&str> = narrowed
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    if cpuset_root().is_some() {
        // cgroup v1: children before parents (a child's CPUs stay within its parent's).
        assert_eq!(
            paths,
            [child.to_str().unwrap(), docker.dir.to_str().unwrap()],
            "{narrowed}"
        );
    } else {
        assert!(paths.contains(&docker.dir.to_str().unwrap()), "{narrowed}");
    }
    let out = h.run(&["unreserve"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(ForeignCpuset::cpus(&docker.dir), all);
    assert_eq!(ForeignCpuset::cpus(&child), all);
    for c in docker.task_cpus() {
        assert!(
            c.contains(&1),
            "the foreign task did not get core 1 back: {c:?}"
        );
    }
    assert_eq!(settings(), before);

    // A cpuset with nothing but core 1 cannot be narrowed: refused, named, nothing taken.
    let pinned = ForeignCpuset::new("partition-test-pinned", "1", false).unwrap();
    let before = settings();
    let out = h.run(&["reserve", "--memory", "64M", "--cores", "1"]);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("{} is in the way", pinned.dir.display()))
            && out.stderr.contains("--isolation none"),
        "{}",
        out.stderr
    );
    assert_eq!(settings(), before);
    for f in ["ledger.json", "narrowing.json", "unfinished.json"] {
        assert!(!h.dir.join(f).exists(), "the refused reserve left {f}");
    }
    // Shared cores accepted: reserved, said so, no cpuset touched.
    let out = h.run(&[
        "reserve",
        "--memory",
        "64M",
        "--cores",
        "1",
        "--isolation",
        "none",
    ]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("isolation: none (--isolation none"),
        "{}",
        out.stderr
    );
    assert_eq!(ForeignCpuset::cpus(&pinned.dir), "1");
    assert_eq!(ForeignCpuset::cpus(&docker.dir), all);
    let iso = h.status()["cores"]["isolation"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(iso.starts_with("none (--isolation none"), "{iso}");
    let out = h.run(&["unreserve"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    drop(pinned);

    // Killed once the hugepages, the pool file, the cpusets and the IRQs are taken, before
    // its ledger records them: the next reserve widens the cpusets back and gives back
    // what the killed one took (written down before each step) first, so its ledger holds
    // what the host had before, and the unreserve after it leaves the host as it was.
    let before = settings();
    let kill = |h: &Host| {
        let out = h.run_env(
            &["reserve", "--memory", "64M", "--cores", "1"],
            &[(partition::host::reserve::FAIL_ENV, "kill-after-isolation")],
        );
        assert_eq!(out.code(), -1, "expected death by SIGKILL: {}", out.stderr);
        assert_ne!(ForeignCpuset::cpus(&docker.dir), all, "not narrowed");
        assert_ne!(
            settings().nr_hugepages,
            before.nr_hugepages,
            "no hugepages taken"
        );
        for f in ["narrowing.json", "unfinished.json"] {
            assert!(h.dir.join(f).exists(), "no {f}");
        }
        // status says so, and what gives it back.
        let s = h.status();
        assert_eq!(
            (&s["reserved"], &s["unfinished"]),
            (&false.into(), &true.into()),
            "{s}"
        );
        let out = h.run(&["status"]);
        assert!(
            out.stdout.contains("a reserve that did not finish")
                && out.stdout.contains("`partition unreserve` gives them back"),
            "{}",
            out.stdout
        );
    };
    kill(&h);
    h.reserve("64M");
    for f in ["narrowing.json", "unfinished.json"] {
        assert!(!h.dir.join(f).exists(), "{f} left after the recovery");
    }
    let pool = h.ledger_json()["pool"].clone();
    assert_eq!(pool["hugepages_added"], 32, "{pool}");
    let narrowed = h.ledger_json()["cores"]["isolation"]["narrowed"].clone();
    let n = narrowed.as_array().unwrap();
    assert!(
        !n.is_empty(),
        "nothing narrowed after the recovery: {narrowed}"
    );
    for n in n {
        assert_eq!(n["cpus"], all.as_str(), "{narrowed}");
    }
    let out = h.run(&["unreserve"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(ForeignCpuset::cpus(&docker.dir), all);
    assert_eq!(ForeignCpuset::cpus(&child), all);
    assert_eq!(settings(), before);
    // Killed again, and only unreserved: the same, with no reservation made after.
    kill(&h);
    let out = h.run(&["unreserve"]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(!h.dir.join("unfinished.json").exists());
    assert_eq!(settings(), before);
}
