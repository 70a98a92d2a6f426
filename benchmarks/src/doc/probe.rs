//! `probe`'s document: the VMM's own exit paths and the memory staircase.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::head::{Cell, Head};

/// The `probe` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// What was run.
    pub params: ProbeParams,
    /// How.
    pub method: String,
    /// Our VMM with ioeventfd doorbells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ours: Option<PathsRun>,
    /// Our VMM with `--no-ioeventfd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ours_no_ioeventfd: Option<PathsRun>,
    /// QEMU microvm, or why there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu: Option<Peer>,
    /// What `pio_exit_ns` is on a host that refuses ring-3 port I/O.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pio_note: Option<String>,
    /// The memory-latency staircase, guest against host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_lat: Option<Vec<Stair>>,
    /// What failed on the host side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_failures: Option<Vec<String>>,
    /// What failed of QEMU's runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu_note: Option<String>,
}

/// What `probe` ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeParams {
    /// Rounds.
    pub runs: usize,
    /// The guest's core.
    pub core: usize,
    /// Guest memory, MiB.
    pub guest_memory_mb: u64,
    /// What backs it.
    pub guest_memory: String,
    /// What backs the host's chase.
    pub host_chase_memory: String,
    /// Calls timed per repetition.
    pub calls_per_repetition: u32,
    /// Repetitions per path.
    pub repetitions: u32,
}

/// One VMM's paths.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PathsRun {
    /// Per path.
    pub paths_ns: BTreeMap<String, Cell>,
    /// A port-I/O exit, ns (see `pio_note`).
    pub pio_exit_ns: Option<f64>,
    /// The command, as typed.
    pub command: String,
    /// What failed.
    pub failures: Vec<String>,
}

/// A peer's runs, or why it did not run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Peer {
    /// It ran.
    Ran(PathsRun),
    /// Why not.
    Note(String),
}

/// One step of the staircase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stair {
    /// Working set.
    pub bytes: u64,
    /// Guest, ns per load.
    pub guest_ns: Option<f64>,
    /// Its (min, max).
    pub guest_spread: Option<[f64; 2]>,
    /// Host, ns per load.
    pub host_ns: Option<f64>,
    /// Its (min, max).
    pub host_spread: Option<[f64; 2]>,
    /// Guest over host.
    pub guest_over_host: Option<f64>,
    /// QEMU's guest, ns per load.
    pub qemu_ns: Option<f64>,
}
