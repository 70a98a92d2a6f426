//! The board a launch assembles: the legacy PC devices on the port bus, and every device
//! the launch has, of whatever kind (`crate::board`'s kinds: the console among them), held
//! as one list that is started, stopped and reported without naming a kind.

use std::sync::{Arc, Mutex};

use devices::Bus;
use devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use devices::power::{
    ACPI_PM_BASE, ACPI_PM_LEN, AcpiPm, DEBUG_EXIT_LEN, DEBUG_EXIT_PORT, DebugExit,
};
use devices::rtc::{self, RTC_LEN, RTC_PORT, Rtc};

use crate::board::device::{Device, DeviceReport, GuestOutput};
use crate::board::kind::Board;
use crate::board::spec::DeviceSpec;
use crate::kvm::Vm;
use crate::memory::GuestMemory;

use super::confine::Filters;
use super::error::LaunchError;
use super::open::Checked;

/// The board's own legacy devices on the PIO bus the ACPI DSDT describes (the RTC, whose
/// interrupt is not emulated), beside those the kinds place there (the console's COM1,
/// `MachinePlan::isa`).
pub(super) const LEGACY_DEVICES: [boot::acpi::IsaDevice; 1] = [boot::acpi::IsaDevice {
    name: "RTC0",
    hid: "PNP0B00",
    port: RTC_PORT as u16,
    len: RTC_LEN as u8,
    irq: None,
}];

/// The device buses, frozen, and what teardown needs of them.
pub(super) struct Devices {
    pub(super) pio: Arc<Bus>,
    pub(super) mmio: Arc<Bus>,
    /// What the guest's text output told the launch (its first byte, its fault lines).
    pub(super) output: GuestOutput,
    /// Every device of the launch, of every kind, in the order they are given back: the
    /// kinds in the order of `board::spec`'s list (the disks, the engine, the
    /// passed-through functions, the console).
    pub(super) list: Vec<Box<dyn Device>>,
    /// The core device threads (queue workers, the engine) run on, when one is free.
    pub(super) worker_core: Option<usize>,
}

impl Devices {
    /// Starts the devices' threads, each installing its role's filter (`filters`) before it
    /// serves anything.
    pub(super) fn start(&mut self, filters: Option<&Filters>) -> Result<(), LaunchError> {
        let filter = |role| filters.and_then(|f| f.of(role));
        for d in &mut self.list {
            d.start(&filter, self.worker_core)?;
        }
        Ok(())
    }

    /// Every vCPU has stopped: each device's step before any is stopped.
    pub(super) fn guest_stopped(&mut self) {
        for d in &mut self.list {
            d.guest_stopped();
        }
    }

    /// Stops every device (their threads write into guest memory; the console, last,
    /// flushes what the guest wrote); each device's entry of the report.
    pub(super) fn shut_down(&mut self) -> Vec<DeviceReport> {
        self.list.iter_mut().map(|d| d.stop()).collect()
    }
}

/// The board's legacy devices on the PIO bus, the PCI root with its functions, and every
/// kind's devices where the plan put them (the virtio-mmio ones on the MMIO bus, the
/// console's COM1 on the PIO bus).
pub(super) fn attach_devices(
    checked: &mut Checked,
    vm: &Arc<Vm>,
    memory: &Arc<GuestMemory>,
) -> Result<Devices, LaunchError> {
    let mut pio = Bus::new("pio");
    let output = GuestOutput::default();
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
    // Queue workers go to a core the partition does not use, when there is one.
    let worker_core = crate::config::cores::available()
        .into_iter()
        .find(|c| !checked.plan.cores.contains(c));
    // Every kind's devices, each kind's together, in the list's order of kinds
    // (`board::spec`): the devices the launch keeps, and the PCI kinds' functions.
    let machine = &mut checked.plan.machine;
    let mut board = Board {
        vm,
        memory,
        mmio: &mut mmio,
        pio: &mut pio,
        output: &output,
        resources: &mut machine.resources,
        cores: &checked.plan.cores,
        worker_core,
        ioeventfd: checked.plan.ioeventfd,
    };
    let opened = std::mem::take(&mut checked.opened);
    let mut list: Vec<Box<dyn Device>> = Vec::new();
    let mut functions = Vec::new();
    for a in DeviceSpec::attach_all(&mut board, &checked.plan.devices, &machine.places, opened)? {
        list.extend(a.devices);
        functions.extend(a.functions);
    }
    // The PCI root: with no PCI function, empty on CF8/CFC only (a guest finds no PCI).
    crate::board::pci::attach(vm, &mut pio, &mut mmio, functions, machine)?;
    Ok(Devices {
        pio: Arc::new(pio),
        mmio: Arc::new(mmio),
        output,
        list,
        worker_core,
    })
}

/// docs/security.md's table of the seccomp filters: `confine::table` for a machine with a
/// device of every kind (each kind's placeholder descriptors: a disk's, a passed-through
/// function's device, container and interrupt counter...), so every condition shows.
pub fn security_table() -> String {
    super::confine::table(crate::board::spec::example_fds())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/security.md holds the generated table between these markers.
    const BEGIN: &str = "<!-- seccomp table: generated by partition::machine::devices::security_table; a test checks it -->\n";
    const END: &str = "<!-- end of the seccomp table -->";

    #[test]
    fn security_md_shows_the_filters_as_they_are() {
        let page =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/security.md"))
                .expect("docs/security.md");
        let start = page.find(BEGIN).expect("the table's start marker") + BEGIN.len();
        let end = page[start..].find(END).expect("the table's end marker") + start;
        let want = security_table();
        assert!(
            page[start..end].trim() == want.trim(),
            "docs/security.md's seccomp table differs from the filters; put this between the \
             markers:\n{want}"
        );
    }
}
