//! The probe guest boots under our VMM and reports exactly what it was given: the command
//! line, the e820 map, the CPUs (brought up with INIT/SIPI), and a memory test whose
//! checksum we recompute here. Both entry protocols, one and two vCPUs, both backings.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);

fn check_memtest(r: &ProbeReport, size: u64) {
    let seed = r.seed.expect("memtest seed line");
    // Tested ranges = usable e820 RAM minus page 0 and the probe image.
    let (img_start, img_end) = {
        let s = r.skips.split(',').nth(1).expect("image skip");
        let range = s.split('(').next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        (
            u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap(),
            u64::from_str_radix(b.trim_start_matches("0x"), 16).unwrap(),
        )
    };
    assert!(
        r.skips.starts_with("skip=0x0-0x1000(null page)"),
        "{}",
        r.skips
    );
    let mut want = Vec::new();
    for e in r.e820.iter().filter(|e| e.kind == 1) {
        let s = e.start.max(0x1000);
        for (a, b) in [(s, e.end.min(img_start)), (s.max(img_end), e.end)] {
            if a < b {
                want.push((a, b));
            }
        }
    }
    let got: Vec<(u64, u64)> = r.ranges.iter().map(|x| (x.start, x.end)).collect();
    assert_eq!(got, want, "memtest ranges");
    let mut total = 0u64;
    let mut bytes = 0u64;
    for x in &r.ranges {
        assert_eq!(x.errors, 0, "memtest errors in {x:x?}");
        let c = expected_checksum(x.start, x.end, seed);
        assert_eq!(x.checksum, c, "checksum of {:#x}-{:#x}", x.start, x.end);
        total = total.wrapping_add(c);
        bytes += x.end - x.start;
    }
    assert_eq!(r.total, Some((bytes, total, 0)));
    let usable: u64 = r
        .e820
        .iter()
        .filter(|e| e.kind == 1)
        .map(|e| e.end - e.start)
        .sum();
    assert_eq!(bytes, usable - 0x1000 - (img_end - img_start));
    assert!(bytes > size / 2);
}

#[test]
fn one_core_linux64_reports_what_it_was_given() {
    if !kvm_available("one_core_linux64_reports_what_it_was_given") {
        return;
    }
    let cmdline = "console=ttyS0 probe.seed=12345 quoted=\"a b\" x=y";
    let out = run(
        &[
            "launch",
            "--cores",
            "0",
            "--memory",
            "128M",
            "--probe",
            "--cmdline",
            cmdline,
            "--json",
        ],
        LIMIT,
    );
    assert_eq!(
        out.code(),
        0,
        "stderr: {}\nstdout: {}",
        out.stderr,
        out.stdout
    );
    let r = parse_probe(&out.stdout);
    assert_eq!(r.protocol, "linux64");
    let want = format!(
        "{}{cmdline}{}",
        cpu_model_words(),
        idle_words(&report(&out.stdout))
    );
    assert_eq!(r.cmdline.as_deref(), Some(want.as_str()));
    assert_eq!(report(&out.stdout)["cmdline"], want.as_str());
    // The sentence the launch prints for a person says the same.
    assert_eq!(vmm_cmdline(&out.stderr), want);
    assert_eq!(r.e820, expected_e820(128 << 20));
    assert_eq!(r.madt_ids, Some(vec![0]));
    assert_eq!(r.mptable_ids, Some(vec![0]));
    assert_eq!((r.expected, r.started), (Some(1), Some(1)));
    assert_eq!(r.seed, Some(12345));
    check_memtest(&r, 128 << 20);
    assert_eq!(r.result.as_deref(), Some("ok"));
    // The VMM's own account, as a program reads it.
    let j = report(&out.stdout);
    assert_eq!(j["outcome"]["kind"], "power_off", "{j}");
    assert_eq!(j["outcome"]["status"], 0, "{j}");
    assert_eq!(j["outcome"]["exit_code"], 0, "{j}");
    assert_eq!(j["vcpus"].as_array().map(Vec::len), Some(1), "{j}");
    assert_eq!(j["vcpus"][0]["core"], 0, "{j}");
    assert!(j["vcpus"][0]["exits"]["io_out"].as_u64() > Some(0), "{j}");
    assert_eq!(j["memory"]["bytes"], 128u64 << 20, "{j}");
    assert_eq!(j["memory"]["backing"], "anonymous", "{j}");
    assert!(j["timings"]["first_output_ms"].as_f64() > Some(0.0), "{j}");
    // The timeline from `main` to the first byte: every phase, in order, adding up to the
    // wall time (issue 25: nothing unaccounted for).
    let t = &j["timings"];
    let phases: Vec<(&str, f64)> = t["timeline"]
        .as_array()
        .unwrap_or_else(|| panic!("no timeline: {t}"))
        .iter()
        .map(|p| (p["phase"].as_str().unwrap(), p["ms"].as_f64().unwrap()))
        .collect();
    let names: Vec<&str> = phases.iter().map(|p| p.0).collect();
    assert_eq!(
        names,
        [
            "args",
            "check",
            "acquire",
            "mounts",
            "memory",
            "kvm_open",
            "vm_create",
            "slots",
            "irqchip",
            "vm_caps",
            "vm",
            "boot",
            "devices",
            "vcpus",
            "filters",
            "private_root",
            "confine",
            "vcpu_start",
            "guest_to_first_byte"
        ],
        "{t}"
    );
    assert!(phases.iter().all(|p| p.1 >= 0.0), "{t}");
    let wall = t["wall_to_first_byte_ms"].as_f64().unwrap();
    let sum: f64 = phases.iter().map(|p| p.1).sum();
    assert!(
        wall > 0.0 && (sum - wall).abs() <= wall * 0.1,
        "sum {sum} wall {wall}: {t}"
    );
}

#[test]
fn two_cores_bring_up_two_cpus() {
    if !kvm_available("two_cores_bring_up_two_cpus") {
        return;
    }
    if host_cores() < 2 {
        skip(
            "probe_boot::two_cores_bring_up_two_cpus",
            "this host has one core",
        );
        return;
    }
    let out = run(
        &[
            "launch", "--cores", "0,1", "--memory", "128M", "--probe", "--json",
        ],
        LIMIT,
    );
    assert_eq!(
        out.code(),
        0,
        "stderr: {}\nstdout: {}",
        out.stderr,
        out.stdout
    );
    let r = parse_probe(&out.stdout);
    assert_eq!(r.madt_ids, Some(vec![0, 1]));
    assert_eq!(r.mptable_ids, Some(vec![0, 1]));
    assert_eq!((r.expected, r.started), (Some(2), Some(2)));
    check_memtest(&r, 128 << 20);
    let j = report(&out.stdout);
    assert_eq!(j["outcome"]["kind"], "power_off", "{j}");
    let cores: Vec<u64> = j["vcpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["core"].as_u64().unwrap())
        .collect();
    assert_eq!(cores, vec![0, 1], "{j}");
}

#[test]
fn pvh_entry_sees_the_same_machine() {
    if !kvm_available("pvh_entry_sees_the_same_machine") {
        return;
    }
    let out = run(
        &[
            "launch",
            "--cores",
            "0",
            "--memory",
            "64M",
            "--probe",
            "--boot",
            "pvh",
            "--cmdline",
            "via pvh",
            "--json",
        ],
        LIMIT,
    );
    assert_eq!(
        out.code(),
        0,
        "stderr: {}\nstdout: {}",
        out.stderr,
        out.stdout
    );
    let r = parse_probe(&out.stdout);
    assert_eq!(r.protocol, "pvh");
    let want = format!(
        "{}via pvh{}",
        cpu_model_words(),
        idle_words(&report(&out.stdout))
    );
    assert_eq!(r.cmdline.as_deref(), Some(want.as_str()));
    assert_eq!(r.e820, expected_e820(64 << 20));
    assert_eq!(r.madt_ids, Some(vec![0]));
    check_memtest(&r, 64 << 20);
    // Entered at the PVH note's 32-bit entry, not the ELF entry (the Linux 64-bit one).
    let j = report(&out.stdout);
    assert_eq!(j["outcome"]["kind"], "power_off", "{j}");
    assert_ne!(j["entry_addr"], 0x100000, "{j}");
}

#[test]
fn memory_above_the_hole_is_mapped_and_reported() {
    if !kvm_available("memory_above_the_hole_is_mapped_and_reported") {
        return;
    }
    // 4 GiB: 3 GiB below the MMIO hole, 1 GiB above 4 GiB. The memory test is skipped here
    // (it would touch all 4 GiB); the map is what this test is about.
    let out = run(
        &[
            "launch",
            "--cores",
            "0",
            "--memory",
            "4G",
            "--probe",
            "--cmdline",
            "probe.memtest=0",
        ],
        LIMIT,
    );
    assert_eq!(
        out.code(),
        0,
        "stderr: {}\nstdout: {}",
        out.stderr,
        out.stdout
    );
    let r = parse_probe(&out.stdout);
    assert_eq!(r.e820, expected_e820(4 << 30));
    assert_eq!(r.e820.last().unwrap().end, 0x1_4000_0000);
    assert!(r.ranges.is_empty());
}

#[test]
fn console_file_gets_the_serial_output() {
    if !kvm_available("console_file_gets_the_serial_output") {
        return;
    }
    let dir = Scratch::new("console");
    let log = dir.path("serial.log");
    let out = run(
        &[
            "launch",
            "--cores",
            "0",
            "--memory",
            "32M",
            "--probe",
            "--cmdline",
            "probe.memtest=0 to-file",
            "--console",
            log.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    assert!(!out.stdout.contains("probe:"), "serial leaked to stdout");
    let text = std::fs::read_to_string(&log).unwrap();
    let r = parse_probe(&text);
    let want = format!("{}probe.memtest=0 to-file", cpu_model_words());
    assert_eq!(r.cmdline.as_deref(), Some(want.as_str()));
    assert_eq!(r.result.as_deref(), Some("ok"));
}

/// Restores vm.nr_hugepages on drop, whatever the test did.
struct HugepageGuard(String);

impl Drop for HugepageGuard {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/vm/nr_hugepages", &self.0);
    }
}

#[test]
fn hugetlb_backing_boots_and_gives_the_pages_back() {
    if !kvm_available("hugetlb_backing_boots_and_gives_the_pages_back") {
        return;
    }
    let before = std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap();
    let n: u64 = before.trim().parse().unwrap();
    let guard = HugepageGuard(before.clone());
    if std::fs::write("/proc/sys/vm/nr_hugepages", (n + 32).to_string()).is_err() {
        skip(
            "probe_boot::hugetlb_backing_boots_and_gives_the_pages_back",
            "cannot set vm.nr_hugepages (not root?)",
        );
        return;
    }
    let got: u64 = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    if got < n + 32 {
        skip(
            "probe_boot::hugetlb_backing_boots_and_gives_the_pages_back",
            &format!("kernel gave {got} of {} hugepages", n + 32),
        );
        return;
    }
    let out = run(
        &[
            "launch",
            "--cores",
            "0",
            "--memory",
            "64M",
            "--probe",
            "--hugepages",
            "--json",
        ],
        LIMIT,
    );
    assert_eq!(
        out.code(),
        0,
        "stderr: {}\nstdout: {}",
        out.stderr,
        out.stdout
    );
    let j = report(&out.stdout);
    assert_eq!(j["memory"]["backing"], "hugetlb", "{j}");
    assert_eq!(j["memory"]["page_size"], 2u64 << 20, "{j}");
    check_memtest(&parse_probe(&out.stdout), 64 << 20);
    // All hugepages free again once the VMM exited.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let free: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(free, n + 32);
    drop(guard);
    assert_eq!(
        std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap(),
        before
    );
}

#[test]
fn probe_image_is_an_elf_with_a_pvh_note() {
    let dir = Scratch::new("probe-image");
    let p = dir.path("probe.elf");
    let out = run(&["probe-image", "-o", p.to_str().unwrap()], LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let b = std::fs::read(&p).unwrap();
    assert_eq!(&b[0..4], b"\x7fELF");
    assert!(
        b.windows(4).any(|w| w == b"Xen\0"),
        "no PVH note name in the image"
    );
}

/// A guest cannot write more to its console than `--console-limit` lets through: the file
/// holds exactly that many bytes, the guest runs to its end, and the launch says so once.
#[test]
fn console_output_stops_at_its_limit() {
    if !kvm_available("console_output_stops_at_its_limit") {
        return;
    }
    let dir = Scratch::new("console-limit");
    let console = dir.path("console.log");
    let out = run(
        &[
            "launch",
            "--cores",
            "0",
            "--memory",
            "64M",
            "--probe",
            "--console",
            console.to_str().unwrap(),
            "--console-limit",
            "100",
            "--json",
        ],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let bytes = std::fs::read(&console).unwrap();
    assert_eq!(bytes.len(), 100, "{}", String::from_utf8_lossy(&bytes));
    // The console's entry in the report says what it passed on and what it dropped.
    let c = report(&out.stdout)["console"].clone();
    assert_eq!(c["output"], console.to_str().unwrap(), "{c}");
    assert_eq!(
        (c["limit"].as_u64(), c["written"].as_u64()),
        (Some(100), Some(100)),
        "{c}"
    );
    assert!(c["dropped"].as_u64().is_some_and(|d| d > 0), "{c}");
    assert!(
        bytes.starts_with(b"probe: "),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert_eq!(
        out.stderr
            .matches("passed 100 bytes (--console-limit)")
            .count(),
        1,
        "{}",
        out.stderr
    );
}

/// With `PARTITION_EXEC_AT_NS` set by the caller just before the spawn, the timeline starts
/// there: its first phase is `exec` (fork, exec, dynamic loading), then `args` and the rest,
/// still adding up to the wall time.
#[test]
fn the_timeline_counts_exec_when_the_caller_says_when_it_spawned() {
    if !kvm_available("the_timeline_counts_exec_when_the_caller_says_when_it_spawned") {
        return;
    }
    let child = partition()
        .args([
            "launch", "--cores", "0", "--memory", "16M", "--probe", "--json",
        ])
        .args(["--cmdline", "probe.memtest=0"])
        .env(
            partition::sys::timeline::EXEC_ENV,
            partition::sys::timeline::monotonic_ns().to_string(),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child, std::time::Duration::from_secs(120), "launch");
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let t = report(&out.stdout)["timings"].clone();
    let phases = t["timeline"].as_array().unwrap();
    assert_eq!(phases[0]["phase"], "exec", "{t}");
    assert_eq!(phases[1]["phase"], "args", "{t}");
    assert!(phases[0]["ms"].as_f64().unwrap() > 0.0, "{t}");
    let sum: f64 = phases.iter().map(|p| p["ms"].as_f64().unwrap()).sum();
    let wall = t["wall_to_first_byte_ms"].as_f64().unwrap();
    assert!(
        (sum - wall).abs() <= wall * 0.1,
        "sum {sum} wall {wall}: {t}"
    );
    // Each phase's CPU time: exec and loading cost some, they add up to the total, and
    // the total is at most what the host's CPUs could give in the wall time.
    let cpu = |p: &serde_json::Value| p["cpu_ms"].as_f64().unwrap();
    assert!(cpu(&phases[0]) > 0.0, "{t}");
    assert!(phases.iter().all(|p| cpu(p) >= 0.0), "{t}");
    let cpu_sum: f64 = phases.iter().map(cpu).sum();
    let cpu_total = t["cpu_to_first_byte_ms"].as_f64().unwrap();
    assert!(cpu_total > 0.0, "{t}");
    assert!((cpu_sum - cpu_total).abs() <= 0.01, "{t}");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    assert!(cpu_total <= wall * cpus, "{t}");
}

/// A guest's marks (the mark port): the VMM notes its own exit counts and KVM's statistics
/// at each, so what a loop cost is the difference, counted by KVM itself too. 50 port
/// reads between two marks: 50 port-read exits to the VMM, the second mark's own port
/// write, and at least as many exits in KVM's count.
#[test]
fn marks_say_what_a_loop_cost_to_the_vmm_and_to_kvm() {
    if !kvm_available("marks_say_what_a_loop_cost_to_the_vmm_and_to_kvm") {
        return;
    }
    let out = run(
        &[
            "launch",
            "--cores",
            "0",
            "--memory",
            "16M",
            "--probe",
            "--cmdline",
            "probe.memtest=0 probe.marks=50",
            "--json",
        ],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let r = report(&out.stdout);
    let marks = r["vcpus"][0]["marks"].as_array().expect("marks");
    assert_eq!(marks.len(), 2, "{r}");
    assert_eq!(
        (marks[0]["mark"].as_u64(), marks[1]["mark"].as_u64()),
        (Some(1), Some(2))
    );
    let grew = |key: &str, name: &str| {
        marks[1][key][name].as_u64().unwrap_or(0) - marks[0][key][name].as_u64().unwrap_or(0)
    };
    assert_eq!(grew("exits", "io_in"), 50, "{r}");
    assert_eq!(grew("exits", "io_out"), 1, "{r}");
    assert_eq!(grew("exits", "mmio_read"), 0, "{r}");
    if marks[0]["kvm"].get("exits").is_some() {
        assert!(grew("kvm", "exits") >= 51, "{r}");
        // Hardware KVM counts each port exit in io_exits; the nested kvm_pvm emulates
        // guest port I/O and counts it as emulation instead (io_exits stays 0 there).
        if nested_pvm() {
            println!(
                "NOTE marks: kvm_pvm counted {} exits, {} failed emulations and {} port exits for the loop and the mark",
                grew("kvm", "exits"),
                grew("kvm", "insn_emulation_fail"),
                grew("kvm", "io_exits")
            );
        } else {
            assert_eq!(grew("kvm", "io_exits"), 51, "{r}");
        }
    } else {
        println!(
            "NOTE marks: this host's KVM keeps no statistics; only the VMM's counts were checked"
        );
    }
}
