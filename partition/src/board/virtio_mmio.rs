//! Any virtio device on virtio-mmio, wired the one way the board wires them: a 4 KiB window
//! from the virtio-mmio range and an IOAPIC pin (placed by `crate::board::resources`),
//! described in the ACPI DSDT (a `LNRO0005` device, how stock kernels find it) and on the
//! guest's command line as `virtio_mmio.device=4K@ADDR:GSI`, its interrupt on an irqfd, and
//! each queue's QueueNotify bound to an ioeventfd (datamatch = queue index) so doorbells
//! never leave the kernel. With `--no-ioeventfd` the doorbell is an MMIO exit the transport
//! turns into the same eventfd write. A kind on virtio-mmio ([`crate::board::disks`]) builds
//! its device and hands it here.

use std::sync::{Arc, Mutex};

use boot::acpi::MmioDevice;
use devices::Bus;
use devices::virtio::mmio::{MmioTransport, QUEUE_NOTIFY, WINDOW};
use devices::virtio::{VirtioDevice, VirtioInterrupt};
use vmm_sys_util::eventfd::EventFd;

use crate::kvm::{Vm, VmError};
use crate::memory::GuestMemory;

/// Why a virtio-mmio device could not be wired.
#[derive(Debug, thiserror::Error)]
pub enum VirtioMmioError {
    /// eventfd creation.
    #[error("eventfd: {0}")]
    EventFd(std::io::Error),
    /// The bus refused the window.
    #[error("{0}")]
    Bus(#[from] devices::BusError),
    /// KVM refused a doorbell (ioeventfd) or an interrupt line (irqfd).
    #[error("{0}")]
    Vm(#[from] VmError),
}

/// The command-line words announcing the devices in `windows` (where
/// `crate::board::resources` placed them), for kernels built with
/// `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES` (stock distribution kernels find them in the ACPI
/// DSDT, which describes the same windows).
pub fn cmdline(windows: &[MmioDevice]) -> String {
    windows
        .iter()
        .map(|w| format!("virtio_mmio.device=4K@{:#x}:{}", w.base, w.gsi))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Puts `device` on `bus` as `name` in `window`, its doorbells (with `ioeventfd`) and its
/// interrupt wired through KVM: the transport the bus and the launch share.
pub fn attach(
    vm: &Vm,
    mem: &GuestMemory,
    bus: &mut Bus,
    name: &str,
    device: Box<dyn VirtioDevice>,
    window: &MmioDevice,
    ioeventfd: bool,
) -> Result<Arc<Mutex<MmioTransport>>, VirtioMmioError> {
    let MmioDevice { base, gsi, .. } = *window;
    let mut doorbells = Vec::new();
    for q in 0..device.queue_sizes().len() {
        let evt = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(VirtioMmioError::EventFd)?);
        if ioeventfd {
            vm.bind_doorbell(&evt, base + QUEUE_NOTIFY, q as u32)?;
            log::debug!(
                "{name} queue {q}: doorbell at {:#x} (datamatch {q}) is answered by the kernel",
                base + QUEUE_NOTIFY
            );
        }
        doorbells.push(evt);
    }
    let irq = vm.irq_line(gsi)?;
    let interrupt = Arc::new(VirtioInterrupt::new(Box::new(irq)));
    let t = Arc::new(Mutex::new(MmioTransport::new(
        device,
        mem.mem().clone(),
        interrupt,
        doorbells,
    )));
    bus.insert(name, base, WINDOW, t.clone())?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_names_each_window_and_its_pin() {
        let ask = |owner: &str| crate::board::resources::Ask {
            owner: owner.into(),
            written: owner.into(),
            needs: crate::board::resources::Needs::VirtioMmio,
        };
        let plan = crate::board::resources::MachinePlan::new(
            1,
            &[ask("virtio-blk0"), ask("virtio-blk1")],
            48,
        )
        .unwrap();
        assert_eq!(
            cmdline(&plan.virtio_mmio()),
            "virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"
        );
        assert_eq!(cmdline(&[]), "");
    }
}
