//! kill -9 at every point of a partition's life, the launcher's, the keeper's and a
//! release's: nothing stays held, and the next owner of the memory sees only zeros.
//!
//! Before the keeper exists a dead launcher leaves its claim, which `release` (or the next
//! `status` as root) gives back. Once the guest runs, the keeper gives everything back when
//! the launcher dies. When the keeper itself dies (killed from outside while the guest
//! runs, or on purpose as it answers `running` or before it scrubs), its launcher notices,
//! stops the guest and exits with the reason, and the next `status` as root scrubs and
//! frees what the partition held (issue 52, E: it was held until `partition release`).

mod common;

use std::time::Duration;

use common::host::*;
use common::*;

/// The ledger as reserved (no partition): `want`'s partitions gone, the rest equal.
fn assert_back_to(h: &Host, reserved_ledger: &serde_json::Value, what: &str) {
    let mut now = h.ledger_json();
    let mut want = reserved_ledger.clone();
    now["partitions"] = serde_json::json!([]);
    want["partitions"] = serde_json::json!([]);
    assert_eq!(h.ledger_json(), want, "ledger after {what}");
    assert_eq!(now, want);
}

/// `name` is dead (its lock free): `release` reclaims it.
fn assert_dead_then_release(h: &Host, name: &str, reserved_ledger: &serde_json::Value) {
    let l = h.ledger_json();
    assert!(
        l["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == name),
        "{name} not in the ledger: {l}"
    );
    let out = h.run(&["release", name]);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(out.stderr.contains("was dead; reclaimed"), "{}", out.stderr);
    assert_back_to(h, reserved_ledger, &format!("releasing {name}"));
}

/// `name` is dead: the next `status` (as root) gives it back and says so.
fn assert_dead_then_status_reclaims(h: &Host, name: &str, reserved_ledger: &serde_json::Value) {
    let s = h.status();
    let r = s["reclaimed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} not reclaimed by status: {s}"));
    assert_eq!(r["cores"], serde_json::json!([1]), "{r}");
    assert_eq!(s["partitions"], serde_json::json!([]), "{s}");
    assert_eq!(s["pool"]["free_bytes"], s["pool"]["size"], "{s}");
    assert_back_to(h, reserved_ledger, &format!("status reclaimed {name}"));
    // Said once: the next status has nothing to give back.
    assert_eq!(h.status()["reclaimed"], serde_json::json!([]));
}

/// The launcher died without stopping its guest: its keeper scrubbed the extent and gave it
/// and the cores back, and said so.
fn assert_kept(h: &Host, name: &str, stderr: &str, reserved_ledger: &serde_json::Value) {
    assert!(
        stderr.contains(&format!(
            "{name}: its launcher ended without stopping the guest cleanly"
        )) && stderr.contains("the keeper scrubbed"),
        "{stderr}"
    );
    let s = h.status();
    assert_eq!(s["partitions"], serde_json::json!([]), "{s}");
    assert_eq!(s["reclaimed"], serde_json::json!([]), "{s}");
    assert_back_to(h, reserved_ledger, &format!("{name}'s keeper"));
}

/// The keeper died: its launcher stopped the guest and said why, exiting 1.
fn assert_launcher_saw_its_keeper_die(out: &Output, what: &str) {
    assert_eq!(out.code(), 1, "{what}: {}", out.stderr);
    assert!(
        out.stderr.contains("the partition's keeper"),
        "{what}: {}",
        out.stderr
    );
}

/// The memory of pool extent `64M@0` is all zero for its next owner.
fn assert_next_owner_sees_zeros(h: &Host, name: &str) {
    assert!(probe_zero(&zerocheck_launch(h, name, "probe.memtest=0")));
}

#[test]
fn kill_9_at_each_point_is_recoverable() {
    let Some(h) = Host::new("crash") else { return };
    h.reserve("256M");
    let reserved = h.ledger_json();
    let hold = |name: &str, crash: &str| {
        h.run_env(
            &[
                "launch",
                "--name",
                name,
                "--cores",
                "1",
                "--memory",
                "64M",
                "--probe",
                "--cmdline",
                "probe.hold=1",
            ],
            &[("PARTITION_TEST_CRASH_AT", crash)],
        )
    };
    // Before the keeper exists, a dead launcher leaves its claim: `release` gives it back,
    // and so does the next `status` as root.
    for (point, by_status) in [("after-ledger", false), ("after-map", true)] {
        let out = hold(point, point);
        assert_eq!(
            out.code(),
            -1,
            "{point}: expected death by SIGKILL: {}",
            out.stderr
        );
        assert!(out.stderr.contains(point), "{}", out.stderr);
        if by_status {
            assert_dead_then_status_reclaims(&h, point, &reserved);
        } else {
            assert_dead_then_release(&h, point, &reserved);
        }
    }
    // Once the guest runs, the keeper gives everything back when the launcher dies:
    // killed at the running point, or by kill -9 from outside after the guest dirtied its
    // memory (the next owner's zero check below proves the scrub).
    let out = hold("running", "running");
    assert_eq!(out.code(), -1, "expected death by SIGKILL: {}", out.stderr);
    assert_kept(&h, "running", &out.stderr, &reserved);
    let c = h.hold("victim", "64M@0", "probe.memtest=1");
    // SAFETY: killing our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
    let out = wait_output(c, LIMIT, "victim");
    assert_kept(&h, "victim", &out.stderr, &reserved);
    // Launcher and keeper both killed: the claim stays for `release`.
    kill_launcher_and_keeper(h.hold("both", "64M@0", "probe.memtest=1"));
    assert_dead_then_release(&h, "both", &reserved);
    // Killed again during release: the record says `releasing`, and a second release
    // finishes the job.
    kill_launcher_and_keeper(h.hold("twice", "64M@0", "probe.memtest=1"));
    let out = h.run_env(
        &["release", "twice"],
        &[("PARTITION_TEST_CRASH_AT", "during-release")],
    );
    assert_eq!(out.code(), -1, "{}", out.stderr);
    assert_eq!(h.ledger_json()["partitions"][0]["state"], "releasing");
    assert_dead_then_release(&h, "twice", &reserved);
    // And the extent those dead guests dirtied is clean for the next owner.
    assert_next_owner_sees_zeros(&h, "after");
}

#[test]
fn a_killed_keeper_leaves_nothing_held() {
    let Some(h) = Host::new("keeper") else { return };
    h.reserve("256M");
    let reserved = h.ledger_json();
    // The keeper dies as it records the guest running, before it answers: the launcher
    // never runs the guest.
    let out = h.run_env(
        &[
            "launch", "--name", "k-run", "--cores", "1", "--memory", "64M@0", "--probe",
        ],
        &[("PARTITION_TEST_CRASH_AT", "keeper-running")],
    );
    assert_launcher_saw_its_keeper_die(&out, "keeper-running");
    assert!(out.stderr.contains("dying on purpose at keeper-running"));
    assert_dead_then_status_reclaims(&h, "k-run", &reserved);
    // Killed from outside while the guest runs, having written all its memory: the
    // launcher stops the guest within a second.
    let c = h.hold("k-kill", "64M@0", "probe.memtest=1");
    let keeper = keeper_of(c.id()).expect("a keeper beside the launcher");
    // SAFETY: killing our own child's child.
    unsafe { libc::kill(keeper as i32, libc::SIGKILL) };
    let out = wait_output(c, Duration::from_secs(30), "k-kill");
    assert_launcher_saw_its_keeper_die(&out, "keeper killed while running");
    assert_dead_then_status_reclaims(&h, "k-kill", &reserved);
    assert_next_owner_sees_zeros(&h, "after-kill");
    // Dead once the guest has stopped, before it scrubs: the guest wrote all its memory.
    let out = h.run_env(
        &[
            "launch",
            "--name",
            "k-scrub",
            "--cores",
            "1",
            "--memory",
            "64M@0",
            "--probe",
            "--cmdline",
            "probe.memtest=1",
        ],
        &[("PARTITION_TEST_CRASH_AT", "keeper-releasing")],
    );
    assert_launcher_saw_its_keeper_die(&out, "keeper-releasing");
    assert_dead_then_status_reclaims(&h, "k-scrub", &reserved);
    assert_next_owner_sees_zeros(&h, "after-scrub");
}
