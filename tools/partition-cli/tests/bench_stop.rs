//! A benchmark run stopped half-way leaves the host as it found it: `partition bench` runs
//! under a supervisor that, on SIGTERM to it or Ctrl-C to the whole process group, stops
//! what the run started, gives back its reservation (pool file, hugepages, mounts,
//! cgroups) and removes its scratch directory; nothing half-measured reaches the results.
//! The same holds when the run process itself is killed outright.

mod common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

/// Names under the cgroup roots and hugetlbfs mounts that carry `tag`.
fn tagged_leftovers(tag: &str) -> Vec<PathBuf> {
    let mut dirs = vec![
        PathBuf::from("/sys/fs/cgroup"),
        PathBuf::from("/sys/fs/cgroup/cpuset"),
    ];
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    dirs.extend(
        mounts
            .lines()
            .filter(|l| l.split_whitespace().nth(2) == Some("hugetlbfs"))
            .filter_map(|l| l.split_whitespace().nth(1).map(PathBuf::from)),
    );
    dirs.iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|r| r.flatten().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().contains(tag))
        })
        .collect()
}

/// If the test fails half-way: kills the run's process group and gives back what the
/// supervisor did not (so a failing test still leaves the host as it was).
struct Fallback {
    pgid: i32,
    state: PathBuf,
    hugepages: u64,
}

impl Drop for Fallback {
    fn drop(&mut self) {
        // SAFETY: signalling the process group the test started (gone already if passed).
        unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
        if let Ok(st) = partition::host::partitions::status(&self.state) {
            for p in &st.partitions {
                let _ = partition::host::partitions::release(&self.state, &p.name, Duration::ZERO);
            }
        }
        let _ = partition::host::reserve::unreserve(&self.state);
        benchmarks::HugepageCount::set(self.hugepages);
    }
}

/// Starts a memsetup run that will not finish by itself, waits until it holds a
/// reservation, stops it with `stop` (given the supervisor's pid) and checks the host.
fn stop_half_way(what: &str, stop: impl Fn(i32), expect_code: i32, expect_said: &str) {
    let scratch = Scratch::new(&format!("bench-stop-{what}"));
    let results = scratch.path("results.json");
    let before = host_state();
    let child = partition()
        .env("TMPDIR", &scratch.0)
        .args([
            "bench", "--only", "memsetup", "--sizes", "64M", "--runs", "1000",
        ])
        .arg("--results")
        .arg(&results)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let hugepages = benchmarks::HugepageCount::read();
    let deadline = Instant::now() + Duration::from_secs(120);
    // The supervisor's scratch directory: its pid, then a name nobody can guess.
    let prefix = format!("partition-bench-{pid}-");
    let work = loop {
        let found = std::fs::read_dir(&scratch.0)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with(&prefix));
        if let Some(e) = found {
            break e.path();
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the run never made its scratch directory"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let state = work.join("state");
    let tag = partition::host::ledger::state_tag(&state);
    let _fallback = Fallback {
        pgid: pid,
        state: state.clone(),
        hugepages,
    };
    while !state.join("ledger.json").exists() {
        assert!(
            Instant::now() < deadline,
            "{what}: the run never reserved its pool"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Give it a moment to have a partition running on the pool.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !tagged_leftovers(&tag).is_empty(),
        "{what}: a reservation with no pool file or cgroup named {tag}?"
    );
    stop(pid);
    let out = wait_output(child, Duration::from_secs(90), what);
    assert_eq!(out.code(), expect_code, "{what}: {}", out.stderr);
    assert!(out.stderr.contains(expect_said), "{what}: {}", out.stderr);
    assert!(!work.exists(), "{what}: scratch dir left: {}", out.stderr);
    assert_eq!(tagged_leftovers(&tag), Vec::<PathBuf>::new(), "{what}");
    let after = host_state();
    assert_eq!(
        after.hugepages_total, before.hugepages_total,
        "{what}: {}",
        out.stderr
    );
    assert_eq!(after.mounts, before.mounts, "{what}");
    assert_eq!(after.our_processes, before.our_processes, "{what}");
    // Nothing half-measured was stored.
    let stored = std::fs::read_to_string(&results).unwrap_or_default();
    assert!(!stored.contains("memsetup"), "{what}: {stored}");
}

#[test]
fn a_stopped_bench_run_gives_back_everything_it_held() {
    if !kvm_and_two_cores("a_stopped_bench_run_gives_back_everything_it_held") {
        return;
    }
    // SIGTERM to the supervisor alone (a service manager, `kill PID`).
    stop_half_way(
        "sigterm",
        // SAFETY: signalling the child we started.
        |pid| unsafe {
            libc::kill(pid, libc::SIGTERM);
        },
        128 + libc::SIGTERM,
        "stopped by SIGTERM; stopping the run",
    );
    // SIGINT to the whole process group, as Ctrl-C on a terminal sends it: the run, its
    // partitions and the supervisor all get it at once.
    stop_half_way(
        "ctrl-c",
        // SAFETY: signalling the process group the child leads.
        |pid| unsafe {
            libc::kill(-pid, libc::SIGINT);
        },
        128 + libc::SIGINT,
        "stopped by SIGINT; stopping the run",
    );
    // The run itself dies (SIGKILL, nothing of its own cleanup runs): the supervisor gives
    // back what it held all the same and passes the status on.
    stop_half_way(
        "run-killed",
        |pid| {
            let run = child_of(pid).expect("the supervisor has no run child");
            // SAFETY: signalling the run process the test's child started.
            unsafe { libc::kill(run, libc::SIGKILL) };
        },
        128 + libc::SIGKILL,
        "given back",
    );
}

/// A child process of `parent`, from /proc.
fn child_of(parent: i32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let st = partition::host::ledger::proc_stat(pid)?;
        (st.ppid == parent as u32).then_some(pid as i32)
    })
}
