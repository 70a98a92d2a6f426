//! A partition's PCI functions (`--device`): the host bridge at 00.0, the submission
//! engine at 01.0 (`docs/pci.md`) and a passed-through host function at 02.0
//! (`--device vfio=BDF`, `crate::board::vfio`, `docs/passthrough.md`), and the KVM side of them
//! ([`KvmPciHost`]): MSI-X routes in front of one irqfd per vector, and the doorbell BAR's
//! memory slot or ioeventfd and a passed-through BAR's memory slots, which follow the BAR
//! when the guest moves it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use boot::layout::{PCI_ECAM_BASE, PCI_ECAM_SIZE, PCI_WINDOW_END, PCI_WINDOW_START};
use devices::Bus;
use devices::pci::config::BarChange;
use devices::pci::msix::RouteChange;
use devices::pci::submit::{
    BAR_DOORBELL, BAR_MSIX, BAR_REGS, BAR_SIZE, DoorbellMode, DoorbellPage, Shared, SubmitFunction,
    VECTORS,
};
use devices::pci::{HostBridge, PciHost, PciRoot};
use vmm_sys_util::eventfd::EventFd;

use crate::board::resources::{EnginePlace, MachinePlan};
use crate::config::keyvalue::{KeyValueError, KeyValues, PciAddress};
use crate::kvm::{Vm, VmError, routing_table};
use crate::memory::GuestMemory;

/// Errors parsing or attaching PCI devices.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// `--device` does not parse.
    #[error("--device {spec:?}: {why}")]
    Spec {
        /// The argument.
        spec: String,
        /// What is wrong.
        why: String,
    },
    /// VFIO passthrough was asked for on a host that cannot do it.
    #[error("--device {spec:?}: {what}")]
    Vfio {
        /// The argument.
        spec: String,
        /// What the host lacks or has.
        what: String,
    },
    /// The engine could not be built.
    #[error("{0}")]
    Engine(#[from] devices::pci::submit::SubmitError),
    /// A function could not be passed through.
    #[error("{0}")]
    Passthrough(#[from] crate::board::vfio::VfioError),
    /// The root refused a function.
    #[error("{0}")]
    Root(#[from] devices::pci::PciError),
    /// The bus refused a range.
    #[error("{0}")]
    Bus(#[from] devices::BusError),
    /// KVM refused something.
    #[error("{0}")]
    Vm(#[from] VmError),
    /// An eventfd or the doorbell page could not be made.
    #[error("{what}: {source}")]
    Os {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

impl From<KeyValueError> for PciError {
    fn from(e: KeyValueError) -> Self {
        Self::Spec {
            spec: e.spec,
            why: e.why,
        }
    }
}

impl PciError {
    /// A mistake in what the user asked (exit 2), not a failure of the host.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Self::Spec { .. }
                | Self::Vfio { .. }
                | Self::Passthrough(crate::board::vfio::VfioError::Refused { .. })
        )
    }
}

/// A `--device` argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The submission engine with this doorbell.
    Engine {
        /// How its doorbell page reaches it.
        doorbell: DoorbellMode,
    },
    /// A host PCI function passed through with VFIO (`crate::board::vfio`).
    Vfio {
        /// Its address, DDDD:BB:DD.F.
        bdf: String,
    },
}

impl std::fmt::Display for DeviceSpec {
    /// As a user writes it after `--device`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Engine { doorbell } => write!(f, "engine,doorbell={}", doorbell.name()),
            Self::Vfio { bdf } => write!(f, "vfio={bdf}"),
        }
    }
}

/// Why `new` cannot join the devices already asked for: a second engine, or a function
/// asked for twice. Several passed-through functions are fine (each its own slot).
pub fn conflict(asked: &[DeviceSpec], new: &DeviceSpec) -> Option<String> {
    asked.iter().find_map(|a| match (a, new) {
        (DeviceSpec::Engine { .. }, DeviceSpec::Engine { .. }) => {
            Some("one submission engine per partition".into())
        }
        (DeviceSpec::Vfio { bdf: x }, DeviceSpec::Vfio { bdf: y }) if x == y => {
            Some(format!("{y} is asked for twice"))
        }
        _ => None,
    })
}

/// Parses `engine[,doorbell=trap|ioeventfd|mapped]` (default `mapped`) or
/// `vfio=DDDD:BB:DD.F` (refused with the reason when the host cannot pass it through).
pub fn parse(spec: &str) -> Result<DeviceSpec, PciError> {
    let mut kv = KeyValues::parse_with_kind(spec)?;
    match kv.head() {
        Some("engine") => {
            let doorbell = kv.get::<DoorbellMode>("doorbell")?;
            kv.finish(&["doorbell"])?;
            Ok(DeviceSpec::Engine {
                doorbell: doorbell.unwrap_or(DoorbellMode::Mapped),
            })
        }
        None if spec.starts_with("vfio=") => {
            let bdf: PciAddress = kv.require("vfio")?;
            kv.finish(&["vfio"])?;
            match crate::board::vfio::missing(std::path::Path::new("/"), &bdf.0) {
                Some(why) => Err(PciError::Vfio {
                    spec: spec.into(),
                    what: why,
                }),
                None => Ok(DeviceSpec::Vfio { bdf: bdf.0 }),
            }
        }
        other => Err(kv
            .error(format!(
                "{:?} is not a device: engine[,doorbell=trap|ioeventfd|mapped] or \
                 vfio=DDDD:BB:DD.F",
                other.unwrap_or(spec)
            ))
            .into()),
    }
}

/// How a BAR is served, for the report.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BarReport {
    /// BAR index.
    pub index: usize,
    /// Guest address (where the VMM placed it; the guest may move it).
    pub addr: u64,
    /// Size.
    pub size: u64,
    /// `trap` (exits to the VMM), `ioeventfd` (answered in the kernel) or `memory`
    /// (a memory slot: no exit).
    pub served_by: &'static str,
}

/// The engine as the launch report shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EngineReport {
    /// Slot on bus 0.
    pub slot: u8,
    /// Doorbell mode.
    pub doorbell: DoorbellMode,
    /// Its BARs.
    pub bars: Vec<BarReport>,
    /// MSI-X vectors.
    pub msix_vectors: usize,
    /// Commands executed over the launch (across the guest's resets of the engine).
    pub executed: u64,
    /// Doorbell writes that exited to the VMM (trap mode's doorbell page and the
    /// `DOORBELL` register; 0 when every doorbell went through ioeventfd or the mapped page).
    pub trapped_doorbells: u64,
    /// Completion interrupts sent.
    pub interrupts_sent: u64,
    /// Host core the engine thread was pinned to (none free: where the scheduler put it).
    pub core: Option<usize>,
    /// The engine thread's CPU time over its life, ms.
    pub thread_cpu_ms: f64,
    /// Its life, ms (CPU over life: how busy it kept its core).
    pub thread_ran_ms: f64,
    /// The error that stopped it, if any.
    pub error: Option<String>,
}

/// The engine's parts the launch keeps: what its thread needs and what the report shows.
pub struct AttachedEngine {
    /// Shared with the function and the thread.
    pub shared: Arc<Shared>,
    /// The thread's kick (trap mode's doorbell, enable, reset; ioeventfd's doorbell).
    pub kick: Arc<EventFd>,
    /// Its doorbell mode.
    pub mode: DoorbellMode,
    /// The mapped doorbell page (mapped mode).
    pub page: Option<DoorbellPage>,
    /// Where it was placed.
    pub place: EnginePlace,
}

impl AttachedEngine {
    /// The report; `core` is where its thread was pinned.
    pub fn report(&self, core: Option<usize>) -> EngineReport {
        let doorbell = match self.mode {
            DoorbellMode::Trap => "trap",
            DoorbellMode::Ioeventfd => "ioeventfd",
            DoorbellMode::Mapped => "memory",
        };
        let bars = [
            (BAR_REGS, "trap"),
            (BAR_MSIX, "trap"),
            (BAR_DOORBELL, doorbell),
        ]
        .into_iter()
        .zip(self.place.bars)
        .map(|((index, served_by), addr)| BarReport {
            index,
            addr,
            size: BAR_SIZE,
            served_by,
        })
        .collect();
        let e = self.shared.engine();
        EngineReport {
            slot: self.place.slot,
            doorbell: self.mode,
            bars,
            msix_vectors: VECTORS,
            executed: e.lifetime(),
            trapped_doorbells: self.shared.trapped_doorbells.load(Ordering::Relaxed),
            interrupts_sent: self.shared.interrupts_sent.load(Ordering::Relaxed),
            core,
            thread_cpu_ms: self.shared.thread_cpu_ns.load(Ordering::Acquire) as f64 / 1e6,
            thread_ran_ms: self.shared.thread_wall_ns.load(Ordering::Acquire) as f64 / 1e6,
            error: e.error().map(|x| x.to_string()),
        }
    }
}

/// The doorbell BAR's binding to KVM, which moves with the BAR.
enum Doorbell {
    Trap,
    Knock(Arc<EventFd>),
    /// The page and its KVM memory slot.
    Page(DoorbellPage, u32),
}

/// The KVM side of the root's functions.
pub struct KvmPciHost {
    vm: Arc<Vm>,
    /// GSI -> (address, data) of every installed MSI route.
    routes: BTreeMap<u32, (u64, u32)>,
    /// (slot, vector) -> (GSI, its irqfd).
    vectors: BTreeMap<(u8, u16), (u32, Arc<EventFd>)>,
    doorbell: Doorbell,
    /// Where the engine is, if there is one.
    engine: Option<EnginePlace>,
    /// (slot, BAR) -> the pieces of a passed-through BAR mapped as memory slots.
    mapped: BTreeMap<(u8, usize), Vec<crate::board::vfio::Piece>>,
}

/// Environment variable that makes the VMM install no MSI route for its PCI functions, so
/// their interrupts never reach the guest: how the tests see their interrupt checks fail
/// (tests/vfio.rs). Only debug builds (the test builds) read it.
pub const BREAK_MSI_ENV: &str = "PARTITION_TEST_BREAK_MSI_ROUTES";

impl KvmPciHost {
    fn install_routes(&self) {
        let mut msi: Vec<(u32, u64, u32)> =
            self.routes.iter().map(|(g, (a, d))| (*g, *a, *d)).collect();
        if cfg!(debug_assertions) && std::env::var_os(BREAK_MSI_ENV).is_some() {
            msi.clear();
        }
        if let Err(e) = self.vm.set_routes(&routing_table(&msi)) {
            log::warn!("PCI: installing MSI routes: {e}");
        }
    }
}

impl PciHost for KvmPciHost {
    fn bar_changed(&mut self, slot: u8, change: &BarChange) {
        if let Some(pieces) = self.mapped.get(&(slot, change.index)) {
            for p in pieces {
                let at = |a: Option<u64>, len| match a {
                    // SAFETY: the pieces are mmaps the passthrough keeps until after the VM.
                    Some(a) => unsafe {
                        self.vm.map_device_memory(p.slot, a + p.offset, p.host, len)
                    },
                    None => Ok(()),
                };
                if let Err(e) = at(change.old, 0).and_then(|()| at(change.new, p.len)) {
                    log::warn!(
                        "PCI: following BAR {} of 00:{slot:02x}.0: {e}",
                        change.index
                    );
                }
            }
            return;
        }
        if Some(slot) != self.engine.map(|e| e.slot) || change.index != BAR_DOORBELL {
            return;
        }
        let r = match &self.doorbell {
            Doorbell::Trap => Ok(()),
            Doorbell::Knock(evt) => change
                .old
                .map_or(Ok(()), |a| self.vm.unbind_knock(evt, a))
                .and_then(|()| change.new.map_or(Ok(()), |a| self.vm.bind_knock(evt, a))),
            Doorbell::Page(page, page_slot) => {
                let (host, len) = page.host_range();
                let slot = |at: Option<u64>, len| match at {
                    // SAFETY: the page is owned by this host (and the engine thread), both
                    // of which live until the VM is torn down.
                    Some(a) => unsafe { self.vm.map_device_memory(*page_slot, a, host, len) },
                    None => Ok(()),
                };
                slot(change.old, 0).and_then(|()| slot(change.new, len))
            }
        };
        if let Err(e) = r {
            log::warn!(
                "PCI: following the engine's doorbell BAR to {:?}: {e}",
                change.new
            );
        }
    }

    fn msix_changed(&mut self, slot: u8, change: &RouteChange) {
        let Some((gsi, line)) = self.vectors.get(&(slot, change.vector)).cloned() else {
            return;
        };
        match change.route {
            Some(m) => self.routes.insert(gsi, (m.address, m.data)),
            None => self.routes.remove(&gsi),
        };
        self.install_routes();
        if change.fire_pending {
            let _ = line.write(1);
        }
    }
}

/// An MSI-X vector's line: an irqfd the host routes.
struct Line(Arc<EventFd>);

impl devices::Interrupt for Line {
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// Puts the PCI root on the buses: CF8/CFC, ECAM and the BAR window, with the host bridge
/// and the devices of `specs` (None: an empty root on CF8/CFC only, as without PCI), each
/// where `plan` placed it; a passed-through function takes its GSIs and memory slots from
/// `plan`'s pools once its vectors and BARs are known.
pub fn attach(
    vm: &Arc<Vm>,
    memory: &GuestMemory,
    pio: &mut Bus,
    mmio: &mut Bus,
    specs: &[DeviceSpec],
    plan: &mut MachinePlan,
    cores: &[usize],
) -> Result<
    (
        Option<AttachedEngine>,
        Option<crate::board::vfio::Passthrough>,
    ),
    PciError,
> {
    let os = |what| move |source| PciError::Os { what, source };
    let mut engine = None;
    let mut host = KvmPciHost {
        vm: vm.clone(),
        routes: BTreeMap::new(),
        vectors: BTreeMap::new(),
        doorbell: Doorbell::Trap,
        engine: plan.engine,
        mapped: BTreeMap::new(),
    };
    let mut functions: Vec<(usize, Box<dyn devices::pci::PciFunction>)> = Vec::new();
    if !specs.is_empty() {
        functions.push((0, Box::new(HostBridge::new())));
    }
    // Passed-through functions, each where the plan put it, all in one container.
    let mut vfio = None;
    if !plan.vfio.is_empty() {
        let mut pass = crate::board::vfio::Passthrough::new(crate::board::vfio::Shared::open(vm)?);
        for place in plan.vfio.clone() {
            let slot = place.slot;
            let (f, attached) = crate::board::vfio::attach(
                vm,
                memory,
                crate::board::vfio::Target {
                    bdf: &place.bdf,
                    guest_slot: slot,
                    resources: &mut plan.resources,
                    irq_cores: cores,
                },
                &place.windows,
                pass.shared(),
            )?;
            for (v, (gsi, evt)) in attached.vectors.iter().enumerate() {
                host.vectors.insert((slot, v as u16), (*gsi, evt.clone()));
            }
            for (bar, piece) in attached.pieces() {
                host.mapped.entry((slot, *bar)).or_default().push(*piece);
            }
            log::info!(
                "PCI: {} passed through at 00:{slot:02x}.0: {} BARs, {} pieces mapped, {} \
                 MSI-X vectors",
                place.bdf,
                f.bars().len(),
                attached.pieces().len(),
                attached.vectors.len()
            );
            functions.push((usize::from(slot), Box::new(f)));
            pass.functions.push(attached);
        }
        vfio = Some(pass);
    }
    let engine_spec = specs.iter().find_map(|s| match s {
        DeviceSpec::Engine { doorbell } => Some(doorbell),
        DeviceSpec::Vfio { .. } => None,
    });
    if let (Some(doorbell), Some(place)) = (engine_spec, plan.engine) {
        let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(os("engine kick eventfd"))?);
        let mut lines: Vec<Box<dyn devices::Interrupt + Sync>> = Vec::new();
        for v in 0..VECTORS as u16 {
            let gsi = place.first_gsi + u32::from(v);
            let evt = Arc::new(vm.irq_line(gsi)?);
            host.vectors.insert((place.slot, v), (gsi, evt.clone()));
            lines.push(Box::new(Line(evt)));
        }
        let (f, shared) = SubmitFunction::new(
            place.bars,
            *doorbell,
            memory.mem().clone(),
            lines,
            Box::new(
                kick.as_ref()
                    .try_clone()
                    .map_err(os("engine kick eventfd"))?,
            ),
        )?;
        let door = place.bars[2];
        let page = match doorbell {
            DoorbellMode::Trap => None,
            DoorbellMode::Ioeventfd => {
                vm.bind_knock(&kick, door)?;
                host.doorbell = Doorbell::Knock(kick.clone());
                None
            }
            DoorbellMode::Mapped => {
                let page = DoorbellPage::new().map_err(os("the doorbell page"))?;
                let (h, len) = page.host_range();
                // SAFETY: the page is kept by the host (inside the root, on the buses) and
                // by the engine, which live as long as the VM.
                unsafe { vm.map_device_memory(place.doorbell_slot, door, h, len)? };
                host.doorbell = Doorbell::Page(page.clone(), place.doorbell_slot);
                Some(page)
            }
        };
        functions.push((usize::from(place.slot), Box::new(f)));
        engine = Some(AttachedEngine {
            shared,
            kick,
            mode: *doorbell,
            page,
            place,
        });
    }
    let has_functions = !functions.is_empty();
    let mut root = PciRoot::new(PCI_WINDOW_START, PCI_WINDOW_END, Box::new(host));
    if let Some((start, end)) = plan.window64 {
        root.add_window(start, end);
    }
    for (slot, f) in functions {
        root.add(slot, f)?;
    }
    let root = Arc::new(Mutex::new(root));
    pio.insert(
        "pci-config",
        devices::pci::PCI_CONFIG_BASE,
        devices::pci::PCI_CONFIG_LEN,
        PciRoot::port_device(&root),
    )?;
    if has_functions {
        mmio.insert(
            "pci-ecam",
            PCI_ECAM_BASE,
            PCI_ECAM_SIZE,
            PciRoot::ecam_device(&root),
        )?;
        mmio.insert(
            "pci-window",
            PCI_WINDOW_START,
            PCI_WINDOW_END - PCI_WINDOW_START,
            PciRoot::window_device(&root),
        )?;
        if let Some((start, end)) = plan.window64 {
            mmio.insert(
                "pci-window64",
                start,
                end - start,
                PciRoot::window_device_at(&root, start),
            )?;
        }
    }
    Ok((engine, vfio))
}

/// The host bridge the boot tables describe when there are PCI functions, with the
/// 64-bit window `plan` sized.
pub fn host_bridge(specs: &[DeviceSpec], plan: &MachinePlan) -> Option<boot::acpi::PciHostBridge> {
    (!specs.is_empty()).then_some(boot::acpi::PciHostBridge {
        ecam_base: PCI_ECAM_BASE,
        window_start: PCI_WINDOW_START,
        window_end: PCI_WINDOW_END,
        window64: plan.window64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_specs_parse_and_vfio_is_refused_with_a_reason() {
        assert_eq!(
            parse("engine").unwrap(),
            DeviceSpec::Engine {
                doorbell: DoorbellMode::Mapped
            }
        );
        for (s, m) in [
            ("engine,doorbell=trap", DoorbellMode::Trap),
            ("engine,doorbell=ioeventfd", DoorbellMode::Ioeventfd),
            ("engine,doorbell=mapped", DoorbellMode::Mapped),
        ] {
            assert_eq!(parse(s).unwrap(), DeviceSpec::Engine { doorbell: m });
        }
        for bad in [
            "",
            "gpu",
            "engine,doorbell=fast",
            "engine,queues=2",
            "engine,doorbell",
            "engine,doorbell=trap,doorbell=mapped",
            "vfio=",
            "vfio=41:00.0",
            "vfio=0000:41:00.8",
            "vfio=0000:41:20.0",
            "vfio=0000:4g:00.0",
            "vfio=0000:41:00.0:1",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(
                e.is_usage() && matches!(e, PciError::Spec { .. }),
                "{bad:?}: {e}"
            );
        }
        match parse("vfio=0000:41:00.0") {
            // A host that could pass it through gets as far as the spec.
            Ok(s) => assert_eq!(
                s,
                DeviceSpec::Vfio {
                    bdf: "0000:41:00.0".into()
                }
            ),
            Err(e) => {
                assert!(e.is_usage(), "{e}");
                assert!(matches!(e, PciError::Vfio { .. }), "{e}");
                assert!(
                    crate::board::vfio::missing(std::path::Path::new("/"), "0000:41:00.0")
                        .is_some()
                );
            }
        }
        let engine = parse("engine").unwrap();
        let why = conflict(
            std::slice::from_ref(&engine),
            &parse("engine,doorbell=trap").unwrap(),
        );
        assert!(why.is_some_and(|w| w.contains("one submission engine")));
        let f = |b: &str| DeviceSpec::Vfio { bdf: b.into() };
        let asked = [engine, f("0000:41:00.0")];
        assert_eq!(conflict(&asked, &f("0000:42:00.0")), None);
        let why = conflict(&asked, &f("0000:41:00.0"));
        assert!(why.is_some_and(|w| w.contains("0000:41:00.0 is asked for twice")));
    }

    #[test]
    fn the_engine_report_names_how_each_bar_is_served() {
        let mem = vm_memory::GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 20)])
            .unwrap();
        for (mode, door) in [
            (DoorbellMode::Trap, "trap"),
            (DoorbellMode::Ioeventfd, "ioeventfd"),
            (DoorbellMode::Mapped, "memory"),
        ] {
            let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
            let place = MachinePlan::new(1, 0, true, &[], 48)
                .unwrap()
                .engine
                .unwrap();
            let (_, shared) = SubmitFunction::new(
                place.bars,
                mode,
                mem.clone(),
                Vec::new(),
                Box::new(kick.as_ref().try_clone().unwrap()),
            )
            .unwrap();
            let r = AttachedEngine {
                shared,
                kick,
                mode,
                page: None,
                place,
            }
            .report(Some(3));
            assert_eq!(
                (r.core, r.trapped_doorbells, r.interrupts_sent),
                (Some(3), 0, 0)
            );
            let served: Vec<_> = r.bars.iter().map(|b| b.served_by).collect();
            assert_eq!(served, ["trap", "trap", door]);
            assert_eq!(r.bars[2].addr, 0xc000_2000);
            assert_eq!((r.executed, r.error.as_deref()), (0, None));
        }
    }
}
