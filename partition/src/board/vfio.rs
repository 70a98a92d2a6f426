//! VFIO passthrough (`--device vfio=DDDD:BB:DD.F`): a host PCI function bound to vfio-pci
//! given to the partition through rust-vmm's vfio-ioctls (legacy container and group).
//!
//! **Not run on hardware yet** (docs/passthrough.md): this host has no IOMMU and no VFIO,
//! so what runs here is the refusal ([`check_host`]) and the pure rules the attach follows
//! (`devices::pci::passthrough`, unit-tested). The order of an attach:
//!
//! 1. [`check_host`]: `/dev/vfio/vfio`, the function in sysfs, bound to `vfio-pci`, in an
//!    IOMMU group (anything missing: exit 2 with what is missing);
//! 2. the KVM VFIO pseudo-device, a container with it, the device opened in it;
//! 3. its configuration space (256 bytes, 4 KiB for PCIe) and BAR regions read; the
//!    guest's view built (`virtual_function`: BARs placed in the BAR window, MSI-X
//!    emulated, MSI hidden beside MSI-X and emulated without it, extended capabilities
//!    shown or hidden);
//! 4. guest memory mapped for DMA (`dma_plan`: a pool extent of hugepages is one mapping);
//! 5. each mappable BAR mmapped from the device and made a KVM memory slot, except the
//!    pages holding the MSI-X table and PBA (`mappable`), which trap;
//! 6. one irqfd per MSI-X vector (or one for MSI), given to the device
//!    (VFIO_DEVICE_SET_IRQS); the guest's table entries (or MSI capability) become KVM MSI
//!    routes in front of them (the root's `PciHost`);
//! 7. its host IRQs steered to the partition's cores and counted (`HostIrqs`);
//! 8. once the guest has stopped, before its memory is scrubbed ([`Quiet`], on the
//!    `vfio-return` thread when confined, else as [`AttachedVfio`] drops): MSI-X (or MSI)
//!    off, the device reset, DMA unmapped; then the BAR mappings unmapped. A confined VMM
//!    leaves the device's descriptors to its exit, when the kernel takes the group out of
//!    its container and of KVM's VFIO device.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use devices::pci::config::ROM_BAR;
use devices::pci::passthrough::{
    DeviceAccess, DmaMap, PassthroughError, PassthroughFunction, PhysicalBar, Windows, dma_plan,
    mappable, physical_bars, virtual_function,
};
use vfio_bindings::bindings::vfio::{
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_ROM_REGION_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioDeviceFd, VfioOps};
use vmm_sys_util::eventfd::EventFd;

use crate::board::device::{
    BarBinding, Device, DeviceError, DeviceFds, DeviceReport, FilterOf, PciAttachment, Section,
};
use crate::board::kind::{Attached, Board, DeviceFacts, Kind, KindError, Placed};
use crate::board::resources::{Ask, Needs, PciNeeds, Place};
use crate::config::keyvalue::{KeyValueError, KeyValues, PciAddress};
use crate::kvm::{Vm, VmError};
use crate::memory::GuestMemory;
use crate::sys::seccomp::{Fds, Grants, IoctlGrant, Role};

/// The thread that quiets the passed-through functions once the guest has stopped
/// (`vfio-return`): only the ioctls of [`return_grants`], on the functions' descriptors
/// and their container's; no other thread of a confined VMM makes a VFIO call.
pub const VFIO_RETURN: Role = Role {
    name: "vfio-return",
    thread: "`vfio-return` (with `--device vfio=`)",
    calls: &[],
};

/// The passed-through functions' key in the launch's JSON report: a list, left out when
/// there is none.
pub const SECTION: Section = Section {
    key: "passthrough",
    one: false,
    always: false,
};

/// Errors passing a function through.
#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    /// The machine has no GSIs or memory slots left for it.
    #[error("--device vfio: {0}")]
    Resources(#[from] crate::board::resources::ResourceError),
    /// The host cannot pass this function through (a usage error: exit 2).
    #[error("--device vfio={bdf}: {why}")]
    Refused {
        /// The function.
        bdf: String,
        /// What is missing.
        why: String,
    },
    /// A VFIO call failed.
    #[error("VFIO {what}: {source}")]
    Vfio {
        /// What.
        what: &'static str,
        /// Why.
        source: vfio_ioctls::VfioError,
    },
    /// The device's view could not be built.
    #[error("{0}")]
    View(#[from] PassthroughError),
    /// KVM refused something.
    #[error("{0}")]
    Vm(#[from] VmError),
    /// An mmap or eventfd failed.
    #[error("{what}: {source}")]
    Os {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// A request to pass a host function through: `--device vfio=DDDD:BB:DD.F`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Its address, DDDD:BB:DD.F.
    pub bdf: String,
}

impl Kind for Function {
    const THREADS: &'static [Role] = &[VFIO_RETURN];
    const SECTION: Section = SECTION;
    const DEVICE_FORM: Option<(&'static str, &'static str)> = Some(("vfio", "vfio=DDDD:BB:DD.F"));
    type Opened = ();

    /// Its words. Whether this host can pass the function through is not asked here but
    /// with the launch's host facts ([`Kind::facts`], [`missing`]).
    fn parse(mut kv: KeyValues<'_>) -> Result<Self, KeyValueError> {
        let bdf: PciAddress = kv.require("vfio")?;
        kv.finish(&["vfio"])?;
        Ok(Function { bdf: bdf.0 })
    }

    fn written(&self) -> String {
        format!("vfio={}", self.bdf)
    }

    /// Several functions are fine (each its own slot); one asked for twice is not.
    fn conflict(&self, earlier: &[&Self]) -> Option<String> {
        earlier
            .iter()
            .any(|e| e.bdf == self.bdf)
            .then(|| format!("{} is asked for twice", self.bdf))
    }

    /// Refused when the host cannot pass it through (no VFIO, no IOMMU group, a driver
    /// other than vfio-pci...), naming why; else its BARs, from sysfs.
    fn facts(&self, root: &Path) -> Result<DeviceFacts, KindError> {
        if let Some(what) = missing(root, &self.bdf) {
            return Err(KindError::new(
                format!("--device {:?}: {what}", self.written()),
                true,
            ));
        }
        let bars = sysfs_bars(root, &self.bdf).map_err(|e| KindError::new(e, true))?;
        Ok(DeviceFacts { bars: Some(bars) })
    }

    /// The next free slot from 02.0 up, its BARs planned in the windows with the other
    /// functions' (its GSIs and memory slots are taken at attach, when known).
    fn ask(&self, _index: usize, facts: &DeviceFacts) -> Ask {
        Ask {
            owner: format!("the passed-through function {}", self.bdf),
            written: self.written(),
            needs: Needs::Pci(PciNeeds {
                host_bars: Some(facts.bars.clone().unwrap_or_default()),
                ..PciNeeds::default()
            }),
        }
    }

    fn open(all: &[&Self]) -> Result<Vec<()>, KindError> {
        Ok(vec![(); all.len()])
    }

    /// The function's interrupt counter (read by the launcher), its device (whose regions
    /// the vCPUs read and write) and, for the `vfio-return` thread, the device and its
    /// container.
    fn example_fds(fds: &mut DeviceFds, first: i32) {
        let (counter, device, container) = (first, first + 1, first + 2);
        fds.pci = true;
        fds.irq_counts.push(counter);
        fds.vcpu_regions.push(device);
        fds.grant(VFIO_RETURN, return_grants(vec![device], container));
    }

    /// Every function in one container.
    fn attach(board: &mut Board<'_>, all: Vec<Placed<Self>>) -> Result<Attached, KindError> {
        let usage = |e: VfioError| {
            let u = matches!(e, VfioError::Refused { .. });
            KindError::new(e, u)
        };
        let (functions, pass) = attach_all(board, &all).map_err(usage)?;
        Ok(Attached {
            devices: vec![Box::new(pass)],
            functions,
        })
    }
}

/// What this host lacks to pass `bdf` through, under `sys` (normally `/`): None when it
/// has everything. Read-only; nothing is opened.
pub fn missing(root: &Path, bdf: &str) -> Option<String> {
    if !root.join("dev/vfio/vfio").exists() {
        let groups = std::fs::read_dir(root.join("sys/kernel/iommu_groups"))
            .map(|d| d.count())
            .unwrap_or(0);
        return Some(format!(
            "this host has no /dev/vfio/vfio ({} IOMMU groups): VFIO passthrough needs an \
             IOMMU enabled on the kernel command line and the vfio-pci module \
             (docs/passthrough.md)",
            groups
        ));
    }
    let dev = root.join("sys/bus/pci/devices").join(bdf);
    if !dev.exists() {
        return Some(format!("no PCI function {bdf} on this host"));
    }
    let driver = std::fs::read_link(dev.join("driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    if driver.as_deref() != Some("vfio-pci") {
        return Some(format!(
            "{bdf} is bound to {}, not vfio-pci (docs/passthrough.md: binding it)",
            driver.as_deref().unwrap_or("no driver")
        ));
    }
    if !dev.join("iommu_group").exists() {
        return Some(format!("{bdf} is in no IOMMU group"));
    }
    let (group, others) = group_of(root, bdf);
    for (other, driver) in others {
        if !matches!(driver.as_deref(), None | Some("vfio-pci" | "pci-stub")) {
            return Some(format!(
                "{bdf}'s IOMMU group {} also holds {other}, bound to {}: the IOMMU gives a \
                 group to one owner whole, so bind {other} to vfio-pci too (docs/passthrough.md: \
                 binding it); the partition is not shown it unless asked for",
                group.map_or("?".into(), |g| g.to_string()),
                driver.as_deref().unwrap_or("no driver")
            ));
        }
    }
    None
}

/// `bdf`'s IOMMU group number and the other functions in it with their drivers, under
/// `root` (normally `/`).
pub fn group_of(root: &Path, bdf: &str) -> (Option<u32>, Vec<(String, Option<String>)>) {
    let link = root
        .join("sys/bus/pci/devices")
        .join(bdf)
        .join("iommu_group");
    let group = std::fs::read_link(&link)
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok());
    let mut others: Vec<(String, Option<String>)> = std::fs::read_dir(link.join("devices"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let driver = std::fs::read_link(e.path().join("driver"))
                .ok()
                .and_then(|p| Some(p.file_name()?.to_str()?.to_string()));
            (name != bdf).then_some((name, driver))
        })
        .collect();
    others.sort();
    (group, others)
}

/// The BARs of `bdf` as its sysfs `resource` file (under `root`, normally `/`) lists them,
/// for planning the BAR windows before the device is opened.
pub fn sysfs_bars(root: &Path, bdf: &str) -> Result<Vec<PhysicalBar>, VfioError> {
    let path = root.join("sys/bus/pci/devices").join(bdf).join("resource");
    let refused = |why: String| VfioError::Refused {
        bdf: bdf.into(),
        why,
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| refused(format!("reading {}: {e}", path.display())))?;
    devices::pci::windows::bars_from_resource(&text)
        .map_err(|e| refused(format!("{}: {e}", path.display())))
}

/// [`missing`] on this host, as the error a launch stops with.
pub fn check_host(bdf: &str) -> Result<PathBuf, VfioError> {
    match missing(Path::new("/"), bdf) {
        Some(why) => Err(VfioError::Refused {
            bdf: bdf.into(),
            why,
        }),
        None => Ok(Path::new("/sys/bus/pci/devices").join(bdf)),
    }
}

/// ioctl requests by name.
pub type Ioctls = Vec<(&'static str, u64)>;

/// What quieting the device calls, on the `vfio-return` thread once the guest has stopped
/// ([`Quiet::run`]): on the device's descriptor VFIO_DEVICE_SET_IRQS (MSI-X or MSI off) and
/// VFIO_DEVICE_RESET; on the container's VFIO_IOMMU_UNMAP_DMA. The rest of giving the
/// device back (the group leaving KVM's VFIO device and its container) is the kernel's when
/// the descriptors close at the VMM's exit: no call of the confined VMM needs it, nor the
/// sysfs `readlink` vfio-ioctls would make (docs/security.md).
pub fn return_ioctls() -> (Ioctls, Ioctls) {
    (
        vec![
            ("VFIO_DEVICE_SET_IRQS", vfio_io(10)),
            ("VFIO_DEVICE_RESET", vfio_io(11)),
        ],
        vec![("VFIO_IOMMU_UNMAP_DMA", vfio_io(14))],
    )
}

/// What the `vfio-return` thread may call: [`return_ioctls`] on the functions' `devices` and
/// on their `container`.
pub fn return_grants(devices: Vec<std::os::fd::RawFd>, container: std::os::fd::RawFd) -> Grants {
    let (on_device, on_container) = return_ioctls();
    Grants {
        ioctls: vec![
            IoctlGrant {
                on: Fds {
                    what: "the VFIO devices' descriptors",
                    fds: devices,
                },
                requests: on_device,
            },
            IoctlGrant {
                on: Fds {
                    what: "the VFIO container's descriptor",
                    fds: vec![container],
                },
                requests: on_container,
            },
        ],
        ..Grants::default()
    }
}

/// `_IO(VFIO_TYPE, VFIO_BASE + nr)`.
const fn vfio_io(nr: u64) -> u64 {
    ((b';' as u64) << 8) | (100 + nr)
}

/// The device's trapped BAR parts and configuration writes, through VFIO's regions.
struct Regions(Arc<VfioDevice>);

impl DeviceAccess for Regions {
    fn read_bar(&self, bar: usize, offset: u64, data: &mut [u8]) {
        self.0.region_read(bar as u32, data, offset);
    }
    fn write_bar(&self, bar: usize, offset: u64, data: &[u8]) {
        self.0.region_write(bar as u32, data, offset);
    }
    fn write_config(&self, offset: u64, data: &[u8]) {
        self.0
            .region_write(VFIO_PCI_CONFIG_REGION_INDEX, data, offset);
    }
}

/// A piece of a BAR mapped into the guest: the KVM memory slot index, its offset in the
/// BAR, the host mapping and its length.
#[derive(Clone, Copy, Debug)]
pub struct Piece {
    /// Device memory slot index (`Vm::map_device_memory`).
    pub slot: u32,
    /// Offset in the BAR.
    pub offset: u64,
    /// Host address of the mmap of the device region.
    pub host: u64,
    /// Length.
    pub len: u64,
}

impl BarBinding for Piece {
    /// The piece's memory slot follows the BAR (emptied at the old place, filled at the new).
    fn moved(&self, vm: &Vm, old: Option<u64>, new: Option<u64>) -> Result<(), VmError> {
        let at = |a: Option<u64>, len| match a {
            // SAFETY: the piece is an mmap the passthrough keeps until after the VM.
            Some(a) => unsafe { vm.map_device_memory(self.slot, a + self.offset, self.host, len) },
            None => Ok(()),
        };
        at(old, 0).and_then(|()| at(new, self.len))
    }
}

/// One BAR of a passed-through function as the launch report shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PassthroughBar {
    /// BAR index.
    pub index: usize,
    /// Guest address where the VMM placed it (the guest may move it).
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// 64-bit BAR.
    pub is64: bool,
    /// Prefetchable.
    pub prefetchable: bool,
    /// Bytes of it mapped into the guest as memory slots (no exit); the rest is trapped.
    pub mapped_bytes: u64,
}

/// A passed-through function as the launch report shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PassthroughReport {
    /// The host function, `DDDD:BB:DD.F`.
    pub bdf: String,
    /// Its slot on the guest's bus 0.
    pub slot: u8,
    /// Its IOMMU group.
    pub iommu_group: Option<u32>,
    /// The other functions of its group: in the partition's IOMMU domain with it (a group
    /// has one owner), shown to the guest only when asked for themselves.
    pub group_peers: Vec<String>,
    /// How the VMM reached the IOMMU: `container` (the legacy VFIO container and group).
    pub iommu: &'static str,
    /// Why that way ([`iommu_reason`]).
    pub iommu_reason: String,
    /// Its memory BARs.
    pub bars: Vec<PassthroughBar>,
    /// MSI-X vectors routed to the guest (0: the function has no MSI-X).
    pub msix_vectors: usize,
    /// The guest sees an emulated MSI capability with one message (the function has MSI
    /// and no MSI-X).
    pub msi: bool,
    /// Capabilities hidden from the guest: (offset, id).
    pub hidden_capabilities: Vec<(usize, u8)>,
    /// PCIe extended capabilities the guest sees (read-only): (offset, id).
    pub extended_capabilities: Vec<(usize, u16)>,
    /// PCIe extended capabilities hidden from it: (offset, id).
    pub hidden_extended_capabilities: Vec<(usize, u16)>,
    /// Guest memory regions mapped for the device's DMA.
    pub dma_regions: usize,
    /// The host IRQs of its vectors (each an interrupt KVM turns into the guest's).
    pub host_irqs: Vec<u32>,
    /// Where the host delivers them: the partition's cores, as `/proc/irq/N/
    /// smp_affinity_list` reads back after the VMM set it, or why it could not.
    pub irq_affinity: Option<String>,
    /// Interrupts the device raised during the run (the host's count over its IRQs, read
    /// before teardown; None where the host does not show it).
    pub interrupts: Option<u64>,
}

/// Quieting a partition's passed-through functions: each one's interrupts off and the
/// function reset, then guest memory unmapped from their IOMMU domain. Done once, before
/// the partition's memory is scrubbed, by the `vfio-return` thread when the launch is
/// confined (its filter allows exactly these calls on these descriptors), or as the
/// [`Passthrough`] drops otherwise.
pub struct Quiet {
    /// Each function's device and whether it uses MSI (else MSI-X).
    devices: Vec<(Arc<VfioDevice>, bool)>,
    container: Arc<VfioContainer>,
    dma: Vec<DmaMap>,
    done: std::sync::atomic::AtomicBool,
}

impl Quiet {
    /// Quiets the functions (once; later calls do nothing).
    pub fn run(&self) {
        if self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        for (device, msi) in &self.devices {
            if *msi {
                let _ = device.disable_msi();
            } else {
                let _ = device.disable_msix();
            }
            device.reset();
        }
        for m in &self.dma {
            let _ = self.container.vfio_dma_unmap(m.iova, m.len as usize);
        }
    }

    /// The devices' descriptors and the container's (what the quieting calls name).
    pub fn fds(&self) -> (Vec<std::os::fd::RawFd>, std::os::fd::RawFd) {
        (
            self.devices.iter().map(|(d, _)| d.as_raw_fd()).collect(),
            self.container.as_raw_fd(),
        )
    }
}

/// The VFIO container a partition's passed-through functions share: one IOMMU domain (every
/// function's group joins it) behind one KVM VFIO device, with guest memory mapped for DMA
/// once, when the first function's group has joined.
pub struct Shared {
    container: Arc<VfioContainer>,
    dma: Option<Vec<DmaMap>>,
}

impl Shared {
    /// The container, on the VM's KVM VFIO device.
    pub fn open(vm: &Vm) -> Result<Self, VfioError> {
        let kvm_dev = vm.vfio_device()?;
        let container = VfioContainer::new(Some(Arc::new(VfioDeviceFd::new_from_kvm(kvm_dev))))
            .map_err(|source| VfioError::Vfio {
                what: "opening the container",
                source,
            })?;
        Ok(Self {
            container: Arc::new(container),
            dma: None,
        })
    }
}

/// A partition's passed-through functions; dropping it gives them back.
pub struct Passthrough {
    /// Confined: the thread that quiets the functions once the guest has stopped. The
    /// first field, so that on a launch's way out before the guest ran it quiets them
    /// (dropped) before the functions' BAR mappings go.
    vfio_return: Option<VfioReturn>,
    /// Each function, in `--device` order.
    pub functions: Vec<AttachedVfio>,
    shared: Shared,
    quiet: std::sync::OnceLock<Arc<Quiet>>,
    /// Confined: the devices stay open until the VMM exits (closing them through
    /// vfio-ioctls would read sysfs, which the confined VMM cannot and should not).
    keep_open: bool,
    /// The report, read once the guest stopped (its interrupt counts then).
    reports: Option<Vec<PassthroughReport>>,
}

impl Passthrough {
    /// No function yet, over `shared`.
    pub fn new(shared: Shared) -> Self {
        Self {
            vfio_return: None,
            functions: Vec::new(),
            shared,
            quiet: std::sync::OnceLock::new(),
            keep_open: false,
            reports: None,
        }
    }

    /// The container the functions join (for [`attach`]).
    pub fn shared(&mut self) -> &mut Shared {
        &mut self.shared
    }

    /// The launch report's section: each function with the interrupts it raised up to now.
    pub fn final_reports(&self) -> Vec<PassthroughReport> {
        self.functions.iter().map(|f| f.final_report()).collect()
    }

    /// What quiets the functions, for the `vfio-return` thread (made once every function
    /// is attached).
    pub fn quiet(&self) -> Arc<Quiet> {
        self.quiet
            .get_or_init(|| {
                Arc::new(Quiet {
                    devices: self
                        .functions
                        .iter()
                        .map(|f| (f.device.clone(), f.report.msi))
                        .collect(),
                    container: self.shared.container.clone(),
                    dma: self.shared.dma.clone().unwrap_or_default(),
                    done: std::sync::atomic::AtomicBool::new(false),
                })
            })
            .clone()
    }

    /// The descriptors the launcher reads the functions' interrupt counts from (`pread64`).
    pub fn count_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.functions.iter().flat_map(|f| f.count_fds()).collect()
    }

    /// The launch is confined from now on: the functions are quieted by the `vfio-return`
    /// thread and left open until the VMM exits (the kernel closes them then, and takes the
    /// groups out of the container and of KVM's VFIO device).
    pub fn keep_open_until_exit(&mut self) {
        self.keep_open = true;
    }
}

impl Device for Passthrough {
    fn fds(&self, fds: &mut DeviceFds) {
        fds.pci = true;
        fds.irq_counts.extend(self.count_fds());
        let (devices, container) = self.quiet().fds();
        fds.vcpu_regions.extend(&devices);
        fds.grant(VFIO_RETURN, return_grants(devices, container));
    }

    /// Confined, the functions are quieted by a thread of their own once the guest has
    /// stopped (nobody else may make a VFIO call) and stay open until the VMM exits.
    fn start(
        &mut self,
        filter: FilterOf<'_>,
        _worker_core: Option<usize>,
    ) -> Result<(), DeviceError> {
        if let Some(f) = filter(VFIO_RETURN) {
            self.keep_open_until_exit();
            self.vfio_return = Some(VfioReturn::start(self.quiet(), f)?);
        }
        Ok(())
    }

    /// Every vCPU has stopped: the interrupt counts are read (the host IRQs go with the
    /// vectors), then the functions are quieted before anything else (their DMA must end
    /// before the partition's memory is scrubbed).
    fn guest_stopped(&mut self) {
        self.reports = Some(self.final_reports());
        if let Some(r) = self.vfio_return.take() {
            r.finish();
        }
    }

    fn stop(&mut self) -> DeviceReport {
        let reports = self.reports.take().unwrap_or_else(|| self.final_reports());
        DeviceReport {
            section: SECTION,
            entries: reports
                .iter()
                .map(|r| serde_json::to_value(r).unwrap_or_default())
                .collect(),
            sentences: Vec::new(),
        }
    }
}

/// The thread that quiets passed-through functions once the guest has stopped, under a
/// filter that allows exactly those calls on exactly those descriptors: no other thread of
/// a confined VMM may make a VFIO call at all.
struct VfioReturn {
    go: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl VfioReturn {
    /// Starts it, waiting; `filter` is installed first thing.
    fn start(quiet: Arc<Quiet>, filter: Arc<seccompiler::BpfProgram>) -> Result<Self, DeviceError> {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("vfio-return".into())
            .spawn(move || {
                if let Err(e) = crate::sys::seccomp::apply(VFIO_RETURN, &filter) {
                    log::error!("{e}; the function is quieted without it");
                }
                // A message, or the launcher gone: either way the guest no longer runs.
                let _ = wait.recv();
                quiet.run();
            })
            .map_err(|source| DeviceError::Thread {
                what: "the vfio-return thread",
                source,
            })?;
        Ok(Self {
            go: Some(go),
            thread: Some(thread),
        })
    }

    /// The guest has stopped (every vCPU joined): quiet the function now and wait for it.
    fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        drop(self.go.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for VfioReturn {
    fn drop(&mut self) {
        self.end();
    }
}

impl Drop for Passthrough {
    fn drop(&mut self) {
        if self.keep_open {
            // Never dropped: vfio-ioctls' drop of a device reads its sysfs link, and the
            // process's exit closes it.
            for f in &self.functions {
                std::mem::forget(f.device.clone());
            }
        } else {
            self.quiet().run();
        }
    }
}

/// One passed-through function's parts that live as long as the VM (its BAR mappings are
/// unmapped when it drops, after the VM is gone).
pub struct AttachedVfio {
    /// What the launch report says of it.
    pub report: PassthroughReport,
    device: Arc<VfioDevice>,
    pieces: Vec<(usize, Piece)>,
    /// One irqfd per MSI-X vector (one for MSI), with its GSI.
    pub vectors: Vec<(u32, Arc<EventFd>)>,
    irqs: HostIrqs,
}

impl AttachedVfio {
    /// The launch report's section, with the interrupts the device raised up to now.
    pub fn final_report(&self) -> PassthroughReport {
        PassthroughReport {
            interrupts: self.irqs.count(),
            ..self.report.clone()
        }
    }

    /// Each mapped piece, by BAR index.
    pub fn pieces(&self) -> &[(usize, Piece)] {
        &self.pieces
    }

    /// The descriptors the launcher reads its interrupt counts from (`pread64`).
    pub fn count_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.irqs.counts.iter().map(|f| f.as_raw_fd()).collect()
    }

    /// The device's descriptor (its regions, which the vCPU threads read and write).
    pub fn device_fd(&self) -> std::os::fd::RawFd {
        self.device.as_raw_fd()
    }
}

impl Drop for AttachedVfio {
    fn drop(&mut self) {
        for (_, p) in &self.pieces {
            // SAFETY: each piece is an mmap this attach made and nothing else refers to
            // (its memory slot went with the VM, which is torn down before this drop).
            unsafe { libc::munmap(p.host as *mut libc::c_void, p.len as usize) };
        }
    }
}

/// Why the legacy container reaches the IOMMU for the function at `sysfs`, given whether
/// the kernel offers iommufd (`/dev/iommu`). The iommufd / VFIO cdev path is not built: no
/// platform this project tests on has it (Debian's 6.12 kernel, the rig's host, is built
/// without CONFIG_IOMMUFD), so a kernel that offers it still gets the container, and the
/// report says so.
pub fn iommu_reason(iommufd: bool, sysfs: &Path) -> String {
    let cdev = sysfs.join("vfio-dev").is_dir();
    match (iommufd, cdev) {
        (true, true) => "the kernel offers iommufd (/dev/iommu) and the function's VFIO cdev \
                         (vfio-dev/); the VMM's iommufd path is not built, so the legacy \
                         container (VFIO_TYPE1v2)"
            .into(),
        (true, false) => "the kernel offers iommufd but no VFIO cdev for the function \
                          (CONFIG_VFIO_DEVICE_CDEV off): the legacy container (VFIO_TYPE1v2)"
            .into(),
        (false, _) => "the kernel offers no iommufd (/dev/iommu absent: CONFIG_IOMMUFD off): \
                       the legacy container (VFIO_TYPE1v2)"
            .into(),
    }
}

/// The most of an expansion ROM the VMM copies (a GPU's VBIOS is under 1 MiB; past this
/// the guest reads all ones, as past a ROM image).
const ROM_COPY_MAX: u64 = 16 << 20;

impl Placed<Function> {
    /// Its parts of the BAR windows, as the plan gave them.
    fn place_windows(&self) -> Option<Windows> {
        self.place.pci().and_then(|p| p.windows)
    }
}

/// Passes through every function of `all`, each where it was placed, all in one
/// container: the functions for the PCI root and the set the launch keeps.
fn attach_all(
    board: &mut Board<'_>,
    all: &[Placed<Function>],
) -> Result<(Vec<PciAttachment>, Passthrough), VfioError> {
    let mut pass = Passthrough::new(Shared::open(board.vm)?);
    let mut out = Vec::new();
    for p in all {
        let bdf = &p.request.bdf;
        let (Place::Pci(place), Some(windows)) = (&p.place, p.place_windows()) else {
            return Err(VfioError::Os {
                what: "placing a passed-through function",
                source: std::io::Error::other(format!("{bdf} has no place in the BAR windows")),
            });
        };
        let slot = place.slot;
        let (f, attached) = attach(
            board.vm,
            board.memory,
            Target {
                bdf,
                guest_slot: slot,
                resources: board.resources,
                irq_cores: board.cores,
            },
            &windows,
            pass.shared(),
        )?;
        log::info!(
            "PCI: {bdf} passed through at 00:{slot:02x}.0: {} BARs, {} pieces mapped, {} MSI-X \
             vectors",
            f.bars().len(),
            attached.pieces().len(),
            attached.vectors.len()
        );
        out.push(PciAttachment {
            slot,
            function: Box::new(f),
            vectors: attached.vectors.clone(),
            bindings: attached
                .pieces()
                .iter()
                .map(|(bar, piece)| (*bar, Box::new(*piece) as Box<dyn BarBinding>))
                .collect(),
        });
        pass.functions.push(attached);
    }
    Ok((out, pass))
}

/// What [`attach`] passes through and where.
pub struct Target<'a> {
    /// The host function, `DDDD:BB:DD.F`.
    pub bdf: &'a str,
    /// Its slot on the guest's bus 0.
    pub guest_slot: u8,
    /// The pools it takes its GSIs and KVM memory slots from.
    pub resources: &'a mut crate::board::resources::Resources,
    /// The host cores its interrupts are steered to (the partition's).
    pub irq_cores: &'a [usize],
}

/// Passes `t.bdf` through as the function in guest slot `t.guest_slot`, its group joining
/// `shared`'s container (guest memory mapped for DMA there with the first function):
/// returns the function for the root and what must live as long as the VM; `windows` are
/// its parts of the BAR windows.
pub fn attach(
    vm: &Vm,
    memory: &GuestMemory,
    t: Target,
    windows: &Windows,
    shared: &mut Shared,
) -> Result<(PassthroughFunction, AttachedVfio), VfioError> {
    let Target {
        bdf,
        guest_slot,
        resources,
        irq_cores,
    } = t;
    let sysfs = check_host(bdf)?;
    let vfio = |what| move |source| VfioError::Vfio { what, source };
    let ops: Arc<dyn VfioOps> = shared.container.clone();
    let device = Arc::new(VfioDevice::new(&sysfs, ops, false).map_err(vfio("opening the device"))?);
    // Configuration space and BARs.
    // 256 bytes, or 4 KiB for a PCIe function (its extended capabilities).
    let config_len = (device.get_region_size(VFIO_PCI_CONFIG_REGION_INDEX) as usize).clamp(
        devices::pci::passthrough::STANDARD_CONFIG,
        devices::pci::config::CONFIG_SIZE,
    );
    let mut config = vec![0u8; config_len];
    device.region_read(VFIO_PCI_CONFIG_REGION_INDEX, &mut config, 0);
    let mut sizes = [0u64; 6];
    let mut mmap = [false; 6];
    for i in 0..6 {
        sizes[i] = device.get_region_size(i as u32);
        mmap[i] = device.get_region_flags(i as u32) & VFIO_REGION_INFO_FLAG_MMAP != 0;
    }
    let mut bars = physical_bars(&config, sizes, mmap)?;
    // The expansion ROM (VFIO reports none when the function has none or it cannot be
    // read): offered below 4 GiB, served from a copy read here once.
    let rom_size = device.get_region_size(VFIO_PCI_ROM_REGION_INDEX);
    let mut rom = Vec::new();
    if rom_size > 0 {
        bars.push(PhysicalBar {
            index: ROM_BAR,
            size: rom_size,
            io: false,
            is64: false,
            prefetchable: false,
            mmap: false,
        });
        rom = vec![0xff; rom_size.min(ROM_COPY_MAX) as usize];
        device.region_read(VFIO_PCI_ROM_REGION_INDEX, &mut rom, 0);
    }
    let view = virtual_function(&config, &bars, windows)?;
    // DMA: guest memory as the devices will address it (guest physical = I/O virtual), in
    // the container's one IOMMU domain, once its first group has joined it.
    if shared.dma.is_none() {
        let dma = dma_plan(&memory.regions(), 4096)?;
        for m in &dma {
            // SAFETY: the range is guest memory, owned by `memory` for the life of the VM;
            // the guest shares it with the devices by design, and the VMM touches it only
            // through vm-memory's volatile accesses.
            unsafe {
                shared
                    .container
                    .vfio_dma_map(m.iova, m.len as usize, m.hva as *mut u8)
            }
            .map_err(vfio("mapping guest memory for DMA"))?;
        }
        shared.dma = Some(dma);
    }
    let dma_regions = shared.dma.as_ref().map_or(0, Vec::len);
    let function = PassthroughFunction::new(view, Box::new(Regions(device.clone()))).with_rom(rom);
    // BARs into the guest, less the MSI-X pages.
    let traps: Vec<(usize, u64, u64)> = function
        .msix_ranges()
        .map(|(t, p)| vec![t, p])
        .unwrap_or_default();
    let mut pieces = Vec::new();
    for (bar, addr) in function.bars().to_vec() {
        // A BAR smaller than a page is trapped: a memory slot is whole pages.
        if !bar.mmap || bar.size < 4096 {
            continue;
        }
        let in_bar: Vec<(u64, u64)> = traps
            .iter()
            .filter(|t| t.0 == bar.index)
            .map(|t| (t.1, t.2))
            .collect();
        let base = device.get_region_offset(bar.index as u32);
        for (offset, len) in mappable(bar.size, &in_bar, 4096) {
            let slot = resources.memory_slots.take(
                1,
                1,
                &format!("{bdf} BAR {} at {offset:#x}", bar.index),
            )? as u32;
            // SAFETY: maps `len` bytes of the device's BAR region (VFIO gives the file
            // offset); the mapping is ours until AttachedVfio's drop unmaps it.
            let host = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    device.as_raw_fd(),
                    (base + offset) as libc::off_t,
                )
            };
            if host == libc::MAP_FAILED {
                return Err(VfioError::Os {
                    what: "mapping a BAR of the device",
                    source: std::io::Error::last_os_error(),
                });
            }
            let p = Piece {
                slot,
                offset,
                host: host as u64,
                len,
            };
            // SAFETY: the mapping lives in AttachedVfio until after the VM is gone.
            unsafe { vm.map_device_memory(slot, addr + offset, p.host, len)? };
            pieces.push((bar.index, p));
        }
    }
    // MSI-X: one irqfd per vector, signalled by the device; MSI (a device without MSI-X):
    // one. The guest's programming only moves the KVM routes in front of them.
    let mut vectors = Vec::new();
    let lines = if function.has_msi() {
        1
    } else {
        function.vectors() as u32
    };
    if lines > 0 {
        let base = resources
            .msi
            .take(u64::from(lines), 1, &format!("{bdf}'s vectors"))? as u32;
        for gsi in base..base + lines {
            vectors.push((gsi, Arc::new(vm.irq_line(gsi)?)));
        }
    }
    if !vectors.is_empty() {
        let fds: Vec<&EventFd> = vectors.iter().map(|(_, e)| e.as_ref()).collect();
        if function.has_msi() {
            device.enable_msi(fds).map_err(vfio("enabling MSI"))?;
        } else {
            device.enable_msix(fds).map_err(vfio("enabling MSI-X"))?;
        }
    }
    let irqs = HostIrqs::steer(&sysfs, irq_cores);
    let (iommu_group, peers) = group_of(Path::new("/"), bdf);
    let report = PassthroughReport {
        iommu_reason: iommu_reason(Path::new("/dev/iommu").exists(), &sysfs),
        host_irqs: irqs.numbers.clone(),
        irq_affinity: irqs.affinity.clone(),
        interrupts: None,
        bdf: bdf.to_string(),
        slot: guest_slot,
        iommu_group,
        group_peers: peers.into_iter().map(|(b, _)| b).collect(),
        iommu: "container",
        bars: function
            .bars()
            .iter()
            .map(|(b, addr)| PassthroughBar {
                index: b.index,
                addr: *addr,
                size: b.size,
                is64: b.is64,
                prefetchable: b.prefetchable,
                mapped_bytes: pieces
                    .iter()
                    .filter(|(i, _)| *i == b.index)
                    .map(|(_, p)| p.len)
                    .sum(),
            })
            .collect(),
        msix_vectors: function.vectors(),
        msi: function.has_msi(),
        hidden_capabilities: function.hidden().to_vec(),
        extended_capabilities: function.extended().0.to_vec(),
        hidden_extended_capabilities: function.extended().1.to_vec(),
        dma_regions,
    };
    Ok((
        function,
        AttachedVfio {
            report,
            device,
            pieces,
            vectors,
            irqs,
        },
    ))
}

/// The host's interrupts of a passed-through function (`msi_irqs/` in its sysfs directory,
/// one per MSI-X vector or MSI message VFIO enabled): steered to the partition's cores and
/// counted. Their affinity needs no restoring: the IRQs are freed when VFIO turns MSI-X
/// off at teardown, and the next user of those numbers starts from the default.
struct HostIrqs {
    numbers: Vec<u32>,
    /// What `/proc/irq/N/smp_affinity_list` reads after steering (the first IRQ's), or why
    /// it could not be set.
    affinity: Option<String>,
    /// `/sys/kernel/irq/N/per_cpu_count` of each, opened while the VMM may still open files.
    counts: Vec<std::fs::File>,
}

impl HostIrqs {
    fn steer(sysfs: &Path, cores: &[usize]) -> Self {
        let mut numbers: Vec<u32> = std::fs::read_dir(sysfs.join("msi_irqs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        numbers.sort_unstable();
        let list = cores
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut affinity = None;
        for n in &numbers {
            let at = format!("/proc/irq/{n}/smp_affinity_list");
            let r = std::fs::write(&at, &list)
                .and_then(|()| std::fs::read_to_string(&at))
                .map(|s| s.trim().to_string());
            if affinity.is_none() {
                affinity = Some(r.unwrap_or_else(|e| format!("not set ({at}: {e})")));
            }
        }
        let counts = numbers
            .iter()
            .filter_map(|n| std::fs::File::open(format!("/sys/kernel/irq/{n}/per_cpu_count")).ok())
            .collect();
        Self {
            numbers,
            affinity,
            counts,
        }
    }

    /// Interrupts the device raised so far, all its IRQs on all CPUs (None: unreadable).
    fn count(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        if self.counts.is_empty() {
            return None;
        }
        let mut total = 0;
        for f in &self.counts {
            let mut buf = [0u8; 4096];
            let n = f.read_at(&mut buf, 0).ok()?;
            total += String::from_utf8_lossy(&buf[..n])
                .trim()
                .split(',')
                .filter_map(|c| c.parse::<u64>().ok())
                .sum::<u64>();
        }
        Some(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_iommu_path_is_reported_with_what_the_kernel_offers() {
        let root = vmm_sys_util::tempdir::TempDir::new_with_prefix(
            std::env::temp_dir().join("vfio-iommu-"),
        )
        .unwrap();
        let dev = root.as_path().join("0000:41:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        assert!(iommu_reason(false, &dev).contains("no iommufd"));
        assert!(iommu_reason(true, &dev).contains("no VFIO cdev"));
        std::fs::create_dir_all(dev.join("vfio-dev/vfio0")).unwrap();
        let both = iommu_reason(true, &dev);
        assert!(
            both.contains("not built") && both.contains("legacy container"),
            "{both}"
        );
    }

    #[test]
    fn a_host_without_vfio_or_a_bound_function_is_told_what_is_missing() {
        let root = vmm_sys_util::tempdir::TempDir::new_with_prefix(
            std::env::temp_dir().join("vfio-test-"),
        )
        .unwrap();
        let r = root.as_path();
        let why = missing(r, "0000:41:00.0").unwrap();
        assert!(why.contains("no /dev/vfio/vfio (0 IOMMU groups)"), "{why}");
        std::fs::create_dir_all(r.join("dev/vfio")).unwrap();
        std::fs::write(r.join("dev/vfio/vfio"), b"").unwrap();
        let why = missing(r, "0000:41:00.0").unwrap();
        assert!(why.contains("no PCI function 0000:41:00.0"), "{why}");
        let dev = r.join("sys/bus/pci/devices/0000:41:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        let why = missing(r, "0000:41:00.0").unwrap();
        assert!(why.contains("bound to no driver"), "{why}");
        std::fs::create_dir_all(r.join("drivers/nvidia")).unwrap();
        std::os::unix::fs::symlink(r.join("drivers/nvidia"), dev.join("driver")).unwrap();
        let why = missing(r, "0000:41:00.0").unwrap();
        assert!(why.contains("bound to nvidia, not vfio-pci"), "{why}");
        std::fs::remove_file(dev.join("driver")).unwrap();
        std::fs::create_dir_all(r.join("drivers/vfio-pci")).unwrap();
        std::os::unix::fs::symlink(r.join("drivers/vfio-pci"), dev.join("driver")).unwrap();
        let why = missing(r, "0000:41:00.0").unwrap();
        assert!(why.contains("in no IOMMU group"), "{why}");
        // The group, with the GPU's audio function in it: viable only when that is bound
        // to vfio-pci too (or to no driver).
        let group = r.join("sys/kernel/iommu_groups/7");
        std::fs::create_dir_all(group.join("devices")).unwrap();
        std::os::unix::fs::symlink(&group, dev.join("iommu_group")).unwrap();
        std::os::unix::fs::symlink(&dev, group.join("devices/0000:41:00.0")).unwrap();
        assert_eq!(missing(r, "0000:41:00.0"), None);
        let audio = r.join("sys/bus/pci/devices/0000:41:00.1");
        std::fs::create_dir_all(&audio).unwrap();
        std::os::unix::fs::symlink(&audio, group.join("devices/0000:41:00.1")).unwrap();
        assert_eq!(
            missing(r, "0000:41:00.0"),
            None,
            "an unbound peer is viable"
        );
        std::fs::create_dir_all(r.join("drivers/snd_hda_intel")).unwrap();
        std::os::unix::fs::symlink(r.join("drivers/snd_hda_intel"), audio.join("driver")).unwrap();
        let why = missing(r, "0000:41:00.0").unwrap();
        assert!(
            why.contains("IOMMU group 7 also holds 0000:41:00.1, bound to snd_hda_intel")
                && why.contains("bind 0000:41:00.1 to vfio-pci too"),
            "{why}"
        );
        std::fs::remove_file(audio.join("driver")).unwrap();
        std::os::unix::fs::symlink(r.join("drivers/vfio-pci"), audio.join("driver")).unwrap();
        assert_eq!(missing(r, "0000:41:00.0"), None);
        assert_eq!(
            group_of(r, "0000:41:00.0"),
            (
                Some(7),
                vec![("0000:41:00.1".into(), Some("vfio-pci".into()))]
            )
        );
    }

    #[test]
    fn the_return_ioctls_are_vfios_numbers() {
        // As the kernel's headers (and vfio-ioctls' own tests) define them.
        let (device, container) = return_ioctls();
        let n = |v: Vec<(&str, u64)>| v.into_iter().map(|(_, n)| n).collect::<Vec<_>>();
        assert_eq!(n(device), [0x3b6e, 0x3b6f]);
        assert_eq!(n(container), [0x3b72]);
    }

    #[test]
    fn this_host_refuses_with_the_reason() {
        if Path::new("/dev/vfio/vfio").exists() {
            skip::skip(
                "partition::board::vfio::this_host_refuses_with_the_reason",
                "this host has /dev/vfio/vfio",
            );
            return;
        }
        match check_host("0000:41:00.0") {
            Err(VfioError::Refused { why, .. }) => assert!(why.contains("/dev/vfio/vfio")),
            other => panic!("{other:?}"),
        }
    }
}
