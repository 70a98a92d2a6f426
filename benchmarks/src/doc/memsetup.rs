//! `memsetup`'s document: launch to the first serial byte, per memory source and size.

use serde::{Deserialize, Serialize};

use crate::head::Head;
use crate::stats::Summary;

/// Runs the section.
/// The `memsetup` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemSetupSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// How.
    pub method: String,
    /// What was run.
    pub params: MemSetupParams,
    /// The pool the `pool` rows come from, and how long reserving it took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_preallocation: Option<PoolPreallocation>,
    /// Why there are no QEMU rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu_note: Option<String>,
    /// Why there is no QEMU hugetlbfs row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu_hugetlbfs_note: Option<String>,
    /// The Rust peers: each one's binary and version, or why it has no rows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<crate::peers::PeerInfo>,
    /// One per (source, size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<Vec<MemSetupRow>>,
    /// The section's claims, checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<MemSetupChecks>,
    /// Our launches against the peers, at each size where a peer ran: the goals of being
    /// ahead of every peer (docs/benchmarks.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub against_peers: Vec<PeerGoals>,
    /// What failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<Vec<String>>,
}

/// What `memsetup` ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemSetupParams {
    /// Guest sizes.
    pub sizes_bytes: Vec<u64>,
    /// Rounds (after the warm-up).
    pub runs: usize,
    /// Memory sources.
    pub sources: Vec<String>,
    /// The pool partition's core.
    pub reserved_core: usize,
    /// Where launchers run.
    pub host_core: usize,
}

/// The benchmark's pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolPreallocation {
    /// Its size.
    pub bytes: u64,
    /// `partition reserve`'s preallocation time, when it said.
    pub seconds: Option<f64>,
}

/// One (source, size).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemSetupRow {
    /// Memory source.
    pub source: String,
    /// Guest size.
    pub size_bytes: u64,
    /// Spawn to first serial byte, ms.
    pub first_byte_ms: Option<Summary>,
    /// The VMM's memory setup, ms (ours only).
    pub memory_ms: Option<Summary>,
    /// VMM CPU time at the first byte, ms.
    pub vmm_cpu_ms_at_first_byte: Option<Summary>,
    /// VMM resident set at the first byte, KiB.
    pub vmm_rss_kib_at_first_byte: Option<Summary>,
    /// VMM hugetlb pages mapped at the first byte, KiB.
    pub vmm_hugetlb_kib_at_first_byte: Option<Summary>,
    /// The guest's memory, KiB.
    pub guest_memory_kib: u64,
    /// Per run: first byte, ms.
    pub runs_first_byte_ms: Vec<f64>,
    /// Per run: memory setup, ms.
    pub runs_memory_ms: Vec<f64>,
    /// Per run: VMM CPU, ms.
    pub runs_vmm_cpu_ms: Vec<f64>,
    /// Per run: VMM RSS, KiB.
    pub runs_vmm_rss_kib: Vec<f64>,
    /// Our launches: each phase of the VMM's timeline to the first byte (`launch
    /// --timings`), per run, ms, in the order the phases ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs_timeline_ms: Vec<(String, Vec<f64>)>,
    /// The VMM's CPU time (all its threads) in each of those phases, per run, ms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs_timeline_cpu_ms: Vec<(String, Vec<f64>)>,
    /// What it ran: the options that make the configuration (the peer's flags, or ours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// Where its threads ran ([`crate::placement`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
}

/// What the section claims, checked against its medians.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemSetupChecks {
    /// Pool first byte at the largest size over the smallest.
    pub pool_first_byte_largest_over_smallest: Option<f64>,
    /// That ratio at most 1.5.
    pub pool_first_byte_within_1_5x: Option<bool>,
    /// Fresh prefaulted memory's setup over the pool's, at the largest size.
    pub anon_prefault_memory_over_pool_memory_at_largest: Option<f64>,
    /// That ratio at least 100.
    pub pool_memory_at_least_100x_smaller: Option<bool>,
}

/// One of our launches against the peers at one size: each ratio is ours over the peers'
/// best median, and the goal is at most [`PEER_GOAL`] for each.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerGoals {
    /// Ours: `pool` (the product's launch) or `anonymous` (the ad hoc launch's default).
    pub ours: String,
    /// Guest memory.
    pub size_bytes: u64,
    /// The peer source with the shortest median time to the first byte, and ours over it.
    pub fastest_peer: String,
    /// Ours over that peer's first byte.
    pub first_byte_over_fastest: f64,
    /// The peer source with the lowest median VMM CPU at the first byte.
    pub lowest_cpu_peer: String,
    /// Ours over that peer's CPU.
    pub cpu_over_lowest: f64,
    /// Ours over Firecracker's lowest median resident set (its two sources), if it ran.
    pub rss_over_firecracker: Option<f64>,
    /// Every ratio at most [`PEER_GOAL`].
    pub met: bool,
}

/// The goal for each of [`PeerGoals`]' ratios: ours at most this much of the best peer's.
pub const PEER_GOAL: f64 = 0.8;
