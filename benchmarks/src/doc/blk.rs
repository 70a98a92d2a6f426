//! `blk`'s document: 4 KiB block latency on the bare host, in our VMM and in QEMU.

use serde::{Deserialize, Serialize};

use crate::head::{Head, Ordering};

/// The `blk` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlkSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// What was run.
    pub params: BlkParams,
    /// How.
    pub method: String,
    /// The disk image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageDoc>,
    /// The bare host's rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Vec<HostRow>>,
    /// What failed on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_failures: Option<Vec<String>>,
    /// Our VMM's rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ours: Option<Vec<GuestRow>>,
    /// QEMU's rows, or why there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu: Option<Peers>,
    /// The Rust peers' rows (Firecracker's virtio-blk is virtio-mmio, as ours), or why a
    /// peer has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rust_peers: Vec<PeerBlk>,
    /// The orderings the section checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orderings: Option<Vec<Ordering>>,
    /// Our best row against QEMU's best, per completion style.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ours_vs_qemu_best: Option<Vec<VsQemu>>,
    /// Like against like: our polling worker against QEMU's polling iothread, our
    /// event-driven device against the Rust peers' (which do not poll).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headline: Vec<BlkHeadline>,
}

/// One like-for-like pairing of the headline: 4 KiB random read at depth 1, warm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlkHeadline {
    /// What is compared with what.
    pub pairing: String,
    /// How the guest learns of the completion (`lat4k/poll` or `lat4k/irq`).
    pub completion: String,
    /// Our row.
    pub ours: String,
    /// Its median, ns.
    pub ours_median_ns: f64,
    /// The peer's row (the fastest of the peer rows named in `pairing`).
    pub peer: String,
    /// Its median, ns.
    pub peer_median_ns: f64,
    /// Ours over the peer's.
    pub ours_over_peer: f64,
}

/// What `blk` ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlkParams {
    /// Rounds.
    pub runs: usize,
    /// Disk image size.
    pub image_bytes: u64,
    /// Requests per run.
    pub samples_per_run: usize,
    /// The guest's discarded warm-up requests.
    pub discarded_warmup_samples_guest: usize,
    /// Think time between requests.
    pub gap_between_requests_us: u64,
    /// Our queue worker's polling window.
    pub worker_poll_us: u64,
    /// QEMU's iothread poll-max-ns.
    pub qemu_poll_max_ns: u64,
    /// The vCPU's core.
    pub vcpu_core: usize,
    /// The host's core.
    pub host_core: usize,
    /// The guest.
    pub guest: String,
}

/// The image the rows read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageDoc {
    /// Its file system (`stat -f`).
    pub path_fs: Option<String>,
    /// The checksum the probe must read.
    pub probe_checksum: String,
}

/// A metric over runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// Median of the per-run medians.
    pub median: f64,
    /// (min, max) of them.
    pub spread: [f64; 2],
    /// Runs.
    pub runs: usize,
    /// Unit.
    pub unit: String,
    /// Median of the per-run p99s.
    pub p99_median: Option<f64>,
    /// The per-run medians.
    pub per_run: Vec<f64>,
}

/// A bare-host row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostRow {
    /// Name.
    pub name: String,
    /// Warm or cold, in words.
    pub cache: String,
    /// 4 KiB read at depth 1.
    pub lat4k: Option<Metric>,
}

/// A guest row (ours or QEMU's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuestRow {
    /// Name.
    pub name: String,
    /// Warm or cold, in words.
    pub cache: String,
    /// 4 KiB read, the guest polling the used ring.
    pub lat4k_guest_polls: Option<Metric>,
    /// 4 KiB read, the guest waiting for the interrupt.
    pub lat4k_guest_waits_for_irq: Option<Metric>,
    /// GET_ID fence, polled.
    pub fence_guest_polls: Option<Metric>,
    /// GET_ID fence, by interrupt.
    pub fence_guest_waits_for_irq: Option<Metric>,
    /// 4 KiB reads at depth 32.
    pub qd32_iops: Option<Metric>,
    /// 64 MiB sequential read.
    pub seq_read_64m: Option<Metric>,
    /// What the VMM said its doorbells are.
    pub readback: Vec<String>,
    /// The command, as typed.
    pub command: String,
    /// What failed.
    pub failures: Vec<String>,
}

/// QEMU's rows, or why there are none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Peers {
    /// Its rows.
    Rows(Vec<GuestRow>),
    /// Why not.
    Note(String),
}

/// A Rust peer's rows in `blk`, or why it has none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerBlk {
    /// `cloud-hypervisor` or `firecracker`.
    pub name: String,
    /// Its rows, or why there are none.
    pub rows: Peers,
}

/// Our best against QEMU's best.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VsQemu {
    /// The completion style compared.
    pub completion: String,
    /// Cache state.
    pub cache: String,
    /// Our best row.
    pub ours_best: String,
    /// Its median, ns.
    pub ours_median_ns: f64,
    /// Its (min, max).
    pub ours_spread_ns: [f64; 2],
    /// QEMU's best row.
    pub qemu_best: String,
    /// Its median, ns.
    pub qemu_median_ns: f64,
    /// Its (min, max).
    pub qemu_spread_ns: [f64; 2],
    /// Ours over QEMU's.
    pub ours_over_qemu: f64,
    /// Ours at or below QEMU's.
    pub ours_no_worse: bool,
}
