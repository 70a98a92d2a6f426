//! `sandbox` and `builds`: the same paths under two variants of the VMM.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::head::{Cell, Head};

/// `sandbox` or `builds`: the two variants' paths and a verdict per path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompareSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// What was run.
    pub params: CompareParams,
    /// How.
    pub method: String,
    /// The question the comparison answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// Each variant's cells (first, then second).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<VariantDoc>,
    /// Per path: is the second slower than the first beyond the spread?
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verdicts: Vec<Verdict>,
}

/// The comparison's fixed parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompareParams {
    /// Rounds.
    pub runs: usize,
    /// The core the vCPU runs on.
    pub vcpu_core: usize,
    /// Disk image size.
    pub image_bytes: u64,
    /// Block samples per run.
    pub blk_samples_per_run: usize,
    /// Think time between block requests.
    pub blk_gap_us: u64,
    /// The queue worker's polling window.
    pub worker_poll_us: u64,
    /// The guest.
    pub guest: String,
}

/// One variant's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantDoc {
    /// Its name.
    pub name: String,
    /// Its binary.
    pub partition: PathBuf,
    /// Its extra launch arguments.
    pub args: Vec<String>,
    /// Per path (results key): its cell, null when not measured.
    pub paths: BTreeMap<String, Option<Cell>>,
    /// The first commands it ran, as typed.
    pub commands: Vec<String>,
    /// What failed.
    pub failures: Vec<String>,
}

/// One path's verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Results key.
    pub path: String,
    /// First variant's median, ns.
    pub first_median_ns: Option<f64>,
    /// Second variant's median, ns.
    pub second_median_ns: Option<f64>,
    /// Their ratio.
    pub second_over_first: Option<f64>,
    /// Slower beyond the spread (None: not measured).
    pub second_slower_beyond_spread: Option<bool>,
}
