//! `crosscheck`'s document: our bare-host figures against independent tools.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::head::Head;

/// The `crosscheck` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrosscheckSection {
    /// Completion, times, provenance.
    #[serde(flatten)]
    pub head: Head,
    /// What was run.
    pub params: CrosscheckParams,
    /// How.
    pub method: String,
    /// One per pair of figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<Vec<CrossRow>>,
}

/// What `crosscheck` ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrosscheckParams {
    /// Rounds.
    pub runs: usize,
    /// The core both sides run on.
    pub core: usize,
    /// How far apart a pair may be and still agree (a fraction).
    pub tolerance: f64,
    /// Where lmbench's binaries are.
    pub lmbench: Option<PathBuf>,
}

/// Our figure against an independent tool's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrossRow {
    /// What is compared.
    pub row: String,
    /// Our figure's name.
    pub ours: String,
    /// Theirs.
    pub theirs: String,
    /// Unit.
    pub unit: String,
    /// Our median over rounds.
    pub ours_median: Option<f64>,
    /// Its (min, max).
    pub ours_spread: Option<[f64; 2]>,
    /// Their median.
    pub theirs_median: Option<f64>,
    /// Its (min, max).
    pub theirs_spread: Option<[f64; 2]>,
    /// Ours over theirs.
    pub ours_over_theirs: Option<f64>,
    /// Within the tolerance.
    pub within_20_percent: Option<bool>,
    /// Runs of ours and of theirs.
    pub runs: [usize; 2],
    /// What differs between the two figures.
    pub note: Option<String>,
    /// What failed.
    pub failures: Vec<String>,
}
