//! A partition's PCI root: the host bridge at 00.0 and the functions of the PCI kinds at the
//! slots the plan gave them (the submission engine at 01.0, `docs/pci.md`; passed-through
//! host functions from 02.0, `docs/passthrough.md`), and the KVM side of them
//! ([`KvmPciHost`]): MSI-X routes in front of one irqfd per vector, and what each function
//! binds to a BAR (the engine's doorbell memory slot or ioeventfd, a passed-through BAR's
//! memory slots), which follows the BAR when the guest moves it. Each function comes from
//! its kind's attach step as a [`PciAttachment`]; the root here knows no kind.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use boot::layout::{PCI_ECAM_BASE, PCI_ECAM_SIZE, PCI_WINDOW_END, PCI_WINDOW_START};
use devices::Bus;
use devices::pci::config::BarChange;
use devices::pci::msix::RouteChange;
use devices::pci::{HostBridge, PciHost, PciRoot};
use vmm_sys_util::eventfd::EventFd;

use crate::board::device::{BarBinding, PciAttachment};
use crate::board::resources::MachinePlan;
use crate::kvm::{Vm, routing_table};

/// Errors putting the PCI root together.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// The root refused a function.
    #[error("{0}")]
    Root(#[from] devices::pci::PciError),
    /// The bus refused a range.
    #[error("{0}")]
    Bus(#[from] devices::BusError),
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

/// Puts the PCI root on the buses: CF8/CFC, ECAM and the BAR windows, with the host bridge
/// and `functions` (each kind's, from its attach step, at the slots `plan` gave them); with
/// none, an empty root on CF8/CFC only, as without PCI.
pub fn attach(
    vm: &Arc<Vm>,
    pio: &mut Bus,
    mmio: &mut Bus,
    functions: Vec<PciAttachment>,
    plan: &MachinePlan,
) -> Result<(), PciError> {
    let mut host = KvmPciHost {
        vm: vm.clone(),
        routes: BTreeMap::new(),
        vectors: BTreeMap::new(),
        bindings: BTreeMap::new(),
    };
    let mut root_functions: Vec<(usize, Box<dyn devices::pci::PciFunction>)> = Vec::new();
    if plan.has_pci() {
        root_functions.push((0, Box::new(HostBridge::new())));
    }
    for a in functions {
        for (v, line) in a.vectors.into_iter().enumerate() {
            host.vectors.insert((a.slot, v as u16), line);
        }
        for (bar, binding) in a.bindings {
            host.bindings
                .entry((a.slot, bar))
                .or_default()
                .push(binding);
        }
        root_functions.push((usize::from(a.slot), a.function));
    }
    let has_functions = !root_functions.is_empty();
    let mut root = PciRoot::new(PCI_WINDOW_START, PCI_WINDOW_END, Box::new(host));
    if let Some((start, end)) = plan.window64 {
        root.add_window(start, end);
    }
    for (slot, f) in root_functions {
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
    Ok(())
}

/// The host bridge the boot tables describe when `plan` has PCI functions, with the
/// 64-bit window it sized.
pub fn host_bridge(plan: &MachinePlan) -> Option<boot::acpi::PciHostBridge> {
    plan.has_pci().then_some(boot::acpi::PciHostBridge {
        ecam_base: PCI_ECAM_BASE,
        window_start: PCI_WINDOW_START,
        window_end: PCI_WINDOW_END,
        window64: plan.window64,
    })
}
