//! What every section of the results file shares: its [`Head`] (whether it completed, when,
//! on what, and why not), a measured [`Cell`] and an [`Ordering`] claim between two
//! figures. Every harness builds these; the sections' own types are in [`crate::doc`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Env, now_utc, provenance};

/// What every section has.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Head {
    /// Every configuration measured as asked.
    pub completed: bool,
    /// UTC, when the section began.
    pub started_at: String,
    /// UTC, when it ended (absent while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The host, the build and the settings it ran on (`benchmarks::provenance`'s
    /// document, every field nullable, kept as it was read).
    pub provenance: Value,
    /// Why it did not complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Head {
    /// A section starting now on `env`.
    pub fn start(env: &Env) -> Self {
        Self {
            completed: false,
            started_at: now_utc(),
            finished_at: None,
            provenance: provenance(env),
            reason: None,
        }
    }

    /// A section that runs the peer VMMs starting now: its provenance names each peer's
    /// binary, version and commit too (`peers`, from [`crate::peers::infos`]), as it names
    /// our build.
    pub fn start_with_peers(env: &Env, peers: &[crate::peers::PeerInfo]) -> Self {
        let mut h = Self::start(env);
        if let Some(p) = h.provenance.as_object_mut() {
            p.insert(
                "peers".into(),
                serde_json::to_value(peers).unwrap_or_default(),
            );
        }
        h
    }

    /// The peers its provenance names (none for a section that runs no peer, or one whose
    /// list does not read).
    pub fn peers(&self) -> Vec<crate::peers::PeerInfo> {
        self.provenance
            .get("peers")
            .and_then(|p| serde_json::from_value(p.clone()).ok())
            .unwrap_or_default()
    }

    /// Ends it: `completed`, and the reason when it did not.
    pub fn finish(&mut self, completed: bool, reason: impl FnOnce() -> String) {
        self.completed = completed;
        if !completed {
            self.reason = Some(reason());
        }
        self.finished_at = Some(now_utc());
    }

    /// Ends it early for `why`.
    pub fn fail(&mut self, why: String) {
        self.finish(false, || why);
    }
}

/// A `{median_ns, spread_ns: [min, max], runs}` cell.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// Median, ns.
    pub median_ns: f64,
    /// (min, max), ns.
    pub spread_ns: [f64; 2],
    /// Values behind it.
    pub runs: usize,
}

impl Cell {
    /// From a summary of ns values.
    pub fn of(s: &crate::stats::Summary) -> Self {
        Self {
            median_ns: s.median,
            spread_ns: [s.min, s.max],
            runs: s.n,
        }
    }
}

/// A claim the section checks: is `fast` faster than `slow` beyond the spread?
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ordering {
    /// The claim, in words.
    pub claim: String,
    /// The fast side's median, ns.
    pub fast_median_ns: Option<f64>,
    /// The slow side's median, ns.
    pub slow_median_ns: Option<f64>,
    /// Shown beyond the spread (None: not measured).
    pub shown: Option<bool>,
    /// The verdict in words.
    pub note: String,
}

impl Ordering {
    /// Checks `claim` on the two summaries.
    pub fn check(
        claim: &str,
        fast: Option<crate::stats::Summary>,
        slow: Option<crate::stats::Summary>,
    ) -> Self {
        Self::check_or(claim, fast, slow, "not shown on this host")
    }

    /// As [`Ordering::check`], with `unshown` as the note when it is not shown.
    pub fn check_or(
        claim: &str,
        fast: Option<crate::stats::Summary>,
        slow: Option<crate::stats::Summary>,
        unshown: &str,
    ) -> Self {
        let shown = crate::stats::faster(fast, slow);
        Self {
            claim: claim.to_string(),
            fast_median_ns: fast.map(|s| s.median),
            slow_median_ns: slow.map(|s| s.median),
            shown,
            note: match shown {
                Some(true) => "shown beyond the spread",
                Some(false) => unshown,
                None => "not measured",
            }
            .into(),
        }
    }
}
