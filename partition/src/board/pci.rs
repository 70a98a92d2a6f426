//! A partition's PCI functions (`--device`): the host bridge at 00.0, the submission
//! engine at 01.0 (`docs/pci.md`) and a passed-through host function at 02.0
//! (`--device vfio=BDF`, `crate::board::vfio`, `docs/passthrough.md`), and the KVM side of them
//! ([`KvmPciHost`]): MSI-X routes in front of one irqfd per vector, and what each function
//! binds to a BAR (the engine's doorbell memory slot or ioeventfd, a passed-through BAR's
//! memory slots), which follows the BAR when the guest moves it. Each function comes from
//! its kind's file ([`crate::board::engine`], [`crate::board::vfio`]) as a
//! [`PciAttachment`]; the root here knows no kind.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use boot::layout::{PCI_ECAM_BASE, PCI_ECAM_SIZE, PCI_WINDOW_END, PCI_WINDOW_START};
use devices::Bus;
use devices::pci::config::BarChange;
use devices::pci::msix::RouteChange;
use devices::pci::{HostBridge, PciHost, PciRoot};
use vmm_sys_util::eventfd::EventFd;

use crate::board::device::{BarBinding, Device, PciAttachment};
use crate::board::resources::MachinePlan;
use crate::board::spec::DeviceSpec;
use crate::config::keyvalue::KeyValueError;
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
    /// The engine could not be attached.
    #[error("{0}")]
    Engine(#[from] crate::board::engine::EngineError),
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

/// Why the host under `root` cannot pass `spec`'s function through (no VFIO, no IOMMU
/// group, a driver other than vfio-pci...), as a usage error naming the request; None for
/// a request that is not a passed-through function or one the host can take.
pub fn host_refusal(root: &std::path::Path, spec: &DeviceSpec) -> Option<PciError> {
    let bdf = spec.vfio()?;
    crate::board::vfio::missing(root, bdf).map(|what| PciError::Vfio {
        spec: spec.to_string(),
        what,
    })
}

/// The KVM side of the root's functions.
pub struct KvmPciHost {
    vm: Arc<Vm>,
    /// GSI -> (address, data) of every installed MSI route.
    routes: BTreeMap<u32, (u64, u32)>,
    /// (slot, vector) -> (GSI, its irqfd).
    vectors: BTreeMap<(u8, u16), (u32, Arc<EventFd>)>,
    /// (slot, BAR) -> what follows that BAR.
    bindings: BTreeMap<(u8, usize), Vec<Box<dyn BarBinding>>>,
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
        for b in self
            .bindings
            .get(&(slot, change.index))
            .into_iter()
            .flatten()
        {
            if let Err(e) = b.moved(&self.vm, change.old, change.new) {
                log::warn!(
                    "PCI: following BAR {} of 00:{slot:02x}.0 to {:?}: {e}",
                    change.index,
                    change.new
                );
            }
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

/// Puts the PCI root on the buses: CF8/CFC, ECAM and the BAR window, with the host bridge
/// and the PCI devices of `specs` (none: an empty root on CF8/CFC only, as without PCI), each
/// where `plan` placed it; a passed-through function takes its GSIs and memory slots from
/// `plan`'s pools once its vectors and BARs are known. Returns each kind's device (the
/// passed-through functions, then the engine).
pub fn attach(
    vm: &Arc<Vm>,
    memory: &GuestMemory,
    pio: &mut Bus,
    mmio: &mut Bus,
    specs: &[DeviceSpec],
    plan: &mut MachinePlan,
    cores: &[usize],
) -> Result<Vec<Box<dyn Device>>, PciError> {
    let mut attachments: Vec<PciAttachment> = Vec::new();
    let mut out: Vec<Box<dyn Device>> = Vec::new();
    let passthrough = crate::board::vfio::attach_all(vm, memory, plan, cores)?;
    let passthrough = passthrough.map(|(mut functions, pass)| {
        attachments.append(&mut functions);
        pass
    });
    let engine_spec = specs.iter().find_map(|s| match s {
        DeviceSpec::Engine { doorbell } => Some(*doorbell),
        _ => None,
    });
    if let (Some(doorbell), Some(place)) = (engine_spec, plan.engine) {
        let (function, engine) = crate::board::engine::attach(vm, memory, place, doorbell)?;
        attachments.push(function);
        out.push(Box::new(engine));
    }
    // Given back last: its mappings outlive the engine's.
    if let Some(pass) = passthrough {
        out.push(Box::new(pass));
    }
    let mut host = KvmPciHost {
        vm: vm.clone(),
        routes: BTreeMap::new(),
        vectors: BTreeMap::new(),
        bindings: BTreeMap::new(),
    };
    let mut functions: Vec<(usize, Box<dyn devices::pci::PciFunction>)> = Vec::new();
    if specs.iter().any(DeviceSpec::is_pci) {
        functions.push((0, Box::new(HostBridge::new())));
    }
    for a in attachments {
        for (v, line) in a.vectors.into_iter().enumerate() {
            host.vectors.insert((a.slot, v as u16), line);
        }
        for (bar, binding) in a.bindings {
            host.bindings
                .entry((a.slot, bar))
                .or_default()
                .push(binding);
        }
        functions.push((usize::from(a.slot), a.function));
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
    Ok(out)
}

/// The host bridge the boot tables describe when `specs` has PCI functions, with the
/// 64-bit window `plan` sized.
pub fn host_bridge(specs: &[DeviceSpec], plan: &MachinePlan) -> Option<boot::acpi::PciHostBridge> {
    specs
        .iter()
        .any(DeviceSpec::is_pci)
        .then_some(boot::acpi::PciHostBridge {
            ecam_base: PCI_ECAM_BASE,
            window_start: PCI_WINDOW_START,
            window_end: PCI_WINDOW_END,
            window64: plan.window64,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::pci::submit::DoorbellMode;

    fn engine(doorbell: DoorbellMode) -> DeviceSpec {
        DeviceSpec::Engine { doorbell }
    }

    #[test]
    fn a_function_the_host_cannot_take_is_refused_and_two_that_clash_are_named() {
        // The host's answer, from a made-up root with no VFIO: refused, naming the request.
        let root = std::env::temp_dir().join(format!("pci-refusal-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let vfio = DeviceSpec::Vfio {
            bdf: "0000:41:00.0".into(),
        };
        let e = host_refusal(&root, &vfio).expect("no VFIO under the root");
        assert!(e.is_usage() && matches!(e, PciError::Vfio { .. }), "{e}");
        assert!(
            e.to_string().contains("--device \"vfio=0000:41:00.0\""),
            "{e}"
        );
        assert!(host_refusal(&root, &engine(DoorbellMode::Mapped)).is_none());
        std::fs::remove_dir_all(&root).unwrap();
        let mapped = engine(DoorbellMode::Mapped);
        let why = conflict(std::slice::from_ref(&mapped), &engine(DoorbellMode::Trap));
        assert!(why.is_some_and(|w| w.contains("one submission engine")));
        let f = |b: &str| DeviceSpec::Vfio { bdf: b.into() };
        let asked = [mapped, f("0000:41:00.0")];
        assert_eq!(conflict(&asked, &f("0000:42:00.0")), None);
        let why = conflict(&asked, &f("0000:41:00.0"));
        assert!(why.is_some_and(|w| w.contains("0000:41:00.0 is asked for twice")));
    }
}
