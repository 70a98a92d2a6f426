//! The tests' own rules, tested: what a test allows itself on one platform and refuses on
//! another (the doubled-interrupt allowance), and how `scripts/rig-suite.sh` judges what a
//! test binary printed inside the rig (a failure or a skip that no rerun removes, a death
//! that may be rerun, a silent hang that fails). Each from made-up inputs: no guest, no
//! rig.

mod common;

use common::*;

/// The doubled-interrupt allowance holds under QEMU TCG only: on a made-up KVM guest's
/// CPU or bare metal, a doubled count fails the test.
#[test]
fn a_doubled_interrupt_is_refused_anywhere_but_under_tcg() {
    let sig = |hypervisor, vendor: &[u8; 12]| CpuSignature {
        hypervisor,
        vendor: *vendor,
    };
    let tcg = sig(true, b"TCGTCGTCGTCG");
    let kvm = sig(true, b"KVMKVMKVM\0\0\0");
    let bare = sig(false, &[0; 12]);
    // TCG's signature without the hypervisor bit is not TCG.
    let forged = sig(false, b"TCGTCGTCGTCG");
    for s in [&tcg, &kvm, &bare, &forged] {
        assert_eq!(allow_doubled(s, "edu", 0, "ctx"), Ok(None), "{s:?}");
    }
    let note = allow_doubled(&tcg, "edu", 2, "took 5, raised 3").unwrap();
    assert!(
        note.as_deref()
            .is_some_and(|n| n.starts_with("NOTE edu: QEMU TCG delivered 2")),
        "{note:?}"
    );
    for s in [&kvm, &bare, &forged] {
        let e = allow_doubled(s, "edu", 1, "took 4, raised 3").unwrap_err();
        assert!(
            e.contains("1 interrupt(s) taken more often than raised: took 4, raised 3"),
            "{e}"
        );
    }
}

/// The checkout's top directory.
fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

/// Runs scripts/rig-judge.sh's `FUNC ARGS...` and returns its output's lines.
fn judge(func: &str, args: &[&str]) -> Vec<String> {
    let root = repo_root();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -euo pipefail; . '{}'; \"$@\"",
            root.join("scripts/rig-judge.sh").display()
        ))
        .arg("judge")
        .arg(func)
        .args(args)
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{func} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

/// A made-up run log: `ended` binaries with their status, then `partial` lines of the
/// binary the machine was running when it stopped.
fn run_log(dir: &Scratch, ended: &[(&str, u32)], partial: Option<(&str, &[&str])>) -> String {
    let mut s = String::from("RIG-READY kernel=6.12 cpus=2\n");
    for (b, rc) in ended {
        s += &format!(
            "RIG-TEST-BEGIN {b}\nrunning 2 tests\ntest a ... ok\ntest b ... ok\nRIG-TEST-END {b} rc={rc}\n"
        );
    }
    if let Some((b, lines)) = partial {
        s += &format!("RIG-TEST-BEGIN {b}\nrunning 5 tests\n");
        for l in lines {
            s += l;
            s.push('\n');
        }
    }
    dir.file("run.out", s.as_bytes()).display().to_string()
}

/// A made-up dead machine's kept console, ending with `tail`.
fn kept(dir: &Scratch, tail: &str) -> String {
    dir.file(
        "died.log",
        format!("[    0.000000] Linux version 6.12\nrig-alive 10.0\nrig-alive 20.0\n{tail}")
            .as_bytes(),
    )
    .display()
    .to_string()
}

/// A test that printed FAILED (or panicked) before the outer machine died is a failure:
/// the binary is not run again, so no rerun can pass it. One whose tests had all passed
/// so far may run again, and one not begun runs again.
#[test]
fn a_failure_before_the_machine_died_fails_the_suite() {
    let dir = Scratch::new("rules-judge-failed");
    let log = run_log(
        &dir,
        &[("idle", 0)],
        Some((
            "pool",
            &[
                "test pool::a ... ok",
                "thread 'pool::b' (812) panicked at tools/partition-cli/tests/pool.rs:90:5:",
                "test pool::b ... FAILED",
            ],
        )),
    );
    let died = kept(
        &dir,
        "---- QEMU's last CPU resets (-d cpu_reset)\nCPU Reset (CPU 1)\n",
    );
    let v = judge("rig_judge", &[&log, "125", &died, "idle", "pool", "vfio"]);
    assert_eq!(v[0], "idle ok");
    assert!(
        v[1].starts_with("pool failed: before the outer machine stopped: thread 'pool::b'"),
        "{v:?}"
    );
    assert_eq!(v[2], "vfio rerun: not begun when the outer machine stopped");
    // Without the failure, the same death reruns pool.
    let log = run_log(
        &dir,
        &[("idle", 0)],
        Some(("pool", &["test pool::a ... ok"])),
    );
    let v = judge("rig_judge", &[&log, "125", &died, "idle", "pool"]);
    assert!(
        v[1].starts_with("pool rerun: the outer machine died under QEMU TCG"),
        "{v:?}"
    );
    // A binary that ended keeps its failure, death or not.
    let log = run_log(&dir, &[("idle", 101)], None);
    let v = judge("rig_judge", &[&log, "125", &died, "idle"]);
    assert_eq!(v, ["idle failed rc=101"]);
}

/// A SKIPPED printed before the machine died is reported (and so fails the suite unless
/// allowed) even though the binary may run again; a later pass does not replace a failure.
#[test]
fn a_skip_or_a_failure_sticks_across_reruns() {
    let dir = Scratch::new("rules-judge-skip");
    let log = run_log(
        &dir,
        &[],
        Some((
            "vfio",
            &[
                "SKIPPED vfio::edu: no IOMMU groups",
                "test vfio::edu ... ok",
            ],
        )),
    );
    let died = kept(&dir, "");
    let v = judge("rig_judge", &[&log, "125", &died, "vfio"]);
    assert_eq!(v[0], "vfio skipped: SKIPPED vfio::edu: no IOMMU groups");
    assert!(v[1].starts_with("vfio rerun: "), "{v:?}");
    for (old, new, kept) in [
        ("failed rc=101", "ok", "failed rc=101"),
        (
            "failed: before the outer machine stopped: x",
            "ok",
            "failed: before the outer machine stopped: x",
        ),
        (
            "did not end: rig.sh exit 124",
            "ok",
            "did not end: rig.sh exit 124",
        ),
        ("", "ok", "ok"),
        ("ok", "failed rc=1", "failed rc=1"),
    ] {
        assert_eq!(judge("rig_sticky", &[old, new]), [kept], "{old} then {new}");
    }
}

/// A machine that said nothing on the command's line while its heartbeat went on hung in a
/// test of ours: a failure, not the emulator's. Only a machine whose own clock stopped (no
/// heartbeat, or QEMU showing it not running) may run the binary again. A death whose oops
/// names one of our VMM's threads is ours too, unless it is the panic seen under QEMU's own
/// guests.
#[test]
fn a_silent_hang_fails_and_only_a_stopped_machine_reruns() {
    let dir = Scratch::new("rules-judge-hang");
    let log = run_log(
        &dir,
        &[],
        Some(("linux_kernel", &["test linux_kernel::a ... ok"])),
    );
    let stacks = "RIG-STACKS the command's line silent 960 s\n== pid 312 /tmp/t/linux_kernel-1a2b\n-- 312 linux_kernel state S wchan do_wait\nRIG-STACKS-END\n";
    let silent = kept(
        &dir,
        &format!(
            "{stacks}---- hung: nothing on the command's line for 1020 s\n---- QEMU's state when it was stopped (QMP)\nstatus: running\n"
        ),
    );
    let v = judge("rig_judge", &[&log, "125", &silent, "linux_kernel"]);
    assert!(
        v[0].starts_with("linux_kernel failed: hung: nothing on the command's line for 1020 s while the outer machine ran"),
        "{v:?}"
    );
    // The same silence with QEMU showing the machine stopped is the emulator's.
    let paused = kept(
        &dir,
        "---- hung: nothing on the command's line for 1020 s\n---- QEMU's state when it was stopped (QMP)\nstatus: internal-error\n",
    );
    let v = judge("rig_judge", &[&log, "125", &paused, "linux_kernel"]);
    assert!(
        v[0].starts_with("linux_kernel rerun: the outer machine stopped"),
        "{v:?}"
    );
    let clock = kept(
        &dir,
        "---- hung: no heartbeat for 120 s, a QMP poke did not help\n---- QEMU's state when it was stopped (QMP)\nstatus: running\n",
    );
    let v = judge("rig_judge", &[&log, "125", &clock, "linux_kernel"]);
    assert!(
        v[0].starts_with("linux_kernel rerun: the outer machine stopped: no heartbeat"),
        "{v:?}"
    );
    let oops = kept(
        &dir,
        "BUG: kernel NULL pointer dereference, address: 0000000000000008\nCPU: 1 UID: 0 PID: 400 Comm: vcpu0 Not tainted 6.12\n",
    );
    let v = judge("rig_judge", &[&log, "125", &oops, "linux_kernel"]);
    assert!(
        v[0].starts_with("linux_kernel failed: the outer machine died in one of our VMM's threads"),
        "{v:?}"
    );
    let emulator = kept(
        &dir,
        "Kernel panic - not syncing: corrupted stack end detected inside scheduler\nCPU: 1 UID: 0 PID: 400 Comm: vcpu0 Not tainted 6.12\n",
    );
    let v = judge("rig_judge", &[&log, "125", &emulator, "linux_kernel"]);
    assert!(
        v[0].starts_with("linux_kernel rerun: the outer kernel panicked: corrupted stack end"),
        "{v:?}"
    );
    // rig.sh's timeout is no death: what had not ended failed.
    let v = judge("rig_judge", &[&log, "124", "", "linux_kernel"]);
    assert_eq!(v, ["linux_kernel did not end: rig.sh exit 124"]);
}

/// The rig's silence limit is made from the tests' longest deadline, which every wait in
/// the rig holds to: it exceeds it, and a test there asking for more fails.
#[test]
fn the_rigs_silence_limit_exceeds_every_deadline() {
    let root = repo_root();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            ". '{}'; rig_silence",
            root.join("scripts/lib.sh").display()
        ))
        .output()
        .unwrap();
    let silence: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(silence > LONGEST_DEADLINE.as_secs(), "{silence}");
    let over = LONGEST_DEADLINE + std::time::Duration::from_secs(1);
    assert!(
        deadline_fits(over, "too long", true).is_err(),
        "a deadline past LONGEST_DEADLINE was taken in the rig"
    );
    assert!(deadline_fits(LONGEST_DEADLINE, "longest", true).is_ok());
    // The nested host has no silence limit: a stock kernel's 30-minute boot is allowed.
    assert!(deadline_fits(over, "nested boot", false).is_ok());
    // And a wait in the rig asking for more is refused before anything is waited for.
    if under_qemu_tcg() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let r = std::panic::catch_unwind(|| wait_output(child, over, "too long"));
        assert!(
            r.is_err(),
            "wait_output took a deadline past LONGEST_DEADLINE"
        );
    }
}
