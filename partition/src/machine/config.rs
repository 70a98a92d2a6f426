//! What to launch, as the CLI, a plan or the API hands it to [`super::launch`]: typed, so
//! every choice is an enum and every list is parsed before it gets here.

pub use crate::config::keyvalue::CoreSelection;
use std::path::PathBuf;

use boot::regs::BootProtocol;
use pool::Backing;

use crate::cpu::cpumodel::CpuModelRequest;
use crate::cpu::idle::IdlePolicy;

/// Where the kernel comes from.
#[derive(Clone, Debug)]
pub enum KernelSource {
    /// A file.
    Path(PathBuf),
    /// An image built into the binary (the probe guest).
    Builtin {
        /// Name for messages.
        name: &'static str,
        /// The ELF.
        bytes: &'static [u8],
    },
}

/// What to launch.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    /// Host cores; vCPU i runs on the i-th.
    pub cores: CoreSelection,
    /// Guest memory in bytes.
    pub memory: u64,
    /// The kernel.
    pub kernel: KernelSource,
    /// Initial ramdisk.
    pub initrd: Option<PathBuf>,
    /// Kernel command line.
    pub cmdline: String,
    /// Entry protocol.
    pub protocol: BootProtocol,
    /// Where guest memory comes from.
    pub source: MemorySource,
    /// State directory holding the ledger.
    pub state_dir: PathBuf,
    /// Idle policy.
    pub idle: IdlePolicy,
    /// Bind each queue's doorbell to an ioeventfd (else: a VM exit per notify).
    pub ioeventfd: bool,
    /// What the guest is told about its CPU (see [`crate::cpu::cpumodel`]).
    pub cpu_model: CpuModelRequest,
    /// Whether, and as whom, the running VMM is confined ([`crate::sys::sandbox`]).
    pub sandbox: SandboxRequest,
    /// With `cores` = `from-cgroup`: the kubelet's CPU manager checkpoint, to establish
    /// that the cgroup's cores are exclusive ([`crate::host::pod`]).
    pub kubelet_cpu_state: Option<PathBuf>,
    /// Serve the local API ([`crate::api`]) on this Unix socket.
    pub api_socket: Option<PathBuf>,
    /// Every device, of every kind ([`crate::board::spec::DeviceSpec`]), in the order asked (the
    /// CLI: the console, each `--disk`, then each `--device`); disks take their virtio-mmio
    /// slots in their order among them. A kind asked for none of that every board has (the
    /// console) is added on stdout by the plan (`DeviceSpec::with_implied`).
    pub devices: Vec<crate::board::spec::DeviceSpec>,
}

/// A launch configuration that breaks a rule of its own, whoever built it (the CLI, a plan,
/// the API): [`LaunchConfig::validate`] says which, before anything is looked at.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A kubelet checkpoint without cores taken from the cgroup.
    #[error("--kubelet-cpu-state goes with --cores from-cgroup")]
    KubeletStateWithoutCgroup,
    /// Two devices that cannot be in one partition.
    #[error("--device {spec:?}: {why}")]
    Devices {
        /// The second of the two, as asked.
        spec: String,
        /// Why not.
        why: String,
    },
}

/// A configuration that keeps its own rules ([`LaunchConfig::validate`], run by
/// `TryFrom`): the only way to a plan (`machine::check::check` takes one), so every way of
/// building a launch runs them, once.
#[derive(Clone, Debug)]
pub struct ValidConfig(LaunchConfig);

impl TryFrom<LaunchConfig> for ValidConfig {
    type Error = ConfigError;
    fn try_from(cfg: LaunchConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self(cfg))
    }
}

impl std::ops::Deref for ValidConfig {
    type Target = LaunchConfig;
    fn deref(&self) -> &LaunchConfig {
        &self.0
    }
}

impl ValidConfig {
    /// The configuration, to be taken apart.
    pub fn into_inner(self) -> LaunchConfig {
        self.0
    }
}

impl LaunchConfig {
    /// The rules a configuration keeps by itself (the host is not looked at); a launch
    /// runs them by making a [`ValidConfig`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.kubelet_cpu_state.is_some() && self.cores != CoreSelection::FromCgroup {
            return Err(ConfigError::KubeletStateWithoutCgroup);
        }
        for (i, d) in self.devices.iter().enumerate() {
            if let Some(why) = d.conflict(&self.devices[..i]) {
                return Err(ConfigError::Devices {
                    spec: d.to_string(),
                    why,
                });
            }
        }
        Ok(())
    }
}

/// `--no-sandbox`, or `--uid`/`--gid` (each a name or a number; default the `partition`
/// user and its group).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SandboxRequest {
    /// Root, every capability, no seccomp: for debugging.
    Off,
    /// Confined, as this user and group.
    On {
        /// `--uid`.
        uid: Option<String>,
        /// `--gid`.
        gid: Option<String>,
    },
}

/// Where a launch's guest memory comes from.
#[derive(Clone, Debug)]
pub enum MemorySource {
    /// Anonymous memory of this backing, on cores the reservation does not hold.
    Anonymous(Backing),
    /// A pool extent and reserved cores, claimed under a partition name.
    Pool(PoolRequest),
    /// A file in this hugetlbfs directory (a pod's `HugePages-2Mi` volume), within the
    /// pod's hugetlb limit ([`crate::host::pod`]).
    Volume(PathBuf),
}

/// A launch from the reservation.
#[derive(Clone, Debug)]
pub struct PoolRequest {
    /// Partition name.
    pub name: String,
    /// Explicit extent offset in the pool; first fit if absent.
    pub offset: Option<u64>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::board::spec::DeviceSpec;

    /// A configuration that keeps every rule, for tests to change one field of.
    pub(crate) fn cfg() -> LaunchConfig {
        LaunchConfig {
            cores: CoreSelection::List(vec![1]),
            memory: 16 << 20,
            kernel: KernelSource::Path("k".into()),
            initrd: None,
            cmdline: String::new(),
            protocol: BootProtocol::Linux64,
            source: MemorySource::Anonymous(Backing::Anonymous),
            state_dir: "/s".into(),
            idle: IdlePolicy::Shared,
            ioeventfd: true,
            cpu_model: CpuModelRequest::Auto,
            sandbox: SandboxRequest::Off,
            kubelet_cpu_state: None,
            api_socket: None,
            devices: Vec::new(),
        }
    }

    #[test]
    fn a_configuration_keeps_its_own_rules_whoever_built_it() {
        assert_eq!(cfg().validate(), Ok(()));
        let mut c = cfg();
        c.kubelet_cpu_state = Some("/var/lib/kubelet/cpu_manager_state".into());
        assert_eq!(c.validate(), Err(ConfigError::KubeletStateWithoutCgroup));
        c.cores = CoreSelection::FromCgroup;
        assert_eq!(c.validate(), Ok(()));
        // Requests as the CLI makes them, by their words (no kind named here).
        let device = |words: &str| crate::board::spec::parse_device(words).unwrap();
        let engine = |d: &str| device(&format!("engine,doorbell={d}"));
        let vfio = |b: &str| device(&format!("vfio={b}"));
        let mut c = cfg();
        let disk = |p: &str| {
            DeviceSpec::Disk(devices::virtio::block::BlockConfig::new(p.into(), p.into()))
        };
        // Disks among the PCI functions: no conflict with them.
        c.devices = vec![
            disk("/a.img"),
            vfio("0000:41:00.0"),
            disk("/b.img"),
            vfio("0000:42:00.0"),
        ];
        assert_eq!(c.validate(), Ok(()));
        c.devices.push(engine("mapped"));
        c.devices.push(engine("trap"));
        let e = c.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "--device \"engine,doorbell=trap\": one submission engine per partition"
        );
        c.devices = vec![vfio("0000:41:00.0"), vfio("0000:41:00.0")];
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("asked for twice")
        );
    }
}
