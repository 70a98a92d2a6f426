//! The board a launch assembles: the legacy PC devices on the port bus, the console, the
//! virtio-blk disks and the PCI root, and starting their worker threads.

use std::io::Write;
use std::sync::{Arc, Mutex};

use devices::Bus;
use devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use devices::power::{
    ACPI_PM_BASE, ACPI_PM_LEN, AcpiPm, DEBUG_EXIT_LEN, DEBUG_EXIT_PORT, DebugExit,
};
use devices::rtc::{self, RTC_LEN, RTC_PORT, Rtc};
use devices::serial::{COM1_IRQ, COM1_LEN, COM1_PORT, SerialPort};

use crate::kvm::Vm;
use crate::memory::GuestMemory;
use crate::sys::seccomp::Role;

use super::confine::Filters;
use super::error::LaunchError;
use super::open::Checked;
use super::outcome::DiskReport;

/// The legacy devices on the PIO bus, as the ACPI DSDT describes them (COM1 with its
/// interrupt; the RTC, whose interrupt is not emulated).
pub(super) const LEGACY_DEVICES: [boot::acpi::IsaDevice; 2] = [
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

/// Starts the devices' threads (the disks' queue workers), each installing the worker
/// filter before it serves anything.
pub(super) fn start_devices(
    devices: &Devices,
    filters: Option<&Filters>,
) -> Result<(), LaunchError> {
    let worker = filters.map(|f| f.worker.clone());
    let hook: devices::virtio::ThreadHook = Arc::new(move |_kind| match &worker {
        Some(f) => crate::sys::seccomp::apply(Role::BlockWorker, f).map_err(Into::into),
        None => Ok(()),
    });
    for d in &devices.disks {
        d.transport
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .start(hook.clone())?;
    }
    if let Some(e) = &devices.engine {
        let filter = filters.map(|f| f.engine.clone());
        let hook: devices::virtio::ThreadHook = Arc::new(move |_kind| match &filter {
            Some(f) => crate::sys::seccomp::apply(Role::Engine, f).map_err(Into::into),
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

/// The device buses, frozen, and what teardown needs of them.
pub(super) struct Devices {
    pub(super) pio: Arc<Bus>,
    pub(super) mmio: Arc<Bus>,
    pub(super) serial: Arc<Mutex<SerialPort>>,
    pub(super) first_byte: Arc<std::sync::OnceLock<crate::sys::timeline::Stamp>>,
    /// Lines of the guest's console that report a fatal signal or an Oops
    /// (`console::FAULT_LINES`).
    pub(super) guest_faults: Arc<std::sync::atomic::AtomicU64>,
    pub(super) disks: Vec<crate::board::disks::AttachedDisk>,
    /// The submission engine (`--device engine`), and its thread once started.
    pub(super) engine: Option<crate::board::pci::AttachedEngine>,
    pub(super) engine_thread: Mutex<Option<devices::pci::submit::EngineThread>>,
    /// The core device threads (queue workers, the engine) run on, when one is free.
    pub(super) worker_core: Option<usize>,
    /// A passed-through function's VFIO state (given back when the devices go).
    pub(super) vfio: Option<crate::board::vfio::Passthrough>,
}

impl Devices {
    /// Stops the disks' queue workers and flushes the console; each disk's counters.
    pub(super) fn shut_down(&self) -> Vec<DiskReport> {
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
pub(super) fn attach_devices(
    checked: &mut Checked,
    vm: &Arc<Vm>,
    memory: &Arc<GuestMemory>,
) -> Result<Devices, LaunchError> {
    let serial_irq = vm.irq_line(COM1_IRQ)?;
    let console = std::mem::replace(&mut checked.console, Box::new(std::io::sink()));
    let first_byte = Arc::new(std::sync::OnceLock::new());
    let guest_faults = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let console = Box::new(FirstByte {
        inner: Box::new(crate::board::console::FaultWatch::new(
            Box::new(crate::board::console::Capped::new(
                console,
                checked.plan.console_limit,
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
    let (engine, vfio) = crate::board::pci::attach(
        vm,
        memory,
        &mut pio,
        &mut mmio,
        &checked.plan.devices,
        &mut checked.plan.machine,
        &checked.plan.cores,
    )?;
    // Queue workers go to a core the partition does not use, when there is one.
    let worker_core = crate::config::cores::available()
        .into_iter()
        .find(|c| !checked.plan.cores.contains(c));
    let disks = crate::board::disks::attach(
        vm,
        memory,
        &mut mmio,
        std::mem::take(&mut checked.disks),
        &checked.plan.machine.disks,
        checked.plan.ioeventfd,
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

/// Passes output through and notes when the first byte went by.
pub(super) struct FirstByte {
    pub(super) inner: Box<dyn Write + Send>,
    pub(super) at: Arc<std::sync::OnceLock<crate::sys::timeline::Stamp>>,
}

impl Write for FirstByte {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        // One stamp (a CPU clock read is a system call), at the first byte.
        if !b.is_empty() && self.at.get().is_none() {
            let _ = self.at.set(crate::sys::timeline::Stamp::now());
        }
        self.inner.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
