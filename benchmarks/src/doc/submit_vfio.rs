//! `submit-vfio`'s document: submission through a passed-through device.

use serde::{Deserialize, Serialize};

use crate::head::{Cell, Head};

/// The section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubmitVfioSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// The function (`DDDD:BB:DD.F vendor:device`), if one was given.
    pub device: Option<String>,
    /// The machine the host is (DMI vendor and product).
    pub machine: String,
    /// False on an emulated machine, where the timings describe the emulator.
    pub timings_meaningful: bool,
    /// No function to pass through: the section cannot run on this host.
    pub host_limitation: bool,
    /// Rounds.
    pub runs: usize,
    /// Timed reads per completion mode per run.
    pub samples_per_run: usize,
    /// The core every driver ran on.
    pub core: usize,
    /// How.
    pub method: String,
    /// One row per driver and completion.
    pub rows: Vec<VfioRow>,
    /// The partition's exits to the VMM per submission (all but its console's).
    pub exits_per_submission: Option<f64>,
    /// Interrupts the host counted for the function during the partition's last run (both
    /// completion modes: the queue raises MSI-X even while the driver polls).
    pub host_interrupts: Option<u64>,
    /// What was not measured and why.
    pub not_measured: Vec<String>,
    /// The first commands run, as typed.
    pub commands: Vec<String>,
    /// What failed.
    pub failures: Vec<String>,
}

/// One driver and completion.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VfioRow {
    /// One of [`WHO`].
    pub who: String,
    /// `poll` (the completion's phase bit) or `irq` (MSI-X).
    pub completion: String,
    /// Submit to completion: median of per-run medians, min-max of them.
    pub latency: Option<Cell>,
    /// p99 within a run: median of per-run p99s, min-max of them.
    pub p99: Option<Cell>,
    /// Median over the bare-host twin's with the same completion.
    pub ratio_to_twin: Option<f64>,
}
