//! The one error type of the launch pipeline, [`LaunchError`]: every step's failure, each
//! saying whether the user's request is at fault (exit 2) or the VMM (exit 1).

use boot::BootError;
use boot::kernel::KernelError;
use std::path::PathBuf;

use boot::layout::LayoutError;
use pool::Backing;

use crate::board::resources::ResourceError;
use crate::config::cores::CoreError;
use crate::host::claim::ClaimError;
use crate::host::isolation::IsolationError;
use crate::host::keeper::KeeperError;
use crate::kvm::VmError;
use crate::memory::MemoryError;
use crate::sys::sandbox::SandboxError;

/// Errors launching a partition.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A device's threads could not start.
    #[error("{0}")]
    Device(#[from] crate::board::device::DeviceError),
    /// The devices asked for do not fit the machine.
    #[error("placing the devices: {0}")]
    Resources(#[from] ResourceError),
    /// Bad core list.
    #[error("--cores: {0}")]
    Cores(#[from] CoreError),
    /// Bad memory size.
    #[error("--memory: {0}")]
    Memory(#[from] LayoutError),
    /// Memory size not a multiple of the backing's page size.
    #[error(
        "--memory: {size} bytes is not a multiple of the {page} byte pages of {backing:?} memory"
    )]
    PageMultiple {
        /// Size.
        size: u64,
        /// Page size.
        page: usize,
        /// Backing.
        backing: Backing,
    },
    /// A file could not be read.
    #[error("{what} {path}: {source}")]
    File {
        /// Which argument.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A path was refused or could not be opened (`crate::sys::files`).
    #[error("{what} {}: {source}", path.display())]
    Path {
        /// Which argument.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: crate::sys::files::FileError,
    },
    /// More guest memory than the host (or this process's cgroup) has.
    #[error("--memory: {0}")]
    HostMemory(String),
    /// A file is larger than allowed.
    #[error("{what} {path} is {size} bytes, more than {limit} (the guest's memory or the limit)")]
    TooLarge {
        /// Which argument.
        what: &'static str,
        /// Path.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The kernel image was refused.
    #[error("--kernel {path}: {source}")]
    Kernel {
        /// Path or name.
        path: String,
        /// Why.
        source: KernelError,
    },
    /// Boot setup refused the configuration.
    #[error("{0}")]
    Boot(#[from] BootError),
    /// Guest memory could not be assembled.
    #[error("guest memory: {0}")]
    GuestMemory(#[from] MemoryError),
    /// KVM setup failed.
    #[error("{0}")]
    Vm(#[from] VmError),
    /// A device cannot be had: refused by the host, its backing, its place or its attach
    /// (its kind says whether the user's request is at fault).
    #[error("{0}")]
    Kind(#[from] crate::board::kind::KindError),
    /// The PCI root could not be put together.
    #[error("{0}")]
    Pci(#[from] crate::board::pci::PciError),
    /// The idle policy cannot be had here.
    #[error("{0}")]
    Idle(#[from] crate::cpu::idle::IdleError),
    /// Building the device buses failed.
    #[error("devices: {0}")]
    Bus(#[from] devices::BusError),
    /// The reservation refused the launch (no reservation, cores or extent not available,
    /// name in use).
    #[error("{0}")]
    Reservation(String),
    /// The ledger could not be read or written.
    #[error("{0}")]
    Ledger(#[from] crate::host::ledger::LedgerError),
    /// The pool file could not be opened or mapped.
    #[error("{0}")]
    PoolFile(#[from] pool::poolfile::PoolFileError),
    /// The sandbox cannot be set up (no such user, say), or did not take.
    #[error("sandbox: {0}")]
    Sandbox(#[from] SandboxError),
    /// The partition's keeper could not be started or did not give the partition back.
    #[error("{0}")]
    Keeper(#[from] KeeperError),
    /// The reserved cores' cpuset could not be opened or joined.
    #[error("{0}")]
    Isolation(#[from] IsolationError),
    /// A pod's cores or memory cannot be used.
    #[error("{0}")]
    Pod(#[from] crate::host::pod::PodError),
    /// The API socket cannot be set up.
    #[error("{0}")]
    Api(#[from] crate::api::ApiError),
    /// The configuration breaks a rule of its own.
    #[error(transparent)]
    Config(#[from] super::config::ConfigError),
    /// The host's facts lack what the configuration needs: they were read for another one
    /// (a bug of the caller, not the user's input).
    #[error("the host's facts were read for another configuration: {0}")]
    Facts(&'static str),
    /// OS-level failure (threads, signals, eventfds).
    #[error("{what}: {source}")]
    Os {
        /// What failed.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

impl From<crate::sys::seccomp::SeccompError> for LaunchError {
    fn from(e: crate::sys::seccomp::SeccompError) -> Self {
        Self::Sandbox(e.into())
    }
}

impl From<ClaimError> for LaunchError {
    fn from(e: ClaimError) -> Self {
        match e {
            ClaimError::Refused(why) => Self::Reservation(why),
            ClaimError::Ledger(e) => Self::Ledger(e),
            ClaimError::PoolFile(e) => Self::PoolFile(e),
        }
    }
}

impl LaunchError {
    /// Whether this is the user's input at fault (the CLI exits with status 2).
    pub fn is_usage(&self) -> bool {
        match self {
            Self::Cores(_)
            | Self::Memory(_)
            | Self::PageMultiple { .. }
            | Self::File { .. }
            | Self::Path { .. }
            | Self::HostMemory(_)
            | Self::TooLarge { .. }
            | Self::Kernel { .. }
            | Self::Idle(_)
            | Self::Resources(_)
            | Self::Reservation(_)
            | Self::Config(_) => true,
            Self::Kind(e) => e.is_usage(),
            Self::Boot(b) => !matches!(b, BootError::GuestMemory { .. }),
            Self::Sandbox(e) => e.is_usage(),
            Self::Pod(e) => e.is_usage(),
            Self::Api(e) => e.is_usage(),
            Self::Ledger(e) => e.is_usage(),
            Self::Vm(e) => e.is_usage(),
            _ => false,
        }
    }
}
