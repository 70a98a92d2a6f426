//! `noise`'s document: what the host takes from a core a partition runs on, against the
//! same gap detector on the bare host and in QEMU, quiet and beside a noisy neighbour.

use serde::{Deserialize, Serialize};

use crate::head::Head;
use crate::stats::Summary;

/// The `noise` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NoiseSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// What was run.
    pub params: NoiseParams,
    /// How.
    pub method: String,
    /// One per case and neighbour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<Vec<NoiseRow>>,
    /// Why the reserved-core rows are missing or partial, if they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_note: Option<String>,
    /// The wake round trip and the mapped-doorbell submit-to-fence in our partition, quiet
    /// and beside the same neighbour (absent from results written before they were).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathRow>,
}

/// One VMM path timed in our partition, quiet or beside the neighbour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PathRow {
    /// `wake-ipi` (the probe's IPI round trip between its two vCPUs) or `submit-fence`
    /// (the mapped doorbell's submit to the engine's fence, polled).
    pub path: String,
    /// Whether the neighbour ran.
    pub neighbour: bool,
    /// The idle policy asked and, for the wake, the mode the probe waited in.
    pub policy: String,
    /// Per-run medians, ns, summarised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_ns: Option<Summary>,
    /// Per-run 99th percentiles, ns, summarised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_ns: Option<Summary>,
    /// Runs that produced nothing, and why.
    pub failures: Vec<String>,
    /// Beside the neighbour: the runs it was seen running through (as a row's
    /// `neighbour_windows`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour_windows: Option<usize>,
}

/// What `noise` ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NoiseParams {
    /// Rounds.
    pub runs: usize,
    /// The core measured.
    pub core: usize,
    /// The core the neighbour runs on.
    pub neighbour_core: usize,
    /// Length of one detector run, ms.
    pub window_ms: u64,
    /// What the neighbour is.
    pub neighbour: String,
}

/// One case (bare, ours, QEMU) with or without the neighbour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NoiseRow {
    /// `bare`, `partition` or `qemu` (ad hoc, pinned to the core), `bare-reserved` or
    /// `partition-reserved` (the core reserved).
    pub case: String,
    /// Whether the neighbour ran.
    pub neighbour: bool,
    /// Per metric (`noise_us_per_s`, `max_gap_us`, `over_1us_per_s`, `over_10us_per_s`,
    /// `over_100us_per_s`, `p9999_gap_ns`): the per-run values summarised.
    pub metrics: std::collections::BTreeMap<String, Summary>,
    /// Runs that produced nothing, and why.
    pub failures: Vec<String>,
    /// Beside the neighbour: the windows it was seen running through (stress-ng alive,
    /// no launch of its guest failed); a window it was not is a failure, not a row value.
    /// None for a quiet row and in results written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour_windows: Option<usize>,
}
