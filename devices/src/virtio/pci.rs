//! virtio over PCI, modern only (virtio 1.2, 4.1): a function on the root bus whose one BAR
//! holds the common configuration, the ISR byte, the device's configuration, the
//! notification addresses and the MSI-X table, each found by the driver through a
//! vendor-specific capability in configuration space.
//!
//! BAR 0 (32-bit, one page, [`BAR_SIZE`]): common configuration at [`COMMON`], ISR at [`ISR`], device
//! configuration at [`DEVICE`], queue `q`'s notification address at [`NOTIFY`] + 4q (a
//! multiplier of 4, so each queue has an address of its own for an ioeventfd), the MSI-X
//! table at [`MSIX_TABLE`] and its pending bits at [`MSIX_PBA`]. One MSI-X vector per
//! queue and one for configuration changes: a used buffer costs the guest no ISR read and
//! no acknowledgement, unlike virtio-mmio's one interrupt a device.
//!
//! There is no INTx pin: a driver that does not turn MSI-X on gets no interrupt (Linux's
//! virtio_pci and the probe both use MSI-X). The `VIRTIO_PCI_CAP_PCI_CFG` window (4.1.4.9),
//! which the specification asks devices to offer for drivers that cannot map BARs, is not
//! offered: its data bytes read through configuration space, which the root serves from
//! the function's static bytes.
//!
//! Guest input: common configuration fields take only their own width (a 64-bit address
//! also as two 32-bit halves); anything else reads as zero and writes nothing. Vector
//! numbers past the table read back as `NO_VECTOR` (4.1.5.1.2), the driver's sign that the
//! vector was not taken. What the negotiation refuses is in [`super::negotiation`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::negotiation::Negotiation;
use super::{MsixVectors, NO_VECTOR, VirtioDevice, VirtioInterrupt};
use crate::pci::config::{Bar, BarKind, ConfigError, ConfigSpace};
use crate::pci::msix::{MsixError, MsixLayout, RouteChange};
use crate::pci::{ConfigEffects, PciFunction};
use crate::{Interrupt, VmEvent, warn_ratelimited};

/// virtio's PCI vendor id.
pub const VENDOR: u16 = 0x1af4;
/// Modern device ids are this plus the device type.
pub const DEVICE_BASE: u16 = 0x1040;
/// BAR 0's size: one page, as the board places a function's own BARs.
pub const BAR_SIZE: u64 = 0x1000;
/// Common configuration.
pub const COMMON: u64 = 0x0000;
/// Its length (through `queue_device`).
pub const COMMON_LEN: u64 = 0x38;
/// ISR status.
pub const ISR: u64 = 0x100;
/// Device configuration.
pub const DEVICE: u64 = 0x200;
/// Device configuration's window.
pub const DEVICE_LEN: u64 = 0x100;
/// Notification addresses: queue `q` at `NOTIFY + NOTIFY_MULTIPLIER * q`.
pub const NOTIFY: u64 = 0x300;
/// Bytes between two queues' notification addresses.
pub const NOTIFY_MULTIPLIER: u32 = 4;
/// The MSI-X table.
pub const MSIX_TABLE: u64 = 0x400;
/// The MSI-X pending bits.
pub const MSIX_PBA: u64 = 0xc00;
/// Most queues a device may have here (the notification window, 0x100 bytes, and the
/// vectors' table, 128 entries).
pub const MAX_QUEUES: usize = 64;

const CAP_VENDOR: u8 = 0x09;
const CAP_MSIX: u8 = 0x11;
const CFG_COMMON: u8 = 1;
const CFG_NOTIFY: u8 = 2;
const CFG_ISR: u8 = 3;
const CFG_DEVICE: u8 = 4;

/// Errors building the function (the VMM's own mistakes).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PciTransportError {
    /// Configuration space refused a BAR or capability.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// The MSI-X capability refused its layout or count.
    #[error("{0}")]
    Msix(#[from] MsixError),
    /// Not one line per queue plus one for configuration changes.
    #[error("{queues} queues need {} MSI-X lines, not {lines}", queues + 1)]
    Lines {
        /// Queues.
        queues: usize,
        /// Lines given.
        lines: usize,
    },
    /// One doorbell per queue, and at most [`MAX_QUEUES`].
    #[error("{queues} queues with {doorbells} doorbells (at most {MAX_QUEUES} queues)")]
    Queues {
        /// Queues.
        queues: usize,
        /// Doorbells given.
        doorbells: usize,
    },
    /// BAR 0's address is not aligned to its size.
    #[error("BAR 0 at {0:#x} is not aligned to {BAR_SIZE:#x}")]
    Base(u64),
}

/// PCI class of a device type (QEMU's choices: storage for block, network for net).
fn class(device_type: u32) -> u32 {
    match device_type {
        super::TYPE_BLOCK => 0x01_0000,
        1 => 0x02_0000,
        _ => 0xff_0000,
    }
}

/// A virtio device on the PCI root.
pub struct PciTransport {
    config: ConfigSpace,
    msix_cap: usize,
    n: Negotiation,
    vectors: Arc<MsixVectors>,
    device_features_sel: u32,
    driver_features_sel: u32,
    queue_sel: u16,
    config_generation: u8,
}

impl PciTransport {
    /// `device` with BAR 0 at `bar0`, one doorbell per queue, and one MSI-X line per queue
    /// plus one (the last) for configuration changes. Returns the vectors too: what the
    /// VMM shows a device's interrupts to (they live in the function's state).
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        bar0: u64,
        lines: Vec<Box<dyn Interrupt + Sync>>,
        doorbells: Vec<Arc<EventFd>>,
    ) -> Result<Self, PciTransportError> {
        let queues = device.queue_sizes().len();
        if queues > MAX_QUEUES || doorbells.len() != queues {
            return Err(PciTransportError::Queues {
                queues,
                doorbells: doorbells.len(),
            });
        }
        if lines.len() != queues + 1 {
            return Err(PciTransportError::Lines {
                queues,
                lines: lines.len(),
            });
        }
        if bar0 % BAR_SIZE != 0 {
            return Err(PciTransportError::Base(bar0));
        }
        let device_type = device.device_type();
        let id = DEVICE_BASE.wrapping_add(device_type as u16);
        let mut config = ConfigSpace::new(VENDOR, id, class(device_type), 1, 0);
        // Modern devices: a subsystem id of 0x40 or more (4.1.2.1).
        config.set_subsystem(VENDOR, 0x0040);
        config.set_bar(
            0,
            Bar {
                size: BAR_SIZE,
                kind: BarKind::Mem32,
                prefetchable: false,
            },
            bar0,
        )?;
        let cap = |cfg_type: u8, offset: u64, length: u64| -> Vec<u8> {
            let mut b = vec![16, cfg_type, 0, 0, 0, 0];
            b.extend_from_slice(&(offset as u32).to_le_bytes());
            b.extend_from_slice(&(length as u32).to_le_bytes());
            b
        };
        config.add_capability(CAP_VENDOR, &cap(CFG_COMMON, COMMON, COMMON_LEN), &[0; 14])?;
        let mut notify = cap(
            CFG_NOTIFY,
            NOTIFY,
            u64::from(NOTIFY_MULTIPLIER) * queues as u64,
        );
        notify[0] = 20;
        notify.extend_from_slice(&NOTIFY_MULTIPLIER.to_le_bytes());
        config.add_capability(CAP_VENDOR, &notify, &[0; 18])?;
        config.add_capability(CAP_VENDOR, &cap(CFG_ISR, ISR, 1), &[0; 14])?;
        config.add_capability(CAP_VENDOR, &cap(CFG_DEVICE, DEVICE, DEVICE_LEN), &[0; 14])?;
        let vectors = Arc::new(MsixVectors::new(
            lines,
            MsixLayout {
                table: (0, MSIX_TABLE as u32),
                pba: (0, MSIX_PBA as u32),
            },
            queues,
        )?);
        let (body, mask) = vectors
            .msix
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capability();
        let msix_cap = config.add_capability(CAP_MSIX, &body, &mask)?;
        let interrupt = Arc::new(VirtioInterrupt::msix(vectors.clone()));
        Ok(Self {
            config,
            msix_cap,
            n: Negotiation::new("virtio-pci", device, mem, interrupt, doorbells),
            vectors,
            device_features_sel: 0,
            driver_features_sel: 0,
            queue_sel: 0,
            config_generation: 0,
        })
    }

    /// The device.
    pub fn device(&self) -> &dyn VirtioDevice {
        self.n.device.as_ref()
    }

    /// Starts the device's threads (before the guest runs).
    pub fn start(&mut self, hook: super::ThreadHook) -> Result<(), super::DeviceError> {
        self.n.device.start(hook)
    }

    /// Stops the device (teardown).
    pub fn shutdown(&mut self) {
        self.n.device.reset();
    }

    /// Guest-triggered messages the rate limits dropped over the VMM's life.
    pub fn log_suppressed(&self) -> u64 {
        self.n.log.dropped_total() + self.n.device.log_suppressed()
    }

    /// The vectors (their state, lines and the driver's choices).
    pub fn vectors(&self) -> &Arc<MsixVectors> {
        &self.vectors
    }

    /// A vector number as the device takes it: one past the table is none.
    fn vector(&self, v: u16) -> u16 {
        if usize::from(v) < self.vectors.lines.len() {
            v
        } else {
            NO_VECTOR
        }
    }

    fn set_status(&mut self, v: u8) {
        if self.n.set_status(u32::from(v)) {
            self.device_features_sel = 0;
            self.driver_features_sel = 0;
            self.queue_sel = 0;
            self.vectors.config.store(NO_VECTOR, Ordering::Relaxed);
            for q in &self.vectors.queues {
                q.store(NO_VECTOR, Ordering::Relaxed);
            }
        }
    }

    /// A common configuration field: (offset, width) as the driver reads it.
    fn read_common(&self, offset: u64, len: usize) -> Option<u64> {
        let sel = usize::from(self.queue_sel);
        let q = self.n.queues.get(sel);
        let qv = |f: fn(&super::queue::QueueSetup) -> u64| q.map_or(0, f);
        let half = |v: u64, high: bool| if high { v >> 32 } else { v & 0xffff_ffff };
        Some(match (offset, len) {
            (0x00, 4) => u64::from(self.device_features_sel),
            (0x04, 4) => u64::from(self.n.device_features(self.device_features_sel)),
            (0x08, 4) => u64::from(self.driver_features_sel),
            (0x0c, 4) => match self.driver_features_sel {
                0 => self.n.driver_features & 0xffff_ffff,
                1 => self.n.driver_features >> 32,
                _ => 0,
            },
            (0x10, 2) => u64::from(self.vectors.config.load(Ordering::Relaxed)),
            (0x12, 2) => self.n.queues.len() as u64,
            (0x14, 1) => u64::from(self.n.status() as u8),
            (0x15, 1) => u64::from(self.config_generation),
            (0x16, 2) => u64::from(self.queue_sel),
            (0x18, 2) => qv(|q| u64::from(q.size)),
            (0x1a, 2) => self
                .vectors
                .queues
                .get(sel)
                .map_or(u64::from(NO_VECTOR), |v| {
                    u64::from(v.load(Ordering::Relaxed))
                }),
            (0x1c, 2) => qv(|q| u64::from(q.ready)),
            // Queue q's notification address is q multipliers into the window.
            (0x1e, 2) => q.map_or(0, |_| sel as u64),
            (0x20, 8) => qv(|q| q.desc_table),
            (0x20 | 0x24, 4) => half(qv(|q| q.desc_table), offset == 0x24),
            (0x28, 8) => qv(|q| q.avail_ring),
            (0x28 | 0x2c, 4) => half(qv(|q| q.avail_ring), offset == 0x2c),
            (0x30, 8) => qv(|q| q.used_ring),
            (0x30 | 0x34, 4) => half(qv(|q| q.used_ring), offset == 0x34),
            _ => return None,
        })
    }

    fn write_common(&mut self, offset: u64, len: usize, v: u64) {
        let sel = usize::from(self.queue_sel);
        // A 64-bit address written whole, or one 32-bit half of it.
        let addr = |old: u64| match (offset % 8, len) {
            (0, 8) => v,
            (0, 4) => (old & !0xffff_ffff) | (v & 0xffff_ffff),
            _ => (old & 0xffff_ffff) | (v << 32),
        };
        match (offset, len) {
            (0x00, 4) => self.device_features_sel = v as u32,
            (0x08, 4) => self.driver_features_sel = v as u32,
            (0x0c, 4) => match self.driver_features_sel {
                0 => self.n.set_driver_features(false, v as u32),
                1 => self.n.set_driver_features(true, v as u32),
                _ => {}
            },
            (0x10, 2) => {
                let x = self.vector(v as u16);
                self.vectors.config.store(x, Ordering::Relaxed);
            }
            (0x14, 1) => self.set_status(v as u8),
            (0x16, 2) => self.queue_sel = v as u16,
            (0x18, 2) => {
                if let Some(q) = self.n.queue_mut(sel) {
                    // Validated at DRIVER_OK (a power of two within the maximum).
                    q.size = v as u16;
                }
            }
            (0x1a, 2) => {
                let x = self.vector(v as u16);
                if let Some(q) = self.vectors.queues.get(sel) {
                    q.store(x, Ordering::Relaxed);
                }
            }
            // Only 1 may be written (4.1.4.3.2): a queue is disabled by a reset.
            (0x1c, 2) if v == 1 => self.n.set_ready(sel, true),
            (0x20 | 0x24, _) | (0x28 | 0x2c, _) | (0x30 | 0x34, _)
                if len == 4 || (len == 8 && offset % 8 == 0) =>
            {
                if let Some(q) = self.n.queue_mut(sel) {
                    match offset & !7 {
                        0x20 => q.desc_table = addr(q.desc_table),
                        0x28 => q.avail_ring = addr(q.avail_ring),
                        _ => q.used_ring = addr(q.used_ring),
                    }
                }
            }
            _ => warn_ratelimited!(
                self.n.log,
                "virtio-pci: {len}-byte write {v:#x} to common configuration {offset:#x} ignored"
            ),
        }
    }

    /// A write at `offset` in the notification window: the doorbell of its queue.
    fn notify(&mut self, offset: u64) {
        let q = offset / u64::from(NOTIFY_MULTIPLIER);
        match self.n.doorbells.get(q as usize) {
            Some(bell) if offset % u64::from(NOTIFY_MULTIPLIER) == 0 => {
                let _ = bell.write(1);
            }
            _ => warn_ratelimited!(
                self.n.log,
                "virtio-pci: notification at {offset:#x} is no queue's"
            ),
        }
    }
}

fn le(data: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..data.len().min(8)].copy_from_slice(&data[..data.len().min(8)]);
    u64::from_le_bytes(b)
}

impl PciFunction for PciTransport {
    fn config(&self) -> &ConfigSpace {
        &self.config
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) -> ConfigEffects {
        let bars = self.config.write(offset, data);
        let msix = self
            .vectors
            .msix
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .follow_config_write(&self.config, self.msix_cap, offset, data.len());
        ConfigEffects { bars, msix }
    }

    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if bar != 0 {
            return;
        }
        match offset {
            o if o < COMMON_LEN => {
                if let Some(v) = self.read_common(o, data.len()) {
                    let n = data.len();
                    data.copy_from_slice(&v.to_le_bytes()[..n]);
                }
            }
            // Reading the ISR clears it (4.1.4.5).
            ISR if data.len() == 1 => data[0] = self.n.interrupt.take_status() as u8,
            o if (DEVICE..DEVICE + DEVICE_LEN).contains(&o) => {
                self.n.device.read_config(o - DEVICE, data)
            }
            o if (MSIX_TABLE..MSIX_PBA).contains(&o) => {
                let m = self.vectors.msix.lock().unwrap_or_else(|p| p.into_inner());
                m.read_table(o - MSIX_TABLE, data);
            }
            o if (MSIX_PBA..BAR_SIZE).contains(&o) => {
                let m = self.vectors.msix.lock().unwrap_or_else(|p| p.into_inner());
                m.read_pba(o - MSIX_PBA, data);
            }
            _ => {}
        }
    }

    fn write_bar(
        &mut self,
        bar: usize,
        offset: u64,
        data: &[u8],
    ) -> (Vec<RouteChange>, Option<VmEvent>) {
        if bar != 0 {
            return (Vec::new(), None);
        }
        match offset {
            o if o < COMMON_LEN => self.write_common(o, data.len(), le(data)),
            o if (DEVICE..DEVICE + DEVICE_LEN).contains(&o) => {
                self.n.device.write_config(o - DEVICE, data)
            }
            o if (NOTIFY..MSIX_TABLE).contains(&o) => self.notify(o - NOTIFY),
            o if (MSIX_TABLE..MSIX_PBA).contains(&o) => {
                // A vector unmasked while pending is the host's to send, once it has
                // installed the route (`RouteChange::fire_pending`).
                let change = self
                    .vectors
                    .msix
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .write_table(o - MSIX_TABLE, data);
                return (change.into_iter().collect(), None);
            }
            _ => warn_ratelimited!(
                self.n.log,
                "virtio-pci: {}-byte write at BAR 0 {offset:#x} ignored",
                data.len()
            ),
        }
        (Vec::new(), None)
    }
}

#[cfg(test)]
#[path = "pci_tests.rs"]
mod tests;
