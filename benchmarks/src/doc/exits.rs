//! `exits`' document: the exits each kernel hot path takes on real KVM, counted by the host
//! kernel's tracepoint, in our partition and in QEMU with the same guest and workload,
//! beside the least the hardware allows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::head::Head;
use crate::stats::Summary;

/// The `exits` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExitsSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// What was run.
    pub params: ExitsParams,
    /// How the exits were counted.
    pub method: String,
    /// Per operation, the least exits an iteration can take on AMD hardware without AVIC,
    /// and why (docs/measurement.md).
    pub minimum: Vec<(String, String)>,
    /// One per VMM and operation.
    pub rows: Vec<ExitsRow>,
    /// Runs that gave nothing, and why.
    pub failures: Vec<String>,
    /// Runs lost to a triple fault in the guest (a shutdown exit KVM counted on a vCPU: the
    /// rig's TCG, below both VMMs) and run again in a round of their own, and why; the rows
    /// are over the runs that finished (absent from results written before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaced: Vec<String>,
}

/// What `exits` ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExitsParams {
    /// Rounds (each VMM once a round).
    pub runs: usize,
    /// Iterations of each loop's first counted run.
    pub n1: u64,
    /// Of its second.
    pub n2: u64,
    /// The operations (hotpaths' names).
    pub ops: Vec<String>,
    /// The guest kernel and initramfs.
    pub guest: String,
    /// How each VMM ran.
    pub vmms: Vec<String>,
    /// VMM -> how its guest idles, as the guest said at its start (`idle=` its cpuidle
    /// driver, `gov=` the governor): the wake-up rows' timer writes and IPIs depend on it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub guest_idle: std::collections::BTreeMap<String, String>,
    /// VMM -> the idle loop the guest's kernel took, from its own boot log (`mwait`: "using
    /// mwait in idle threads"; `poll`: "using polling idle threads"; `default`: neither, its
    /// HLT), beside the launch's prediction from the CPUID KVM gave back (ours only).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub idle_routine: std::collections::BTreeMap<String, IdleRoutineSeen>,
    /// The idle policies our partition ran under, one row set each (`partition` is
    /// `--idle mwait`; another policy's rows are `partition --idle P`). Absent from
    /// results written before: mwait alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
}

/// Which idle loop a guest took, in its words and as predicted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdleRoutineSeen {
    /// From the guest's boot log: `mwait`, `poll` or `default`.
    pub guest: String,
    /// The launch's `--json` prediction (`idle.readback.cpuid.guest_idle.routine`: `mwait`,
    /// `hlt`, `poll`; results merged before 2026-12-07 say `MWAIT`, `HLT`, `a polling loop`,
    /// from its sentence), where it made one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<String>,
}

/// One VMM's exits per iteration of one operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExitsRow {
    /// `partition` or `qemu`.
    pub vmm: String,
    /// The operation.
    pub op: String,
    /// All exits per iteration, over the rounds.
    pub total: Option<Summary>,
    /// The median per iteration of each reason that is not 0.
    pub reasons: BTreeMap<String, f64>,
    /// The guest's own count of the IPIs an iteration sent, median per iteration by kind
    /// (`RES` rescheduling, `CAL` function call, from its /proc/interrupts around the same
    /// marks). Absent where the guest is not Linux, and from results written before.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub guest_ipis: BTreeMap<String, f64>,
}
