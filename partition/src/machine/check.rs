//! The launch's first step: every piece of user input validated (cores, memory size,
//! kernel, initrd, command line, console, partition name, idle policy, CPU model, disks,
//! devices) into [`Checked`] before guest memory is taken or a VM is made. It is not yet
//! the pure plan it should be: it reads the kernel and initrd, opens the disks, the
//! console, the API socket's directory and /dev/kvm (for the idle capabilities and the
//! guest's address width) and reads host facts (cores, memory, the ledger, sysfs BARs).
//! Its errors are the pipeline's one type, [`LaunchError`] (`machine/error.rs`).

use std::borrow::Cow;
use std::io::Write;

use boot::BootError;
use boot::kernel::{KernelError, KernelImage};
use boot::layout::MemoryLayout;
use boot::regs::BootProtocol;
use pool::Backing;

use super::config::{
    Console, CoreSelection, KernelSource, LaunchConfig, MemorySource, SandboxRequest,
};
use super::error::LaunchError;
use crate::board::resources::{MachinePlan, PassthroughAsk};
use crate::config::cores;
use crate::cpu::cpumodel::CpuModel;
use crate::cpu::idle::IdlePlan;
use crate::sys::sandbox::Sandbox;

/// Largest initrd accepted.
pub(super) const MAX_INITRD: u64 = 1 << 30;

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
    /// Where the API socket goes, its directory held open.
    pub(super) api_place: Option<crate::api::ApiPlace>,
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

/// The contents of regular file `path` (argument `what`), opened once by
/// [`crate::sys::files::open`] and read through a bound of `limit` bytes.
pub(super) fn read_limited(
    what: &'static str,
    path: &std::path::Path,
    limit: u64,
) -> Result<Vec<u8>, LaunchError> {
    use crate::sys::files::{self, FileError, How};
    let refused = |source| LaunchError::Path {
        what,
        path: path.to_path_buf(),
        source,
    };
    let f = files::open(path, How::READ).map_err(refused)?;
    let size = f.metadata().map(|m| m.len()).ok();
    files::read_file_limited(f, limit).map_err(|e| match e {
        FileError::TooLarge { limit } => LaunchError::TooLarge {
            what,
            path: path.to_path_buf(),
            size: size.unwrap_or(limit + 1),
            limit,
        },
        e => refused(e),
    })
}

/// Validates everything the user gave. No guest memory is mapped and no VM is made; the
/// files and devices the module doc names are opened or read here.
pub fn check(cfg: LaunchConfig) -> Result<Checked, LaunchError> {
    cfg.validate()?;
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
            check_host_memory(cfg.memory, *backing)?;
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
    let api_place = match &cfg.api_socket {
        Some(p) => Some(crate::api::ApiPlace::check(p)?),
        None => None,
    };
    let disks = crate::board::disks::open(&cfg.disks)?;
    let has = |engine: bool| {
        cfg.devices
            .iter()
            .any(|d| matches!(d, crate::board::pci::DeviceSpec::Engine { .. }) == engine)
    };
    // Passed-through functions' BARs from sysfs, so the windows are planned before any
    // device is opened; the guest's address width bounds the 64-bit window.
    let passthrough = cfg
        .devices
        .iter()
        .filter_map(|d| match d {
            crate::board::pci::DeviceSpec::Vfio { bdf } => Some(bdf),
            crate::board::pci::DeviceSpec::Engine { .. } => None,
        })
        .map(|bdf| {
            Ok(PassthroughAsk {
                bdf: bdf.clone(),
                bars: crate::board::vfio::sysfs_bars(std::path::Path::new("/"), bdf)
                    .map_err(crate::board::pci::PciError::from)?,
            })
        })
        .collect::<Result<Vec<_>, LaunchError>>()?;
    let phys_bits = match has(true) || has(false) {
        true => crate::kvm::vm::guest_phys_bits()?,
        false => 0,
    };
    let plan = MachinePlan::new(
        layout.ram_ranges().len(),
        disks.len(),
        has(true),
        &passthrough,
        phys_bits,
    )?;
    let cpu_model =
        crate::cpu::cpumodel::resolve(cfg.cpu_model, crate::cpu::cpumodel::host_is_kvm_pvm());
    // The CPU model's words go first, so the user's own can override them (see
    // `cpumodel::command_line` for `clearcpuid=`).
    let cmdline = boot::compose_cmdline(
        &crate::cpu::cpumodel::command_line(&cpu_model, &cfg.cmdline),
        &[idle.cmdline, &crate::board::disks::cmdline(&plan.disks)],
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
        api_place,
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

/// `/proc/meminfo`'s `key` in bytes (its kB, or a count of hugepages times their size).
fn meminfo(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
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

/// Refuses guest memory the host cannot back before anything is built: more than the
/// host's memory (or, made up front, more than is available now), more than this process's
/// memory cgroup allows (the kernel would kill the VMM as the guest touched it), or with
/// `--backing hugetlb` more than the kernel's free hugepages.
fn check_host_memory(size: u64, backing: Backing) -> Result<(), LaunchError> {
    use crate::config::size::format;
    let refuse = |why: String| Err(LaunchError::HostMemory(why));
    match backing {
        Backing::Hugetlb => {
            if let Some(free) = meminfo("HugePages_Free") {
                if size > free {
                    return refuse(format!(
                        "{} of hugepages asked for, the kernel has {} free (--backing \
                         hugetlb takes them from its free pool: free more with `sysctl \
                         vm.nr_hugepages=N`, or launch from a reserved pool with --name)",
                        format(size),
                        format(free)
                    ));
                }
            }
            return Ok(());
        }
        Backing::AnonymousPopulated => {
            if let Some(avail) = meminfo("MemAvailable") {
                if size > avail {
                    return refuse(format!(
                        "{} made up front (--backing prefault) is more than the {} this host \
                         has available",
                        format(size),
                        format(avail)
                    ));
                }
            }
        }
        Backing::Anonymous => {}
    }
    if let Some(total) = meminfo("MemTotal") {
        if size > total {
            return refuse(format!(
                "{} is more than this host's {} of memory",
                format(size),
                format(total)
            ));
        }
    }
    if let Some((limit, cg)) = crate::host::pod::memory_limit() {
        if size > limit {
            return refuse(format!(
                "{} is more than the {} this process's memory cgroup ({}) allows: the \
                 kernel would kill the VMM as the guest touched it",
                format(size),
                format(limit),
                cg.display()
            ));
        }
    }
    Ok(())
}

/// Opens `--console FILE` for writing without waiting (a FIFO's open would block until a
/// reader came), once, by [`crate::sys::files::open`]: a regular file (created, or
/// truncated once it is known to be one), `/dev/null` or a terminal; anything else is
/// refused.
pub(super) fn open_console(p: &std::path::Path) -> Result<std::fs::File, LaunchError> {
    use crate::sys::files::{self, FileError, How};
    use std::os::unix::fs::FileTypeExt;
    let refused = |source| LaunchError::Path {
        what: "--console",
        path: p.to_path_buf(),
        source,
    };
    let not_regular = || {
        refused(FileError::Io(std::io::Error::other(
            "not a regular file, /dev/null or a terminal",
        )))
    };
    let f = files::open(p, How::CREATE_WRITE).map_err(|e| {
        match e.io().and_then(|e| e.raw_os_error()) {
            // A FIFO without a reader: O_NONBLOCK refuses it at once.
            Some(libc::ENXIO) => not_regular(),
            _ => refused(e),
        }
    })?;
    let m = f.metadata().map_err(|e| refused(e.into()))?;
    if m.is_file() {
        f.set_len(0).map_err(|e| refused(e.into()))?;
        return Ok(f);
    }
    if m.file_type().is_char_device() && (is_dev_null(&m) || std::io::IsTerminal::is_terminal(&f)) {
        return Ok(f);
    }
    Err(not_regular())
}

/// Whether `m` is the null device (character device 1:3).
fn is_dev_null(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    libc::major(m.rdev()) == 1 && libc::minor(m.rdev()) == 3
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::idle::IdlePolicy;
    use crate::host::claim::ClaimError;
    use crate::machine::config::{KernelSource, PoolRequest};
    use pool::Backing;

    fn config(source: MemorySource, memory: u64) -> LaunchConfig {
        LaunchConfig {
            cores: CoreSelection::List(vec![0]),
            memory,
            kernel: KernelSource::Builtin {
                name: "not-a-kernel",
                bytes: b"nothing",
            },
            console_limit: crate::board::console::DEFAULT_LIMIT,
            source,
            state_dir: std::env::temp_dir().join("partition-launch-unit-no-ledger"),
            idle: IdlePolicy::Auto,
            ..crate::machine::config::tests::cfg()
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
