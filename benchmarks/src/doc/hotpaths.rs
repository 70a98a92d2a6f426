//! `host` and `guest`: the lmbench-style hot paths on the bare host and in a Linux partition.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::head::Head;

/// One benchmark's row: its median over runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HotRow {
    /// hotpaths' name for it.
    pub name: String,
    /// Unit.
    pub unit: String,
    /// Median over runs.
    pub median: f64,
    /// (min, max) over runs.
    pub spread: [f64; 2],
    /// Runs.
    pub runs: usize,
    /// The per-run values.
    pub per_run: Vec<f64>,
}

/// The `host` section: the suite on the bare host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// What was run.
    pub params: HostParams,
    /// How.
    pub method: String,
    /// One per benchmark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<Vec<HotRow>>,
    /// What failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<Vec<String>>,
}

/// What `host` ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostParams {
    /// Rounds.
    pub runs: usize,
    /// The two CPUs.
    pub cpus: Vec<usize>,
    /// How processes are pinned.
    pub pinning: String,
    /// hotpaths' arguments.
    pub hotpaths_args: Vec<String>,
}

/// The `guest` section: the suite in a Linux partition, per idle policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuestSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// What was run.
    pub params: GuestParams,
    /// One per policy this host offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<PolicyRows>>,
    /// The guest image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<GuestImage>,
    /// The numbers are real but the host qualifies them (see `limitation`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_limitation: bool,
    /// What the host limitation is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limitation: Option<String>,
}

/// What `guest` ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuestParams {
    /// Rounds per policy actually run.
    pub runs: usize,
    /// Rounds asked for.
    pub runs_asked: usize,
    /// The vCPUs' cores.
    pub vcpus_on_cores: Vec<usize>,
    /// Guest memory.
    pub memory: String,
    /// hotpaths' arguments in the guest.
    pub hotpaths_args: String,
    /// Per launch.
    pub time_limit_s: u64,
}

/// One policy's rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyRows {
    /// The idle policy.
    pub policy: String,
    /// One per benchmark.
    pub rows: Vec<HotRow>,
    /// What failed.
    pub failures: Vec<String>,
    /// What the guest said about itself (`guest: ` lines).
    pub guest_lines: Option<Vec<String>>,
}

/// The guest image the section booted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuestImage {
    /// Kernel.
    pub kernel: PathBuf,
    /// Initramfs.
    pub initramfs: PathBuf,
    /// What it was built from (`inputs` beside the kernel).
    pub inputs: Option<String>,
}
