//! What the host is, as a launch needs to know it, read once before the launch is planned:
//! the cores online and (with `--cores from-cgroup`) the cgroup's, the sandbox's user, the
//! memory the host can back, a reservation holding an asked-for core, a pod volume's page
//! size, KVM's idle capabilities and the guest's address width, whether `/dev/kvm` is the
//! nested kvm_pvm module, and the BARs of the functions to pass through.
//!
//! Reading them is all this step does: nothing the guest will use is opened (the kernel,
//! the disks and the console are the open step's, `machine/open.rs`), and nothing is
//! decided (not even whether the cgroup's cores are exclusive, or the volume hugetlbfs) (the plan, `machine/check.rs`, decides from these facts and the configuration
//! alone, so a unit test can hand it a made-up host).

use std::path::PathBuf;

use super::config::{CoreSelection, LaunchConfig, MemorySource, SandboxRequest};
use super::error::LaunchError;
use crate::board::kind::DeviceFacts;
use crate::board::resources::Needs;
use crate::board::spec::DeviceSpec;
use crate::cpu::idle::IdleCaps;
use crate::host::claim::CoreHolder;
use crate::sys::sandbox::Identity;

/// The host's memory, as far as it bounds a guest's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostMemory {
    /// `/proc/meminfo` `MemTotal`, in bytes.
    pub total: Option<u64>,
    /// `/proc/meminfo` `MemAvailable`, in bytes.
    pub available: Option<u64>,
    /// `/proc/meminfo` `HugePages_Free` times `Hugepagesize`, in bytes.
    pub hugepages_free: Option<u64>,
    /// This process's memory cgroup's limit, and the cgroup.
    pub cgroup_limit: Option<(u64, PathBuf)>,
}

impl HostMemory {
    /// Reads `/proc/meminfo` and this process's memory cgroup.
    pub fn read() -> Self {
        let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        HostMemory {
            total: meminfo(&text, "MemTotal"),
            available: meminfo(&text, "MemAvailable"),
            hugepages_free: meminfo(&text, "HugePages_Free"),
            cgroup_limit: crate::host::pod::memory_limit(),
        }
    }
}

/// `/proc/meminfo`'s (`text`) `key` in bytes (its kB, or a count of hugepages times their
/// size).
fn meminfo(text: &str, key: &str) -> Option<u64> {
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    let v = field(key)?;
    Some(if key.starts_with("HugePages_") {
        v * field("Hugepagesize")? * 1024
    } else {
        v * 1024
    })
}

/// Everything of the host a launch's plan depends on.
#[derive(Clone, Debug)]
pub struct HostFacts {
    /// The cores online (`/sys/devices/system/cpu/online`).
    pub online: Vec<usize>,
    /// With `--cores from-cgroup`: this process's cpuset cgroup as read (whether its cores
    /// are exclusive is the plan's to judge).
    pub cgroup: Option<crate::host::pod::CgroupCpuset>,
    /// With the sandbox on: the user and group the VMM will run as.
    pub identity: Option<Identity>,
    /// The memory the host can back.
    pub memory: HostMemory,
    /// For a launch outside the reservation: the first asked-for core a reservation holds.
    pub reserved: Option<(usize, CoreHolder)>,
    /// For a pod volume: its directory, held open, with what was read of it (its page
    /// size, its owner).
    pub volume: Option<crate::host::volume::VolumeDir>,
    /// What KVM can do about idle exits and halt polling.
    pub idle_caps: IdleCaps,
    /// Whether `/dev/kvm` is the nested kvm_pvm module.
    pub kvm_pvm: bool,
    /// With PCI devices: the guest's physical address width (0 without).
    pub phys_bits: u8,
    /// What the host has for each device asked for, in the order asked (a passed-through
    /// function's BARs, from sysfs).
    pub devices: Vec<DeviceFacts>,
}

impl HostFacts {
    /// Reads what `cfg` needs to know of this host.
    pub fn read(cfg: &LaunchConfig) -> Result<Self, LaunchError> {
        let cgroup = match &cfg.cores {
            CoreSelection::FromCgroup => Some(crate::host::pod::CgroupCpuset::read(
                cfg.kubelet_cpu_state.as_deref(),
            )?),
            CoreSelection::List(_) => None,
        };
        let identity = match &cfg.sandbox {
            SandboxRequest::Off => None,
            SandboxRequest::On { uid, gid } => Some(crate::sys::sandbox::resolve(
                uid.as_deref(),
                gid.as_deref(),
            )?),
        };
        let asked: &[usize] = match (&cfg.cores, &cgroup) {
            (CoreSelection::List(l), _) => l,
            (CoreSelection::FromCgroup, Some(c)) => &c.cores,
            (CoreSelection::FromCgroup, None) => &[],
        };
        let (reserved, volume) = match &cfg.source {
            MemorySource::Anonymous(_) => (
                crate::host::claim::reserved_core(&cfg.state_dir, asked)?,
                None,
            ),
            MemorySource::Volume(dir) => (
                crate::host::claim::reserved_core(&cfg.state_dir, asked)?,
                Some(crate::host::volume::VolumeDir::open(dir)?),
            ),
            MemorySource::Pool(_) => (None, None),
        };
        // A function the host cannot pass through is refused here, naming why, before its
        // BARs are read.
        let root = std::path::Path::new("/");
        let devices = cfg
            .devices
            .iter()
            .map(|d| d.facts(root))
            .collect::<Result<Vec<_>, _>>()?;
        let pci = DeviceSpec::asks(&cfg.devices, &devices)
            .iter()
            .any(|a| matches!(a.needs, Needs::Pci(_)));
        let phys_bits = match pci {
            false => 0,
            true => crate::kvm::vm::guest_phys_bits()?,
        };
        Ok(HostFacts {
            online: crate::config::cores::available(),
            cgroup,
            identity,
            memory: HostMemory::read(),
            reserved,
            volume,
            idle_caps: crate::kvm::idle_caps()?,
            kvm_pvm: crate::cpu::cpumodel::host_is_kvm_pvm(),
            phys_bits,
            devices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_reads_kilobytes_and_hugepages_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemAvailable:   20000000 kB\n\
                    HugePages_Total:      8\nHugePages_Free:       3\nHugepagesize:       2048 kB\n";
        assert_eq!(meminfo(text, "MemTotal"), Some(24576000 * 1024));
        assert_eq!(meminfo(text, "MemAvailable"), Some(20000000 * 1024));
        assert_eq!(meminfo(text, "HugePages_Free"), Some(3 * 2048 * 1024));
        assert_eq!(meminfo(text, "MemFree"), None);
        assert_eq!(meminfo("HugePages_Free: 3\n", "HugePages_Free"), None);
    }
}
