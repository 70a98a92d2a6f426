//! `exits`: the exits each kernel hot path takes on real KVM, counted by KVM itself, in our
//! partition and in QEMU with the same guest kernel and the same workload (docs/
//! measurement.md, "Exits per operation"). A figure that survives a change of host: what
//! makes a guest path slower than bare metal on hardware is mostly the exits it takes.
//!
//! The guest is Debian's kernel (`--exits-guest DIR`: its `vmlinux` and `base.cpio`, the
//! initramfs the Linux tests boot, with busybox and the virtio modules) with an overlay
//! that runs hotpaths in counted mode (`hotpaths --count N1,N2`: each loop exactly N1 then
//! N2 iterations between port-write marks) on 2 vCPUs, then powers off. It runs once in a
//! partition (`--idle mwait`, a virtio-blk disk) and once in QEMU microvm (`-cpu host
//! -overcommit cpu-pm=on -smp 2`, a virtio-blk-device with an iothread, qboot as its
//! firmware: [`QEMU_FIRMWARE`]), per round.
//!
//! The instrument is the same for both: the host kernel's `kvm:kvm_exit` tracepoint
//! (tracefs), every exit with its reason. The marks are the exits writing to the mark
//! port (an I/O exit whose port is 0x520), in the order hotpaths writes them; each loop's
//! cost per iteration is (exits between its N2 marks - exits between its N1 marks) /
//! (N2 - N1), by reason, so the boot, the loop's set-up and the marks themselves cancel.
//! What runs in proportion to time (the guest's timer ticks, the host's interrupts) stays
//! in the figure, by reason, as on hardware.
//!
//! With `--vfio BDF`, two rows more ([`NVME_OPS`]): the probe guest's NVMe driver through
//! VFIO, polled and by MSI-X, in both VMMs under the same tracepoint, the probe's own marks
//! bracketing each loop ([`nvme_per_read`]).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::doc::exits::{ExitsParams, ExitsRow, ExitsSection, IdleRoutineSeen};
use crate::head::Head;
use crate::placement::{Pin, Placement};
use crate::stats::summary;
use crate::{Env, Launch, Microvm, timed_run_with};

mod guest;
mod merge;
mod trace;
pub use guest::{cpio_entry, init_script, initramfs};
pub use merge::merge_policy_rows;
use trace::under_trace;
pub use trace::{
    Exit, FIRST_MARK, Loop, Tracer, exit_of, ipis_per_iteration, loops, per_iteration, shutdowns,
    snapshots,
};

/// The mark port (the VMM's, `partition::cpu::exits::MARK_PORT`).
pub const MARK_PORT: u16 = 0x520;
/// Iterations of the two counted runs of each loop.
pub const N1: u64 = 50;
/// See [`N1`].
pub const N2: u64 = 550;
/// The loops run, in hotpaths' names.
pub const OPS: &str = "null_syscall,read,write,stat,open_close,sig_install,sig_catch,pipe_2cores,unix_2cores,ctx_switch_2cores,fork_exit,sleep_1ms,blk_read";
/// QEMU's firmware for the section, named so that QEMU finds it in its own data directory.
/// microvm with ACPI takes SeaBIOS's microvm build by default, which wakes the second vCPU
/// and parks it in a `hlt` loop; under `cpu-pm=on` that HLT runs in guest mode, and in the
/// rig QEMU TCG did not wake the outer CPU halted there when the guest's kernel sent it
/// INIT/SIPI, so the run hung (docs/testing.md). qboot starts no AP: the second vCPU waits
/// for its SIPI inside KVM, as in our partition, and Linux finds both in ACPI's MADT.
pub const QEMU_FIRMWARE: &str = "qboot.rom";
/// Both guests' command line. `irqaffinity=0`: every device interrupt on vCPU 0, where
/// hotpaths runs its single-CPU loops, so the disk's completion reaches the reader's vCPU in
/// either VMM. Left to itself Linux gives a new IRQ's vector to the CPU with the most free
/// ones: in the rig our guest put the disk's interrupt on vCPU 1 and QEMU's on vCPU 0, and
/// a completion on the other vCPU costs an IPI and a second wake-up a read (docs/
/// benchmarks.md): the row then measured the guest's choice, not the VMM's path.
pub const GUEST_CMDLINE: &str = "console=ttyS0 quiet irqaffinity=0";
/// One guest run's limit.
const LIMIT: Duration = Duration::from_secs(900);

/// The least each loop can take on AMD hardware without AVIC, with the reasoning in
/// docs/measurement.md: (op, exits per iteration, why).
pub const MINIMUM: &[(&str, &str)] = &[
    (
        "null_syscall",
        "0: SYSCALL, SYSRET and the kernel's work stay in the guest",
    ),
    ("read", "0: as a null system call"),
    ("write", "0: as a null system call"),
    ("stat", "0: as a null system call"),
    ("open_close", "0: as a null system call"),
    ("sig_install", "0: as a null system call"),
    (
        "sig_catch",
        "0: the signal frame and the handler are guest work",
    ),
    (
        "pipe_2cores",
        "0 with mwait idle: the sleeping reader's vCPU waits in MWAIT on its own flag, which the writer's store wakes (no IPI); 2 wrmsr (ICR) + 2 host-interrupt exits a round trip when the reader's vCPU halts instead",
    ),
    ("unix_2cores", "0 with mwait idle: as pipe_2cores"),
    ("ctx_switch_2cores", "0 with mwait idle: as pipe_2cores"),
    (
        "fork_exit",
        "0: page tables, faults (nested paging) and the child's exit are guest work",
    ),
    (
        "sleep_1ms",
        "3: arming the TSC-deadline timer (a wrmsr exit), its expiry (the host's timer interrupt exits the vCPU to inject it) and the write that programs the next event, which the guest's hrtimer_interrupt makes after every expiry (Linux 6.1 kernel/time/hrtimer.c); the EOI needs none with PV EOI",
    ),
    (
        "blk_read",
        "4 over virtio-mmio: the queue notify (a write to the doorbell, answered by an ioeventfd in the kernel), the completion's interrupt (an exit to inject it into the reader's vCPU, running or halted), and the handler's read of the interrupt status and write of its acknowledgement (virtio-mmio has no MSI); 2 over virtio-pci with MSI-X, whose handler touches no register",
    ),
];

/// The NVMe rows (`--vfio BDF`, a controller bound to vfio-pci): the probe guest's reads
/// of it, polled and by MSI-X, in a partition and in QEMU microvm with vfio-pci (the
/// submit-vfio section's two runs, one vCPU each), counted by the same tracepoint. Linux's
/// own driver is not measured here: its polled reads need poll queues and io_uring's
/// IOPOLL, and QEMU's PCIe microvm boots only with SeaBIOS, whose parked AP hangs a
/// two-vCPU guest in the rig ([`QEMU_FIRMWARE`]).
pub const NVME_OPS: [&str; 2] = ["nvme_read_poll", "nvme_read_irq"];
/// Rounds the section may add to replace runs lost to a triple fault in the guest (the
/// rig's TCG, below both VMMs: docs/testing.md); a fault past them is a failure.
pub const SPARE_ROUNDS: usize = 2;
/// Timed reads of each NVMe loop (the probe first warms up with a tenth as many, between
/// the same marks).
pub const NVME_READS: usize = 200;
/// The least each NVMe row can take (AMD, no AVIC), as [`MINIMUM`].
pub const NVME_MINIMUM: [(&str, &str); 2] = [
    (
        "nvme_read_poll",
        "0: the doorbell is the device's own BAR, mapped into the guest, and the completion a store in guest memory the vCPU polls",
    ),
    (
        "nvme_read_irq",
        "1-2: the MSI-X's injection into the vCPU (an interrupt exit, running or halted) and, unless the guest uses PV EOI (the probe does not), its EOI write",
    ),
];

/// Exits per read of the probe's two NVMe loops, by reason, from the snapshots at its six
/// marks in order: 5 and 6 with nothing between (a mark's own cost, taken off), then 1, 2
/// around the polled reads and 3, 4 around those by MSI-X. `reads` counts the warm-up too.
pub fn nvme_per_read(
    snaps: &[BTreeMap<String, u64>],
    reads: u64,
) -> Option<[BTreeMap<String, f64>; 2]> {
    if snaps.len() != 6 || reads == 0 {
        return None;
    }
    let reasons: std::collections::BTreeSet<&String> =
        snaps.iter().flat_map(|m| m.keys()).collect();
    let between = |i: usize, r: &String| {
        let at = |k: usize| *snaps[k].get(r).unwrap_or(&0) as f64;
        at(i + 1) - at(i)
    };
    let per = |from: usize| -> BTreeMap<String, f64> {
        reasons
            .iter()
            .map(|r| {
                let v = (between(from, r) - between(0, r)) / reads as f64;
                ((*r).clone(), v)
            })
            .collect()
    };
    Some([per(2), per(4)])
}

/// Per loop (op, part), a quantity per iteration by kind.
type Counts = BTreeMap<(String, u32), BTreeMap<String, f64>>;

/// What one run of the guest gave.
struct Run {
    /// Exits per iteration by reason.
    exits: Counts,
    /// The guest's own IPIs per iteration by kind (`RES`, `CAL`).
    ipis: Counts,
    /// How the guest said it idles (`guest_idle`).
    idle: Option<String>,
    /// The idle loop its kernel took, in its words, and as our launch predicted it.
    routine: Option<IdleRoutineSeen>,
}

/// Why a traced run gave nothing: the message, and whether a vCPU took a shutdown exit (a
/// triple fault in the guest).
#[derive(Debug)]
struct Failed {
    why: String,
    triple_fault: bool,
}

impl From<String> for Failed {
    fn from(why: String) -> Self {
        Self {
            why,
            triple_fault: false,
        }
    }
}

/// Runs `cmd` (a VMM booting the guest) under the tracer and counts.
fn traced((cmd, pin): (std::process::Command, Pin)) -> Result<Run, Failed> {
    let (r, trace) = under_trace(|| {
        timed_run_with(cmd, LIMIT, |pid| pin.apply(pid))
            .map_err(|e| format!("running the VMM: {e}"))
    })?;
    let console = r.stdout;
    let ready = console.lines().find(|l| l.contains("EXITS-READY"));
    if let Some(l) = ready {
        eprintln!("partition: bench exits: {}", l.trim());
    }
    let idle = ready.and_then(guest_idle);
    let routine = ready.and_then(|l| {
        Some(IdleRoutineSeen {
            guest: word_after(l, "routine=")?,
            predicted: predicted_routine(&console),
        })
    });
    // Where the guest took its disk's interrupts (a completion on another vCPU than the
    // reader's costs an IPI a read).
    for l in console.lines().filter(|l| l.contains("EXITS-IRQ")) {
        eprintln!("partition: bench exits: {}", l.trim());
    }
    if !console.contains("EXITS-DONE rc=0") {
        let tail: Vec<&str> = console.lines().rev().take(8).collect();
        let shutdowns = shutdowns(&trace);
        return Err(Failed {
            why: format!(
                "the guest did not finish its loops (exit {:?}{}): {} | {}",
                r.status.code(),
                if shutdowns.is_empty() {
                    String::new()
                } else {
                    format!(", a triple fault: shutdown exit on vCPU {shutdowns:?}")
                },
                tail.into_iter().rev().collect::<Vec<_>>().join(" | "),
                r.stderr.lines().last().unwrap_or("")
            ),
            triple_fault: !shutdowns.is_empty(),
        });
    }
    let snaps = snapshots(&trace, MARK_PORT);
    let mut exits = Counts::new();
    let loops = loops(&console);
    for l in &loops {
        let per = per_iteration(&snaps, FIRST_MARK, l)
            .ok_or_else(|| format!("{}: its marks are not all in the trace", l.op))?;
        exits.insert((l.op.clone(), l.part), per);
    }
    Ok(Run {
        exits,
        ipis: ipis_per_iteration(&console, &loops),
        idle,
        routine,
    })
}

/// The value of the first `key` word of a line (`routine=mwait` -> `mwait`).
fn word_after(line: &str, key: &str) -> Option<String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .filter(|v| !v.is_empty())
        .map(String::from)
}

/// The loop our launch's `--json` report (its last line on stdout) predicts a Linux guest
/// idles in: `idle.readback.cpuid.guest_idle.routine`, `mwait`, `hlt` or `poll`.
fn predicted_routine(stdout: &str) -> Option<String> {
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last()?).ok()?;
    report["idle"]["readback"]["cpuid"]["guest_idle"]["routine"]
        .as_str()
        .map(String::from)
}

/// How the guest said it idles: the `idle=` and `gov=` words of its `EXITS-READY` line.
fn guest_idle(line: &str) -> Option<String> {
    let words: Vec<&str> = line
        .split_whitespace()
        .filter(|w| w.starts_with("idle=") || w.starts_with("gov=") || w.starts_with("routine="))
        .collect();
    (!words.is_empty()).then(|| words.join(" "))
}

/// The part of each benchmark that is its operation (the ring of a context switch; the
/// rest are one loop).
fn part_of(op: &str) -> u32 {
    if op.starts_with("ctx_switch") { 1 } else { 0 }
}

/// The name of our partition's rows under idle `policy` (`partition` for `mwait`, the
/// section's first and the rows every reader of results written before knows).
pub fn partition_label(policy: &str) -> String {
    if policy == "mwait" {
        "partition".into()
    } else {
        format!("partition --idle {policy}")
    }
}

/// One VMM a round runs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Vmm {
    /// Ours, under an idle policy.
    Partition(String),
    /// QEMU microvm.
    Qemu,
}

impl Vmm {
    fn name(&self) -> String {
        match self {
            Self::Partition(p) => partition_label(p),
            Self::Qemu => "qemu".into(),
        }
    }
}

/// The section, each loop counted over `n1` then `n2` iterations, our partition once a
/// round under each idle policy of `policies` (none: `mwait` alone).
pub fn run(env: &Env, n1: u64, n2: u64, policies: &[String]) -> ExitsSection {
    let policies: Vec<String> = if policies.is_empty() {
        vec!["mwait".into()]
    } else {
        policies.to_vec()
    };
    let mut head = Head::start(env);
    let mut s = ExitsSection {
        head: Head::default(),
        params: ExitsParams {
            runs: env.runs,
            n1,
            n2,
            ops: OPS.split(',').map(String::from).collect(),
            guest: String::new(),
            vmms: vec![
                "partition: --idle mwait, 2 vCPUs, virtio-blk on virtio-mmio (ioeventfd, io_uring)".into(),
                format!("qemu: microvm -enable-kvm -cpu host -overcommit cpu-pm=on -smp 2 -bios {QEMU_FIRMWARE}, virtio-blk-device (virtio-mmio) with an iothread"),
            ],
            guest_idle: Default::default(),
            idle_routine: Default::default(),
            policies: policies.clone(),
        },
        method: "host tracepoint kvm:kvm_exit over the whole run; per loop (N2-run exits - N1-run exits) / (N2 - N1), by reason".into(),
        minimum: MINIMUM
            .iter()
            .chain(NVME_MINIMUM.iter())
            .map(|(o, w)| (o.to_string(), w.to_string()))
            .collect(),
        rows: Vec::new(),
        failures: Vec::new(),
        replaced: Vec::new(),
    };
    let Some(dir) = env.exits_guest.clone() else {
        head.fail("no guest (--exits-guest DIR with vmlinux and base.cpio; scripts/rig-bench.sh exits makes it)".into());
        s.head = head;
        return s;
    };
    let prepared = prepare(env, &dir, n1, n2);
    let (kernel, initrd, disk) = match prepared {
        Ok(p) => p,
        Err(e) => {
            head.fail(e);
            s.head = head;
            return s;
        }
    };
    s.params.guest = format!(
        "{} with {}, command line \"{GUEST_CMDLINE}\"",
        kernel.display(),
        dir.join("base.cpio").display()
    );
    for p in policies.iter().filter(|p| *p != "mwait") {
        s.params.vmms.push(format!(
            "{}: as partition, the guest idling as --idle {p} has it",
            partition_label(p)
        ));
    }
    let cmdline = GUEST_CMDLINE;
    let mut per: BTreeMap<(String, String), Vec<BTreeMap<String, f64>>> = BTreeMap::new();
    let mut ipis: BTreeMap<(String, String), Vec<BTreeMap<String, f64>>> = BTreeMap::new();
    // The NVMe rows, with a function to pass through: the probe's driver in both VMMs.
    // The NVMe rows, with a function to pass through: the probe's driver in both VMMs (QEMU's
    // run needs the probe as a file).
    let nvme = env.vfio.clone().map(|bdf| {
        s.params.ops.extend(NVME_OPS.map(String::from));
        s.params.vmms.push(format!(
            "nvme_*: the probe guest's driver of {bdf} through VFIO, {NVME_READS} timed reads \
             a loop, one vCPU: partition --device vfio=; qemu: microvm pcie=on, \
             cpu-pm=on, SeaBIOS's microvm build, vfio-pci (the submit-vfio section's runs)"
        ));
        let probe = env.qemu.as_ref().and_then(|_| {
            crate::probe_image(env)
                .inspect_err(|e| s.failures.push(format!("writing the probe image: {e}")))
                .ok()
        });
        (bdf, probe)
    });
    let runs = env.runs.max(1);
    let mut vmms: Vec<Vmm> = policies.iter().cloned().map(Vmm::Partition).collect();
    if env.qemu.is_some() {
        vmms.push(Vmm::Qemu);
    } else {
        s.failures.push(format!("qemu: {}", env.qemu_absent()));
    }
    // Runs each VMM has had that count: a run lost to a triple fault in its guest does not,
    // and is run again in a round of its own, up to SPARE_ROUNDS of them in the section.
    let mut counted: BTreeMap<Vmm, usize> = vmms.iter().map(|v| (v.clone(), 0)).collect();
    let mut spare = SPARE_ROUNDS;
    for round in 0.. {
        let due: Vec<Vmm> = vmms
            .iter()
            .filter(|v| counted[*v] < runs)
            .cloned()
            .collect();
        if due.is_empty() {
            break;
        }
        let state = env.work.join(format!("exits-state-{round}"));
        for vmm in due {
            let name = vmm.name();
            let cmd = match &vmm {
                Vmm::Partition(policy) => {
                    let c = Launch::new(
                        env,
                        &state,
                        &format!("{},{}", env.host_core, env.core),
                        "512M",
                    )
                    .kernel(&kernel, &initrd)
                    .idle(policy)
                    .disk(&disk, "")
                    .cmdline(cmdline)
                    .json()
                    .command();
                    (c, Pin::Nothing)
                }
                Vmm::Qemu => qemu_command(env, &kernel, &initrd, &disk, cmdline),
            };
            // Spawned from where its threads other than the vCPUs are to run.
            let traced = placement(env)
                .from_place(|| traced(cmd))
                .unwrap_or_else(|e| Err(Failed::from(e)));
            match traced {
                Ok(run) => {
                    if let Some(idle) = run.idle {
                        s.params.guest_idle.entry(name.clone()).or_insert(idle);
                    }
                    if let Some(r) = run.routine {
                        s.params.idle_routine.entry(name.clone()).or_insert(r);
                    }
                    for (into, counts) in [(&mut per, run.exits), (&mut ipis, run.ipis)] {
                        for ((op, part), m) in counts {
                            if part == part_of(&op) {
                                into.entry((name.clone(), op)).or_default().push(m);
                            }
                        }
                    }
                }
                Err(f) if f.triple_fault && spare > 0 => {
                    spare -= 1;
                    s.replaced.push(format!("{name} round {round}: {}", f.why));
                    continue;
                }
                Err(f) => s.failures.push(format!("{name} round {round}: {}", f.why)),
            }
            *counted.get_mut(&vmm).expect("a VMM of the section") += 1;
        }
        let _ = std::fs::remove_dir_all(&state);
        // The NVMe loops run in the section's first `runs` rounds (the probe's own guest,
        // not the Linux one whose rounds may be replaced).
        if let Some((bdf, probe)) = &nvme
            && round < runs
        {
            let reads = (NVME_READS + NVME_READS / 10) as u64;
            let mut vmms = vec![("partition", None)];
            vmms.extend(probe.as_deref().map(|p| ("qemu", Some(p))));
            for (vmm, qemu_probe) in vmms {
                let counted = under_trace(|| match qemu_probe {
                    None => crate::submit_vfio::partition_once(env, bdf, NVME_READS).map(drop),
                    Some(p) => {
                        crate::submit_vfio::qemu_once(env, p, bdf, NVME_READS, true).map(drop)
                    }
                })
                .and_then(|((), trace)| {
                    let snaps = snapshots(&trace, MARK_PORT);
                    nvme_per_read(&snaps, reads).ok_or_else(|| {
                        format!(
                            "the probe's six NVMe marks are not in the trace ({} marks)",
                            snaps.len()
                        )
                    })
                });
                match counted {
                    Ok(loops) => {
                        for (op, m) in NVME_OPS.iter().zip(loops) {
                            per.entry((vmm.to_string(), op.to_string()))
                                .or_default()
                                .push(m);
                        }
                    }
                    Err(e) => s.failures.push(format!("{vmm} nvme round {round}: {e}")),
                }
            }
        }
    }
    for ((vmm, op), runs) in per {
        let totals: Vec<f64> = runs.iter().map(|m| m.values().sum()).collect();
        let mut reasons = medians(Some(&runs));
        reasons.retain(|_, v| v.abs() >= 0.0005);
        let guest_ipis = medians(ipis.get(&(vmm.clone(), op.clone())));
        s.rows.push(ExitsRow {
            vmm,
            op,
            guest_ipis,
            total: summary(&totals),
            reasons,
        });
    }
    let _ = std::fs::remove_file(&disk);
    let _ = std::fs::remove_file(&initrd);
    let complete = s.failures.is_empty() && !s.rows.is_empty();
    head.finish(complete, || s.failures.join("; "));
    s.head = head;
    s
}

/// The median of each kind over the runs (none: empty).
fn medians(runs: Option<&Vec<BTreeMap<String, f64>>>) -> BTreeMap<String, f64> {
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for m in runs.into_iter().flatten() {
        for (k, v) in m {
            by.entry(k.clone()).or_default().push(*v);
        }
    }
    by.into_iter()
        .filter_map(|(k, v)| Some((k, summary(&v)?.median)))
        .collect()
}

/// Where both VMMs' threads run: vCPU 0 on the housekeeping core, vCPU 1 on the reserved
/// one, everything else on the housekeeping core.
fn placement(env: &Env) -> Placement {
    Placement {
        vcpus: vec![env.host_core, env.core],
        other: env.host_core,
        join: None,
    }
}

/// QEMU's run of one round: the same kernel, initramfs, disk and command line as ours, on
/// microvm with qboot ([`QEMU_FIRMWARE`]), every idle exit disabled (`cpu-pm=on`), the
/// disk a virtio-blk-device served by an iothread through the host's page cache with
/// io_uring as ours is (`cache=writeback,aio=io_uring`), its threads placed as ours
/// (started paused, vCPUs pinned over QMP).
fn qemu_command(
    env: &Env,
    kernel: &Path,
    initrd: &Path,
    disk: &Path,
    cmdline: &str,
) -> (std::process::Command, Pin) {
    let mut qemu = Microvm {
        pin: None,
        smp: 2,
        mb: 512,
        acpi: true,
        prealloc: false,
        probe: kernel,
        cmdline,
    }
    .command(env);
    qemu.arg("-initrd")
        .arg(initrd)
        .args(["-overcommit", "cpu-pm=on", "-no-reboot"])
        .args(["-bios", QEMU_FIRMWARE])
        .args(["-object", "iothread,id=io0"])
        .arg("-drive")
        .arg(format!(
            "file={},if=none,id=d0,format=raw,cache=writeback,aio=io_uring",
            disk.display()
        ))
        .args(["-device", "virtio-blk-device,drive=d0,iothread=io0"]);
    let pin = placement(env).qemu(&mut qemu, "exits", &env.work.join("exits-qmp.sock"));
    (qemu, pin)
}

/// The largest `base.cpio` the section reads (Debian's userspace initramfs is tens of MiB).
const MAX_BASE: u64 = 1 << 30;

/// The kernel, the initramfs with the overlay (hotpaths from this `partition`), a 64 MiB
/// disk of known bytes.
fn prepare(env: &Env, dir: &Path, n1: u64, n2: u64) -> Result<(PathBuf, PathBuf, PathBuf), String> {
    let kernel = dir.join("vmlinux");
    // Read through the launch's walk (no link the trust rule forbids), bounded: a root-only
    // file linked there never goes into the guest.
    let base = partition::sys::files::read_limited(&dir.join("base.cpio"), MAX_BASE)
        .map_err(|e| format!("{}: {e}", dir.join("base.cpio").display()))?;
    if !kernel.exists() {
        return Err(format!("{}: no such file", kernel.display()));
    }
    let hp = env.work.join("exits-hotpaths");
    let st = std::process::Command::new(&env.partition)
        .arg("hotpaths-binary")
        .arg("-o")
        .arg(&hp)
        .status()
        .map_err(|e| format!("partition hotpaths-binary: {e}"))?;
    let hotpaths = std::fs::read(&hp).map_err(|e| format!("{}: {e} ({st})", hp.display()))?;
    let _ = std::fs::remove_file(&hp);
    let initrd = env.work.join("exits-initrd.cpio");
    std::fs::write(
        &initrd,
        initramfs(&base, &hotpaths, &init_script(n1, n2, OPS)),
    )
    .map_err(|e| format!("{}: {e}", initrd.display()))?;
    let disk = env.work.join("exits-disk.img");
    let mut f = std::fs::File::create(&disk).map_err(|e| format!("{}: {e}", disk.display()))?;
    let block: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    for _ in 0..64 {
        f.write_all(&block)
            .map_err(|e| format!("{}: {e}", disk.display()))?;
    }
    Ok((kernel, initrd, disk))
}

#[cfg(test)]
mod tests {
    use super::*;

    // As the rig's 6.12 kernel prints them (AMD): a port write to the mark port, an MSR
    // write, a host interrupt, and an I/O read of the same port (not a mark).
    const OUT: &str = "  partition-512 [000] d..2.  10.000001: kvm_exit: vcpu 0 reason io rip 0x401000 info1 0x0000000005200210 info2 0x0000000000401002 intr_info 0x00000000 error_code 0x00000000";
    const MSR: &str = "  partition-512 [000] d..2.  10.000002: kvm_exit: vcpu 1 reason msr rip 0xffffffff81000000 info1 0x0000000000000001 info2 0x0000000000000000 intr_info 0x00000000 error_code 0x00000000";
    const INTR: &str = "  partition-512 [001] d..2.  10.000003: kvm_exit: vcpu 0 reason interrupt rip 0x401000 info1 0x0000000000000000 info2 0x0000000000000000 intr_info 0x00000000 error_code 0x00000000";
    const IN: &str = "  partition-512 [000] d..2.  10.000004: kvm_exit: vcpu 0 reason io rip 0x401000 info1 0x0000000005200211 info2 0x0000000000401002 intr_info 0x00000000 error_code 0x00000000";

    #[test]
    fn exits_and_marks_are_read_from_the_trace() {
        assert_eq!(
            exit_of(OUT),
            Some(Exit {
                reason: "io".into(),
                out_port: Some(0x520)
            })
        );
        assert_eq!(exit_of(IN).unwrap().out_port, None);
        assert_eq!(exit_of(MSR).unwrap().reason, "msr");
        assert_eq!(exit_of("  <idle>-0 [000] 1.0: sched_switch: x"), None);
        // Intel prints the exit qualification's direction in bit 3.
        let vmx = "kvm_exit: vcpu 0 reason IO_INSTRUCTION rip 0x1 info1 0x0000000005200003 info2 0x0 intr_info 0x0 error_code 0x0";
        assert_eq!(exit_of(vmx).unwrap().out_port, Some(0x520));
    }

    #[test]
    fn qemu_boots_with_qboot_and_every_idle_exit_disabled() {
        let env = Env::for_tests();
        let (cmd, pin) = qemu_command(
            &env,
            Path::new("/k/vmlinux"),
            Path::new("/k/initrd"),
            Path::new("/k/disk"),
            "console=ttyS0",
        );
        // Placed as ours: paused, its vCPUs one to a core as our --cores puts them.
        assert!(
            matches!(&pin, Pin::QemuPaused { placement, .. }
                if placement.vcpus == [env.host_core, env.core]),
            "{pin:?}"
        );
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let after = |flag: &str| -> Vec<&str> {
            args.windows(2)
                .filter(|w| w[0] == flag)
                .map(|w| w[1].as_str())
                .collect()
        };
        // SeaBIOS (microvm's default with ACPI) parks the AP in a guest-mode HLT.
        assert_eq!(after("-bios"), ["qboot.rom"]);
        assert_eq!(after("-overcommit"), ["cpu-pm=on"]);
        assert_eq!(after("-smp"), ["2"]);
        assert_eq!(after("-M"), ["microvm"]);
        assert_eq!(after("-kernel"), ["/k/vmlinux"]);
        assert_eq!(after("-initrd"), ["/k/initrd"]);
        assert!(after("-drive")[0].starts_with("file=/k/disk,"));
        // The same caching as ours: the host's page cache, io_uring.
        assert!(after("-drive")[0].ends_with(",cache=writeback,aio=io_uring"));
        assert_eq!(
            after("-device").last(),
            Some(&"virtio-blk-device,drive=d0,iothread=io0")
        );
    }

    #[test]
    fn an_nvme_loops_exits_per_read_leave_out_the_marks_own() {
        // Cumulative counts at each mark exit, in the probe's order 5, 6, 1, 2, 3, 4: every
        // mark is one io exit; 22 polled reads take a host interrupt between them (a tick),
        // 22 reads by MSI-X an interrupt exit and an EOI write each.
        let snap = |io: u64, interrupt: u64, msr: u64| {
            let mut m = BTreeMap::new();
            m.insert("io".to_string(), io);
            m.insert("interrupt".to_string(), interrupt);
            if msr > 0 {
                m.insert("msr wr 0x80b".to_string(), msr);
            }
            m
        };
        let snaps = [
            snap(10, 3, 0),
            snap(11, 3, 0),
            snap(12, 3, 0),
            snap(13, 4, 0),
            snap(14, 4, 0),
            snap(15, 26, 22),
        ];
        let [poll, irq] = nvme_per_read(&snaps, 22).unwrap();
        assert_eq!(poll["io"], 0.0);
        assert!((poll["interrupt"] - 1.0 / 22.0).abs() < 1e-9);
        assert_eq!(irq["io"], 0.0);
        assert_eq!(irq["interrupt"], 1.0);
        assert_eq!(irq["msr wr 0x80b"], 1.0);
        assert_eq!(poll["msr wr 0x80b"], 0.0);
        // A trace without all six marks (the guest stopped early) gives nothing.
        assert!(nvme_per_read(&snaps[..5], 22).is_none());
        assert!(nvme_per_read(&snaps, 0).is_none());
        assert_eq!(NVME_MINIMUM.map(|(o, _)| o), NVME_OPS);
    }

    #[test]
    fn a_triple_fault_is_named_by_its_vcpu() {
        let shut = "  qemu-system-x86-77 [001] d..2.  12.5: kvm_exit: vcpu 1 reason shutdown rip 0xffffffff81073916 info1 0x0 info2 0x0 intr_info 0x80000b0e error_code 0x00000010";
        let vmx = "kvm_exit: vcpu 0 reason TRIPLE_FAULT rip 0x1 info1 0x0 info2 0x0 intr_info 0x0 error_code 0x0";
        let trace = [OUT, MSR, shut, INTR, vmx].join("\n");
        assert_eq!(shutdowns(&trace), [1, 0]);
        assert!(shutdowns(&[OUT, MSR, INTR].join("\n")).is_empty());
    }

    #[test]
    fn the_guests_ipis_per_iteration_are_the_difference_of_its_two_runs() {
        let console = "hotpaths-count op=pipe_2cores part=0 mark=4136 n1=50 n2=550\n\
                       hotpaths-ipis op=pipe_2cores part=0 res=100,110,110,130 cal=7,57,57,557\n\
                       hotpaths-ipis op=unknown part=0 res=1,2,3,4 cal=1,2,3,4\n\
                       hotpaths-ipis op=pipe_2cores part=1 res=1,2 cal=x\n";
        let l = loops(console);
        let got = ipis_per_iteration(console, &l);
        assert_eq!(got.len(), 1, "{got:?}");
        let m = &got[&("pipe_2cores".to_string(), 0)];
        // RES: (20 - 10) / 500; CAL: (500 - 50) / 500.
        assert!((m["RES"] - 0.02).abs() < 1e-9, "{m:?}");
        assert!((m["CAL"] - 0.9).abs() < 1e-9, "{m:?}");
    }

    #[test]
    fn the_guests_idle_loop_and_the_launchs_prediction_are_read() {
        let ready = "EXITS-READY cpus=2 idle= gov= routine=mwait";
        assert_eq!(word_after(ready, "routine=").as_deref(), Some("mwait"));
        assert_eq!(word_after("EXITS-READY routine=", "routine="), None);
        assert_eq!(
            guest_idle(ready).as_deref(),
            Some("idle= gov= routine=mwait")
        );
        // The launch's --json report is the last line of its stdout, after the console.
        let stdout = "EXITS-DONE rc=0\n{\"idle\":{\"readback\":{\"cpuid\":{\"guest_idle\":{\"routine\":\"hlt\",\"why\":\"leaf 5 counts no C1\"}}}}}\n";
        assert_eq!(predicted_routine(stdout).as_deref(), Some("hlt"));
        assert_eq!(predicted_routine("EXITS-DONE rc=0\n{\"idle\":{}}"), None);
        // Its English sentences are not read.
        let said = "a Linux guest (6.0 on) idles in HLT without a cpuidle driver: x";
        assert_eq!(predicted_routine(said), None);
        assert_eq!(partition_label("mwait"), "partition");
        assert_eq!(partition_label("hlt"), "partition --idle hlt");
    }

    #[test]
    fn the_guests_idle_driver_is_read_from_its_ready_line() {
        assert_eq!(
            guest_idle("EXITS-READY cpus=2 idle=haltpoll gov=menu").as_deref(),
            Some("idle=haltpoll gov=menu")
        );
        assert_eq!(
            guest_idle("EXITS-READY cpus=2 idle= gov=").as_deref(),
            Some("idle= gov=")
        );
        assert_eq!(guest_idle("EXITS-READY cpus=2"), None);
    }

    #[test]
    fn a_loops_exits_per_iteration_are_the_difference_of_its_two_runs() {
        // Marks 0..3: N1 = 10 iterations cost 10 msr and 1 intr; N2 = 110 cost 210 msr and
        // 1 intr: 2 msr an iteration, no intr; the closing marks' io exits cancel.
        let mut t = Vec::new();
        t.push(OUT); // mark 0
        t.extend(std::iter::repeat_n(MSR, 10));
        t.push(INTR);
        t.push(OUT); // mark 1
        t.push(IN);
        t.push(OUT); // mark 2
        t.extend(std::iter::repeat_n(MSR, 210));
        t.push(INTR);
        t.push(OUT); // mark 3
        let trace = t.join("\n");
        let snaps = snapshots(&trace, 0x520);
        assert_eq!(snaps.len(), 4);
        let console = "noise\nhotpaths-count op=null_syscall part=0 mark=4096 n1=10 n2=110\n";
        let l = &loops(console)[0];
        assert_eq!(
            (l.op.as_str(), l.mark, l.n1, l.n2),
            ("null_syscall", 4096, 10, 110)
        );
        let per = per_iteration(&snaps, FIRST_MARK, l).unwrap();
        assert_eq!(per["msr"], 2.0);
        // With kvm_msr events after the msr exits on their CPUs: counted by MSR.
        let wr = "  partition-512 [000] d..2.  10.000002: kvm_msr: msr_write 830 = 0x4000000fd";
        let t2 = [MSR, wr, MSR, wr, MSR, INTR, OUT].join("\n");
        let s2 = snapshots(&t2, 0x520);
        assert_eq!(s2.len(), 1);
        assert_eq!(s2[0]["msr wr 0x830"], 2, "{:?}", s2[0]);
        // The third msr exit had no event before the next exit on its CPU (the mark's):
        // plain msr.
        assert_eq!(s2[0]["msr"], 1, "{:?}", s2[0]);
        assert_eq!(s2[0]["interrupt"], 1, "{:?}", s2[0]);
        assert_eq!(per["interrupt"], 0.0);
        assert_eq!(per["io"], 0.0);
        // A loop whose marks are not all there: None.
        let later = Loop {
            mark: FIRST_MARK + 4,
            ..l.clone()
        };
        assert_eq!(per_iteration(&snaps, FIRST_MARK, &later), None);
    }

    #[test]
    fn the_overlay_follows_the_base_archive_and_names_init_and_hotpaths() {
        let base = b"0707010000base".to_vec();
        let out = initramfs(&base, b"\x7fELF", &init_script(5, 50, "null_syscall"));
        assert!(out.starts_with(&base));
        let text = String::from_utf8_lossy(&out);
        for want in [
            "bin/hotpaths",
            "init\0",
            "TRAILER!!!",
            "--count 5,50 --mark-port 0x520",
            "--only null_syscall",
        ] {
            assert!(text.contains(want), "{want}");
        }
        assert_eq!(out.len() % 4, 0);
        assert_eq!(MINIMUM.len(), OPS.split(',').count());
        assert!(OPS.split(',').all(|o| MINIMUM.iter().any(|(m, _)| *m == o)));
    }
}
