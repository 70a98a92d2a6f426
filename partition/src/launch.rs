//! Launching a partition: a pipeline of small steps.
//!
//! 1. [`check`]: every piece of user input is validated (cores, memory size, kernel, initrd,
//!    command line, console) before anything is allocated or KVM is touched.
//! 2. [`run`]: map memory, create the VM, write the boot structures, build the buses, start
//!    one pinned thread per vCPU, wait for the guest, a fault or a signal, tear down.

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
use devices::pci::{NoPci, PCI_CONFIG_BASE, PCI_CONFIG_LEN};
use devices::power::{
    ACPI_PM_BASE, ACPI_PM_LEN, AcpiPm, DEBUG_EXIT_LEN, DEBUG_EXIT_PORT, DebugExit,
};
use devices::rtc::{self, RTC_LEN, RTC_PORT, Rtc};
use devices::serial::{COM1_IRQ, COM1_LEN, COM1_PORT, SerialPort};
use pool::{AnonRam, Backing, GuestRam};
use vmm_sys_util::eventfd::EventFd;

use crate::cores::{self, CoreError};
use crate::cpuid::IdleCpuid;
use crate::cpumodel::{CpuModel, CpuModelRequest};
use crate::idle::{IdlePlan, IdlePolicy};
use crate::kvm::stats::Stats;
use crate::kvm::vcpu::{self as kvm_vcpu, VcpuContext};
use crate::kvm::{Vm, VmError};
use crate::ledger::Isolation;
use crate::memory::{GuestMemory, MemoryError};
use crate::signals::SignalGuard;
use crate::vcpu::{self, StopReason, VcpuHandle};

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
    /// Entry protocol.
    pub protocol: BootProtocol,
    /// Memory backing (ignored when `pool` is set: the memory is a pool extent).
    pub backing: Backing,
    /// Take cores and memory from the reservation, under this name.
    pub pool: Option<PoolRequest>,
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
    /// Guest memory could not be mapped.
    #[error("guest memory: {0}")]
    Backing(#[from] pool::anon::AnonError),
    /// Guest memory could not be assembled.
    #[error("guest memory: {0}")]
    GuestMemory(#[from] MemoryError),
    /// KVM setup failed.
    #[error("{0}")]
    Vm(#[from] VmError),
    /// A disk cannot be used.
    #[error("{0}")]
    Disk(#[from] crate::disks::DiskError),
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
    /// OS-level failure (threads, signals, eventfds).
    #[error("{what}: {source}")]
    Os {
        /// What failed.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
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
}

fn read_limited(what: &'static str, path: &PathBuf, limit: u64) -> Result<Vec<u8>, LaunchError> {
    let file_err = |source| LaunchError::File {
        what,
        path: path.clone(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(file_err)?;
    if !meta.is_file() {
        return Err(LaunchError::File {
            what,
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"),
        });
    }
    if meta.len() > limit {
        return Err(LaunchError::TooLarge {
            what,
            path: path.clone(),
            size: meta.len(),
            limit,
        });
    }
    std::fs::read(path).map_err(file_err)
}

/// Validates everything the user gave. Nothing is allocated, mapped or created, except
/// that the console file is opened.
pub fn check(cfg: LaunchConfig) -> Result<Checked, LaunchError> {
    let cores = cores::parse(&cfg.cores)?;
    cores::check_available(&cores, &cores::available())?;
    if cores.len() > boot::mptable::MAX_CPUS {
        return Err(BootError::Tables(format!(
            "{} vCPUs: at most {} are supported",
            cores.len(),
            boot::mptable::MAX_CPUS
        ))
        .into());
    }
    let layout = MemoryLayout::new(cfg.memory)?;
    let page = cfg.backing.page_size() as u64;
    if cfg.pool.is_none() && cfg.memory % page != 0 {
        return Err(LaunchError::PageMultiple {
            size: cfg.memory,
            page: page as usize,
            backing: cfg.backing,
        });
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
    let disks = crate::disks::open(&cfg.disks)?;
    let cpu_model = crate::cpumodel::resolve(cfg.cpu_model, crate::cpumodel::host_is_kvm_pvm());
    // The CPU model's words go first, so the user's own can override them (see
    // `cpumodel::command_line` for `clearcpuid=`).
    let parts = [
        crate::cpumodel::command_line(&cpu_model, &cfg.cmdline),
        idle.cmdline.to_string(),
        crate::disks::cmdline(disks.len()),
    ];
    let cmdline = parts
        .iter()
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    boot::check_cmdline(&cmdline, kernel.cmdline_max())?;
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
        Console::File(p) => Box::new(std::io::LineWriter::new(std::fs::File::create(p).map_err(
            |source| LaunchError::File {
                what: "--console",
                path: p.clone(),
                source,
            },
        )?)),
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
    /// Memory backing description.
    pub memory: String,
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
    pub idle_readback: Vec<String>,
    /// The CPU model in force.
    pub cpu_model: CpuModel,
    /// The features it hides that the host shows in CPUID anyway (so only the command line
    /// hides them).
    pub cpu_model_shown_anyway: Vec<&'static str>,
    /// Per-disk queue counters.
    pub disks: Vec<String>,
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
#[derive(Clone, Copy, Debug, Default)]
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
}

/// Progress callbacks so callers can say (or record) what is happening while it happens.
pub trait Observer {
    /// Boot structures are written; vCPUs start next.
    fn booting(&self, _checked: &Checked, _boot: &BootInfo, _memory: &str) {}
    /// Every vCPU thread has been started.
    fn running(&self) {}
    /// About once a second while the guest runs.
    fn tick(&self, _vcpus: &[VcpuReport]) {}
}

impl Observer for () {}

/// Anonymous memory for a checked launch (the non-pool source).
pub fn anonymous_ram(checked: &Checked) -> Result<Box<dyn GuestRam>, LaunchError> {
    Ok(Box::new(AnonRam::new(
        checked.layout.size() as usize,
        checked.cfg.backing,
    )?))
}

/// Runs a checked launch to its end on `ram`. `started` is when the caller began getting
/// the memory (so memory setup counts towards the timings); `isolation` says where vCPU
/// threads must go before they pin.
pub fn run(
    mut checked: Checked,
    ram: Box<dyn GuestRam>,
    started: Instant,
    isolation: Option<Isolation>,
    observer: &dyn Observer,
) -> Result<LaunchReport, LaunchError> {
    let layout = checked.layout;
    let t0 = started;
    let memory = Arc::new(GuestMemory::new(ram, layout)?);
    let t_mem = Instant::now();
    let vm = Vm::new()?;
    vm.apply_idle(&checked.idle)?;
    vm.report_emulation_failures()?;
    if checked.cpu_model.syscall_repair {
        vm.trap_lstar_writes()?;
    }
    vm.map_memory(&memory)?;
    let t_vm = Instant::now();

    let boot = boot::setup(
        memory.mem(),
        &layout,
        &BootConfig {
            kernel: &checked.kernel,
            initrd: checked.initrd.as_deref(),
            cmdline: &checked.cmdline,
            cpus: checked.cores.len(),
            protocol: checked.cfg.protocol,
            virtio_mmio: &crate::disks::windows(checked.disks.len()),
            isa: &LEGACY_DEVICES,
        },
    )?;

    let t_boot = Instant::now();

    // Devices.
    let serial_irq = vm.irq_line(COM1_IRQ)?;
    let console = std::mem::replace(&mut checked.console, Box::new(std::io::sink()));
    let first_byte = Arc::new(std::sync::OnceLock::new());
    let console = Box::new(FirstByte {
        inner: console,
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
    pio.insert(
        "no-pci",
        PCI_CONFIG_BASE,
        PCI_CONFIG_LEN,
        Arc::new(Mutex::new(NoPci)),
    )?;
    let pio = Arc::new(pio);
    let mut mmio = Bus::new("mmio");
    // Queue workers go to a core the partition does not use, when there is one.
    let worker_core = crate::cores::available()
        .into_iter()
        .find(|c| !checked.cores.contains(c));
    let disks = std::mem::take(&mut checked.disks);
    let attached = crate::disks::attach(
        &vm,
        &memory,
        &mut mmio,
        disks,
        checked.cfg.ioeventfd,
        worker_core,
    )?;
    let mmio = Arc::new(mmio);

    // vCPUs, created and configured here, run on their own threads.
    let supported = vm.supported_cpuid()?;
    let n = checked.cores.len();
    let mut contexts = Vec::with_capacity(n);
    let mut handles: Vec<VcpuHandle> = Vec::with_capacity(n);
    let idle_cpuid = IdleCpuid {
        mwait: checked.idle.expose_mwait,
        hints_realtime: checked.idle.hints_realtime,
    };
    let mut cpuid_back = None;
    for (index, &core) in checked.cores.iter().enumerate() {
        let entry = (index == 0).then_some(&boot.entry);
        let (fd, back) =
            vm.create_vcpu(index, n, &supported, entry, idle_cpuid, &checked.cpu_model)?;
        if index == 0 {
            cpuid_back = back;
        }
        let (counters, kicker, mut h) = vcpu::handles(index, core);
        h.stats = Stats::open(&fd).ok();
        handles.push(h);
        contexts.push(VcpuContext {
            index,
            core,
            fd,
            pio: pio.clone(),
            mmio: mmio.clone(),
            memory: memory.clone(),
            counters,
            kicker,
            isolation: isolation.clone(),
            syscall: kvm_vcpu::SyscallRepair::new(checked.cpu_model.syscall_repair),
        });
    }
    let t_vcpus = Instant::now();
    observer.booting(&checked, &boot, &memory.describe());

    let os = |what| move |source| LaunchError::Os { what, source };
    kvm_vcpu::install_kick_handler().map_err(os("installing the vCPU kick handler"))?;
    let signals = SignalGuard::new().map_err(os("blocking SIGINT/SIGTERM"))?;
    let exit_evt = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(os("eventfd"))?);
    let first_stop: Arc<Mutex<Option<(usize, StopReason)>>> = Arc::new(Mutex::new(None));

    let spawned = Instant::now();
    let mut threads = Vec::with_capacity(n);
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
                stop_all(&handles, threads);
                return Err(LaunchError::Os {
                    what: "starting a vCPU thread",
                    source: e,
                });
            }
        }
    }

    observer.running();
    let ending = wait(&signals, &exit_evt, &first_stop, || {
        observer.tick(&reports(&handles))
    });
    let ran_for = spawned.elapsed();
    stop_all(&handles, threads);
    // Workers write into guest memory: stop them before it goes away.
    let disk_stats: Vec<String> = attached
        .iter()
        .map(|d| {
            let mut t = d.transport.lock().unwrap_or_else(|e| e.into_inner());
            t.shutdown();
            format!(
                "disk at {:#x} (gsi {}): {}",
                d.base,
                d.gsi,
                t.device().stats()
            )
        })
        .collect();
    serial.lock().unwrap_or_else(|e| e.into_inner()).flush();
    drop(signals);

    let first_output = first_byte.get().map(|t: &Instant| t.duration_since(t0));
    let vcpus = reports(&handles);
    let idle_readback = readback(&checked.idle, cpuid_back.as_ref(), &vcpus);
    let cpu_model_shown_anyway = cpuid_back
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
        memory: memory.describe(),
        ran_for,
        vcpus,
        timings: Timings {
            memory: t_mem.duration_since(t0),
            vm: t_vm.duration_since(t_mem),
            boot: t_boot.duration_since(t_vm),
            vcpus: t_vcpus.duration_since(t_boot),
            first_output,
        },
        pool: None,
        disks: disk_stats,
    })
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
                .map(|s| {
                    s.read()
                        .into_iter()
                        .filter(|(k, _)| k.starts_with("halt_") || k == "exits")
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// What KVM's own view says about the idle plan: CPUID as read back, and the vCPUs' halt
/// statistics. Each line states a fact and whether it matches what was asked.
fn readback(
    plan: &IdlePlan,
    cpuid: Option<&kvm_bindings::CpuId>,
    vcpus: &[VcpuReport],
) -> Vec<String> {
    use crate::cpuid::{KVM_HINTS_REALTIME, LEAF1_ECX_MONITOR};
    use crate::idle::EXIT_HLT;
    let mut out = Vec::new();
    if let Some(c) = cpuid {
        let find = |f: u32| c.as_slice().iter().find(|e| e.function == f);
        let mwait = find(1).is_some_and(|e| e.ecx & LEAF1_ECX_MONITOR != 0);
        let leaf5 = find(5).is_some();
        let rt = find(0x4000_0001).is_some_and(|e| e.edx & KVM_HINTS_REALTIME != 0);
        let verdict = |got: bool, want: bool| {
            if got == want {
                "as set"
            } else {
                "NOT as set: the host changed it"
            }
        };
        out.push(format!(
            "KVM_GET_CPUID2: MONITOR/MWAIT {} ({}), leaf 5 {} ({}), KVM_HINTS_REALTIME {} ({})",
            if mwait { "shown" } else { "hidden" },
            verdict(mwait, plan.expose_mwait),
            if leaf5 { "present" } else { "absent" },
            verdict(
                leaf5,
                plan.expose_mwait && crate::cpuid::host_leaf5().is_some()
            ),
            if rt { "set" } else { "clear" },
            verdict(rt, plan.hints_realtime),
        ));
    }
    for v in vcpus {
        let (Some(halts), Some(polls)) =
            (v.kvm.get("halt_exits"), v.kvm.get("halt_attempted_poll"))
        else {
            continue;
        };
        let mut line = format!(
            "vcpu{} stats: halt_exits={halts} halt_attempted_poll={polls} halt_successful_poll={} halt_wakeup={}",
            v.index,
            v.kvm.get("halt_successful_poll").copied().unwrap_or(0),
            v.kvm.get("halt_wakeup").copied().unwrap_or(0),
        );
        if plan.disable_exits & EXIT_HLT != 0 && *halts > 0 {
            line.push_str("; HLT exits were disabled, yet the guest's HLTs exited: this host accepts the setting and ignores it");
        } else if plan.disable_exits & EXIT_HLT != 0 {
            line.push_str("; no HLT exits, as set");
        }
        match plan.halt_poll_ns {
            Some(0) if *polls == 0 && *halts > 0 => {
                line.push_str("; halt polling off: no polls over those halts, as set")
            }
            Some(0) if *polls > 0 => line.push_str("; halt polling was set to 0, yet KVM polled"),
            None if *halts > 0 => line.push_str("; host halt polling in force (shared)"),
            _ => {}
        }
        out.push(line);
    }
    out
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
    first_stop: &Mutex<Option<(usize, StopReason)>>,
    mut tick: impl FnMut(),
) -> Ending {
    use std::os::fd::AsRawFd;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: signals.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: exit_evt.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: polling two valid fds in a local array.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
        if n == 0 {
            tick();
            continue;
        }
        if let Some(sig) = signals.take() {
            return Ending::Signal(sig);
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

/// Checks and runs in one go: from the reservation when `cfg.pool` is set, else on
/// anonymous memory (refusing cores the reservation holds).
pub fn launch(cfg: LaunchConfig, observer: &dyn Observer) -> Result<LaunchReport, LaunchError> {
    if cfg.pool.is_some() {
        return crate::partitions::launch_from_pool(cfg, observer);
    }
    let state_dir = cfg.state_dir.clone();
    let checked = check(cfg)?;
    crate::partitions::check_not_reserved(&state_dir, &checked.cores)?;
    let started = Instant::now();
    let ram = anonymous_ram(&checked)?;
    run(checked, ram, started, None, observer)
}

// The FADT names the RTC's century register; the RTC device must keep it there.
const _: () = assert!(boot::acpi::RTC_CENTURY_REG == devices::rtc::CENTURY_REG);
