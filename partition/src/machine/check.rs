//! The launch's first step: every piece of user input validated (cores, memory size,
//! kernel, initrd, command line, console, partition name, idle policy, CPU model, disks,
//! devices) into [`Checked`] before anything is allocated or KVM is opened; and the one
//! error type of the whole launch pipeline, [`LaunchError`].

use std::borrow::Cow;
use std::io::Write;
use std::path::PathBuf;

use boot::BootError;
use boot::kernel::{KernelError, KernelImage};
use boot::layout::{LayoutError, MemoryLayout};
use boot::regs::BootProtocol;
use pool::Backing;

use super::config::{
    Console, CoreSelection, KernelSource, LaunchConfig, MemorySource, SandboxRequest,
};
use super::resources::{MachinePlan, ResourceError};
use crate::config::cores::{self, CoreError};
use crate::cpu::cpumodel::CpuModel;
use crate::cpu::idle::IdlePlan;
use crate::host::claim::ClaimError;
use crate::host::isolation::IsolationError;
use crate::host::keeper::KeeperError;
use crate::kvm::VmError;
use crate::memory::MemoryError;
use crate::sys::sandbox::{Sandbox, SandboxError};

/// Largest initrd accepted.
pub(super) const MAX_INITRD: u64 = 1 << 30;

/// Errors launching a partition.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A device's threads could not start.
    #[error("starting the disk's queue threads: {0}")]
    Device(#[from] devices::virtio::DeviceError),
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
    /// A disk cannot be used.
    #[error("{0}")]
    Disk(#[from] crate::machine::disks::DiskError),
    /// A PCI device cannot be had.
    #[error("{0}")]
    Pci(#[from] crate::machine::pci::PciError),
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
    Api(#[from] crate::machine::api::ApiError),
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
            | Self::TooLarge { .. }
            | Self::Kernel { .. }
            | Self::Idle(_)
            | Self::Resources(_)
            | Self::Reservation(_) => true,
            Self::Disk(d) => matches!(
                d,
                crate::machine::disks::DiskError::Spec { .. }
                    | crate::machine::disks::DiskError::TooMany
                    | crate::machine::disks::DiskError::Open(_)
            ),
            Self::Boot(b) => !matches!(b, BootError::GuestMemory { .. }),
            Self::Sandbox(e) => e.is_usage(),
            Self::Pci(e) => e.is_usage(),
            Self::Pod(e) => e.is_usage(),
            Self::Api(e) => e.is_usage(),
            Self::Ledger(e) => e.is_usage(),
            _ => false,
        }
    }
}

/// A launch that passed [`check`].
pub struct Checked {
    pub(super) disks: Vec<devices::virtio::block::VirtioBlock>,
    pub(super) idle: IdlePlan,
    pub(super) cpu_model: CpuModel,
    pub(super) cmdline: String,
    pub(super) cores: Vec<usize>,
    pub(super) layout: MemoryLayout,
    /// Where every device goes.
    pub(super) plan: MachinePlan,
    pub(super) kernel: KernelImage,
    pub(super) kernel_name: String,
    pub(super) initrd: Option<Vec<u8>>,
    pub(super) console: Box<dyn Write + Send>,
    pub(super) sandbox: Sandbox,
    pub(super) cores_from: Option<String>,
    pub(super) cfg: LaunchConfig,
}

impl Checked {
    /// Guest memory size.
    pub fn memory(&self) -> u64 {
        self.layout.size()
    }
    /// The launch configuration.
    pub fn config(&self) -> &LaunchConfig {
        &self.cfg
    }
    /// vCPU → core assignment.
    pub fn cores(&self) -> &[usize] {
        &self.cores
    }
    /// The kernel's name for messages.
    pub fn kernel_name(&self) -> &str {
        &self.kernel_name
    }
    /// The idle plan in force.
    pub fn idle(&self) -> &IdlePlan {
        &self.idle
    }
    /// The guest's command line, with what the CPU model, the idle policy and the disks
    /// add.
    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }
    /// The CPU model in force.
    pub fn cpu_model(&self) -> &CpuModel {
        &self.cpu_model
    }
    /// How the running VMM will be confined.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }
    /// With `--cores from-cgroup`: why the cgroup's cores count as exclusive.
    pub fn cores_from(&self) -> Option<&str> {
        self.cores_from.as_deref()
    }
}

pub(super) fn read_limited(
    what: &'static str,
    path: &PathBuf,
    limit: u64,
) -> Result<Vec<u8>, LaunchError> {
    use crate::sys::files::FileError;
    crate::sys::files::read_limited(path, limit).map_err(|e| match e {
        FileError::Io(source) => LaunchError::File {
            what,
            path: path.clone(),
            source,
        },
        FileError::NotRegular => LaunchError::File {
            what,
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"),
        },
        FileError::TooLarge { limit } => LaunchError::TooLarge {
            what,
            path: path.clone(),
            size: std::fs::metadata(path).map_or(limit + 1, |m| m.len()),
            limit,
        },
        e @ FileError::UntrustedSymlink { .. } => LaunchError::File {
            what,
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string()),
        },
    })
}

/// Validates everything the user gave. Nothing is allocated, mapped or created, except
/// that the console file is opened.
pub fn check(cfg: LaunchConfig) -> Result<Checked, LaunchError> {
    let (cores, cores_from) = match &cfg.cores {
        CoreSelection::FromCgroup => {
            let (c, why) = crate::host::pod::cores_from_cgroup(cfg.kubelet_cpu_state.as_deref())?;
            (c, Some(why))
        }
        CoreSelection::List(list) => (list.clone(), None),
    };
    cores::check_distinct(&cores)?;
    cores::check_available(&cores, &cores::available())?;
    let sandbox = match &cfg.sandbox {
        SandboxRequest::Off => Sandbox::Off,
        SandboxRequest::On { uid, gid } => Sandbox::On(crate::sys::sandbox::resolve(
            uid.as_deref(),
            gid.as_deref(),
        )?),
    };
    if cores.len() > boot::mptable::MAX_CPUS {
        return Err(BootError::Tables(format!(
            "{} vCPUs: at most {} are supported",
            cores.len(),
            boot::mptable::MAX_CPUS
        ))
        .into());
    }
    let layout = MemoryLayout::new(cfg.memory)?;
    match &cfg.source {
        MemorySource::Anonymous(backing) => {
            let page = backing.page_size() as u64;
            if cfg.memory % page != 0 {
                return Err(LaunchError::PageMultiple {
                    size: cfg.memory,
                    page: page as usize,
                    backing: *backing,
                });
            }
            crate::host::claim::check_not_reserved(&cfg.state_dir, &cores)?;
        }
        MemorySource::Pool(req) => crate::host::claim::check_name(&req.name)?,
        MemorySource::Volume(dir) => {
            let page = crate::host::pod::volume_page_size(dir)?;
            if cfg.memory % page != 0 {
                return Err(crate::host::pod::PodError::PageMultiple {
                    size: cfg.memory,
                    page,
                    dir: dir.clone(),
                }
                .into());
            }
            crate::host::claim::check_not_reserved(&cfg.state_dir, &cores)?;
        }
    }
    let (bytes, kernel_name) = match &cfg.kernel {
        KernelSource::Path(p) => (
            Cow::Owned(read_limited("--kernel", p, layout.size())?),
            p.display().to_string(),
        ),
        KernelSource::Builtin { name, bytes } => (Cow::Borrowed(*bytes), name.to_string()),
    };
    let kernel = KernelImage::from_bytes(bytes).map_err(|source| LaunchError::Kernel {
        path: kernel_name.clone(),
        source,
    })?;
    kernel
        .check_fits(&layout)
        .map_err(|source| LaunchError::Kernel {
            path: kernel_name.clone(),
            source,
        })?;
    if cfg.protocol == BootProtocol::Pvh && !kernel.has_pvh() {
        return Err(LaunchError::Kernel {
            path: kernel_name,
            source: KernelError::NoPvhEntry,
        });
    }
    let idle = crate::cpu::idle::resolve(cfg.idle, &crate::kvm::idle_caps()?)?;
    if let Some(p) = &cfg.api_socket {
        check_api_socket(p)?;
    }
    let disks = crate::machine::disks::open(&cfg.disks)?;
    let has = |engine: bool| {
        cfg.devices
            .iter()
            .any(|d| matches!(d, crate::machine::pci::DeviceSpec::Engine { .. }) == engine)
    };
    let plan = MachinePlan::new(
        layout.ram_ranges().len(),
        disks.len(),
        has(true),
        has(false),
    )?;
    let cpu_model =
        crate::cpu::cpumodel::resolve(cfg.cpu_model, crate::cpu::cpumodel::host_is_kvm_pvm());
    // The CPU model's words go first, so the user's own can override them (see
    // `cpumodel::command_line` for `clearcpuid=`).
    let cmdline = boot::compose_cmdline(
        &crate::cpu::cpumodel::command_line(&cpu_model, &cfg.cmdline),
        &[idle.cmdline, &crate::machine::disks::cmdline(&plan.disks)],
        kernel.cmdline_max(),
    )?;
    let initrd = match &cfg.initrd {
        Some(p) => {
            let rd = read_limited("--initrd", p, MAX_INITRD.min(layout.size()))?;
            let (_, kernel_end) = kernel.footprint();
            boot::place_initrd(&layout, kernel_end, rd.len() as u64, u64::MAX)?;
            Some(rd)
        }
        None => None,
    };
    let console: Box<dyn Write + Send> = match &cfg.console {
        Console::Stdout => Box::new(std::io::stdout()),
        Console::File(p) => Box::new(std::io::LineWriter::new(open_console(p)?)),
    };
    Ok(Checked {
        disks,
        plan,
        idle,
        cpu_model,
        cmdline,
        cores,
        layout,
        kernel,
        kernel_name,
        initrd,
        console,
        sandbox,
        cores_from,
        cfg,
    })
}

/// Opens `--console FILE` for writing without waiting (a FIFO's open would block until a
/// reader came) and refuses anything but a regular file.
pub(super) fn open_console(p: &std::path::Path) -> Result<std::fs::File, LaunchError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| LaunchError::File {
        what: "--console",
        path: p.to_path_buf(),
        source,
    };
    let not_regular = || err(std::io::Error::other("not a regular file"));
    crate::sys::files::check_symlinks(p).map_err(|e| {
        err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            e.to_string(),
        ))
    })?;
    if std::fs::metadata(p).is_ok_and(|m| !m.is_file()) {
        return Err(not_regular());
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | crate::sys::files::nofollow_in(p))
        .open(p)
        .map_err(|e| match e.raw_os_error() {
            // A FIFO put there since: O_NONBLOCK without a reader.
            Some(libc::ENXIO) => not_regular(),
            _ => err(e),
        })?;
    if !f.metadata().map_err(err)?.is_file() {
        return Err(not_regular());
    }
    Ok(f)
}

/// `--api-socket PATH` must fit a Unix socket address and be in a directory that exists;
/// found before anything is built (the bind itself comes later, as root).
pub(super) fn check_api_socket(p: &std::path::Path) -> Result<(), LaunchError> {
    let err = |why: &str| LaunchError::File {
        what: "--api-socket",
        path: p.to_path_buf(),
        source: std::io::Error::other(why.to_string()),
    };
    // sun_path holds 108 bytes with the terminating zero.
    if p.as_os_str().len() > 107 {
        return Err(err("longer than the 107 bytes a Unix socket address holds"));
    }
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if !parent.is_dir() {
        return Err(err("its directory does not exist"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::cpumodel::CpuModelRequest;
    use crate::cpu::idle::IdlePolicy;
    use crate::host::claim::ClaimError;
    use crate::machine::config::{Console, KernelSource, PoolRequest, SandboxRequest};
    use boot::regs::BootProtocol;
    use pool::Backing;

    fn config(source: MemorySource, memory: u64) -> LaunchConfig {
        LaunchConfig {
            cores: CoreSelection::List(vec![0]),
            memory,
            kernel: KernelSource::Builtin {
                name: "not-a-kernel",
                bytes: b"nothing",
            },
            initrd: None,
            cmdline: String::new(),
            console: Console::Stdout,
            console_limit: crate::machine::console::DEFAULT_LIMIT,
            protocol: BootProtocol::Linux64,
            source,
            state_dir: std::env::temp_dir().join("partition-launch-unit-no-ledger"),
            idle: IdlePolicy::Auto,
            disks: Vec::new(),
            ioeventfd: true,
            cpu_model: CpuModelRequest::Auto,
            sandbox: SandboxRequest::Off,
            kubelet_cpu_state: None,
            api_socket: None,
            devices: Vec::new(),
        }
    }

    fn refused(cfg: LaunchConfig) -> LaunchError {
        match check(cfg) {
            Ok(_) => panic!("check accepted it"),
            Err(e) => e,
        }
    }

    #[test]
    fn check_refuses_bad_input_before_anything_is_allocated() {
        // 9 MiB of 2 MiB pages.
        let e = refused(config(MemorySource::Anonymous(Backing::Hugetlb), 9 << 20));
        assert!(matches!(e, LaunchError::PageMultiple { .. }), "{e}");
        assert!(e.is_usage());
        let e = refused(LaunchConfig {
            cores: CoreSelection::List(vec![0, 0]),
            ..config(MemorySource::Anonymous(Backing::Anonymous), 64 << 20)
        });
        assert!(matches!(e, LaunchError::Cores(_)), "{e}");
        // A pool launch's name is checked with the rest of the input.
        let e = refused(config(
            MemorySource::Pool(PoolRequest {
                name: "-bad".into(),
                offset: None,
            }),
            64 << 20,
        ));
        assert!(
            matches!(e, LaunchError::Reservation(_)) && e.is_usage(),
            "{e}"
        );
        // A kernel that is not one.
        let e = refused(config(
            MemorySource::Anonymous(Backing::Anonymous),
            64 << 20,
        ));
        assert!(
            matches!(e, LaunchError::Kernel { .. } | LaunchError::Vm(_)),
            "{e}"
        );
    }

    #[test]
    fn claim_errors_keep_their_meaning() {
        let e: LaunchError = ClaimError::Refused("core 3 belongs to partition \"a\"".into()).into();
        assert!(e.is_usage(), "{e}");
        assert!(e.to_string().contains("core 3"));
        let e: LaunchError = ClaimError::Ledger(crate::host::ledger::LedgerError::Io {
            path: "/x".into(),
            what: "reading",
            source: std::io::Error::other("disk on fire"),
        })
        .into();
        assert!(!e.is_usage(), "{e}");
    }
}
