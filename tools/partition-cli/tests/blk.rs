//! virtio-blk end to end: the probe guest reads a 64 MiB image of known content through
//! every doorbell and backend mode and gets the checksum the host computes; its writes land
//! in the host file; a read-only disk refuses them; bad `--disk` arguments are refused.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);
const SIZE: usize = 64 << 20;
const SEED: u64 = 0x1357_9bdf_0246_8ace;

/// The image: word at byte offset `o` is the memtest pattern of `o` under SEED.
fn image(path: &Path) {
    let mut b = Vec::with_capacity(SIZE);
    for o in (0..SIZE as u64).step_by(8) {
        b.extend_from_slice(&pattern(o, SEED).to_le_bytes());
    }
    std::fs::write(path, b).unwrap();
}

/// The probe's checksum of a byte string (tools/probe-guest/src/blk.rs).
fn checksum(bytes: &[u8]) -> u64 {
    bytes
        .chunks_exact(8)
        .fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
            (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

fn field(out: &str, prefix: &str, key: &str) -> String {
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{out}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .to_string()
}

fn launch(extra: &[&str], cmdline: &str) -> Output {
    let mut args = vec![
        "launch", "--cores", "0", "--memory", "64M", "--probe", "--idle", "shared",
    ];
    args.extend_from_slice(extra);
    let cl = format!("probe.memtest=0 {cmdline}");
    args.extend_from_slice(&["--cmdline", &cl, "--json"]);
    run(&args, LIMIT)
}

#[test]
fn every_mode_reads_the_image_exactly() {
    if !kvm_available("every_mode_reads_the_image_exactly") {
        return;
    }
    let dir = Scratch::new("blk-read");
    let img = dir.path("disk.img");
    image(&img);
    let want = format!("{:#018x}", checksum(&std::fs::read(&img).unwrap()));
    let disk = format!("path={}", img.display());
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "exit notify",
            vec!["--no-ioeventfd".into(), "--disk".into(), disk.clone()],
            "",
        ),
        ("ioeventfd", vec!["--disk".into(), disk.clone()], ""),
        (
            "ioeventfd + polling",
            vec!["--disk".into(), format!("{disk},poll_us=100")],
            "",
        ),
        (
            "O_DIRECT",
            vec!["--disk".into(), format!("{disk},direct=on")],
            "",
        ),
        (
            "read-only",
            vec!["--disk".into(), format!("{disk},readonly=on")],
            "",
        ),
        (
            "two queues",
            vec!["--disk".into(), format!("{disk},queues=2")],
            "",
        ),
        (
            "no EVENT_IDX",
            vec!["--disk".into(), disk.clone()],
            "probe.blk_event_idx=0",
        ),
        (
            "indirect descriptors",
            vec!["--disk".into(), disk.clone()],
            "probe.blk_indirect=1",
        ),
    ];
    for (what, extra, opts) in cases {
        let refs: Vec<&str> = extra.iter().map(String::as_str).collect();
        let out = launch(
            &refs,
            &format!("probe.blk=read,again,read,again,read,fence probe.blk_n=20 {opts}"),
        );
        assert_eq!(out.code(), 0, "{what}: {}\n{}", out.stderr, out.stdout);
        // Three activations (the device reset and set up again twice), each reading the
        // whole image right: the queue workers' rings are made once and reused.
        let reads: Vec<&str> = out
            .stdout
            .lines()
            .filter(|l| l.starts_with("probe: blk read "))
            .collect();
        assert_eq!(reads.len(), 3, "{what}: {}", out.stdout);
        assert!(
            reads
                .iter()
                .all(|l| l.contains(&format!("checksum={want}"))),
            "{what}: {reads:?}"
        );
        assert_eq!(
            field(&out.stdout, "probe: blk read ", "bytes"),
            SIZE.to_string(),
            "{what}"
        );
        assert_eq!(
            field(&out.stdout, "probe: blk read ", "checksum"),
            want,
            "{what}"
        );
        assert!(
            out.stdout.contains("probe: blk id=partition-disk0"),
            "{what}: {}",
            out.stdout
        );
        // The disk's counters, from the JSON report.
        let r = report(&out.stdout);
        let d = &r["disks"][0];
        assert_eq!(
            (&d["base"], &d["gsi"]),
            (&0xd000_0000u64.into(), &5.into()),
            "{d}"
        );
        let q0 = &d["queues"][0];
        assert!(q0["requests"].as_u64() >= Some(20), "{what}: {q0}");
        assert_eq!(q0["refused"], 0, "{what}: {q0}");
        assert!(
            out.stderr
                .contains("disk at 0xd0000000 (gsi 5): q0: requests="),
            "{what}: {}",
            out.stderr
        );
        let dev = out
            .stdout
            .lines()
            .find(|l| l.starts_with("probe: blk dev "))
            .unwrap();
        if what == "indirect descriptors" {
            assert!(dev.contains("indirect=true"), "{dev}");
        }
        if what == "no EVENT_IDX" {
            assert!(dev.contains("event_idx=false"), "{dev}");
        }
        if what == "exit notify" {
            // The doorbells rang through VM exits, and the device counted them.
            assert!(q0["doorbells"].as_u64() > Some(0), "{q0}");
        }
    }
}

#[test]
fn a_disk_on_virtio_pci_reads_exactly_and_interrupts_by_msix_without_exits() {
    if !kvm_available("a_disk_on_virtio_pci_reads_exactly_and_interrupts_by_msix_without_exits") {
        return;
    }
    let dir = Scratch::new("blk-pci");
    let img = dir.path("disk.img");
    image(&img);
    let want = format!("{:#018x}", checksum(&std::fs::read(&img).unwrap()));
    let disk = format!("path={}", img.display());
    // The same interrupt-completed reads over each transport: virtio-mmio's handler reads
    // and acknowledges the interrupt status (two MMIO exits a completion), MSI-X needs
    // neither.
    let mut mmio_exits = Vec::new();
    for transport in ["pci", "mmio"] {
        let out = launch(
            &["--disk", &format!("{disk},transport={transport}")],
            "probe.blk=read,again,read,lat probe.blk_n=400",
        );
        assert_eq!(out.code(), 0, "{transport}: {}\n{}", out.stderr, out.stdout);
        let reads: Vec<&str> = out
            .stdout
            .lines()
            .filter(|l| l.starts_with("probe: blk read "))
            .collect();
        assert_eq!(reads.len(), 2, "{transport}: {}", out.stdout);
        assert!(
            reads
                .iter()
                .all(|l| l.contains(&format!("checksum={want}"))),
            "{transport}: {reads:?}"
        );
        let r = report(&out.stdout);
        let d = &r["disks"][0];
        let q0 = &d["queues"][0];
        let interrupts = q0["interrupts"].as_u64().unwrap_or(0);
        // lat's interrupt half: 440 completions by interrupt.
        assert!(interrupts >= 400, "{transport}: {q0}");
        let exits = &r["vcpus"][0]["exits"];
        let mmio =
            exits["mmio_read"].as_u64().unwrap_or(0) + exits["mmio_write"].as_u64().unwrap_or(0);
        mmio_exits.push(mmio);
        if transport == "pci" {
            assert_eq!(d["transport"], "virtio-pci", "{d}");
            assert!(
                out.stdout.contains("probe: blk dev transport=virtio-pci"),
                "{}",
                out.stdout
            );
            // The first function's page at the bottom of the 32-bit window.
            assert_eq!(d["base"], 0xc000_0000u64, "{d}");
            // The two set-ups' register accesses (about 130), none a completion.
            assert!(
                2 * mmio < interrupts,
                "{mmio} MMIO exits for {interrupts} interrupts"
            );
        } else {
            assert_eq!(d["transport"], "virtio-mmio", "{d}");
            assert!(
                mmio >= 2 * interrupts,
                "{mmio} MMIO exits for {interrupts} interrupts"
            );
        }
    }
    println!(
        "NOTE virtio-pci: {} MMIO exits in the run, virtio-mmio {}",
        mmio_exits[0], mmio_exits[1]
    );
}

#[test]
fn writes_land_in_the_host_file_and_read_only_refuses_them() {
    if !kvm_available("writes_land_in_the_host_file_and_read_only_refuses_them") {
        return;
    }
    let dir = Scratch::new("blk-write");
    let img = dir.path("disk.img");
    image(&img);
    let before = std::fs::read(&img).unwrap();
    let disk = format!("path={}", img.display());
    let out = launch(&["--disk", &disk], "probe.blk=write");
    assert_eq!(out.code(), 0, "{}\n{}", out.stderr, out.stdout);
    assert_eq!(
        field(&out.stdout, "probe: blk write ", "flushed_and_read_back"),
        "true"
    );
    let after = std::fs::read(&img).unwrap();
    let first = SIZE - (1 << 20);
    assert_eq!(
        after[..first],
        before[..first],
        "bytes outside the written range changed"
    );
    for (i, w) in after[first..].chunks_exact(8).enumerate() {
        let o = (first + 8 * i) as u64;
        let want = pattern(o, 0x5752_4954_4521_0002);
        assert_eq!(
            u64::from_le_bytes(w.try_into().unwrap()),
            want,
            "word at {o:#x}"
        );
    }
    // Read-only: the guest's writes fail (it exits with a failure status), the file stays.
    image(&img);
    let out = launch(
        &["--disk", &format!("{disk},readonly=on")],
        "probe.blk=write",
    );
    assert_eq!(out.code(), 4, "{}\n{}", out.stderr, out.stdout);
    assert_eq!(
        field(&out.stdout, "probe: blk write ", "flushed_and_read_back"),
        "false"
    );
    assert_eq!(std::fs::read(&img).unwrap(), before);
    assert!(out.stderr.contains("refused="), "{}", out.stderr);
}

#[test]
fn bad_disk_arguments_exit_2() {
    let dir = Scratch::new("blk-bad");
    let odd = dir.file("odd.img", &[0u8; 1000]);
    let cases = [
        (
            "path=/nonexistent/disk.img".to_string(),
            // The directory that is missing is named.
            "path=/nonexistent/disk.img\": /nonexistent: No such file",
        ),
        (
            format!("path={}", odd.display()),
            "not a positive multiple of 512",
        ),
        ("path=/tmp".to_string(), "/tmp"),
        ("readonly=on".to_string(), "path=FILE is required"),
        ("path=/x,queues=0".to_string(), "queues=0"),
        ("path=/x,poll_us=abc".to_string(), "poll_us=abc"),
        ("path=/x,bogus=1".to_string(), "unknown key \"bogus\""),
        (
            "path=/x,transport=usb".to_string(),
            "transport=usb: mmio or pci",
        ),
    ];
    let before = host_state();
    for (spec, want) in cases {
        let out = run(
            &[
                "launch", "--cores", "0", "--memory", "16M", "--probe", "--disk", &spec,
            ],
            LIMIT,
        );
        assert_eq!(out.code(), 2, "{spec}: {}", out.stderr);
        assert!(
            out.stderr.contains(want),
            "{spec}: want {want:?} in {}",
            out.stderr
        );
        assert!(out.stdout.is_empty(), "{spec}: the guest ran");
    }
    assert_eq!(host_state().hugepages_total, before.hugepages_total);
}

/// The same probe ELF under QEMU's microvm (the benchmark's peer): it must find its two
/// CPUs in qboot's MP table (whose entry count is zero), pick the block device out of two
/// virtio-mmio devices, and read the image exactly.
#[test]
fn the_probe_reads_the_image_under_qemu_microvm_too() {
    if !kvm_available("the_probe_reads_the_image_under_qemu_microvm_too") {
        return;
    }
    let dir = Scratch::new("blk-qemu");
    let img = dir.path("disk.img");
    image(&img);
    let want = format!("{:#018x}", checksum(&std::fs::read(&img).unwrap()));
    let Some((qemu, probe)) =
        qemu_and_probe("the_probe_reads_the_image_under_qemu_microvm_too", &dir)
    else {
        return;
    };
    let child = qemu_probe(
        &qemu,
        "microvm,acpi=off",
        2,
        &probe,
        "probe.memtest=0 probe.blk=read,fence probe.blk_n=20",
    )
    .args(["-global", "virtio-mmio.force-legacy=false"])
    .args(["-device", "virtio-rng-device"])
    .arg("-drive")
    .arg(format!(
        "id=d0,file={},format=raw,if=none,aio=io_uring",
        img.display()
    ))
    .args(["-device", "virtio-blk-device,drive=d0"])
    .spawn()
    .expect("spawning qemu");
    let out = wait_output(child, LIMIT, "qemu");
    // isa-debug-exit turns status s into (s << 1) | 1: 1 means the probe reported 0.
    assert_eq!(out.code(), 1, "{}\n{}", out.stderr, out.stdout);
    assert!(
        out.stdout.contains("probe: mptable cpus=2"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("started=2"), "{}", out.stdout);
    let mmio = out
        .stdout
        .lines()
        .find(|l| l.starts_with("probe: cmdline="))
        .unwrap_or("")
        .matches("virtio_mmio.device=")
        .count();
    assert_eq!(mmio, 2, "QEMU announced {mmio} devices:\n{}", out.stdout);
    // QEMU announces the rng (created first) first: the probe must have skipped it.
    let first = out
        .stdout
        .split("virtio_mmio.device=")
        .nth(1)
        .and_then(|s| s.split(['@', ':']).nth(1))
        .unwrap_or("?")
        .to_string();
    let dev = out
        .stdout
        .lines()
        .find(|l| l.starts_with("probe: blk dev "))
        .unwrap_or("");
    assert!(
        !dev.contains(&format!("base={first} ")),
        "the probe took the first device ({first}), the rng: {dev}"
    );
    assert_eq!(
        field(&out.stdout, "probe: blk read ", "checksum"),
        want,
        "{}",
        out.stdout
    );
}

/// A guest that activates its disk with a bad queue size 5000 times in a row (the audit's
/// flood: reset, FEATURES_OK, QueueNum=3, Ready, DRIVER_OK; it once left 518,091 lines in
/// a minute) leaves a handful of log lines: the window's limit (5 a second) holds for the
/// VMM's life, and what it dropped is counted in `launch --json`.
#[test]
fn a_guest_flooding_the_log_is_held_to_a_few_lines_and_counted() {
    let name = "a_guest_flooding_the_log_is_held_to_a_few_lines_and_counted";
    if !kvm_available(name) {
        return;
    }
    let dir = Scratch::new("blk-flood");
    let img = dir.path("disk.img");
    image(&img);
    let disk = format!("path={}", img.display());
    let out = launch(&["--disk", &disk], "probe.blk=flood probe.blk_flood=5000");
    assert_eq!(out.code(), 0, "{}\n{}", out.stderr, out.stdout);
    assert!(
        out.stdout.contains("probe: blk flood rounds=5000"),
        "{}",
        out.stdout
    );
    let r = report(&out.stdout);
    let lines = out
        .stderr
        .lines()
        .filter(|l| l.contains("is set up outside guest memory or badly sized"))
        .count() as u64;
    let secs = r["ran_for_s"].as_f64().unwrap_or(0.0).ceil() as u64;
    assert!(
        lines >= 1 && lines <= 5 * (secs + 1),
        "{lines} lines in {secs} s:\n{}",
        tail(&out.stderr, 3000)
    );
    let dropped = r["disks"][0]["log_suppressed"].as_u64().unwrap();
    assert_eq!(
        dropped + lines,
        5000,
        "every refused activation is either a line or counted as dropped: {}",
        r["disks"]
    );
    println!("NOTE {name}: {lines} lines, {dropped} dropped, in {secs} s");
}
