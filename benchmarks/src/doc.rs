//! The results file's sections as types. Every section starts with a [`Head`] (whether it
//! completed, when, on what, and why not); each section's own document is a struct in its
//! module, and [`SectionDoc`] is what a [`Section`](crate::sections::Section) returns.
//!
//! The file format is what these types serialize to, unchanged from the `json!` documents
//! they replaced: `tests::the_committed_results_round_trip` reads
//! `benchmarks/results/vm.json` and `rig.json` through them and must get the same JSON back.

use serde::Serialize;
use serde_json::Value;

use crate::head::Head;

/// One results-file section, as its section produced it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SectionDoc {
    /// `host`.
    Host(Box<crate::hotpaths::HostSection>),
    /// `guest`.
    Guest(Box<crate::hotpaths::GuestSection>),
    /// `probe`.
    Probe(Box<crate::probe::ProbeSection>),
    /// `crosscheck`.
    Crosscheck(Box<crate::crosscheck::CrosscheckSection>),
    /// `wake`.
    Wake(Box<crate::wake::WakeSection>),
    /// `blk`.
    Blk(Box<crate::blk::BlkSection>),
    /// `memsetup`.
    MemSetup(Box<crate::memsetup::MemSetupSection>),
    /// `submit`.
    Submit(Box<crate::submit::SubmitSection>),
    /// `submit-vfio`.
    SubmitVfio(Box<crate::submit_vfio::SubmitVfioSection>),
    /// `sandbox` and `builds`.
    Compare(Box<crate::compare::CompareSection>),
}

impl SectionDoc {
    /// Its head.
    pub fn head(&self) -> &Head {
        match self {
            Self::Host(s) => &s.head,
            Self::Guest(s) => &s.head,
            Self::Probe(s) => &s.head,
            Self::Crosscheck(s) => &s.head,
            Self::Wake(s) => &s.head,
            Self::Blk(s) => &s.head,
            Self::MemSetup(s) => &s.head,
            Self::Submit(s) => &s.head,
            Self::SubmitVfio(s) => &s.head,
            Self::Compare(s) => &s.head,
        }
    }

    /// Whether the section says this host cannot run it at all (a limitation with no
    /// statement of measured numbers).
    pub fn impossible_here(&self) -> bool {
        match self {
            Self::Guest(g) => !g.head.completed && g.host_limitation && g.limitation.is_none(),
            Self::SubmitVfio(s) => !s.head.completed && s.host_limitation,
            _ => false,
        }
    }

    /// As the results file stores it.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Reads the results-file section `name` into its type (for the round-trip test and for
    /// readers that want types).
    pub fn parse(name: &str, v: Value) -> Result<Self, serde_json::Error> {
        Ok(match name {
            "host" => Self::Host(serde_json::from_value(v)?),
            "guest" => Self::Guest(serde_json::from_value(v)?),
            "probe" => Self::Probe(serde_json::from_value(v)?),
            "crosscheck" => Self::Crosscheck(serde_json::from_value(v)?),
            "wake" => Self::Wake(serde_json::from_value(v)?),
            "blk" => Self::Blk(serde_json::from_value(v)?),
            "memsetup" => Self::MemSetup(serde_json::from_value(v)?),
            "submit" => Self::Submit(serde_json::from_value(v)?),
            "submit-vfio" => Self::SubmitVfio(serde_json::from_value(v)?),
            _ => Self::Compare(serde_json::from_value(v)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_results_round_trip() {
        // vm.json: this development host, every section; rig.json: the rig's submit-vfio.
        for (file, at_least) in [("vm.json", 8), ("rig.json", 1)] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("results")
                .join(file);
            let text = std::fs::read_to_string(&path).expect("benchmarks/results/<file>");
            let file_doc: Value = serde_json::from_str(&text).unwrap();
            let sections = file_doc["sections"].as_object().expect("sections");
            assert!(sections.len() >= at_least, "{file}: {:?}", sections.keys());
            for (name, v) in sections {
                let doc = SectionDoc::parse(name, v.clone())
                    .unwrap_or_else(|e| panic!("{file} {name}: does not parse: {e}"));
                let back = doc.to_value();
                if &back != v {
                    let (a, b) = (v.as_object().unwrap(), back.as_object().unwrap());
                    let diff: Vec<_> = a
                        .keys()
                        .chain(b.keys())
                        .filter(|k| a.get(*k) != b.get(*k))
                        .collect();
                    panic!("{file} {name}: differs at {diff:?}");
                }
            }
        }
    }

    #[test]
    fn a_head_finishes_with_a_reason_only_when_incomplete() {
        let mut h = Head::default();
        h.finish(true, || unreachable!());
        assert!(h.completed && h.reason.is_none() && h.finished_at.is_some());
        let mut h = Head::default();
        h.fail("no QEMU".into());
        assert_eq!((h.completed, h.reason.as_deref()), (false, Some("no QEMU")));
    }
}
