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

/// Where the guest's serial output goes.
#[derive(Clone, Debug)]
pub enum Console {
    /// The VMM's stdout.
    Stdout,
    /// A file (created or truncated).
    File(PathBuf),
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
    /// Serial output.
    pub console: Console,
    /// Most bytes of serial output passed on (the rest is dropped and said once).
    pub console_limit: u64,
    /// Entry protocol.
    pub protocol: BootProtocol,
    /// Where guest memory comes from.
    pub source: MemorySource,
    /// State directory holding the ledger.
    pub state_dir: PathBuf,
    /// Idle policy.
    pub idle: IdlePolicy,
    /// virtio-blk disks.
    pub disks: Vec<devices::virtio::block::BlockConfig>,
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
    /// PCI functions (`--device`, [`crate::board::pci`]).
    pub devices: Vec<crate::board::pci::DeviceSpec>,
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
