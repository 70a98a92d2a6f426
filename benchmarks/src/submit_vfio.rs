//! `submit-vfio`: GPU-style submission through a passed-through device (`partition bench
//! --vfio BDF`, an NVMe controller bound to vfio-pci; docs/passthrough.md).
//!
//! Three drivers of the same controller, the same protocol (`crate::nvmecore`), the same
//! one-block reads, in the same run, on the partition's core:
//! - **partition**: the probe guest's driver (`probe.nvme=N`) in a partition with the
//!   function passed through (`--device vfio=BDF`): BAR 0 mapped into the guest, MSI-X
//!   through the device's VFIO eventfd and a KVM irqfd;
//! - **bare-host twin**: the same driver in host userspace through VFIO
//!   (`crate::vfio_nvme`), completions polled or read from the MSI-X eventfd;
//! - **QEMU vfio-pci**: the probe's driver in QEMU microvm (PCIe) with `-device
//!   vfio-pci,host=BDF` and KVM.
//!
//! Each measures submit-to-completion polled and by MSI-X; the partition's exits to the
//! VMM per submission come from two launches that differ only in the number of reads.
//! On an emulated machine (the rig: QEMU TCG) the timings describe the emulation, and the
//! section says so (`timings_meaningful`); the rows are the ones a real host fills.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::doc::submit_vfio::{SubmitVfioSection, VfioRow};
use crate::head::Head;
use crate::stats::summary;
use crate::submit::Series;
use crate::{Env, Launch, pretty, timed_run};

/// Reads timed per completion mode per run, after a tenth as warm-up.
pub const SAMPLES: usize = 1000;
/// The smaller launch of the exits-per-submission pair.
const FEW: usize = 10;
/// SeaBIOS built for microvm (Debian's `seabios` package).
pub const SEABIOS_MICROVM: &str = "/usr/share/seabios/bios-microvm.bin";
/// Who drives the controller, in the report's order.
pub const WHO: [&str; 3] = ["partition", "bare-host twin", "QEMU vfio-pci"];

/// Completion mode → (median, p99), ns.
pub type Figures = BTreeMap<String, (f64, f64)>;

/// `probe: nvme test=submit completion=MODE ... median_ns= p99_ns=` → [`Figures`].
pub fn parse_probe(stdout: &str) -> Figures {
    let mut out = BTreeMap::new();
    for l in stdout.lines() {
        let Some(rest) = l.strip_prefix("probe: nvme test=submit ") else {
            continue;
        };
        let kv: BTreeMap<&str, &str> = rest
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .collect();
        let num = |k: &str| kv.get(k).and_then(|v| v.parse::<f64>().ok());
        if let (Some(c), Some(m), Some(p)) = (kv.get("completion"), num("median_ns"), num("p99_ns"))
        {
            out.insert(c.to_string(), (m, p));
        }
    }
    out
}

/// What the probe printed as `submitted=`.
fn submitted(stdout: &str) -> Option<u64> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("probe: nvme submitted="))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The machine: DMI vendor and product, and whether it is an emulator's.
fn machine() -> (String, bool) {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/class/dmi/id/{f}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let (vendor, product) = (read("sys_vendor"), read("product_name"));
    // QEMU's machines name themselves; under TCG the timings are the emulator's. (A QEMU
    // guest with KVM is also a virtual machine: a nested measurement, not bare metal.)
    let emulated = vendor == "QEMU" || product.starts_with("Standard PC");
    (format!("{vendor} {product}").trim().to_string(), !emulated)
}

/// What one partition launch measured.
pub(crate) struct PartitionRun {
    figures: Figures,
    /// Exits to the VMM other than the console's port writes.
    quiet_exits: u64,
    /// Commands the probe submitted.
    submitted: u64,
    /// The host's interrupt count for the function.
    interrupts: Option<u64>,
    /// The command, as typed.
    shown: String,
}

/// One partition launch with `n` reads each way.
pub(crate) fn partition_once(env: &Env, bdf: &str, n: usize) -> Result<PartitionRun, String> {
    let state = env.work.join("submit-vfio-state");
    let c = Launch::new(env, &state, &env.core.to_string(), "64M")
        .probe()
        .arg("--device")
        .arg(&format!("vfio={bdf}"))
        .cmdline(&format!("probe.memtest=0 probe.nvme={n}"))
        .json()
        .command();
    let shown = pretty(&c);
    let r = timed_run(c, Duration::from_secs(300)).map_err(|e| e.to_string())?;
    let report: serde_json::Value = r
        .stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(serde_json::Value::Null);
    let figures = parse_probe(&r.stdout);
    let subs = submitted(&r.stdout);
    if r.status.code() != Some(0) || figures.len() != 2 || subs.is_none() {
        return Err(format!(
            "exit {:?}, {} completions measured; {}",
            r.status.code(),
            figures.len(),
            r.stdout
                .lines()
                .chain(r.stderr.lines())
                .filter(|l| l.contains("FAILED") || l.contains("error"))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    let quiet: u64 = crate::LaunchJson::from_stdout(&r.stdout)
        .map(|j| j.vcpus)
        .unwrap_or_default()
        .iter()
        .flat_map(|v| &v.exits)
        .filter(|(k, _)| *k != "io_out")
        .map(|(_, n)| n)
        .sum();
    Ok(PartitionRun {
        figures,
        quiet_exits: quiet,
        submitted: subs.unwrap_or(0),
        interrupts: report["passthrough"][0]["interrupts"].as_u64(),
        shown,
    })
}

/// One QEMU microvm (PCIe) run of the probe's driver with the function as vfio-pci, pinned
/// like every QEMU row.
/// `cpu_pm`: QEMU's `-overcommit cpu-pm=on` (idle exits disabled, as the exits section
/// runs QEMU; this section runs it as a user would by default).
pub(crate) fn qemu_once(
    env: &Env,
    probe: &std::path::Path,
    bdf: &str,
    n: usize,
    cpu_pm: bool,
) -> Result<(Figures, String), String> {
    let cmdline = format!("probe.memtest=0 probe.nvme={n} probe.ecam=0xe0000000");
    let qmp = env.work.join("submit-vfio-qmp.sock");
    let mut c = crate::Microvm {
        pin: None,
        smp: 1,
        mb: 64,
        acpi: true,
        prealloc: false,
        probe,
        cmdline: &cmdline,
    }
    .command(env);
    // QEMU's own microvm firmware (qboot) halts before the guest's first instruction with
    // an NVMe passed through (the rig: the vCPU in kvm_vcpu_halt, no output); SeaBIOS's
    // microvm build boots it.
    if std::path::Path::new(SEABIOS_MICROVM).exists() {
        c.args(["-bios", SEABIOS_MICROVM]);
    }
    if cpu_pm {
        c.args(["-overcommit", "cpu-pm=on"]);
    }
    c.args(["-machine", "pcie=on"])
        .arg("-device")
        .arg(format!("vfio-pci,host={bdf}"))
        .args(["-name", "submitvfio,debug-threads=on", "-S"])
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", qmp.display()));
    let shown = pretty(&c);
    let (core, host_core) = (env.core, env.host_core);
    let r = crate::timed_run_with(c, Duration::from_secs(180), |pid| {
        crate::placement::pin_and_start_qemu(pid, &qmp, core, host_core)
    })
    .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&qmp);
    let figures = parse_probe(&r.stdout);
    // isa-debug-exit: status 0 exits (0 << 1) | 1.
    if r.status.code() != Some(1) || figures.len() != 2 {
        return Err(format!(
            "QEMU exit {:?}, {} figures; {} {}",
            r.status.code(),
            figures.len(),
            r.stdout
                .lines()
                .filter(|l| l.contains("FAILED"))
                .collect::<Vec<_>>()
                .join("; "),
            r.stderr.lines().last().unwrap_or("")
        ));
    }
    Ok((figures, shown))
}

/// The bare-host twin on the partition's core, in a thread of its own.
fn twin_once(env: &Env, bdf: &str) -> Result<Figures, String> {
    let (core, bdf) = (env.core, bdf.to_string());
    let run = std::thread::spawn(move || {
        crate::host::pin(core);
        crate::vfio_nvme::run(&bdf, SAMPLES)
    })
    .join()
    .map_err(|_| "the twin's thread panicked".to_string())??;
    if run.poll_interrupts > 0 {
        return Err(format!(
            "{} MSI-X interrupts over the polled reads, whose queue has its interrupt off",
            run.poll_interrupts
        ));
    }
    let mut out = BTreeMap::new();
    for (mode, v) in [("poll", &run.poll_ns), ("irq", &run.irq_ns)] {
        let s = summary(v).ok_or(format!("no {mode} samples"))?;
        out.insert(mode.to_string(), (s.median, s.p99));
    }
    Ok(out)
}

/// The function's `vendor:device`, from sysfs.
fn identity(bdf: &str) -> Option<String> {
    let d = std::path::Path::new("/sys/bus/pci/devices").join(bdf);
    let read = |f: &str| std::fs::read_to_string(d.join(f)).ok();
    let (v, p) = (read("vendor")?, read("device")?);
    Some(format!(
        "{bdf} {}:{}",
        v.trim().trim_start_matches("0x"),
        p.trim().trim_start_matches("0x")
    ))
}

/// Runs the section.
pub fn run(env: &Env) -> SubmitVfioSection {
    let (machine, meaningful) = machine();
    let mut s = SubmitVfioSection {
        head: Head::start(env),
        device: None,
        machine,
        timings_meaningful: meaningful,
        host_limitation: false,
        runs: env.runs,
        samples_per_run: SAMPLES,
        core: env.core,
        method: "see benchmarks/src/submit_vfio.rs: per round, one partition launch with the \
                 function passed through, one bare-host twin run through VFIO and one QEMU \
                 microvm (pcie=on) with vfio-pci, each timing one-block reads submit-to-\
                 completion polled and by MSI-X on the partition's core; cells are medians of \
                 per-run medians (and of per-run p99s) with their min-max over runs; exits per \
                 submission from one more launch with fewer reads"
            .into(),
        rows: Vec::new(),
        exits_per_submission: None,
        host_interrupts: None,
        not_measured: Vec::new(),
        commands: Vec::new(),
        failures: Vec::new(),
    };
    let Some(bdf) = env.vfio.clone() else {
        s.host_limitation = true;
        s.head.fail(
            "no function to pass through: give `partition bench --vfio DDDD:BB:DD.F` an NVMe \
             controller bound to vfio-pci (docs/passthrough.md)"
                .into(),
        );
        return s;
    };
    s.device = identity(&bdf);
    let probe = match env.qemu {
        None => {
            s.not_measured
                .push(format!("QEMU vfio-pci: {}", env.qemu_absent()));
            None
        }
        Some(_) => match crate::probe_image(env) {
            Ok(p) => Some(p),
            Err(e) => {
                s.failures.push(format!("writing the probe image: {e}"));
                None
            }
        },
    };
    let mut series: BTreeMap<(usize, String), Series> = BTreeMap::new();
    let mut add = |who: usize, f: &Figures| {
        for (mode, (m, p)) in f {
            let e = series.entry((who, mode.clone())).or_default();
            e.medians.push(*m);
            e.p99s.push(*p);
        }
    };
    let mut many = None;
    for round in 0..env.runs {
        match partition_once(env, &bdf, SAMPLES) {
            Ok(p) => {
                if round == 0 {
                    s.commands.push(p.shown);
                }
                add(0, &p.figures);
                many = Some((p.quiet_exits, p.submitted));
                s.host_interrupts = p.interrupts;
            }
            Err(e) => s.failures.push(format!("partition: {e}")),
        }
        match twin_once(env, &bdf) {
            Ok(f) => add(1, &f),
            Err(e) => s.failures.push(format!("bare-host twin: {e}")),
        }
        if let Some(p) = &probe {
            match qemu_once(env, p, &bdf, SAMPLES, false) {
                Ok((f, cmd)) => {
                    if round == 0 {
                        s.commands.push(cmd);
                    }
                    add(2, &f);
                }
                Err(e) => s.failures.push(format!("QEMU vfio-pci: {e}")),
            }
        }
    }
    match (partition_once(env, &bdf, FEW), many) {
        (Ok(few), Some((q1, s1))) if s1 > few.submitted => {
            s.exits_per_submission =
                Some((q1 as f64 - few.quiet_exits as f64) / (s1 - few.submitted) as f64);
        }
        (Err(e), _) => s.failures.push(format!("partition (exits pair): {e}")),
        _ => {}
    }
    for (i, who) in WHO.iter().enumerate() {
        for mode in ["poll", "irq"] {
            let (latency, p99) = series
                .get(&(i, mode.to_string()))
                .map(Series::cells)
                .unwrap_or((None, None));
            let twin = series.get(&(1, mode.to_string())).map(Series::cells);
            let ratio = latency
                .zip(twin.and_then(|t| t.0))
                .map(|(a, b)| a.median_ns / b.median_ns);
            s.rows.push(VfioRow {
                who: who.to_string(),
                completion: mode.into(),
                latency,
                p99,
                ratio_to_twin: ratio,
            });
        }
    }
    let want = if probe.is_some() { 6 } else { 4 };
    let full = s
        .rows
        .iter()
        .filter(|r| r.latency.is_some_and(|c| c.runs == env.runs))
        .count();
    let complete = s.failures.is_empty() && full == want && s.exits_per_submission.is_some();
    let reason = format!(
        "{full}/{want} rows with every run, exits per submission {}; {:?}",
        if s.exits_per_submission.is_some() {
            "measured"
        } else {
            "not measured"
        },
        s.failures
    );
    s.head.finish(complete && probe.is_some(), || {
        if probe.is_none() {
            format!("no QEMU peer ({reason})")
        } else {
            reason
        }
    });
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probes_nvme_lines_parse() {
        let out = "probe: nvme rw lba=0 bytes=4096 ok=1\n\
                   probe: nvme test=submit completion=poll n=1000 median_ns=5200 p99_ns=9100 min_ns=1 max_ns=2\n\
                   probe: nvme test=doorbell completion=none n=1000 median_ns=80 p99_ns=90 min_ns=1 max_ns=2\n\
                   probe: nvme test=submit completion=irq n=1000 median_ns=7400 p99_ns=12000 min_ns=1 max_ns=2\n\
                   probe: nvme submitted=2202 irqs=1100 sq_tail=26 cq_head=26\n";
        let f = parse_probe(out);
        assert_eq!(f.len(), 2);
        assert_eq!(f["poll"], (5200.0, 9100.0));
        assert_eq!(f["irq"], (7400.0, 12000.0));
        assert_eq!(submitted(out), Some(2202));
        assert_eq!(submitted("probe: nvme FAILED: no NVMe"), None);
    }
}
