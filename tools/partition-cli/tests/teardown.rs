//! Every way a partition ends: ACPI power-off, exit status, i8042 reset, triple fault, and
//! SIGTERM/SIGINT while the guest sits halted (on one vCPU and with an AP still waiting for
//! SIPI). Each must end the process with the documented status and say why.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

/// Boots `code` (64-bit, entered at 0x200000 through the Linux boot protocol) and returns
/// the finished command (its stdout ends with the `--json` report).
fn boot(name: &str, code: &[u8], cores: &str) -> Output {
    let dir = Scratch::new(name);
    let k = dir.file("kernel", &tiny_kernel(code, 0));
    run(
        &[
            "launch",
            "--cores",
            cores,
            "--memory",
            "16M",
            "--kernel",
            k.to_str().unwrap(),
            "--json",
        ],
        LIMIT,
    )
}

#[test]
fn acpi_s5_powers_off_cleanly() {
    if !kvm_available("acpi_s5_powers_off_cleanly") {
        return;
    }
    // mov dx, 0x600; mov al, 0x34 (SLP_TYP 5 | SLP_EN); out dx, al; hlt; jmp $-1
    let out = boot(
        "s5",
        &[0x66, 0xba, 0x00, 0x06, 0xb0, 0x34, 0xee, 0xf4, 0xeb, 0xfd],
        "0",
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let j = report(&out.stdout);
    assert_eq!(j["outcome"]["kind"], "power_off", "{j}");
    assert_eq!(j["outcome"]["status"], 0, "{j}");
    assert_eq!(j["outcome"]["exit_code"], 0, "{j}");
}

#[test]
fn exit_status_port_reports_failure() {
    if !kvm_available("exit_status_port_reports_failure") {
        return;
    }
    // mov al, 7; out 0xf4, al; hlt
    let out = boot("status", &[0xb0, 0x07, 0xe6, 0xf4, 0xf4, 0xeb, 0xfd], "0");
    assert_eq!(out.code(), 4, "{}", out.stderr);
    let j = report(&out.stdout);
    assert_eq!(j["outcome"]["kind"], "power_off", "{j}");
    assert_eq!(j["outcome"]["status"], 7, "{j}");
    assert_eq!(j["outcome"]["exit_code"], 4, "{j}");
}

#[test]
fn i8042_reset_stops_the_partition() {
    if !kvm_available("i8042_reset_stops_the_partition") {
        return;
    }
    // mov al, 0xfe; out 0x64, al; hlt
    let out = boot("reset", &[0xb0, 0xfe, 0xe6, 0x64, 0xf4, 0xeb, 0xfd], "0");
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(report(&out.stdout)["outcome"]["kind"], "reset");
}

#[test]
fn triple_fault_is_reported_with_its_site() {
    if !kvm_available("triple_fault_is_reported_with_its_site") {
        return;
    }
    // ud2 with no IDT: #UD -> #GP -> #DF -> triple fault.
    let out = boot("triple", &[0x0f, 0x0b], "0");
    assert_eq!(out.code(), 3, "{}", out.stderr);
    let j = report(&out.stdout);
    assert_eq!(j["outcome"]["kind"], "triple_fault", "{j}");
    assert_eq!(j["outcome"]["exit_code"], 3, "{j}");
    let site = j["outcome"]["site"].as_str().unwrap_or("");
    if site.starts_with("site unknown: the host's KVM reset the vCPU") {
        // AMD SVM: KVM re-initialises the vCPU at a shutdown; only Intel and the nested
        // kvm_pvm host keep the faulting state.
        assert!(
            std::path::Path::new("/sys/module/kvm_amd").exists(),
            "the site was lost on a host that is not AMD: {j}"
        );
        assert!(site.contains("RIP 0xfff0"), "{j}");
        println!("NOTE triple_fault_is_reported_with_its_site: AMD SVM loses the site: {site}");
    } else {
        assert!(
            site.contains("RIP 0x200000") && site.contains("bytes 0f 0b"),
            "{j}"
        );
    }
}

/// Starts a guest that prints 'R' and halts with interrupts off, waits for the 'R', sends
/// `signal`, and checks the VMM tears down with 128 + signal.
fn signal_while_halted(name: &str, cores: &str, signal: i32) {
    if !kvm_available(name) {
        return;
    }
    let dir = Scratch::new(name);
    // mov dx, 0x3f8; mov al, 'R'; out dx, al; cli; hlt; jmp $-1
    let k = dir.file(
        "kernel",
        &tiny_kernel(
            &[
                0x66, 0xba, 0xf8, 0x03, 0xb0, b'R', 0xee, 0xfa, 0xf4, 0xeb, 0xfd,
            ],
            0,
        ),
    );
    let mut child = partition()
        .args([
            "launch", "--cores", cores, "--memory", "16M", "--json", "--kernel",
        ])
        .arg(&k)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut byte = [0u8; 1];
    let start = Instant::now();
    stdout.read_exact(&mut byte).expect("guest output");
    assert_eq!(&byte, b"R");
    assert!(start.elapsed() < LIMIT);
    let pid = child.id() as i32;
    // SAFETY: sending a signal to our own child.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    // The rest of stdout (the report, the last line) comes once the VMM has torn down.
    let rest = std::thread::spawn(move || common::read_lossy(&mut stdout));
    let out = wait_output(child, LIMIT, name);
    assert_eq!(out.code(), 128 + signal, "{}", out.stderr);
    let j = report(&rest.join().unwrap());
    assert_eq!(j["outcome"]["kind"], "signal", "{j}");
    assert_eq!(j["outcome"]["signal"], signal, "{j}");
    assert_eq!(j["outcome"]["exit_code"], 128 + signal, "{j}");
    assert!(
        partition::host::ledger::pid_start_time(pid as u32).is_none(),
        "VMM process still running"
    );
}

#[test]
fn sigterm_stops_a_halted_guest() {
    signal_while_halted("sigterm", "0", libc::SIGTERM);
}

#[test]
fn sigint_stops_a_guest_whose_ap_waits_for_sipi() {
    if host_cores() < 2 {
        skip(
            "teardown::sigint_stops_a_guest_whose_ap_waits_for_sipi",
            "one core",
        );
        return;
    }
    signal_while_halted("sigint-2cpu", "0,1", libc::SIGINT);
}
