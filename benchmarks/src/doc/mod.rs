//! The results file's sections as types, in one place. Every section starts with a
//! [`Head`] (whether it completed, when, on what, and why not); each section's document is a
//! struct in this folder, one file per harness; [`SectionDoc`] is what a
//! [`Section`](crate::sections::Section) returns and [`Results`] is a whole results file read
//! into these types, which is what the report and its pictures read.
//!
//! The file format is what these types serialize to, unchanged from the `json!` documents
//! they replaced: `tests::the_committed_results_round_trip` reads
//! `benchmarks/results/vm.json` and `rig.json` through them and must get the same JSON back.

pub mod blk;
pub mod compare;
pub mod crosscheck;
pub mod exits;
pub mod hotpaths;
pub mod memsetup;
pub mod noise;
pub mod probe;
pub mod submit;
pub mod submit_vfio;
pub mod wake;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::head::Head;

/// One results-file section, as its section produced it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SectionDoc {
    /// `host`.
    Host(Box<hotpaths::HostSection>),
    /// `guest`.
    Guest(Box<hotpaths::GuestSection>),
    /// `probe`.
    Probe(Box<probe::ProbeSection>),
    /// `crosscheck`.
    Crosscheck(Box<crosscheck::CrosscheckSection>),
    /// `wake`.
    Wake(Box<wake::WakeSection>),
    /// `noise`.
    Noise(Box<noise::NoiseSection>),
    /// `exits`.
    Exits(Box<exits::ExitsSection>),
    /// `blk`.
    Blk(Box<blk::BlkSection>),
    /// `memsetup`.
    MemSetup(Box<memsetup::MemSetupSection>),
    /// `submit`.
    Submit(Box<submit::SubmitSection>),
    /// `submit-vfio`.
    SubmitVfio(Box<submit_vfio::SubmitVfioSection>),
    /// `sandbox` and `builds`.
    Compare(Box<compare::CompareSection>),
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
            Self::Noise(s) => &s.head,
            Self::Exits(s) => &s.head,
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
            "noise" => Self::Noise(serde_json::from_value(v)?),
            "exits" => Self::Exits(serde_json::from_value(v)?),
            "blk" => Self::Blk(serde_json::from_value(v)?),
            "memsetup" => Self::MemSetup(serde_json::from_value(v)?),
            "submit" => Self::Submit(serde_json::from_value(v)?),
            "submit-vfio" => Self::SubmitVfio(serde_json::from_value(v)?),
            _ => Self::Compare(serde_json::from_value(v)?),
        })
    }
}

/// The sections a results file may hold, in the order the report lists them.
pub const SECTIONS: [&str; 13] = [
    "host",
    "guest",
    "probe",
    "wake",
    "noise",
    "blk",
    "submit",
    "submit-vfio",
    "exits",
    "memsetup",
    "crosscheck",
    "sandbox",
    "builds",
];

/// A whole results file read into its sections' types: what the report and its pictures
/// read. A section that is absent is `None`; one that is present but does not read as its
/// type is listed in `unreadable` (with why) so the report can say so instead of failing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Results {
    /// `host`.
    pub host: Option<hotpaths::HostSection>,
    /// `guest`.
    pub guest: Option<hotpaths::GuestSection>,
    /// `probe`.
    pub probe: Option<probe::ProbeSection>,
    /// `crosscheck`.
    pub crosscheck: Option<crosscheck::CrosscheckSection>,
    /// `wake`.
    pub wake: Option<wake::WakeSection>,
    /// `noise`.
    pub noise: Option<noise::NoiseSection>,
    /// `exits`.
    pub exits: Option<exits::ExitsSection>,
    /// `blk`.
    pub blk: Option<blk::BlkSection>,
    /// `memsetup`.
    pub memsetup: Option<memsetup::MemSetupSection>,
    /// `submit`.
    pub submit: Option<submit::SubmitSection>,
    /// `submit-vfio`.
    pub submit_vfio: Option<submit_vfio::SubmitVfioSection>,
    /// `sandbox`.
    pub sandbox: Option<compare::CompareSection>,
    /// `builds`.
    pub builds: Option<compare::CompareSection>,
    /// Sections present but not readable as their type (or of a name this build does not
    /// know): (name, why).
    pub unreadable: Vec<(String, String)>,
}

/// Largest results file read (a year of sections is a few MiB).
pub const MAX_RESULTS: u64 = 64 << 20;

impl Results {
    /// Reads a results file's JSON (`{"sections": {name: section}}`).
    pub fn from_value(doc: &Value) -> Self {
        let mut out = Self::default();
        let Some(sections) = doc.get("sections").and_then(Value::as_object) else {
            return out;
        };
        for (name, v) in sections {
            if !SECTIONS.contains(&name.as_str()) {
                out.unreadable
                    .push((name.clone(), "not a section this build knows".into()));
                continue;
            }
            match SectionDoc::parse(name, v.clone()) {
                Ok(SectionDoc::Host(s)) => out.host = Some(*s),
                Ok(SectionDoc::Guest(s)) => out.guest = Some(*s),
                Ok(SectionDoc::Probe(s)) => out.probe = Some(*s),
                Ok(SectionDoc::Crosscheck(s)) => out.crosscheck = Some(*s),
                Ok(SectionDoc::Wake(s)) => out.wake = Some(*s),
                Ok(SectionDoc::Noise(s)) => out.noise = Some(*s),
                Ok(SectionDoc::Exits(s)) => out.exits = Some(*s),
                Ok(SectionDoc::Blk(s)) => out.blk = Some(*s),
                Ok(SectionDoc::MemSetup(s)) => out.memsetup = Some(*s),
                Ok(SectionDoc::Submit(s)) => out.submit = Some(*s),
                Ok(SectionDoc::SubmitVfio(s)) => out.submit_vfio = Some(*s),
                Ok(SectionDoc::Compare(s)) if name == "builds" => out.builds = Some(*s),
                Ok(SectionDoc::Compare(s)) => out.sandbox = Some(*s),
                Err(e) => out.unreadable.push((name.clone(), e.to_string())),
            }
        }
        out
    }

    /// Reads the results file at `path`: a regular file of at most [`MAX_RESULTS`] bytes
    /// (opened once, following no link a user planted: `partition::sys::files`), of JSON.
    pub fn read(path: &std::path::Path) -> Result<Self, String> {
        let bytes = partition::sys::files::read_limited(path, MAX_RESULTS)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let text =
            String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", path.display()))?;
        let doc: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self::from_value(&doc))
    }

    /// The head of section `name`, if the file has it.
    pub fn head(&self, name: &str) -> Option<&Head> {
        Some(match name {
            "host" => &self.host.as_ref()?.head,
            "guest" => &self.guest.as_ref()?.head,
            "probe" => &self.probe.as_ref()?.head,
            "crosscheck" => &self.crosscheck.as_ref()?.head,
            "wake" => &self.wake.as_ref()?.head,
            "noise" => &self.noise.as_ref()?.head,
            "exits" => &self.exits.as_ref()?.head,
            "blk" => &self.blk.as_ref()?.head,
            "memsetup" => &self.memsetup.as_ref()?.head,
            "submit" => &self.submit.as_ref()?.head,
            "submit-vfio" => &self.submit_vfio.as_ref()?.head,
            "sandbox" => &self.sandbox.as_ref()?.head,
            "builds" => &self.builds.as_ref()?.head,
            _ => return None,
        })
    }

    /// Whether section `name` completed (None: not in the file).
    pub fn completed(&self, name: &str) -> Option<bool> {
        self.head(name).map(|h| h.completed)
    }

    /// What the first section with a provenance says about the host: the host-wide ones
    /// first, then any (the rig's file holds only submit-vfio).
    pub fn host_facts(&self) -> HostFacts {
        ["host", "probe", "blk", "wake", "memsetup"]
            .iter()
            .chain(SECTIONS.iter())
            .filter_map(|k| self.head(k))
            .find(|h| h.provenance.get("kernel").is_some())
            .and_then(|h| serde_json::from_value(h.provenance.clone()).ok())
            .unwrap_or_default()
    }
}

/// The facts of a section's provenance the report prints (the provenance itself is an open
/// record of the host and stays as written).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct HostFacts {
    /// CPU model name.
    pub cpu_model: Option<Value>,
    /// TSC frequency, MHz.
    pub tsc_mhz: Option<Value>,
    /// Kernel release.
    pub kernel: Option<Value>,
    /// KVM.
    #[serde(default)]
    pub kvm: KvmFacts,
    /// The commit measured.
    pub commit: Option<Value>,
    /// With uncommitted changes.
    #[serde(default)]
    pub commit_dirty: bool,
}

/// The KVM facts the report prints.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct KvmFacts {
    /// `kvm_intel`, `kvm_amd`, ...
    pub vendor_module: Option<Value>,
    /// Whether this host runs under a hypervisor itself.
    pub host_is_a_guest: Option<Value>,
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
