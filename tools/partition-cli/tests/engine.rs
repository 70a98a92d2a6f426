//! The submission engine end to end (issue 13): the probe guest enumerates PCI on our VMM,
//! finds the engine, its BARs and MSI-X vectors, submits through every doorbell mode with
//! both completions (polled fence, MSI-X), and feeds it hostile rings; the VMM stays up, the
//! launch report says how each BAR was served, and a mapped or ioeventfd doorbell never
//! reaches the VMM. Bad `--device` arguments and VFIO on this host are refused with exit 2.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(180);

fn launch(doorbell: &str, tests: &str, n: usize) -> Output {
    let device = format!("engine,doorbell={doorbell}");
    let cmdline = format!("probe.memtest=0 probe.engine={tests} probe.engine_n={n}");
    run(
        &[
            "launch",
            "--cores",
            "0",
            "--memory",
            "64M",
            "--probe",
            "--device",
            &device,
            "--cmdline",
            &cmdline,
            "--json",
        ],
        LIMIT,
    )
}

fn lines<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn the_guest_finds_the_engine_and_every_doorbell_mode_completes() {
    if !kvm_available("the_guest_finds_the_engine_and_every_doorbell_mode_completes") {
        return;
    }
    const N: usize = 200;
    for (doorbell, bar4) in [
        ("trap", "trap"),
        ("ioeventfd", "ioeventfd"),
        ("mapped", "memory"),
    ] {
        let o = launch(doorbell, "list,lat", N);
        let ctx = format!(
            "doorbell={doorbell}\n{}\n{}",
            tail(&o.stdout, 4000),
            tail(&o.stderr, 2000)
        );
        assert_eq!(o.code(), 0, "{ctx}");
        // Enumeration: the host bridge at 00.0 and the engine at 01.0, through ECAM.
        assert!(
            o.stdout
                .contains("probe: pci 00:00.0 vendor=0x1234 device=0x5e00 class=0x060000"),
            "{ctx}"
        );
        assert!(
            o.stdout
                .contains("probe: pci 00:01.0 vendor=0x1234 device=0x5e01 class=0x120000"),
            "{ctx}"
        );
        let bars = lines(&o.stdout, "probe: pci engine bar");
        assert_eq!(bars.len(), 3, "{ctx}");
        for b in bars {
            assert!(b.ends_with("size=0x1000 32-bit"), "{b}");
        }
        assert!(
            o.stdout
                .contains("probe: pci engine msix vectors=2 table=bar2+0x0 pba=bar2+0x800"),
            "{ctx}"
        );
        // Both completions measured, and the polled pass again with the doorbell write
        // timed (three passes), nothing lost.
        for (test, completion) in [
            ("submit", "poll"),
            ("submit", "irq"),
            ("submit-timed", "poll"),
            ("doorbell", "none"),
        ] {
            let want = format!("probe: engine test={test} completion={completion} n={N} ");
            assert!(o.stdout.contains(&want), "no {want:?}: {ctx}");
        }
        let warm = N / 10;
        let submitted = 3 * (N + warm);
        assert!(
            o.stdout.contains(&format!(
                "probe: engine submitted={submitted} head={submitted} status=0x1"
            )),
            "{ctx}"
        );
        // The report: BAR 4 served as asked, every command executed, one interrupt per
        // interrupting command, and the doorbells trapped only in trap mode.
        let r = report(&o.stdout);
        let e = &r["engine"];
        assert_eq!(e["doorbell"], doorbell, "{ctx}");
        assert_eq!(e["bars"][2]["index"], 4);
        assert_eq!(e["bars"][2]["served_by"], bar4, "{ctx}");
        assert_eq!(e["bars"][0]["served_by"], "trap");
        assert_eq!(e["executed"], submitted as u64, "{ctx}");
        assert_eq!(e["interrupts_sent"], (N + warm) as u64, "{ctx}");
        assert!(e["error"].is_null(), "{ctx}");
        // The thread's life and CPU time were recorded when it stopped.
        let (cpu, ran) = (
            e["thread_cpu_ms"].as_f64().unwrap(),
            e["thread_ran_ms"].as_f64().unwrap(),
        );
        assert!(ran > 0.0 && cpu >= 0.0, "{ctx}");
        let trapped = e["trapped_doorbells"].as_u64().unwrap();
        let mmio_writes = r["vcpus"][0]["exits"]["mmio_write"].as_u64().unwrap();
        if doorbell == "trap" {
            assert_eq!(trapped, submitted as u64, "{ctx}");
            assert!(mmio_writes >= submitted as u64, "{ctx}");
        } else {
            // No doorbell reached the VMM: the writes that exited were the setup's
            // (MSI-X table, registers), far fewer than the submissions.
            assert_eq!(trapped, 0, "{ctx}");
            assert!(mmio_writes < 100, "{mmio_writes} MMIO write exits: {ctx}");
        }
    }
}

#[test]
fn hostile_rings_stop_the_engine_not_the_vmm() {
    if !kvm_available("hostile_rings_stop_the_engine_not_the_vmm") {
        return;
    }
    for doorbell in ["trap", "mapped"] {
        let o = launch(doorbell, "hostile", 10);
        let ctx = format!(
            "doorbell={doorbell}\n{}\n{}",
            o.stdout,
            tail(&o.stderr, 2000)
        );
        assert_eq!(o.code(), 0, "{ctx}");
        let checks = lines(&o.stdout, "probe: engine hostile=");
        // Six refusals checked by the guest, then a reset and a good submission.
        assert_eq!(checks.len(), 7, "{ctx}");
        for c in &checks {
            assert!(
                c.ends_with("ok=true") || c.ends_with("completed=true"),
                "{c}\n{ctx}"
            );
        }
        for (name, code) in [
            ("ring_outside_memory", 1),
            ("ring_size_48", 2),
            ("fence_outside_memory", 5),
            ("unknown_opcode", 4),
            ("tail_past_ring", 3),
        ] {
            assert!(
                checks.iter().any(|c| c.starts_with(&format!(
                    "probe: engine hostile={name} status=0x3 error={code} "
                ))),
                "{name}: {ctx}"
            );
        }
        // The VMM ran on, and the engine ended running (the guest reset it last).
        let r = report(&o.stdout);
        assert_eq!(r["outcome"]["kind"], "power_off", "{ctx}");
        assert!(r["engine"]["error"].is_null(), "{ctx}");
    }
}

#[test]
fn bad_device_arguments_and_vfio_are_refused() {
    for (spec, words) in [
        ("engine,doorbell=carrier-pigeon", "doorbell"),
        ("gpu", "engine"),
        ("engine,doorbell=trap,doorbell=mapped", "doorbell"),
        ("vfio=0000:41:00.0", "VFIO"),
        ("vfio=not-a-bdf", "vfio"),
    ] {
        let o = run(
            &[
                "launch", "--cores", "0", "--memory", "64M", "--probe", "--device", spec,
            ],
            LIMIT,
        );
        assert_eq!(o.code(), 2, "{spec}: {}", o.stderr);
        assert!(
            o.stderr.to_lowercase().contains(&words.to_lowercase()),
            "{spec}: {}",
            o.stderr
        );
        assert!(!o.stdout.contains("probe: hello"), "{spec}: the guest ran");
    }
}

/// The same probe on QEMU's microvm with PCIe finds QEMU's `edu` and `pci-testdev` (the
/// submit section's peers) through ECAM, assigns their BARs, and drives both: edu's
/// factorial polled and by MSI, pci-testdev's trapping doorbell counted by QEMU and its
/// ioeventfd doorbell counted by nobody.
#[test]
fn the_probe_drives_qemus_edu_and_pci_testdev() {
    if !kvm_available("the_probe_drives_qemus_edu_and_pci_testdev") {
        return;
    }
    let dir = Scratch::new("engine-qemu");
    let Some((qemu, probe)) = qemu_and_probe("the_probe_drives_qemus_edu_and_pci_testdev", &dir)
    else {
        return;
    };
    let child = qemu_probe(
        &qemu,
        "microvm,pcie=on",
        1,
        &probe,
        "probe.memtest=0 probe.engine=list,edu,testdev probe.ecam=0xe0000000 probe.engine_n=50",
    )
    .args(["-device", "edu", "-device", "pci-testdev"])
    .spawn()
    .expect("spawning qemu");
    let out = wait_output(child, LIMIT, "qemu");
    let ctx = format!("{}\n{}", out.stderr, out.stdout);
    // isa-debug-exit: (0 << 1) | 1 when the probe reported success.
    assert_eq!(out.code(), 1, "{ctx}");
    for want in [
        "probe: pci 00:01.0 vendor=0x1234 device=0x11e8",
        "probe: pci 00:02.0 vendor=0x1b36 device=0x0005",
        "probe: engine none: no submission engine (1234:5e01) on bus 0",
        "probe: engine test=edu completion=poll n=50 ",
        "probe: engine test=edu completion=irq n=50 ",
        "probe: engine test=testdev completion=no-eventfd n=50 ",
        "probe: engine test=testdev completion=wildcard-eventfd n=50 ",
        "probe: peer testdev test=no-eventfd counted=55",
        "probe: peer testdev test=wildcard-eventfd counted=0",
    ] {
        assert!(out.stdout.contains(want), "no {want:?}: {ctx}");
    }
}
