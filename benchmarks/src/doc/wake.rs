//! `wake`'s document: wake-ups per idle policy against the bare host.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::head::{Head, Ordering as Claim};
use crate::stats::Summary;

/// The `wake` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WakeSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// What was run.
    pub params: WakeParams,
    /// How.
    pub method: String,
    /// What this host's KVM offers (`partition caps --json`, as it prints it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_caps: Option<Value>,
    /// The bare host's rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<WakeHost>,
    /// One per idle policy, measured or refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<PolicyRow>>,
    /// QEMU's rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<WakeRow>>,
    /// The orderings the seeds predict, checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orderings: Option<Vec<Claim>>,
}

/// What `wake` ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WakeParams {
    /// Rounds.
    pub runs: usize,
    /// Samples per run.
    pub samples_per_run: usize,
    /// Warm-up samples discarded.
    pub discarded_warmup_samples: usize,
    /// The guest's two cores.
    pub guest_cores: Vec<usize>,
    /// The timer test's period.
    pub timer_interval_us: u64,
    /// The idle window.
    pub idle_window_s: u64,
    /// The guest.
    pub guest: String,
}

/// A wake metric over runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WakeMetric {
    /// Median of the per-run medians.
    pub median_ns: f64,
    /// Their (min, max).
    pub spread_ns: [f64; 2],
    /// Runs.
    pub runs: usize,
    /// Median of the per-run p99s.
    pub p99_ns: Option<f64>,
    /// The per-run medians.
    pub per_run_median_ns: Vec<f64>,
}

/// The bare host's wake rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WakeHost {
    /// What the host is.
    pub label: String,
    /// Futex ping-pong between the two cores.
    pub futex_pingpong: Option<WakeMetric>,
    /// Spin ping-pong.
    pub spin_pingpong: Option<WakeMetric>,
    /// `clock_nanosleep` lateness.
    pub timer_lateness: Option<WakeMetric>,
    /// The cores' busy share with no guest.
    pub idle_busy_share_no_guest: Option<Summary>,
}

/// A guest's (or peer's) wake rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WakeRow {
    /// Policy or peer.
    pub name: String,
    /// How the guest idled.
    pub idle_mode_in_guest: Option<String>,
    /// Timer lateness.
    pub timer_lateness: Option<WakeMetric>,
    /// IPI round trip.
    pub ipi_round_trip: Option<WakeMetric>,
    /// Shared-memory round trip.
    pub shm_round_trip: Option<WakeMetric>,
    /// IPI over the host's futex ping-pong.
    pub ipi_over_host_futex: Option<f64>,
    /// IPI over the host's spin ping-pong.
    pub ipi_over_host_spin: Option<f64>,
    /// Shared memory over the host's spin ping-pong.
    pub shm_over_host_spin: Option<f64>,
    /// The cores' busy share while the guest idles.
    pub idle_busy_share: Option<Summary>,
    /// Energy over the idle window (RAPL).
    pub idle_energy_j: Option<Summary>,
    /// Why there is no energy figure.
    pub energy_note: Option<String>,
    /// The launch's idle read-back (`launch --json`'s `idle`, as it prints it).
    pub readback: Option<Value>,
    /// What failed.
    pub failures: Vec<String>,
    /// What it ran (a peer's options) and where its threads ran ([`crate::placement`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
}

/// A policy: measured, or refused on this host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PolicyRow {
    /// Measured.
    Measured(Box<WakeRow>),
    /// Refused, with what `partition launch` said.
    Refused {
        /// The policy.
        name: String,
        /// The refusal.
        refused: Option<String>,
    },
}
