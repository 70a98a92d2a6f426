//! The host plan: how much hugepage memory and which cores to set aside. From the command
//! line or from a TOML file (`deny_unknown_fields`: a misspelt key is an error, not a
//! silently ignored safety limit), then validated.

use crate::config::keyvalue::{ByteSize, CoreList};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::cores::{self, CoreError};
use crate::config::size::{self, SizeError};
use crate::host::ledger::PlanRecord;
pub use crate::host::ledger::{IrqbalanceMode, IsolationMode};

/// Errors reading or validating a plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The plan file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The plan file does not parse.
    #[error("{path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A size does not parse.
    #[error("{field}: {source}")]
    Size {
        /// Which field.
        field: &'static str,
        /// Why.
        source: SizeError,
    },
    /// Bad cores.
    #[error("cores: {0}")]
    Cores(#[from] CoreError),
    /// Page size not 2M or 1G.
    #[error("page size {0} bytes: only 2M and 1G hugepages are supported")]
    PageSize(u64),
    /// Memory zero or not a page multiple.
    #[error("memory {memory} bytes is not a positive multiple of the {page_size} byte page size")]
    Memory {
        /// Requested.
        memory: u64,
        /// Page size.
        page_size: u64,
    },
    /// The NUMA node does not exist.
    #[error("NUMA node {0} does not exist")]
    NoNode(u32),
    /// Nothing left for the host.
    #[error(
        "reserving cores {reserved} would leave the host no core of its own (available: {available})"
    )]
    NoHousekeeping {
        /// Requested.
        reserved: String,
        /// Available.
        available: String,
    },
}

/// The plan file's format.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanFile {
    /// Pool size ("1G").
    pub memory: ByteSize,
    /// Hugepage size ("2M" or "1G"; default 2M).
    pub page_size: Option<ByteSize>,
    /// NUMA node for the pages (default: any).
    pub node: Option<u32>,
    /// Cores to reserve ("1", "2-5").
    pub cores: CoreList,
    /// State directory (default /run/partition).
    pub state_dir: Option<PathBuf>,
    /// `cpusets` (default): the reserved cores taken out of every cgroup, or the reserve
    /// refused; `none`: they stay shared, as the user accepts.
    pub isolation: Option<IsolationMode>,
    /// `ban` (default): a running irqbalance is told to keep off the reserved cores, or the
    /// reserve refused; `ignore`: it is left alone.
    pub irqbalance: Option<IrqbalanceMode>,
}

/// A validated plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPlan {
    /// Pool bytes.
    pub memory: u64,
    /// Hugepage size.
    pub page_size: u64,
    /// NUMA node.
    pub node: Option<u32>,
    /// Reserved cores.
    pub cores: Vec<usize>,
    /// Cores left to the host.
    pub housekeeping: Vec<usize>,
    /// Whether the cores must be taken out of every cgroup.
    pub isolation: IsolationMode,
    /// What to do about a running irqbalance.
    pub irqbalance: IrqbalanceMode,
}

impl HostPlan {
    /// The plan with `mode` for a running irqbalance.
    pub fn with_irqbalance(mut self, mode: IrqbalanceMode) -> Self {
        self.irqbalance = mode;
        self
    }

    /// The plan with `mode` of isolation.
    pub fn with_isolation(mut self, mode: IsolationMode) -> Self {
        self.isolation = mode;
        self
    }

    /// Builds and validates a plan from its textual parts, against the cores `available`.
    pub fn new(
        memory: &str,
        page_size: Option<&str>,
        node: Option<u32>,
        cores_list: &str,
        available: &[usize],
    ) -> Result<Self, PlanError> {
        let memory = size::parse(memory).map_err(|source| PlanError::Size {
            field: "memory",
            source,
        })?;
        let page_size = match page_size {
            Some(p) => Some(size::parse(p).map_err(|source| PlanError::Size {
                field: "page size",
                source,
            })?),
            None => None,
        };
        Self::from_parts(
            memory,
            page_size,
            node,
            cores::parse(cores_list)?,
            available,
        )
    }

    /// Validates a plan of typed parts (bytes, a page size or 2 MiB, a node, cores) against
    /// the cores `available`.
    pub fn from_parts(
        memory: u64,
        page_size: Option<u64>,
        node: Option<u32>,
        cores: Vec<usize>,
        available: &[usize],
    ) -> Result<Self, PlanError> {
        let page_size = page_size.unwrap_or(2 << 20);
        if page_size != 2 << 20 && page_size != 1 << 30 {
            return Err(PlanError::PageSize(page_size));
        }
        if memory == 0 || memory % page_size != 0 {
            return Err(PlanError::Memory { memory, page_size });
        }
        if let Some(n) = node {
            if !Path::new(&format!("/sys/devices/system/node/node{n}")).exists() {
                return Err(PlanError::NoNode(n));
            }
        }
        cores::check_distinct(&cores)?;
        cores::check_available(&cores, available)?;
        let housekeeping: Vec<usize> = available
            .iter()
            .copied()
            .filter(|c| !cores.contains(c))
            .collect();
        if housekeeping.is_empty() {
            return Err(PlanError::NoHousekeeping {
                reserved: cores::format(&cores),
                available: cores::format(available),
            });
        }
        Ok(Self {
            memory,
            page_size,
            node,
            cores,
            housekeeping,
            isolation: IsolationMode::default(),
            irqbalance: IrqbalanceMode::default(),
        })
    }

    /// Reads a plan file; returns the plan and the state directory it names, if any.
    pub fn from_file(
        path: &Path,
        available: &[usize],
    ) -> Result<(Self, Option<PathBuf>), PlanError> {
        // A plan is a few lines of TOML: 1 MiB is far more than any needs.
        let bytes = crate::sys::files::read_limited(path, 1 << 20).map_err(|e| match e {
            crate::sys::files::FileError::Io(source) => PlanError::Read {
                path: path.to_path_buf(),
                source,
            },
            other => PlanError::Parse {
                path: path.to_path_buf(),
                reason: other.to_string(),
            },
        })?;
        let text = String::from_utf8(bytes).map_err(|_| PlanError::Parse {
            path: path.to_path_buf(),
            reason: "not UTF-8 text".into(),
        })?;
        Self::from_toml(&text, path, available)
    }

    /// Parses plan text (`path` names it in messages); the plan and the state directory it
    /// names, if any.
    pub fn from_toml(
        text: &str,
        path: &Path,
        available: &[usize],
    ) -> Result<(Self, Option<PathBuf>), PlanError> {
        let f: PlanFile = toml::from_str(text).map_err(|e| PlanError::Parse {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let plan = Self::from_parts(
            f.memory.0,
            f.page_size.map(|p| p.0),
            f.node,
            f.cores.0,
            available,
        )?
        .with_isolation(f.isolation.unwrap_or_default())
        .with_irqbalance(f.irqbalance.unwrap_or_default());
        Ok((plan, f.state_dir))
    }

    /// The form recorded in the ledger.
    pub fn record(&self) -> PlanRecord {
        let mut cores = self.cores.clone();
        cores.sort_unstable();
        PlanRecord {
            memory: self.memory,
            page_size: self.page_size,
            node: self.node,
            cores,
            isolation: self.isolation,
            irqbalance: self.irqbalance,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_and_validates() {
        let p = HostPlan::new("1G", None, None, "1", &[0, 1]).unwrap();
        assert_eq!((p.memory, p.page_size), (1 << 30, 2 << 20));
        assert_eq!(
            (p.cores.clone(), p.housekeeping.clone()),
            (vec![1], vec![0])
        );
        assert!(matches!(
            HostPlan::new("1G", Some("4K"), None, "1", &[0, 1]),
            Err(PlanError::PageSize(4096))
        ));
        assert!(matches!(
            HostPlan::new("3M", None, None, "1", &[0, 1]),
            Err(PlanError::Memory { .. })
        ));
        assert!(matches!(
            HostPlan::new("0", None, None, "1", &[0, 1]),
            Err(PlanError::Memory { .. })
        ));
        assert!(matches!(
            HostPlan::new("1G", None, None, "0-1", &[0, 1]),
            Err(PlanError::NoHousekeeping { .. })
        ));
        assert!(matches!(
            HostPlan::new("1G", None, None, "7", &[0, 1]),
            Err(PlanError::Cores(_))
        ));
        assert!(matches!(
            HostPlan::new("lots", None, None, "1", &[0, 1]),
            Err(PlanError::Size { .. })
        ));
    }

    #[test]
    fn the_example_plan_is_valid() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/systemd/host.toml");
        let all: Vec<usize> = (0..16).collect();
        let (plan, dir) = HostPlan::from_file(&p, &all).unwrap();
        assert_eq!(plan.memory, 8 << 30);
        assert_eq!(plan.cores, vec![2, 3, 4, 5, 6, 7]);
        assert_eq!(dir.as_deref(), Some(Path::new("/run/partition")));
    }

    #[test]
    fn plan_files() {
        let dir = std::env::temp_dir().join(format!("plan-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.toml");
        std::fs::write(
            &good,
            "memory = \"512M\"\npage_size = \"2M\"\ncores = \"1\"\nstate_dir = \"/tmp/x\"\n",
        )
        .unwrap();
        let (p, sd) = HostPlan::from_file(&good, &[0, 1]).unwrap();
        assert_eq!(p.memory, 512 << 20);
        assert_eq!(sd, Some(PathBuf::from("/tmp/x")));
        assert_eq!(p.irqbalance, IrqbalanceMode::Ban);
        let ignore = dir.join("ignore.toml");
        std::fs::write(
            &ignore,
            "memory = \"512M\"\ncores = \"1\"\nirqbalance = \"ignore\"\n",
        )
        .unwrap();
        let (p, _) = HostPlan::from_file(&ignore, &[0, 1]).unwrap();
        assert_eq!(p.irqbalance, IrqbalanceMode::Ignore);
        assert_eq!(p.record().irqbalance, IrqbalanceMode::Ignore);
        std::fs::write(
            &ignore,
            "memory = \"512M\"\ncores = \"1\"\nirqbalance = \"off\"\n",
        )
        .unwrap();
        let e = HostPlan::from_file(&ignore, &[0, 1]).unwrap_err();
        assert!(e.to_string().contains("irqbalance"), "{e}");
        let typo = dir.join("typo.toml");
        std::fs::write(&typo, "memory = \"512M\"\ncore = \"1\"\n").unwrap();
        let e = HostPlan::from_file(&typo, &[0, 1]).unwrap_err();
        assert!(matches!(e, PlanError::Parse { .. }), "{e}");
        assert!(e.to_string().contains("core"), "{e}");
        assert!(matches!(
            HostPlan::from_file(&dir.join("missing.toml"), &[0, 1]),
            Err(PlanError::Read { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
