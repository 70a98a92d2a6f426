//! `submit`'s document: GPU-style submission, guest rows beside their bare-host twins and QEMU peers.

use serde::{Deserialize, Serialize};

use crate::head::{Cell, Head};

/// The section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubmitSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// What was run.
    pub params: SubmitParams,
    /// How.
    pub method: String,
    /// One row per doorbell × idle policy × completion.
    pub guest: Vec<GuestRow>,
    /// The bare-host twins.
    pub host: Vec<HostRow>,
    /// QEMU's peers in the same run.
    pub qemu: Vec<PeerRow>,
    /// The goals, checked on what was measured.
    pub goals: Vec<Goal>,
    /// What was not measured and why.
    pub not_measured: Vec<String>,
    /// The first commands run, as typed.
    pub commands: Vec<String>,
    /// What failed.
    pub failures: Vec<String>,
}

/// Fixed parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubmitParams {
    /// Rounds per configuration.
    pub runs: usize,
    /// Timed submissions per run.
    pub samples_per_run: usize,
    /// The driver's core (the vCPU's in guest rows).
    pub driver_core: usize,
    /// The engine thread's core (as the VMM reported it; the twins use the same).
    pub engine_core: Option<usize>,
    /// The guest.
    pub guest: String,
}

/// One guest configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuestRow {
    /// `trap`, `ioeventfd` or `mapped`.
    pub doorbell: String,
    /// `--idle`.
    pub policy: String,
    /// `poll` (the driver polls the fence) or `irq` (it waits for MSI-X vector 0).
    pub completion: String,
    /// Submit to fence: median of per-run medians, min-max of them.
    pub submit_to_fence: Option<Cell>,
    /// p99 within a run: median of per-run p99s, min-max of them.
    pub p99: Option<Cell>,
    /// The doorbell write alone (the guest's store to BAR 4, until it retires), from the
    /// polled runs: median of per-run medians.
    pub doorbell_write: Option<Cell>,
    /// Doorbell writes that reached the VMM in the last run (the launch report).
    pub trapped_doorbells: Option<u64>,
    /// MMIO write exits of the vCPU in the last run (all causes).
    pub mmio_write_exits: Option<u64>,
    /// The engine thread's CPU time over its life (the launch): median over runs, 0-1
    /// (absent from results written before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_thread_busy: Option<f64>,
    /// Polled rows: submit to fence again, with the doorbell write itself timed (a full
    /// fence and a TSC read before it, one after): what timing the write adds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_to_fence_timed_doorbell: Option<Cell>,
}

/// One bare-host twin.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostRow {
    /// How the engine learns of work: `polls page` or `eventfd`.
    pub engine: String,
    /// How the driver learns of completion: `polls fence`, `eventfd` or `futex`.
    pub waiter: String,
    /// The guest rows it is the twin of (doorbell/completion).
    pub twin_of: String,
    /// Submit to fence.
    pub submit_to_fence: Option<Cell>,
    /// p99 within a run.
    pub p99: Option<Cell>,
    /// The mapped/poll twin: its driver run again with the guest's timed doorbell write
    /// (a full fence and a TSC read before the doorbell store, one after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_to_fence_timed_doorbell: Option<Cell>,
}

/// One QEMU peer figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerRow {
    /// `pci-testdev` or `edu`.
    pub device: String,
    /// What was timed.
    pub path: String,
    /// Our row it is the peer of.
    pub peer_of: String,
    /// Median of per-run medians, min-max of them.
    pub latency: Option<Cell>,
    /// p99 within a run: median of per-run p99s.
    pub p99: Option<Cell>,
}

/// A goal of the issue, checked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Goal {
    /// The goal in words.
    pub goal: String,
    /// The measured ratio it rests on (guest over its reference), if measured.
    pub ratio: Option<f64>,
    /// Met (None: not measured).
    pub met: Option<bool>,
    /// In words.
    pub note: String,
}
