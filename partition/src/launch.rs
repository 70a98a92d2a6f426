//! Launching a partition: one straight pipeline, [`launch`], read top to bottom.
//!
//! 1. [`check`]: every piece of user input is validated (cores, memory size, kernel, initrd,
//!    command line, console, partition name) before anything is allocated or KVM is
//!    touched.
//! 2. [`acquire`]: guest memory, [`Acquired`]: anonymous memory, or a pool extent whose
//!    claim ([`crate::claim::ExtentClaim`]) scrubs and frees it when it ends.
//! 3. [`run`]: create the VM, write the boot structures, attach the devices, start one
//!    pinned thread per vCPU, wait for the guest, a fault or a signal, tear down, report.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boot::kernel::{KernelError, KernelImage};
use boot::layout::{LayoutError, MemoryLayout};
use boot::regs::BootProtocol;
use boot::{BootConfig, BootError, BootInfo};
use devices::Bus;
use devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use devices::power::{
    ACPI_PM_BASE, ACPI_PM_LEN, AcpiPm, DEBUG_EXIT_LEN, DEBUG_EXIT_PORT, DebugExit,
};
use devices::rtc::{self, RTC_LEN, RTC_PORT, Rtc};
use devices::serial::{COM1_IRQ, COM1_LEN, COM1_PORT, SerialPort};
use pool::{Backing, RamSource};
use vmm_sys_util::eventfd::EventFd;

use crate::claim::{ClaimError, ClaimRequest, ExtentClaim};
use crate::cores::{self, CoreError};
use crate::cpuid::IdleCpuid;
use crate::cpumodel::{CpuModel, CpuModelRequest};
use crate::idle::{IdlePlan, IdlePolicy};
use crate::isolation::{GuestsCpuset, IsolationError};
use crate::keeper::{Keeper, KeeperError, KeeperMode};
use crate::kvm::stats::Stats;
use crate::kvm::vcpu::{self as kvm_vcpu, VcpuContext, VcpuHandle};
use crate::kvm::{Vm, VmError};
use crate::memory::{GuestMemory, MemoryError};
use crate::readback::Readback;
use crate::sandbox::{Identity, Role, Sandbox, SandboxError};
use crate::signals::SignalGuard;
use crate::vcpu::StopReason;

/// The legacy devices on the PIO bus, as the ACPI DSDT describes them (COM1 with its
/// interrupt; the RTC, whose interrupt is not emulated).
const LEGACY_DEVICES: [boot::acpi::IsaDevice; 2] = [
    boot::acpi::IsaDevice {
        name: "COM1",
        hid: "PNP0501",
        port: COM1_PORT as u16,
        len: COM1_LEN as u8,
        irq: Some(COM1_IRQ),
    },
    boot::acpi::IsaDevice {
        name: "RTC0",
        hid: "PNP0B00",
        port: RTC_PORT as u16,
        len: RTC_LEN as u8,
        irq: None,
    },
];

/// Largest initrd accepted.
const MAX_INITRD: u64 = 1 << 30;

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
    /// Host cores; vCPU i runs on `cores[i]`.
    pub cores: String,
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
    /// What the guest is told about its CPU (see [`crate::cpumodel`]).
    pub cpu_model: CpuModelRequest,
    /// Whether, and as whom, the running VMM is confined ([`crate::sandbox`]).
    pub sandbox: SandboxRequest,
    /// With `cores` = `from-cgroup`: the kubelet's CPU manager checkpoint, to establish
    /// that the cgroup's cores are exclusive ([`crate::pod`]).
    pub kubelet_cpu_state: Option<PathBuf>,
    /// Serve the local API ([`crate::api`]) on this Unix socket.
    pub api_socket: Option<PathBuf>,
    /// PCI functions (`--device`, [`crate::pci`]).
    pub devices: Vec<crate::pci::DeviceSpec>,
}

/// `--cores` naming no list: the cores of the cgroup this process runs in (a pod's).
pub const CORES_FROM_CGROUP: &str = "from-cgroup";

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
    /// pod's hugetlb limit ([`crate::pod`]).
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

/// Errors launching a partition.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
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
    Disk(#[from] crate::disks::DiskError),
    /// A PCI device cannot be had.
    #[error("{0}")]
    Pci(#[from] crate::pci::PciError),
    /// The idle policy cannot be had here.
    #[error("{0}")]
    Idle(#[from] crate::idle::IdleError),
    /// Building the device buses failed.
    #[error("devices: {0}")]
    Bus(#[from] devices::BusError),
    /// The reservation refused the launch (no reservation, cores or extent not available,
    /// name in use).
    #[error("{0}")]
    Reservation(String),
    /// The ledger could not be read or written.
    #[error("{0}")]
    Ledger(#[from] crate::ledger::LedgerError),
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
    Pod(#[from] crate::pod::PodError),
    /// The API socket cannot be set up.
    #[error("{0}")]
    Api(#[from] crate::api::ApiError),
    /// OS-level failure (threads, signals, eventfds).
    #[error("{what}: {source}")]
    Os {
        /// What failed.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
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
            | Self::Reservation(_) => true,
            Self::Disk(d) => matches!(
                d,
                crate::disks::DiskError::Spec { .. }
                    | crate::disks::DiskError::TooMany
                    | crate::disks::DiskError::Open(_)
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
    disks: Vec<devices::virtio::block::VirtioBlock>,
    idle: IdlePlan,
    cpu_model: CpuModel,
    cmdline: String,
    cores: Vec<usize>,
    layout: MemoryLayout,
    kernel: KernelImage,
    kernel_name: String,
    initrd: Option<Vec<u8>>,
    console: Box<dyn Write + Send>,
    sandbox: Sandbox,
    cores_from: Option<String>,
    cfg: LaunchConfig,
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

fn read_limited(what: &'static str, path: &PathBuf, limit: u64) -> Result<Vec<u8>, LaunchError> {
    use crate::files::FileError;
    crate::files::read_limited(path, limit).map_err(|e| match e {
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
    let (cores, cores_from) = if cfg.cores == CORES_FROM_CGROUP {
        let (c, why) = crate::pod::cores_from_cgroup(cfg.kubelet_cpu_state.as_deref())?;
        (c, Some(why))
    } else {
        (cores::parse(&cfg.cores)?, None)
    };
    cores::check_available(&cores, &cores::available())?;
    let sandbox = match &cfg.sandbox {
        SandboxRequest::Off => Sandbox::Off,
        SandboxRequest::On { uid, gid } => {
            Sandbox::On(crate::sandbox::resolve(uid.as_deref(), gid.as_deref())?)
        }
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
            crate::claim::check_not_reserved(&cfg.state_dir, &cores)?;
        }
        MemorySource::Pool(req) => crate::claim::check_name(&req.name)?,
        MemorySource::Volume(dir) => {
            let page = crate::pod::volume_page_size(dir)?;
            if cfg.memory % page != 0 {
                return Err(crate::pod::PodError::PageMultiple {
                    size: cfg.memory,
                    page,
                    dir: dir.clone(),
                }
                .into());
            }
            crate::claim::check_not_reserved(&cfg.state_dir, &cores)?;
        }
    }
    let (bytes, kernel_name) = match &cfg.kernel {
        KernelSource::Path(p) => (
            read_limited("--kernel", p, layout.size())?,
            p.display().to_string(),
        ),
        KernelSource::Builtin { name, bytes } => (bytes.to_vec(), name.to_string()),
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
    let idle = crate::idle::resolve(cfg.idle, &crate::kvm::idle_caps()?)?;
    if let Some(p) = &cfg.api_socket {
        check_api_socket(p)?;
    }
    let disks = crate::disks::open(&cfg.disks)?;
    let cpu_model = crate::cpumodel::resolve(cfg.cpu_model, crate::cpumodel::host_is_kvm_pvm());
    // The CPU model's words go first, so the user's own can override them (see
    // `cpumodel::command_line` for `clearcpuid=`).
    let cmdline = boot::compose_cmdline(
        &crate::cpumodel::command_line(&cpu_model, &cfg.cmdline),
        &[idle.cmdline, &crate::disks::cmdline(disks.len())],
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

/// How the partition ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// vCPU `vcpu` stopped for `reason`.
    Guest {
        /// Which vCPU.
        vcpu: usize,
        /// Why.
        reason: StopReason,
    },
    /// The VMM received a signal.
    Signal(i32),
    /// The local API asked for a clean stop.
    Requested,
}

/// Per-vCPU summary.
#[derive(Clone, Debug)]
pub struct VcpuReport {
    /// Index.
    pub index: usize,
    /// Host core.
    pub core: usize,
    /// Exit counts by reason (the exits that reached the VMM).
    pub exits: Vec<(&'static str, u64)>,
    /// KVM's own halt statistics for the vCPU (`halt_exits`, `halt_attempted_poll`, ...).
    pub kvm: std::collections::BTreeMap<String, u64>,
    /// Instructions the VMM carried out for the guest (see [`crate::assist`]), by kind.
    pub assists: Vec<(&'static str, u64)>,
}

/// What happened.
#[derive(Clone, Debug)]
pub struct LaunchReport {
    /// How it ended.
    pub ending: Ending,
    /// Boot details.
    pub boot: BootInfo,
    /// The kernel command line the guest was given (the CPU model's and idle policy's
    /// words included).
    pub cmdline: String,
    /// The guest's memory and what backs it.
    pub memory: MemoryReport,
    /// From the first KVM_RUN to teardown.
    pub ran_for: Duration,
    /// Per-vCPU exit counters.
    pub vcpus: Vec<VcpuReport>,
    /// Where the time went before the guest ran, and when it first spoke.
    pub timings: Timings,
    /// For a partition from the pool: its name, extent and how long scrubbing took.
    pub pool: Option<PoolOutcome>,
    /// The idle plan in force.
    pub idle: IdlePlan,
    /// What KVM reported back about it.
    pub idle_readback: Readback,
    /// The CPU model in force.
    pub cpu_model: CpuModel,
    /// The features it hides that the host shows in CPUID anyway (so only the command line
    /// hides them).
    pub cpu_model_shown_anyway: Vec<&'static str>,
    /// Per-disk queue counters.
    pub disks: Vec<DiskReport>,
    /// The submission engine (`--device engine`): how each BAR was served, what it did.
    pub engine: Option<crate::pci::EngineReport>,
    /// The passed-through function (`--device vfio=`): where its BARs are, what is mapped.
    pub passthrough: Option<crate::vfio::PassthroughReport>,
    /// Lines of the guest's console reporting a process killed by a fatal signal or a
    /// kernel Oops (`console::FAULT_LINES`).
    pub guest_fault_lines: u64,
    /// Who the VMM ran as once the guest ran (None: `--no-sandbox`).
    pub sandbox: Option<Identity>,
}

/// The guest's memory and what backs it, as data.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemoryReport {
    /// Guest RAM in bytes.
    pub bytes: u64,
    /// `anonymous`, `prefault`, `hugetlb`, `pool` or `volume` (a pod's hugetlbfs).
    pub backing: &'static str,
    /// Page size of the backing.
    pub page_size: u64,
    /// For `pool`: the extent of the pool file, (offset, length).
    pub pool_extent: Option<(u64, u64)>,
    /// The same in words.
    pub description: String,
}

impl MemoryReport {
    fn of(ram: &RamSource, source: &MemorySource, bytes: u64) -> Self {
        let (backing, pool_extent) = match (ram, source) {
            (_, MemorySource::Volume(_)) => ("volume", None),
            (RamSource::Anonymous(Backing::Anonymous), _) => ("anonymous", None),
            (RamSource::Anonymous(Backing::AnonymousPopulated), _) => ("prefault", None),
            (RamSource::Anonymous(Backing::Hugetlb), _) => ("hugetlb", None),
            (RamSource::Extent(e), _) => ("pool", Some((e.extent().offset, e.extent().len))),
        };
        Self {
            bytes,
            backing,
            page_size: ram.page_size(),
            pool_extent,
            description: ram.describe(),
        }
    }
}

/// One disk's window and its queues' counters at teardown.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DiskReport {
    /// virtio-mmio window base.
    pub base: u64,
    /// Its GSI.
    pub gsi: u32,
    /// Each queue's counters.
    pub queues: Vec<devices::virtio::QueueCounters>,
    /// Messages the guest made the VMM log about this disk that the rate limits dropped
    /// (5 a second each for the window and the queue workers, for the VMM's whole life).
    pub log_suppressed: u64,
}

impl std::fmt::Display for DiskReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "disk at {:#x} (gsi {}): ", self.base, self.gsi)?;
        for (i, q) in self.queues.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{q}")?;
        }
        Ok(())
    }
}

/// What a pool-backed launch did with its extent.
#[derive(Clone, Debug)]
pub struct PoolOutcome {
    /// Partition name.
    pub name: String,
    /// Extent offset.
    pub offset: u64,
    /// Extent length.
    pub len: u64,
    /// Time spent zeroing the extent after the guest stopped.
    pub scrub: Duration,
}

/// Stage durations of a launch, measured inside the VMM.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// Getting guest memory (mmap, prefault, vm-memory regions).
    pub memory: Duration,
    /// VM creation, irqchip, memslots.
    pub vm: Duration,
    /// Kernel load and boot structures.
    pub boot: Duration,
    /// Devices and vCPU creation.
    pub vcpus: Duration,
    /// From the start of `run` to the guest's first serial byte.
    pub first_output: Option<Duration>,
    /// From the process's `main` to the guest's first serial byte, ms (None: no byte, or
    /// the timeline was not started).
    pub wall_to_first_byte_ms: Option<f64>,
    /// Where that time went, phase by phase (`crate::timeline`): they add up to it.
    pub phases: Vec<crate::timeline::Phase>,
}

/// Progress callbacks so callers can say (or record) what is happening while it happens.
pub trait Observer {
    /// Boot structures are written; vCPUs start next.
    fn booting(&self, _checked: &Checked, _boot: &BootInfo, _memory: &str) {}
    /// The guest is about to run: every thread is confined, the vCPU threads start next.
    fn running(&self) {}
    /// About once a second while the guest runs.
    fn tick(&self, _vcpus: &[VcpuReport]) {}
}

impl Observer for () {}

/// A launch's guest memory, and what must happen to it afterwards.
pub enum Acquired {
    /// Memory no claim holds (anonymous, or a pod's volume file), gone with the mapping.
    Unclaimed(RamSource),
    /// A pool extent: the claim scrubs and frees it when it ends.
    Extent {
        /// The claim in the ledger (boxed: it holds the ledger as loaded).
        claim: Box<ExtentClaim>,
        /// The extent of the pool file, to be mapped as the guest's RAM.
        ram: RamSource,
    },
}

/// Takes the memory a checked launch asks for.
pub fn acquire(checked: &Checked) -> Result<Acquired, LaunchError> {
    let cfg = &checked.cfg;
    match &cfg.source {
        MemorySource::Anonymous(backing) => Ok(Acquired::Unclaimed(RamSource::Anonymous(*backing))),
        MemorySource::Volume(dir) => Ok(Acquired::Unclaimed(RamSource::Extent(
            crate::pod::volume_memory(dir, checked.memory())?,
        ))),
        MemorySource::Pool(req) => {
            let claim = ExtentClaim::take(&ClaimRequest {
                state_dir: &cfg.state_dir,
                name: &req.name,
                offset: req.offset,
                size: checked.memory(),
                cores: &checked.cores,
                idle: checked.idle.policy.name(),
                kernel: &checked.kernel_name,
                api_socket: cfg.api_socket.as_deref(),
            })?;
            match claim.extent_file() {
                Ok(ram) => Ok(Acquired::Extent {
                    claim: Box::new(claim),
                    ram: RamSource::Extent(ram),
                }),
                Err(e) => {
                    // Nothing touched the extent: it is still clean.
                    claim.forget_unused();
                    Err(e.into())
                }
            }
        }
    }
}

/// Passes progress on, and tells the partition's keeper (which records it in the ledger).
struct KeeperObserver<'a> {
    inner: &'a dyn Observer,
    keeper: &'a std::cell::RefCell<Keeper>,
}

impl Observer for KeeperObserver<'_> {
    fn booting(&self, c: &Checked, b: &BootInfo, m: &str) {
        self.inner.booting(c, b, m);
    }
    fn running(&self) {
        self.keeper.borrow_mut().running();
        crate::claim::crash_point("running");
        self.inner.running();
    }
    fn tick(&self, vcpus: &[VcpuReport]) {
        let stats: Vec<_> = vcpus
            .iter()
            .map(|v| crate::claim::VcpuStats {
                vcpu: v.index,
                core: v.core,
                exits: v.exits.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
                kvm: v.kvm.clone(),
            })
            .collect();
        self.keeper.borrow_mut().record(&stats);
        self.inner.tick(vcpus);
    }
}

/// The seccomp filters of a confined launch, compiled before privileges are dropped.
struct Filters {
    vcpu: Arc<seccompiler::BpfProgram>,
    worker: Arc<seccompiler::BpfProgram>,
    engine: Arc<seccompiler::BpfProgram>,
    api: Arc<seccompiler::BpfProgram>,
    main: seccompiler::BpfProgram,
}

/// How the launcher's wait is told to end, and what the vCPUs' pause state is.
struct Control {
    /// Written by the API to ask for a clean stop.
    stop: Arc<EventFd>,
    /// Set once teardown starts.
    stopping: Arc<std::sync::atomic::AtomicBool>,
    /// Shared with every vCPU thread.
    pause: Arc<kvm_vcpu::PauseControl>,
}

impl Control {
    fn new() -> Result<Self, LaunchError> {
        Ok(Self {
            stop: Arc::new(
                EventFd::new(libc::EFD_NONBLOCK).map_err(|source| LaunchError::Os {
                    what: "eventfd",
                    source,
                })?,
            ),
            stopping: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            pause: Arc::new(kvm_vcpu::PauseControl::default()),
        })
    }
}

/// Starts the API thread on `sock`, serving this launch.
fn start_api(
    sock: crate::api::ApiSocket,
    checked: &Checked,
    vcpus: &Vcpus,
    memory: &MemoryReport,
    control: &Control,
    filter: Option<Arc<seccompiler::BpfProgram>>,
) -> Result<crate::api::ApiServer, LaunchError> {
    let description = serde_json::json!({
        "pid": std::process::id(),
        "name": match &checked.cfg.source {
            MemorySource::Pool(p) => Some(p.name.clone()),
            _ => None,
        },
        "cores": checked.cores,
        "cores_exclusive_by": checked.cores_from,
        "memory": memory,
        "kernel": checked.kernel_name,
        "cmdline": checked.cmdline,
        "idle_policy": checked.idle.policy.name(),
        "cpu_model": checked.cpu_model.name,
        "sandbox": match &checked.sandbox {
            Sandbox::On(who) => serde_json::to_value(who).unwrap_or_default(),
            Sandbox::Off => serde_json::Value::Null,
        },
    });
    let state = crate::api::ApiState {
        description,
        vcpus: vcpus
            .handles
            .iter()
            .map(|h| crate::api::ApiVcpu {
                index: h.index,
                core: h.core,
                counters: h.counters.clone(),
                kicker: h.kicker.clone(),
                stats: h.stats.clone(),
            })
            .collect(),
        idle: checked.idle.clone(),
        cpuid_back: vcpus.cpuid_back.as_ref().map(|c| c.as_slice().to_vec()),
        pause: control.pause.clone(),
        stop: control.stop.clone(),
        stopping: control.stopping.clone(),
        started: Instant::now(),
    };
    crate::api::ApiServer::start(sock, state, move || match &filter {
        Some(f) => crate::sandbox::apply(Role::Api, f).map_err(|e| e.to_string()),
        None => Ok(()),
    })
    .map_err(|source| LaunchError::Os {
        what: "starting the API thread",
        source,
    })
}

/// Gives up root: compiles every thread's filter, installs the SIGSYS handler and becomes
/// the sandbox's user. Called once everything that needs root exists and before any
/// thread is started; `None` with `--no-sandbox`.
fn confine(
    sandbox: &Sandbox,
    pci: bool,
    passthrough: bool,
) -> Result<Option<Filters>, LaunchError> {
    let Sandbox::On(who) = sandbox else {
        return Ok(None);
    };
    // With PCI functions, a guest's configuration writes (MSI-X routes, a moved doorbell
    // BAR) make the vCPU thread that takes them update KVM's routing, ioeventfds and
    // memory slots; with a passed-through function it also reads and writes the device's
    // VFIO regions (its trapped BAR pages and command register).
    let mut vcpu_ioctls = crate::kvm::vcpu_thread_ioctls();
    if pci {
        vcpu_ioctls.extend(crate::kvm::vm_device_ioctls());
    }
    let region_io: &[i64] = if passthrough {
        &[libc::SYS_pread64, libc::SYS_pwrite64]
    } else {
        &[]
    };
    let f = Filters {
        vcpu: Arc::new(crate::sandbox::filter_with(
            Role::Vcpu,
            &vcpu_ioctls,
            region_io,
        )?),
        worker: Arc::new(crate::sandbox::filter(Role::BlockWorker, &[])?),
        engine: Arc::new(crate::sandbox::filter(Role::Engine, &[])?),
        api: Arc::new(crate::sandbox::filter(Role::Api, &[])?),
        main: crate::vfio::launcher_filter(passthrough)?,
    };
    crate::sandbox::install_violation_handler()?;
    crate::sandbox::drop_privileges(who)?;
    Ok(Some(f))
}

/// `--api-socket PATH` must fit a Unix socket address and be in a directory that exists;
/// found before anything is built (the bind itself comes later, as root).
fn check_api_socket(p: &std::path::Path) -> Result<(), LaunchError> {
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

/// Opens `--console FILE` for writing without waiting (a FIFO's open would block until a
/// reader came) and refuses anything but a regular file.
fn open_console(p: &std::path::Path) -> Result<std::fs::File, LaunchError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| LaunchError::File {
        what: "--console",
        path: p.to_path_buf(),
        source,
    };
    let not_regular = || err(std::io::Error::other("not a regular file"));
    crate::files::check_symlinks(p).map_err(|e| {
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
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | crate::files::nofollow_in(p))
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

/// Starts the devices' threads (the disks' queue workers), each installing the worker
/// filter before it serves anything.
fn start_devices(devices: &Devices, filters: Option<&Filters>) -> Result<(), LaunchError> {
    let worker = filters.map(|f| f.worker.clone());
    let hook: devices::virtio::ThreadHook = Arc::new(move |_kind| match &worker {
        Some(f) => crate::sandbox::apply(Role::BlockWorker, f).map_err(|e| e.to_string()),
        None => Ok(()),
    });
    for d in &devices.disks {
        d.transport
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .start(hook.clone())
            .map_err(|e| LaunchError::Os {
                what: "starting the disk's queue threads",
                source: std::io::Error::other(e),
            })?;
    }
    if let Some(e) = &devices.engine {
        let filter = filters.map(|f| f.engine.clone());
        let hook: devices::virtio::ThreadHook = Arc::new(move |_kind| match &filter {
            Some(f) => crate::sandbox::apply(Role::Engine, f).map_err(|e| e.to_string()),
            None => Ok(()),
        });
        let wake = match &e.page {
            Some(p) => devices::pci::submit::Wake::Poll(p.clone()),
            None => devices::pci::submit::Wake::Block,
        };
        // On the queue workers' core: off every vCPU, where a polling engine may spin.
        let t = devices::pci::submit::EngineThread::spawn(
            e.shared.clone(),
            e.kick.clone(),
            wake,
            devices.worker_core,
            hook,
        )
        .map_err(|source| LaunchError::Os {
            what: "starting the submission engine's thread",
            source,
        })?;
        *devices
            .engine_thread
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(t);
    }
    Ok(())
}

/// Runs a checked launch to its end on `ram`. `started` is when the caller began getting
/// the memory (so memory setup counts towards the timings); `cpuset` is where vCPU threads
/// go before they pin. The steps, in order: memory, VM, boot structures, devices, vCPUs,
/// confinement, run and wait, stop, report.
pub fn run(
    mut checked: Checked,
    ram: RamSource,
    started: Instant,
    cpuset: Option<GuestsCpuset>,
    observer: &dyn Observer,
) -> Result<LaunchReport, LaunchError> {
    let memory = Arc::new(GuestMemory::new(&ram, checked.layout)?);
    let memory_report = MemoryReport::of(&ram, &checked.cfg.source, checked.layout.size());
    // Mapped, the pool file is let go: the VMM keeps its own extent's mapping and no
    // descriptor through which another partition's extent could be mapped.
    ram.release_file().map_err(|e| LaunchError::Os {
        what: "letting the pool file go after mapping its extent",
        source: e,
    })?;
    drop(ram);
    let t_mem = Instant::now();
    crate::timeline::mark_at("memory", t_mem);
    let vm = Arc::new(build_vm(&checked, &memory)?);
    let t_vm = Instant::now();
    crate::timeline::mark_at("vm", t_vm);
    let boot = write_boot(&checked, &memory)?;
    let t_boot = Instant::now();
    crate::timeline::mark_at("boot", t_boot);
    let devices = attach_devices(&mut checked, &vm, &memory)?;
    crate::timeline::mark("devices");
    let mut vcpus = create_vcpus(&checked, &vm, &boot, &devices, &memory, cpuset)?;
    let t_vcpus = Instant::now();
    crate::timeline::mark_at("vcpus", t_vcpus);
    observer.booting(&checked, &boot, &memory.describe());

    // Stop signals wait on a signalfd until teardown is over.
    let signals = SignalGuard::new().map_err(|source| LaunchError::Os {
        what: "blocking SIGINT/SIGTERM",
        source,
    })?;
    // The API socket is bound while root, for the sandbox's user.
    let api_socket = match &checked.cfg.api_socket {
        Some(p) => Some(crate::api::ApiSocket::bind(
            p,
            match &checked.sandbox {
                Sandbox::On(who) => Some((who.uid, who.gid)),
                Sandbox::Off => None,
            },
        )?),
        None => None,
    };
    // Everything that needs root exists: give it up, then start the threads, each under
    // its own filter.
    let filters = confine(
        &checked.sandbox,
        devices.engine.is_some() || devices.vfio.is_some(),
        devices.vfio.is_some(),
    )?;
    let control = Control::new()?;
    for c in &mut vcpus.contexts {
        c.filter = filters.as_ref().map(|f| f.vcpu.clone());
        c.pause = control.pause.clone();
    }
    start_devices(&devices, filters.as_ref())?;
    let api = match api_socket {
        Some(sock) => Some(start_api(
            sock,
            &checked,
            &vcpus,
            &memory_report,
            &control,
            filters.as_ref().map(|f| f.api.clone()),
        )?),
        None => None,
    };
    crate::timeline::mark("confine");
    let ran = run_vcpus(
        vcpus.contexts,
        &vcpus.handles,
        &signals,
        observer,
        filters.as_ref().map(|f| &f.main),
        &control,
    );
    if let Some(a) = api {
        a.stop();
    }
    let (ending, ran_for) = ran?;
    // Workers write into guest memory: stop them before it goes away.
    let disks = devices.shut_down();
    drop(signals);

    let first_output = devices.first_byte.get().map(|t| t.duration_since(started));
    let timeline = devices
        .first_byte
        .get()
        .and_then(|t| crate::timeline::phases(*t));
    let vcpu_reports = reports(&vcpus.handles);
    let idle_readback = Readback::new(
        &checked.idle,
        vcpus.cpuid_back.as_ref().map(|c| c.as_slice()),
        crate::cpuid::host_leaf5().is_some(),
        vcpu_reports.iter().map(|v| (v.index, &v.kvm)),
    );
    let cpu_model_shown_anyway = vcpus
        .cpuid_back
        .as_ref()
        .map(|c| checked.cpu_model.shown_anyway(c.as_slice()))
        .unwrap_or_default();
    Ok(LaunchReport {
        idle: checked.idle.clone(),
        idle_readback,
        cpu_model: checked.cpu_model.clone(),
        cpu_model_shown_anyway,
        ending,
        boot,
        cmdline: checked.cmdline.clone(),
        memory: memory_report,
        ran_for,
        vcpus: vcpu_reports,
        timings: Timings {
            memory: t_mem.duration_since(started),
            vm: t_vm.duration_since(t_mem),
            boot: t_boot.duration_since(t_vm),
            vcpus: t_vcpus.duration_since(t_boot),
            first_output,
            wall_to_first_byte_ms: timeline.as_ref().map(|t| t.1),
            phases: timeline.map(|t| t.0).unwrap_or_default(),
        },
        pool: None,
        disks,
        engine: devices
            .engine
            .as_ref()
            .map(|e| e.report(devices.worker_core)),
        passthrough: devices.vfio.as_ref().map(|v| v.final_report()),
        guest_fault_lines: devices
            .guest_faults
            .load(std::sync::atomic::Ordering::Relaxed),
        sandbox: match &checked.sandbox {
            Sandbox::On(who) => Some(who.clone()),
            Sandbox::Off => None,
        },
    })
}

/// The VM, with the idle plan's and the CPU model's settings and the guest's memory slots.
fn build_vm(checked: &Checked, memory: &GuestMemory) -> Result<Vm, LaunchError> {
    let mut vm = Vm::new()?;
    vm.apply_idle(&checked.idle)?;
    vm.report_emulation_failures()?;
    if checked.cpu_model.syscall_repair {
        vm.trap_lstar_writes()?;
    }
    vm.map_memory(memory)?;
    Ok(vm)
}

/// Kernel, initrd, command line and the boot structures, in guest memory.
fn write_boot(checked: &Checked, memory: &GuestMemory) -> Result<BootInfo, LaunchError> {
    Ok(boot::setup(
        memory.mem(),
        &checked.layout,
        &BootConfig {
            kernel: &checked.kernel,
            initrd: checked.initrd.as_deref(),
            cmdline: &checked.cmdline,
            cpus: checked.cores.len(),
            protocol: checked.cfg.protocol,
            virtio_mmio: &crate::disks::windows(checked.disks.len()),
            isa: &LEGACY_DEVICES,
            sleep_port: ACPI_PM_BASE as u16,
            pci: crate::pci::host_bridge(&checked.cfg.devices),
        },
    )?)
}

/// The device buses, frozen, and what teardown needs of them.
struct Devices {
    pio: Arc<Bus>,
    mmio: Arc<Bus>,
    serial: Arc<Mutex<SerialPort>>,
    first_byte: Arc<std::sync::OnceLock<Instant>>,
    /// Lines of the guest's console that report a fatal signal or an Oops
    /// (`console::FAULT_LINES`).
    guest_faults: Arc<std::sync::atomic::AtomicU64>,
    disks: Vec<crate::disks::AttachedDisk>,
    /// The submission engine (`--device engine`), and its thread once started.
    engine: Option<crate::pci::AttachedEngine>,
    engine_thread: Mutex<Option<devices::pci::submit::EngineThread>>,
    /// The core device threads (queue workers, the engine) run on, when one is free.
    worker_core: Option<usize>,
    /// A passed-through function's VFIO state (given back when the devices go).
    vfio: Option<crate::vfio::AttachedVfio>,
}

impl Devices {
    /// Stops the disks' queue workers and flushes the console; each disk's counters.
    fn shut_down(&self) -> Vec<DiskReport> {
        let stats = self
            .disks
            .iter()
            .map(|d| {
                let mut t = d.transport.lock().unwrap_or_else(|e| e.into_inner());
                t.shutdown();
                DiskReport {
                    base: d.base,
                    gsi: d.gsi,
                    queues: t.device().stats(),
                    log_suppressed: t.log_suppressed(),
                }
            })
            .collect();
        // The engine writes fences into guest memory too.
        if let Some(t) = self
            .engine_thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            t.stop();
        }
        self.serial
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .flush();
        stats
    }
}

/// The legacy devices on the PIO bus (the console on COM1 among them) and the disks on
/// the MMIO bus.
fn attach_devices(
    checked: &mut Checked,
    vm: &Arc<Vm>,
    memory: &Arc<GuestMemory>,
) -> Result<Devices, LaunchError> {
    let serial_irq = vm.irq_line(COM1_IRQ)?;
    let console = std::mem::replace(&mut checked.console, Box::new(std::io::sink()));
    let first_byte = Arc::new(std::sync::OnceLock::new());
    let guest_faults = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let console = Box::new(FirstByte {
        inner: Box::new(crate::console::FaultWatch::new(
            Box::new(crate::console::Capped::new(
                console,
                checked.cfg.console_limit,
            )),
            guest_faults.clone(),
        )),
        at: first_byte.clone(),
    });
    let serial = Arc::new(Mutex::new(SerialPort::new(Box::new(serial_irq), console)));
    let mut pio = Bus::new("pio");
    pio.insert("serial", COM1_PORT, COM1_LEN, serial.clone())?;
    pio.insert("i8042", I8042_BASE, I8042_LEN, Arc::new(Mutex::new(I8042)))?;
    pio.insert(
        "rtc",
        RTC_PORT,
        RTC_LEN,
        Arc::new(Mutex::new(Rtc::new(rtc::system_clock))),
    )?;
    pio.insert(
        "acpi-pm",
        ACPI_PM_BASE,
        ACPI_PM_LEN,
        Arc::new(Mutex::new(AcpiPm)),
    )?;
    pio.insert(
        "debug-exit",
        DEBUG_EXIT_PORT,
        DEBUG_EXIT_LEN,
        Arc::new(Mutex::new(DebugExit)),
    )?;
    let mut mmio = Bus::new("mmio");
    // The PCI root: with no --device, empty on CF8/CFC only (a guest finds no PCI).
    let (engine, vfio) = crate::pci::attach(
        vm,
        memory,
        &mut pio,
        &mut mmio,
        &checked.cfg.devices,
        &checked.cores,
    )?;
    // Queue workers go to a core the partition does not use, when there is one.
    let worker_core = crate::cores::available()
        .into_iter()
        .find(|c| !checked.cores.contains(c));
    let disks = crate::disks::attach(
        vm,
        memory,
        &mut mmio,
        std::mem::take(&mut checked.disks),
        checked.cfg.ioeventfd,
        worker_core,
    )?;
    Ok(Devices {
        pio: Arc::new(pio),
        mmio: Arc::new(mmio),
        serial,
        first_byte,
        guest_faults,
        disks,
        engine,
        engine_thread: Mutex::new(None),
        worker_core,
        vfio,
    })
}

/// Created vCPUs: what each thread takes, what the launcher keeps, and the CPUID KVM
/// reported back for vCPU 0.
struct Vcpus {
    contexts: Vec<VcpuContext>,
    handles: Vec<VcpuHandle>,
    cpuid_back: Option<kvm_bindings::CpuId>,
}

/// One vCPU per core, configured (CPUID, LAPIC; vCPU 0 the entry registers), not running.
fn create_vcpus(
    checked: &Checked,
    vm: &Vm,
    boot: &BootInfo,
    devices: &Devices,
    memory: &Arc<GuestMemory>,
    cpuset: Option<GuestsCpuset>,
) -> Result<Vcpus, LaunchError> {
    // Only the vCPU contexts hold it (each drops its share once joined).
    let cpuset = cpuset.map(Arc::new);
    let supported = vm.supported_cpuid()?;
    let n = checked.cores.len();
    let idle_cpuid = IdleCpuid {
        mwait: checked.idle.expose_mwait,
        hints_realtime: checked.idle.hints_realtime,
    };
    let mut out = Vcpus {
        contexts: Vec::with_capacity(n),
        handles: Vec::with_capacity(n),
        cpuid_back: None,
    };
    for (index, &core) in checked.cores.iter().enumerate() {
        let entry = (index == 0).then_some(&boot.entry);
        let (fd, back) =
            vm.create_vcpu(index, n, &supported, entry, idle_cpuid, &checked.cpu_model)?;
        if index == 0 {
            out.cpuid_back = back;
        }
        let (counters, kicker, mut h) = kvm_vcpu::handles(index, core);
        h.stats = Stats::open(&fd).ok().map(Arc::new);
        out.handles.push(h);
        out.contexts.push(VcpuContext {
            index,
            core,
            fd,
            pio: devices.pio.clone(),
            mmio: devices.mmio.clone(),
            memory: memory.clone(),
            counters,
            kicker,
            cpuset: cpuset.clone(),
            filter: None,
            pause: Arc::default(),
            syscall: kvm_vcpu::SyscallRepair::new(checked.cpu_model.syscall_repair),
            guest_faults: devices.guest_faults.clone(),
        });
    }
    drop(cpuset);
    Ok(out)
}

/// Starts one thread per vCPU, waits for the first stop (or a signal), stops and joins
/// them all: how it ended, and for how long the vCPUs ran.
fn run_vcpus(
    contexts: Vec<VcpuContext>,
    handles: &[VcpuHandle],
    signals: &SignalGuard,
    observer: &dyn Observer,
    main_filter: Option<&seccompiler::BpfProgram>,
    control: &Control,
) -> Result<(Ending, Duration), LaunchError> {
    let os = |what| move |source| LaunchError::Os { what, source };
    kvm_vcpu::install_kick_handler().map_err(os("installing the vCPU kick handler"))?;
    let exit_evt = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(os("eventfd"))?);
    let first_stop: Arc<Mutex<Option<(usize, StopReason)>>> = Arc::new(Mutex::new(None));

    observer.running();
    let spawned = Instant::now();
    let mut threads = Vec::with_capacity(contexts.len());
    for ctx in contexts {
        let exit_evt = exit_evt.clone();
        let first_stop = first_stop.clone();
        let index = ctx.index;
        let t = std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || {
                let reason = kvm_vcpu::run(ctx);
                if reason != StopReason::Kicked {
                    let mut f = first_stop.lock().unwrap_or_else(|e| e.into_inner());
                    f.get_or_insert((index, reason));
                }
                let _ = exit_evt.write(1);
            });
        match t {
            Ok(t) => threads.push(t),
            Err(e) => {
                stop_all(handles, threads);
                return Err(LaunchError::Os {
                    what: "starting a vCPU thread",
                    source: e,
                });
            }
        }
    }

    // The launcher's own thread, from here on only waiting, kicking, joining and reporting.
    if let Some(f) = main_filter {
        if let Err(e) = crate::sandbox::apply(Role::Main, f) {
            stop_all(handles, threads);
            return Err(e.into());
        }
    }
    let ending = wait(signals, &exit_evt, &control.stop, &first_stop, || {
        observer.tick(&reports(handles))
    });
    let ran_for = spawned.elapsed();
    control
        .stopping
        .store(true, std::sync::atomic::Ordering::SeqCst);
    stop_all(handles, threads);
    Ok((ending, ran_for))
}

fn reports(handles: &[VcpuHandle]) -> Vec<VcpuReport> {
    handles
        .iter()
        .map(|h| VcpuReport {
            index: h.index,
            core: h.core,
            exits: h.counters.snapshot().to_vec(),
            assists: h.counters.assist_snapshot(),
            kvm: h
                .stats
                .as_ref()
                .map(|s| s.idle_counters())
                .unwrap_or_default(),
        })
        .collect()
}

/// Passes output through and notes when the first byte went by.
struct FirstByte {
    inner: Box<dyn Write + Send>,
    at: Arc<std::sync::OnceLock<Instant>>,
}

impl Write for FirstByte {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if !b.is_empty() {
            let _ = self.at.set(Instant::now());
        }
        self.inner.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn wait(
    signals: &SignalGuard,
    exit_evt: &EventFd,
    api_stop: &EventFd,
    first_stop: &Mutex<Option<(usize, StopReason)>>,
    mut tick: impl FnMut(),
) -> Ending {
    use std::os::fd::AsRawFd;
    loop {
        let mut fds =
            [signals.fd(), exit_evt.as_raw_fd(), api_stop.as_raw_fd()].map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        // SAFETY: polling three valid fds in a local array.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 3, 1000) };
        if n == 0 {
            tick();
            continue;
        }
        if let Some(sig) = signals.take() {
            return Ending::Signal(sig);
        }
        if fds[2].revents & libc::POLLIN != 0 && api_stop.read().is_ok() {
            return Ending::Requested;
        }
        if fds[1].revents & libc::POLLIN != 0 {
            let _ = exit_evt.read();
            if let Some((vcpu, reason)) =
                first_stop.lock().unwrap_or_else(|e| e.into_inner()).take()
            {
                return Ending::Guest { vcpu, reason };
            }
        }
    }
}

fn stop_all(handles: &[VcpuHandle], threads: Vec<std::thread::JoinHandle<()>>) {
    for h in handles {
        h.kicker.kick();
    }
    // A signal can land just before a thread enters KVM_RUN; immediate_exit (set by the
    // kick) makes that KVM_RUN return at once, so joining cannot hang.
    for t in threads {
        let _ = t.join();
    }
}

/// The whole launch: check, acquire memory, run, give the memory back.
pub fn launch(cfg: LaunchConfig, observer: &dyn Observer) -> Result<LaunchReport, LaunchError> {
    crate::timeline::mark("args");
    let checked = check(cfg)?;
    crate::timeline::mark("check");
    let started = Instant::now();
    let acquired = acquire(&checked)?;
    crate::timeline::mark("acquire");
    match acquired {
        Acquired::Unclaimed(ram) => run(checked, ram, started, None, observer),
        Acquired::Extent { claim, ram } => {
            // Opened as root (the vCPU threads join it after the launcher gave root up).
            let cpuset = GuestsCpuset::open(&claim.isolation())?;
            // The keeper takes the claim over: it records the partition while it runs and
            // gives it back, scrubbed, however the launcher ends.
            let mode = match checked.sandbox {
                Sandbox::On(_) => KeeperMode::Confined,
                Sandbox::Off => KeeperMode::Unconfined,
            };
            let keeper = Keeper::spawn(*claim, mode).map_err(|b| {
                // The claim (scrubbed and freed as it drops) stays with us.
                let (e, claim) = *b;
                drop(claim);
                e
            })?;
            crate::timeline::mark("keeper");
            let keeper = std::cell::RefCell::new(keeper);
            let result = {
                let obs = KeeperObserver {
                    inner: observer,
                    keeper: &keeper,
                };
                run(checked, ram, started, cpuset, &obs)
            };
            // The guest is gone (or never ran): the keeper scrubs, then frees the cores
            // and the extent.
            let released = keeper.into_inner().finish();
            let mut report = result?;
            let r = released?;
            report.pool = Some(PoolOutcome {
                name: r.name,
                offset: r.offset,
                len: r.len,
                scrub: r.scrub,
            });
            Ok(report)
        }
    }
}

// The FADT names the RTC's century register; the RTC device must keep it there.
const _: () = assert!(boot::acpi::RTC_CENTURY_REG == devices::rtc::CENTURY_REG);

#[cfg(test)]
mod tests {
    use super::*;

    fn config(source: MemorySource, memory: u64) -> LaunchConfig {
        LaunchConfig {
            cores: "0".into(),
            memory,
            kernel: KernelSource::Builtin {
                name: "not-a-kernel",
                bytes: b"nothing",
            },
            initrd: None,
            cmdline: String::new(),
            console: Console::Stdout,
            console_limit: crate::console::DEFAULT_LIMIT,
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
            cores: "0,0".into(),
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
        let e: LaunchError = ClaimError::Ledger(crate::ledger::LedgerError::Io {
            path: "/x".into(),
            what: "reading",
            source: std::io::Error::other("disk on fire"),
        })
        .into();
        assert!(!e.is_usage(), "{e}");
    }
}
