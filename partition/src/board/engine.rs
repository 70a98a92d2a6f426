//! The submission engine (`--device engine[,doorbell=...]`, docs/submission.md) as a device
//! kind: its PCI function where the plan put it (slot 01.0, three one-page BARs, its MSI-X
//! vectors on irqfds), its doorbell served the way it was asked (trapped, an ioeventfd, or
//! a page mapped into the guest), the thread that executes what the guest submits, and
//! its entry in the launch's report.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use devices::pci::submit::{
    BAR_DOORBELL, BAR_MSIX, BAR_REGS, BAR_SIZE, DoorbellMode, DoorbellPage, EngineThread, Shared,
    SubmitError, SubmitFunction, VECTORS, Wake,
};
use vmm_sys_util::eventfd::EventFd;

use crate::board::device::{
    BarBinding, Device, DeviceError, DeviceFds, DeviceReport, FilterOf, PciAttachment, Section,
};
use crate::board::kind::{Attached, Board, Kind, KindError, Placed};
use crate::board::resources::{Ask, ENGINE_SLOT, Needs, PciNeeds, Place};
use crate::config::keyvalue::{KeyValueError, KeyValues};
use crate::kvm::{Vm, VmError};
use crate::memory::GuestMemory;
use crate::sys::seccomp::Role;

/// The engine's thread (`engine`): waiting on its eventfd (`poll`, `ppoll`) or polling its
/// doorbell page, writing fences into guest memory, raising its MSI-X vector through an
/// irqfd (a write); nothing tied to a descriptor beyond the common set.
pub const ENGINE_THREAD: Role = Role {
    name: "engine",
    thread: "`engine` (`--device engine`)",
    calls: crate::sys::seccomp::syscalls![poll, ppoll],
};

/// The engine's key in the launch's JSON report: one object.
pub const SECTION: Section = Section {
    key: "engine",
    one: true,
    always: false,
};

/// Why the engine could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The function could not be built.
    #[error("{0}")]
    Function(#[from] SubmitError),
    /// KVM refused a vector's line, the ioeventfd or the doorbell page's slot.
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

impl std::fmt::Display for EngineReport {
    /// The sentence the launch prints for it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bars: Vec<String> = self
            .bars
            .iter()
            .map(|b| format!("BAR{} {:#x} {}", b.index, b.addr, b.served_by))
            .collect();
        write!(
            f,
            "engine at 00:{:02x}.0 on {}: doorbell {}; {}; {} commands executed, \
             {} doorbells trapped, {} interrupts sent; its thread busy {:.0}% of {:.0} ms{}",
            self.slot,
            self.core
                .map(|c| format!("core {c}"))
                .unwrap_or_else(|| "no free core".into()),
            self.doorbell.name(),
            bars.join(", "),
            self.executed,
            self.trapped_doorbells,
            self.interrupts_sent,
            100.0 * self.thread_cpu_ms / self.thread_ran_ms.max(1e-9),
            self.thread_ran_ms,
            self.error
                .as_ref()
                .map(|x| format!("; stopped: {x}"))
                .unwrap_or_default()
        )
    }
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
    /// Its thread, once started, and the core it went to.
    thread: Option<EngineThread>,
    core: Option<usize>,
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

impl Device for AttachedEngine {
    fn fds(&self, fds: &mut DeviceFds) {
        fds.pci = true;
    }

    /// The engine's thread, on the device threads' core (off every vCPU, where a polling
    /// engine may spin), under the engine's filter.
    fn start(
        &mut self,
        filter: FilterOf<'_>,
        worker_core: Option<usize>,
    ) -> Result<(), DeviceError> {
        let filter = filter(ENGINE_THREAD);
        let hook: devices::virtio::ThreadHook = Arc::new(move |_kind| match &filter {
            Some(f) => crate::sys::seccomp::apply(ENGINE_THREAD, f).map_err(Into::into),
            None => Ok(()),
        });
        let wake = match &self.page {
            Some(p) => Wake::Poll(p.clone()),
            None => Wake::Block,
        };
        let t = EngineThread::spawn(
            self.shared.clone(),
            self.kick.clone(),
            wake,
            worker_core,
            hook,
        )
        .map_err(|source| DeviceError::Thread {
            what: "the submission engine's thread",
            source,
        })?;
        self.thread = Some(t);
        self.core = worker_core;
        Ok(())
    }

    /// Stops the thread (it writes fences into guest memory).
    fn stop(&mut self) -> DeviceReport {
        if let Some(t) = self.thread.take() {
            t.stop();
        }
        let r = self.report(self.core);
        DeviceReport::one(SECTION, &r, r.to_string())
    }
}

/// The doorbell BAR's binding to KVM, which moves with the BAR.
enum Doorbell {
    /// An ioeventfd at the doorbell's address.
    Knock(Arc<EventFd>),
    /// The page, mapped in its KVM memory slot.
    Page(DoorbellPage, u32),
}

impl BarBinding for Doorbell {
    fn moved(&self, vm: &Vm, old: Option<u64>, new: Option<u64>) -> Result<(), VmError> {
        match self {
            Doorbell::Knock(evt) => old
                .map_or(Ok(()), |a| vm.unbind_knock(evt, a))
                .and_then(|()| new.map_or(Ok(()), |a| vm.bind_knock(evt, a))),
            Doorbell::Page(page, page_slot) => {
                let (host, len) = page.host_range();
                let slot = |at: Option<u64>, len| match at {
                    // SAFETY: the page is owned by this binding (inside the PCI root) and
                    // by the engine, both of which live until the VM is torn down.
                    Some(a) => unsafe { vm.map_device_memory(*page_slot, a, host, len) },
                    None => Ok(()),
                };
                slot(old, 0).and_then(|()| slot(new, len))
            }
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

/// A request for the engine: `--device engine[,doorbell=trap|ioeventfd|mapped]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Engine {
    /// How its doorbell page reaches it.
    pub doorbell: DoorbellMode,
}

/// Where the submission engine went: its slot, its three BARs (registers, MSI-X,
/// doorbell), one page each, the GSI of its vector 0 and its doorbell page's memory slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnginePlace {
    /// Its slot on bus 0.
    pub slot: u8,
    /// Its three BARs (registers, MSI-X, doorbell), one page each.
    pub bars: [u64; 3],
    /// The GSI of its MSI-X vector 0 (vector v is `first_gsi + v`).
    pub first_gsi: u32,
    /// The KVM memory slot of its mapped doorbell page.
    pub doorbell_slot: u32,
}

impl EnginePlace {
    /// The engine's place from the one the plan gave its ask (None: not an engine's).
    pub fn from_place(place: &Place) -> Option<Self> {
        let Place::Pci(p) = place else { return None };
        Some(Self {
            slot: p.slot,
            bars: p.pages.clone().try_into().ok()?,
            first_gsi: p.first_gsi?,
            doorbell_slot: p.first_memory_slot?,
        })
    }
}

impl Kind for Engine {
    const SECTION: Section = SECTION;
    const THREADS: &'static [Role] = &[ENGINE_THREAD];
    const DEVICE_FORM: Option<(&'static str, &'static str)> =
        Some(("engine", "engine[,doorbell=trap|ioeventfd|mapped]"));
    type Opened = ();

    /// Its words after the kind (default doorbell `mapped`).
    fn parse(mut kv: KeyValues<'_>) -> Result<Self, KeyValueError> {
        let doorbell = kv.get::<DoorbellMode>("doorbell")?;
        kv.finish(&["doorbell"])?;
        Ok(Engine {
            doorbell: doorbell.unwrap_or(DoorbellMode::Mapped),
        })
    }

    fn written(&self) -> String {
        format!("engine,doorbell={}", self.doorbell.name())
    }

    fn conflict(&self, earlier: &[&Self]) -> Option<String> {
        (!earlier.is_empty()).then(|| "one submission engine per partition".into())
    }

    /// Slot 01.0 (our guest ABI), its three pages, its vectors and its doorbell page's
    /// memory slot.
    fn ask(&self, _index: usize, _facts: &crate::board::kind::DeviceFacts) -> Ask {
        Ask {
            owner: "the submission engine".into(),
            written: self.written(),
            needs: Needs::Pci(PciNeeds {
                slot: Some(ENGINE_SLOT),
                pages: 3,
                vectors: VECTORS as u64,
                memory_slots: 1,
                host_bars: None,
            }),
        }
    }

    fn open(all: &[&Self]) -> Result<Vec<()>, KindError> {
        Ok(vec![(); all.len()])
    }

    /// A PCI function: the vCPUs update KVM's slots, routes and ioeventfds.
    fn example_fds(fds: &mut DeviceFds, _first: i32) {
        fds.pci = true;
    }

    fn attach(board: &mut Board<'_>, all: Vec<Placed<Self>>) -> Result<Attached, KindError> {
        let mut out = Attached::default();
        for p in all {
            let place = EnginePlace::from_place(&p.place).ok_or_else(|| {
                KindError::new(
                    format!("the engine's place {:?} is not one", p.place),
                    false,
                )
            })?;
            let (function, engine) = attach(board.vm, board.memory, place, p.request.doorbell)
                .map_err(|e| KindError::new(e, false))?;
            out.functions.push(function);
            out.devices.push(Box::new(engine));
        }
        Ok(out)
    }
}

/// Builds the engine where `place` says, its doorbell served as `doorbell` asks: the
/// function for the PCI root, and what the launch keeps.
pub fn attach(
    vm: &Vm,
    memory: &GuestMemory,
    place: EnginePlace,
    doorbell: DoorbellMode,
) -> Result<(PciAttachment, AttachedEngine), EngineError> {
    let os = |what| move |source| EngineError::Os { what, source };
    let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(os("engine kick eventfd"))?);
    let mut lines: Vec<Box<dyn devices::Interrupt + Sync>> = Vec::new();
    let mut vectors = Vec::new();
    for v in 0..VECTORS as u32 {
        let gsi = place.first_gsi + v;
        let evt = Arc::new(vm.irq_line(gsi)?);
        vectors.push((gsi, evt.clone()));
        lines.push(Box::new(Line(evt)));
    }
    let (function, shared) = SubmitFunction::new(
        place.bars,
        doorbell,
        memory.mem().clone(),
        lines,
        Box::new(
            kick.as_ref()
                .try_clone()
                .map_err(os("engine kick eventfd"))?,
        ),
    )?;
    let door = place.bars[2];
    let mut bindings: Vec<(usize, Box<dyn BarBinding>)> = Vec::new();
    let page = match doorbell {
        DoorbellMode::Trap => None,
        DoorbellMode::Ioeventfd => {
            vm.bind_knock(&kick, door)?;
            bindings.push((BAR_DOORBELL, Box::new(Doorbell::Knock(kick.clone()))));
            None
        }
        DoorbellMode::Mapped => {
            let page = DoorbellPage::new().map_err(os("the doorbell page"))?;
            let (h, len) = page.host_range();
            // SAFETY: the page is kept by its binding (inside the root, on the buses) and
            // by the engine, which live as long as the VM.
            unsafe { vm.map_device_memory(place.doorbell_slot, door, h, len)? };
            bindings.push((
                BAR_DOORBELL,
                Box::new(Doorbell::Page(page.clone(), place.doorbell_slot)),
            ));
            Some(page)
        }
    };
    Ok((
        PciAttachment {
            slot: place.slot,
            function: Box::new(function),
            vectors,
            bindings,
        },
        AttachedEngine {
            shared,
            kick,
            mode: doorbell,
            page,
            place,
            thread: None,
            core: None,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::resources::MachinePlan;

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
            let ask = Engine { doorbell: mode }.ask(0, &Default::default());
            let plan = MachinePlan::new(1, &[ask], 48).unwrap();
            let place = EnginePlace::from_place(&plan.places[0]).unwrap();
            let (_, shared) = SubmitFunction::new(
                place.bars,
                mode,
                mem.clone(),
                Vec::new(),
                Box::new(kick.as_ref().try_clone().unwrap()),
            )
            .unwrap();
            let mut engine = AttachedEngine {
                shared,
                kick,
                mode,
                page: None,
                place,
                thread: None,
                core: Some(3),
            };
            let r = engine.report(Some(3));
            assert_eq!(
                (r.core, r.trapped_doorbells, r.interrupts_sent),
                (Some(3), 0, 0)
            );
            let served: Vec<_> = r.bars.iter().map(|b| b.served_by).collect();
            assert_eq!(served, ["trap", "trap", door]);
            assert_eq!(r.bars[2].addr, 0xc000_2000);
            assert_eq!((r.executed, r.error.as_deref()), (0, None));
            // Its entry in the launch's report, and its sentence.
            let d = engine.stop();
            assert_eq!(d.section, SECTION);
            assert_eq!(d.entries[0]["bars"][2]["served_by"], door);
            assert!(d.sentences[0].starts_with("engine at 00:01.0 on core 3: doorbell "));
        }
    }
}
