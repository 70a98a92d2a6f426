//! Any virtio device on virtio-pci (`devices::virtio::pci`): a function on the PCI root at
//! the slot and page the plan gave it (`crate::board::resources`), one MSI-X vector per
//! queue plus one for configuration changes, each an irqfd on a GSI of the plan's that the
//! PCI root routes when the guest programs the vector (`crate::board::pci`), and each
//! queue's notification address bound to an ioeventfd that follows the BAR when the guest
//! moves it. With `--no-ioeventfd` a notification is an MMIO exit the transport turns into
//! the same eventfd write. The root owns the function; the launch keeps the device through
//! a [`SharedDevice`] to start and stop it.

use std::sync::Arc;

use devices::virtio::pci::{NOTIFY, NOTIFY_MULTIPLIER, PciTransport, PciTransportError};
use devices::virtio::{SharedDevice, VirtioDevice};
use vmm_sys_util::eventfd::EventFd;

use crate::board::device::{BarBinding, PciAttachment};
use crate::board::resources::PciPlace;
use crate::kvm::{Vm, VmError};
use crate::memory::GuestMemory;

/// Why a virtio-pci function could not be wired.
#[derive(Debug, thiserror::Error)]
pub enum VirtioPciError {
    /// eventfd creation.
    #[error("eventfd: {0}")]
    EventFd(std::io::Error),
    /// KVM refused a doorbell (ioeventfd) or an interrupt line (irqfd).
    #[error("{0}")]
    Vm(#[from] VmError),
    /// The transport refused its definition.
    #[error("{0}")]
    Transport(#[from] PciTransportError),
    /// The plan gave no page or no vectors.
    #[error("the plan gave the function no {0}")]
    Place(&'static str),
}

/// A vector's line: an irqfd the PCI root routes.
struct Line(Arc<EventFd>);

impl devices::Interrupt for Line {
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// Each queue's notification ioeventfd, at its offset in BAR 0: it follows the BAR.
struct Notifications(Vec<(u64, Arc<EventFd>)>);

impl BarBinding for Notifications {
    fn moved(&self, vm: &Vm, old: Option<u64>, new: Option<u64>) -> Result<(), VmError> {
        for (off, evt) in &self.0 {
            if let Some(a) = old {
                vm.unbind_knock(evt, a + off)?;
            }
            if let Some(a) = new {
                vm.bind_knock(evt, a + off)?;
            }
        }
        Ok(())
    }
}

/// `device` as a virtio-pci function where `place` says (its first page BAR 0, its vectors
/// from its first GSI), its notifications on ioeventfds when `ioeventfd`: what the PCI
/// root takes, and the device for the launch.
pub fn attach(
    vm: &Vm,
    mem: &GuestMemory,
    place: &PciPlace,
    name: &str,
    device: Box<dyn VirtioDevice>,
    ioeventfd: bool,
) -> Result<(PciAttachment, SharedDevice), VirtioPciError> {
    let bar0 = *place.pages.first().ok_or(VirtioPciError::Place("page"))?;
    let first_gsi = place.first_gsi.ok_or(VirtioPciError::Place("vectors"))?;
    let queues = device.queue_sizes().len();
    let mut doorbells = Vec::new();
    let mut notifications = Vec::new();
    for q in 0..queues {
        let evt = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(VirtioPciError::EventFd)?);
        if ioeventfd {
            let off = NOTIFY + u64::from(NOTIFY_MULTIPLIER) * q as u64;
            vm.bind_knock(&evt, bar0 + off)?;
            log::debug!(
                "{name} queue {q}: notification at {:#x} is answered by the kernel",
                bar0 + off
            );
            notifications.push((off, evt.clone()));
        }
        doorbells.push(evt);
    }
    let mut vectors = Vec::new();
    let mut lines: Vec<Box<dyn devices::Interrupt + Sync>> = Vec::new();
    for v in 0..=queues as u32 {
        let gsi = first_gsi + v;
        let evt = Arc::new(vm.irq_line(gsi)?);
        vectors.push((gsi, evt.clone()));
        lines.push(Box::new(Line(evt)));
    }
    let shared = SharedDevice::new(device);
    let function = PciTransport::new(
        Box::new(shared.clone()),
        mem.mem().clone(),
        bar0,
        lines,
        doorbells,
    )?;
    let mut bindings: Vec<(usize, Box<dyn BarBinding>)> = Vec::new();
    if !notifications.is_empty() {
        bindings.push((0, Box::new(Notifications(notifications))));
    }
    Ok((
        PciAttachment {
            slot: place.slot,
            function: Box::new(function),
            vectors,
            bindings,
        },
        shared,
    ))
}
