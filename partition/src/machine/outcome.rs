//! How a partition stopped, in one type with its exit status ([`Outcome`]), and the launch
//! report as a document a program reads instead of the VMM's sentences ([`document`],
//! printed by `partition launch --json`).

use super::open::Checked;
use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use boot::BootInfo;
use pool::{Backing, RamSource};

use super::config::MemorySource;
use crate::cpu::cpumodel::CpuModel;
use crate::cpu::exits::{StopReason, VcpuCounters};
use crate::cpu::idle::IdlePlan;
use crate::cpu::readback::Readback;
use crate::sys::sandbox::Identity;

/// Exit statuses of `partition launch` (and of every other verb where they apply).
pub mod status {
    /// The guest powered off with status 0 (or reset).
    pub const OK: u8 = 0;
    /// The VMM failed (KVM, threads, a vCPU that could not run).
    pub const VMM_ERROR: u8 = 1;
    /// The user's input was refused; nothing was created.
    pub const USAGE: u8 = 2;
    /// The guest crashed: triple fault, KVM internal error, failed entry, crash event.
    pub const GUEST_CRASH: u8 = 3;
    /// The guest powered off with a non-zero status.
    pub const GUEST_FAILED: u8 = 4;
}

/// How a partition stopped. Every way out of a launch that ran is one of these.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The guest powered off with `status`.
    PowerOff {
        /// The vCPU that did it.
        vcpu: usize,
        /// Its status (ACPI power-off is 0; the exit-status port gives others).
        status: u8,
    },
    /// The guest asked for a reset (a partition stops on reset).
    Reset {
        /// The vCPU that did it.
        vcpu: usize,
    },
    /// A triple fault.
    TripleFault {
        /// The vCPU.
        vcpu: usize,
        /// Where: RIP and the instruction bytes there.
        site: String,
    },
    /// KVM reported an internal error the VMM did not assist.
    InternalError {
        /// The vCPU.
        vcpu: usize,
        /// Sub-error, why no assist, RIP and instruction bytes.
        detail: String,
    },
    /// VM entry failed.
    FailEntry {
        /// The vCPU.
        vcpu: usize,
        /// Hardware entry-failure reason.
        reason: u64,
    },
    /// The guest reported a crash (a system event).
    Crash {
        /// The vCPU.
        vcpu: usize,
    },
    /// An exit the VMM does not handle.
    Unhandled {
        /// The vCPU.
        vcpu: usize,
        /// Which exit.
        detail: String,
    },
    /// A vCPU thread could not run (pinning, KVM_RUN, the SYSCALL repair).
    VcpuFailed {
        /// The vCPU.
        vcpu: usize,
        /// Why.
        detail: String,
    },
    /// A vCPU stopped because it was asked to, with nothing else recorded.
    Stopped {
        /// The vCPU.
        vcpu: usize,
    },
    /// The VMM received a stop signal.
    Signal {
        /// The signal number.
        signal: i32,
    },
    /// The local API asked for a clean stop.
    StopRequested,
}

impl Outcome {
    /// The outcome of a launch that ended this way.
    pub fn of(ending: &Ending) -> Self {
        let (vcpu, reason) = match ending {
            Ending::Signal(signal) => return Self::Signal { signal: *signal },
            Ending::Requested => return Self::StopRequested,
            Ending::Guest { vcpu, reason } => (*vcpu, reason),
        };
        match reason {
            StopReason::PowerOff(status) => Self::PowerOff {
                vcpu,
                status: *status,
            },
            StopReason::Reset => Self::Reset { vcpu },
            StopReason::TripleFault(site) => Self::TripleFault {
                vcpu,
                site: site.clone(),
            },
            StopReason::InternalError(d) => Self::InternalError {
                vcpu,
                detail: d.clone(),
            },
            StopReason::FailEntry(reason) => Self::FailEntry {
                vcpu,
                reason: *reason,
            },
            StopReason::Crash => Self::Crash { vcpu },
            StopReason::Unhandled(d) => Self::Unhandled {
                vcpu,
                detail: d.clone(),
            },
            StopReason::RunError(d) => Self::VcpuFailed {
                vcpu,
                detail: d.clone(),
            },
            StopReason::Kicked => Self::Stopped { vcpu },
        }
    }

    /// The exit status `partition launch` ends with.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::PowerOff { status: 0, .. } | Self::Reset { .. } | Self::StopRequested => {
                status::OK
            }
            Self::PowerOff { .. } => status::GUEST_FAILED,
            Self::TripleFault { .. }
            | Self::InternalError { .. }
            | Self::FailEntry { .. }
            | Self::Crash { .. }
            | Self::Unhandled { .. } => status::GUEST_CRASH,
            Self::VcpuFailed { .. } | Self::Stopped { .. } => status::VMM_ERROR,
            Self::Signal { signal } => 128u8.wrapping_add(*signal as u8),
        }
    }

    /// The sentence the CLI prints, without the time.
    pub fn describe(&self) -> String {
        let on = |what: String, vcpu: &usize| format!("{what} on vcpu{vcpu}");
        match self {
            Self::PowerOff { vcpu, status: 0 } => on("guest powered off (status 0)".into(), vcpu),
            Self::PowerOff { vcpu, status } => on(
                format!("guest powered off with failure status {status}"),
                vcpu,
            ),
            Self::Reset { vcpu } => on("guest reset (a partition stops on reset)".into(), vcpu),
            Self::TripleFault { vcpu, site } if !site.is_empty() => {
                on(format!("guest triple-faulted ({site})"), vcpu)
            }
            Self::TripleFault { vcpu, .. } => on("guest triple-faulted".into(), vcpu),
            Self::InternalError { vcpu, detail } => {
                on(format!("KVM internal error: {detail}"), vcpu)
            }
            Self::FailEntry { vcpu, reason } => on(
                format!("VM entry failed, hardware reason {reason:#x}"),
                vcpu,
            ),
            Self::Crash { vcpu } => on("guest reported a crash".into(), vcpu),
            Self::Unhandled { vcpu, detail } => on(format!("unhandled exit: {detail}"), vcpu),
            Self::VcpuFailed { vcpu, detail } => on(format!("vCPU failed: {detail}"), vcpu),
            Self::Stopped { vcpu } => on("stopped".into(), vcpu),
            Self::Signal { signal } => format!("stopped by signal {signal}"),
            Self::StopRequested => "stopped through the API".into(),
        }
    }
}

/// The outcome with its exit status.
#[derive(Clone, Debug, Serialize)]
pub struct OutcomeDoc {
    /// How it stopped.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// `partition launch`'s exit status.
    pub exit_code: u8,
    /// The sentence the CLI printed.
    pub description: String,
}

/// Stage durations in milliseconds.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TimingsDoc {
    /// Getting guest memory.
    pub memory_ms: f64,
    /// VM creation, irqchip, memory slots.
    pub vm_ms: f64,
    /// Kernel load and boot structures.
    pub boot_ms: f64,
    /// Devices and vCPU creation.
    pub vcpus_ms: f64,
    /// From the start of the launch to the guest's first serial byte (none if it printed
    /// nothing).
    pub first_output_ms: Option<f64>,
    /// From the process's `main` to the guest's first serial byte.
    pub wall_to_first_byte_ms: Option<f64>,
    /// The VMM's CPU time (all its threads) over the same span.
    pub cpu_to_first_byte_ms: Option<f64>,
    /// Where that went, phase by phase, in order (`partition::sys::timeline`); they add up to
    /// `wall_to_first_byte_ms` and their `cpu_ms` to `cpu_to_first_byte_ms`.
    pub timeline: Vec<crate::sys::timeline::Phase>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl From<&Timings> for TimingsDoc {
    fn from(t: &Timings) -> Self {
        Self {
            memory_ms: ms(t.memory),
            vm_ms: ms(t.vm),
            boot_ms: ms(t.boot),
            vcpus_ms: ms(t.vcpus),
            first_output_ms: t.first_output.map(ms),
            wall_to_first_byte_ms: t.wall_to_first_byte_ms,
            cpu_to_first_byte_ms: t.cpu_to_first_byte_ms,
            timeline: t.phases.clone(),
        }
    }
}

/// One vCPU's counters.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct VcpuDoc {
    /// Its counters at the end: the record the API and the ledger give too.
    #[serde(flatten)]
    pub counters: VcpuCounters,
    /// The guest's marks, in order: what the VMM and KVM had counted at each (what a loop
    /// between two marks cost is their difference).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<MarkDoc>,
}

/// The counters at one of the guest's marks.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MarkDoc {
    /// What the guest wrote to the mark port.
    pub mark: u32,
    /// Exits that reached the VMM so far, by reason (the mark's own included).
    pub exits: BTreeMap<String, u64>,
    /// KVM's statistics then (its `exits`, `io_exits`, `mmio_exits`, `irq_exits`, ...,
    /// the mark's own exit included): what KVM itself counted, the exits it handled
    /// without the VMM too.
    pub kvm: BTreeMap<String, u64>,
}

impl From<&VcpuReport> for VcpuDoc {
    fn from(v: &VcpuReport) -> Self {
        let map = |p: &[(&'static str, u64)]| p.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        Self {
            counters: v.counters.clone(),
            marks: v
                .marks
                .iter()
                .map(|m| MarkDoc {
                    mark: m.id,
                    exits: map(&m.exits),
                    kvm: m.kvm.clone(),
                })
                .collect(),
        }
    }
}

/// The idle plan in force.
#[derive(Clone, Debug, Serialize)]
pub struct IdleDoc {
    /// The policy (`hlt`, `haltpoll`, ...).
    pub policy: &'static str,
    /// Why this one.
    pub reason: String,
    /// KVM_X86_DISABLE_EXITS_* bits set.
    pub disable_exits: u32,
    /// Per-VM halt polling set (none: the host's default).
    pub halt_poll_ns: Option<u32>,
    /// MONITOR/MWAIT shown to the guest.
    pub expose_mwait: bool,
    /// KVM_HINTS_REALTIME set.
    pub hints_realtime: bool,
    /// The words the policy added to the guest's command line (`cpuidle.off=1` under
    /// `mwait`, `idle=poll` under `poll`; empty otherwise).
    pub cmdline: &'static str,
    /// What KVM reported back about the plan.
    pub readback: crate::cpu::readback::Readback,
}

/// What the guest was told about its CPU.
#[derive(Clone, Debug, Serialize)]
pub struct CpuModelDoc {
    /// `host` or `nested-safe`.
    pub name: &'static str,
    /// Why.
    pub why: String,
    /// Features hidden.
    pub hidden: Vec<&'static str>,
    /// Words put on the guest's command line.
    pub cmdline: String,
    /// Whether SYSCALL is repaired.
    pub syscall_repair: bool,
    /// Hidden features the host showed in CPUID anyway.
    pub shown_anyway: Vec<&'static str>,
}

/// A partition's extent and its scrub.
#[derive(Clone, Debug, Serialize)]
pub struct PoolDoc {
    /// Partition name.
    pub name: String,
    /// Extent offset in the pool.
    pub offset: u64,
    /// Extent length.
    pub len: u64,
    /// Time spent zeroing it after the guest stopped.
    pub scrub_ms: f64,
}

/// The launch report, for `partition launch --json`.
#[derive(Clone, Debug, Serialize)]
pub struct ReportDoc {
    /// How it stopped, and the exit status.
    pub outcome: OutcomeDoc,
    /// From the first KVM_RUN to teardown, in seconds.
    pub ran_for_s: f64,
    /// Stage durations.
    pub timings: TimingsDoc,
    /// The guest's memory and its backing.
    pub memory: MemoryReport,
    /// Kernel entry point used.
    pub entry_addr: u64,
    /// Guest address of the ACPI RSDP.
    pub rsdp: u64,
    /// The kernel command line the guest was given.
    pub cmdline: String,
    /// The idle plan and its read-back.
    pub idle: IdleDoc,
    /// APIC virtualization: the host's (module parameters) and what this VM did so that
    /// KVM has no reason of ours to inhibit it (`active` is always null: KVM does not say).
    pub apic: crate::kvm::apic::VmApic,
    /// The CPU model.
    pub cpu_model: CpuModelDoc,
    /// Per-vCPU counters.
    pub vcpus: Vec<VcpuDoc>,
    /// Each device kind's entries under its key (`disks`: each disk's queue counters;
    /// `engine`: the submission engine's BARs and how each was served, commands executed,
    /// its error; `passthrough`: the passed-through functions in `--device` order, each
    /// one's BARs, vectors, interrupts).
    #[serde(flatten)]
    pub devices: serde_json::Map<String, serde_json::Value>,
    /// The 64-bit PCI BAR window the guest was told of, `[start, end)` (sized from the
    /// passed-through BARs, within the guest's physical address width).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_window64: Option<(u64, u64)>,
    /// Lines of the guest's console that reported a process killed by a fatal signal or a
    /// kernel Oops (a Linux guest's `segfault at`, `print-fatal-signals=1`'s line).
    pub guest_fault_lines: u64,
    /// For a partition from the pool: its extent.
    pub pool: Option<PoolDoc>,
    /// Who the VMM ran as after setup (`null` with `--no-sandbox`: root, unfiltered).
    pub sandbox: Option<crate::sys::sandbox::Identity>,
}

/// The report as a document.
pub fn document(r: &LaunchReport) -> ReportDoc {
    let outcome = Outcome::of(&r.ending);
    ReportDoc {
        outcome: OutcomeDoc {
            exit_code: outcome.exit_code(),
            description: outcome.describe(),
            outcome,
        },
        ran_for_s: r.ran_for.as_secs_f64(),
        timings: (&r.timings).into(),
        memory: r.memory.clone(),
        entry_addr: r.boot.entry_addr,
        rsdp: r.boot.rsdp,
        cmdline: r.cmdline.clone(),
        idle: IdleDoc {
            policy: r.idle.policy.name(),
            reason: r.idle.reason.clone(),
            disable_exits: r.idle.disable_exits.bits(),
            halt_poll_ns: r.idle.halt_poll_ns,
            expose_mwait: r.idle.expose_mwait,
            hints_realtime: r.idle.hints_realtime,
            cmdline: r.idle.cmdline,
            readback: r.idle_readback.clone(),
        },
        apic: r.apic.clone(),
        cpu_model: CpuModelDoc {
            name: r.cpu_model.name,
            why: r.cpu_model.why.clone(),
            hidden: r.cpu_model.hidden.iter().map(|f| f.name).collect(),
            cmdline: r.cpu_model.cmdline.clone(),
            syscall_repair: r.cpu_model.syscall_repair,
            shown_anyway: r.cpu_model_shown_anyway.clone(),
        },
        vcpus: r.vcpus.iter().map(VcpuDoc::from).collect(),
        devices: crate::board::device::sections(&crate::board::spec::sections(), &r.devices),
        pci_window64: r.pci_window64,
        guest_fault_lines: r.guest_fault_lines,
        pool: r.pool.as_ref().map(|p| PoolDoc {
            name: p.name.clone(),
            offset: p.offset,
            len: p.len,
            scrub_ms: ms(p.scrub),
        }),
        sandbox: r.sandbox.clone(),
    }
}

/// How the partition ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// vCPU `vcpu` stopped for `reason`.
    Guest {
        /// Which vCPU.
        vcpu: usize,
        /// Why.
        reason: StopReason,
    },
    /// The VMM received a signal.
    Signal(i32),
    /// The local API asked for a clean stop.
    Requested,
}

/// Per-vCPU summary.
#[derive(Clone, Debug)]
pub struct VcpuReport {
    /// Its counters: exits that reached the VMM, instructions assisted (see
    /// [`crate::cpu::assist`]), KVM's statistics.
    pub counters: VcpuCounters,
    /// The guest's marks ([`crate::cpu::exits::MARK_PORT`]), each with the counters then.
    pub marks: Vec<crate::cpu::exits::Mark>,
}

/// What happened.
#[derive(Clone, Debug)]
pub struct LaunchReport {
    /// How it ended.
    pub ending: Ending,
    /// Boot details.
    pub boot: BootInfo,
    /// The kernel command line the guest was given (the CPU model's and idle policy's
    /// words included).
    pub cmdline: String,
    /// The guest's memory and what backs it.
    pub memory: MemoryReport,
    /// From the first KVM_RUN to teardown.
    pub ran_for: Duration,
    /// Per-vCPU exit counters.
    pub vcpus: Vec<VcpuReport>,
    /// Where the time went before the guest ran, and when it first spoke.
    pub timings: Timings,
    /// For a partition from the pool: its name, extent and how long scrubbing took.
    pub pool: Option<PoolOutcome>,
    /// The idle plan in force.
    pub idle: IdlePlan,
    /// What KVM reported back about it.
    pub idle_readback: Readback,
    /// What the VM did so that KVM has no reason of ours to inhibit APIC virtualization.
    pub apic: crate::kvm::apic::VmApic,
    /// The CPU model in force.
    pub cpu_model: CpuModel,
    /// The features it hides that the host shows in CPUID anyway (so only the command line
    /// hides them).
    pub cpu_model_shown_anyway: Vec<&'static str>,
    /// Each device's entry, in the order they were given back: the disks, the engine
    /// (`--device engine`), the passed-through functions (`--device vfio=`).
    pub devices: Vec<crate::board::device::DeviceReport>,
    /// The 64-bit PCI BAR window announced to the guest (with `--device`).
    pub pci_window64: Option<(u64, u64)>,
    /// Lines of the guest's console reporting a process killed by a fatal signal or a
    /// kernel Oops (`console::FAULT_LINES`).
    pub guest_fault_lines: u64,
    /// Who the VMM ran as once the guest ran (None: `--no-sandbox`).
    pub sandbox: Option<Identity>,
}

/// The guest's memory and what backs it, as data.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemoryReport {
    /// Guest RAM in bytes.
    pub bytes: u64,
    /// `anonymous`, `prefault`, `hugetlb`, `pool` or `volume` (a pod's hugetlbfs).
    pub backing: &'static str,
    /// Page size of the backing.
    pub page_size: u64,
    /// For `pool`: the extent of the pool file, (offset, length).
    pub pool_extent: Option<(u64, u64)>,
    /// The same in words.
    pub description: String,
}

impl MemoryReport {
    pub(super) fn of(ram: &RamSource, source: &MemorySource, bytes: u64) -> Self {
        let (backing, pool_extent) = match (ram, source) {
            (_, MemorySource::Volume(_)) => ("volume", None),
            (RamSource::Anonymous(Backing::Anonymous), _) => ("anonymous", None),
            (RamSource::Anonymous(Backing::AnonymousPopulated), _) => ("prefault", None),
            (RamSource::Anonymous(Backing::Hugetlb), _) => ("hugetlb", None),
            (RamSource::Extent(e), _) => ("pool", Some((e.extent().offset, e.extent().len))),
        };
        Self {
            bytes,
            backing,
            page_size: ram.page_size(),
            pool_extent,
            description: ram.describe(),
        }
    }
}

/// What a pool-backed launch did with its extent.
#[derive(Clone, Debug)]
pub struct PoolOutcome {
    /// Partition name.
    pub name: String,
    /// Extent offset.
    pub offset: u64,
    /// Extent length.
    pub len: u64,
    /// Time spent zeroing the extent after the guest stopped.
    pub scrub: Duration,
}

/// Stage durations of a launch, measured inside the VMM.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// Getting guest memory (mmap, prefault, vm-memory regions).
    pub memory: Duration,
    /// VM creation, irqchip, memslots.
    pub vm: Duration,
    /// Kernel load and boot structures.
    pub boot: Duration,
    /// Devices and vCPU creation.
    pub vcpus: Duration,
    /// From the start of `run` to the guest's first serial byte.
    pub first_output: Option<Duration>,
    /// From the process's `main` to the guest's first serial byte, ms (None: no byte, or
    /// the timeline was not started).
    pub wall_to_first_byte_ms: Option<f64>,
    /// The process's CPU time (all threads) over the same span, ms.
    pub cpu_to_first_byte_ms: Option<f64>,
    /// Where that time went, phase by phase (`crate::sys::timeline`): they add up to it.
    pub phases: Vec<crate::sys::timeline::Phase>,
}

/// Progress callbacks so callers can say (or record) what is happening while it happens.
pub trait Observer {
    /// Boot structures are written; vCPUs start next.
    fn booting(&self, _checked: &Checked, _boot: &BootInfo, _memory: &str) {}
    /// The guest is about to run: every thread is confined, the vCPU threads start next.
    fn running(&self) {}
    /// About once a second while the guest runs.
    fn tick(&self, _vcpus: &[VcpuReport]) {}
}

impl Observer for () {}

impl LaunchReport {
    /// What the launch prints on stderr when it ends, one sentence a line (the CLI puts
    /// `partition: ` before each): how it ended, the disks, the engine, the idle and CPU
    /// model read-back, the pool extent given back, with `timings` where the time went, and
    /// each vCPU's exits and assists.
    pub fn sentences(&self, timings: bool) -> Vec<String> {
        let mut out = Vec::new();
        let secs = self.ran_for.as_secs_f64();
        let outcome = Outcome::of(&self.ending);
        out.push(format!("{} after {secs:.3} s", outcome.describe()));
        for d in &self.devices {
            out.extend(d.sentences.iter().cloned());
        }
        for line in &self.idle_readback.lines() {
            out.push(format!("read back: {line}"));
        }
        out.push(self.apic.sentence());
        if let Some(note) = self
            .cpu_model
            .shown_anyway_note(&self.cpu_model_shown_anyway)
        {
            out.push(format!("read back: {note}"));
        }
        if let Some(p) = &self.pool {
            out.push(format!(
                "{}: extent {:#x}+{:#x} scrubbed in {:.1} ms and returned to the pool",
                p.name,
                p.offset,
                p.len,
                p.scrub.as_secs_f64() * 1e3
            ));
        }
        if timings {
            let t = &self.timings;
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            out.push(format!(
                "timings memory_ms={:.3} vm_ms={:.3} boot_ms={:.3} vcpus_ms={:.3} first_output_ms={}",
                ms(t.memory),
                ms(t.vm),
                ms(t.boot),
                ms(t.vcpus),
                t.first_output
                    .map_or("none".into(), |d| format!("{:.3}", ms(d)))
            ));
            if let Some(wall) = t.wall_to_first_byte_ms {
                let phases: Vec<String> = t
                    .phases
                    .iter()
                    .map(|p| format!("{}={:.3}/{:.3}", p.phase, p.ms, p.cpu_ms))
                    .collect();
                eprintln!(
                    "partition: timeline to the first byte, ms wall/CPU (from main): {} \
                     sum={:.3}/{:.3} wall={wall:.3} cpu={:.3}",
                    phases.join(" "),
                    t.phases.iter().map(|p| p.ms).sum::<f64>(),
                    t.phases.iter().map(|p| p.cpu_ms).sum::<f64>(),
                    t.cpu_to_first_byte_ms.unwrap_or_default()
                );
            }
        }
        for v in self.vcpus.iter().map(|v| &v.counters) {
            let exits: Vec<String> = v
                .exits
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            out.push(format!(
                "vcpu{} (core {}) exits: {}",
                v.vcpu,
                v.core,
                if exits.is_empty() {
                    "none".to_string()
                } else {
                    exits.join(" ")
                }
            ));
            let assists: Vec<String> = v
                .assists
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            if !assists.is_empty() {
                out.push(format!("vcpu{} assists: {}", v.vcpu, assists.join(" ")));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ending_has_one_outcome_and_exit_status() {
        let g = |reason| Ending::Guest { vcpu: 1, reason };
        let cases = [
            (g(StopReason::PowerOff(0)), status::OK, "power_off"),
            (
                g(StopReason::PowerOff(7)),
                status::GUEST_FAILED,
                "power_off",
            ),
            (g(StopReason::Reset), status::OK, "reset"),
            (
                g(StopReason::TripleFault("RIP 0x200000 bytes 0f 0b".into())),
                status::GUEST_CRASH,
                "triple_fault",
            ),
            (
                g(StopReason::InternalError("suberror 1".into())),
                status::GUEST_CRASH,
                "internal_error",
            ),
            (
                g(StopReason::FailEntry(0x21)),
                status::GUEST_CRASH,
                "fail_entry",
            ),
            (g(StopReason::Crash), status::GUEST_CRASH, "crash"),
            (
                g(StopReason::Unhandled("nmi".into())),
                status::GUEST_CRASH,
                "unhandled",
            ),
            (
                g(StopReason::RunError("pinning".into())),
                status::VMM_ERROR,
                "vcpu_failed",
            ),
            (g(StopReason::Kicked), status::VMM_ERROR, "stopped"),
            (Ending::Signal(15), 143, "signal"),
            (Ending::Requested, status::OK, "stop_requested"),
        ];
        for (ending, code, kind) in cases {
            let o = Outcome::of(&ending);
            assert_eq!(o.exit_code(), code, "{o:?}");
            let v = serde_json::to_value(&o).unwrap();
            assert_eq!(v["kind"], kind, "{v}");
        }
        let o = Outcome::of(&g(StopReason::PowerOff(7)));
        assert_eq!(
            serde_json::to_value(&o).unwrap(),
            serde_json::json!({"kind": "power_off", "vcpu": 1, "status": 7})
        );
        assert_eq!(
            o.describe(),
            "guest powered off with failure status 7 on vcpu1"
        );
        assert_eq!(
            Outcome::Signal { signal: 2 }.describe(),
            "stopped by signal 2"
        );
    }

    #[test]
    fn timings_and_vcpus_become_plain_numbers_and_maps() {
        let t = Timings {
            memory: Duration::from_micros(1500),
            vm: Duration::from_millis(2),
            boot: Duration::ZERO,
            vcpus: Duration::from_millis(1),
            first_output: None,
            wall_to_first_byte_ms: None,
            cpu_to_first_byte_ms: None,
            phases: Vec::new(),
        };
        let d = TimingsDoc::from(&t);
        assert_eq!((d.memory_ms, d.vm_ms, d.first_output_ms), (1.5, 2.0, None));
        let map = |p: &[(&str, u64)]| p.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        let v = VcpuReport {
            counters: VcpuCounters {
                vcpu: 0,
                core: 3,
                exits: map(&[("io_out", 5), ("hlt", 0)]),
                kvm: map(&[("halt_exits", 9)]),
                assists: map(&[("int3", 1)]),
            },
            marks: Vec::new(),
        };
        let j = serde_json::to_value(VcpuDoc::from(&v)).unwrap();
        // No marks: no key (the report of a guest that marks nothing is as it was).
        assert!(j.get("marks").is_none(), "{j}");
        assert_eq!(j["exits"]["io_out"], 5);
        assert_eq!(j["exits"]["hlt"], 0);
        assert_eq!(j["assists"]["int3"], 1);
        assert_eq!(j["kvm"]["halt_exits"], 9);
        assert_eq!(j["core"], 3);
        assert_eq!(j["vcpu"], 0);
        // The report's vCPU is the one record, flattened: what the API and ledger read.
        let back: VcpuCounters = serde_json::from_value(j).unwrap();
        assert_eq!(back, v.counters);
    }
}
