//! What every virtio transport shares: the device, its queues' setup, the driver's status
//! and features, and the step from DRIVER_OK to a running device (virtio 1.2, 3.1 "Device
//! Initialization"). The transports ([`super::mmio`], [`super::pci`]) only lay these out in
//! registers.
//!
//! Guest input rules, the same behind every transport: status bits are only ever added
//! (writing 0 resets), FEATURES_OK sticks only for VERSION_1 and a subset of the offer,
//! DRIVER_OK needs FEATURES_OK, queue setup is accepted only while its queue is not ready
//! and the driver is not running, and at DRIVER_OK every ready queue is checked against
//! guest memory before the device starts (a bad one: DEVICE_NEEDS_RESET and a
//! configuration interrupt, no activation).

use std::sync::Arc;

use virtio_bindings::virtio_config;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::queue::QueueSetup;
use super::{Activation, F_VERSION_1, VirtioDevice, VirtioInterrupt};
use crate::ratelimit::RateLimiter;
use crate::warn_ratelimited;

/// Status: ACKNOWLEDGE.
pub const STATUS_ACK: u32 = virtio_config::VIRTIO_CONFIG_S_ACKNOWLEDGE;
/// Status: DRIVER.
pub const STATUS_DRIVER: u32 = virtio_config::VIRTIO_CONFIG_S_DRIVER;
/// Status: DRIVER_OK.
pub const STATUS_DRIVER_OK: u32 = virtio_config::VIRTIO_CONFIG_S_DRIVER_OK;
/// Status: FEATURES_OK.
pub const STATUS_FEATURES_OK: u32 = virtio_config::VIRTIO_CONFIG_S_FEATURES_OK;
/// Status: DEVICE_NEEDS_RESET.
pub const STATUS_NEEDS_RESET: u32 = virtio_config::VIRTIO_CONFIG_S_NEEDS_RESET;
/// Status: FAILED.
pub const STATUS_FAILED: u32 = virtio_config::VIRTIO_CONFIG_S_FAILED;

/// A device and the driver's progress with it.
pub struct Negotiation {
    /// The device.
    pub device: Box<dyn VirtioDevice>,
    /// Guest memory, for the queues' checks and the activation.
    pub mem: GuestMemoryMmap,
    /// Its interrupt.
    pub interrupt: Arc<VirtioInterrupt>,
    /// One doorbell per queue.
    pub doorbells: Vec<Arc<EventFd>>,
    /// Each queue's setup.
    pub queues: Vec<QueueSetup>,
    /// Device status as the driver set it.
    pub status: u32,
    /// Features the driver accepted.
    pub driver_features: u64,
    /// The device runs.
    pub activated: bool,
    /// Rate limit of guest-triggered messages.
    pub log: RateLimiter,
    /// The transport's name, for messages.
    who: &'static str,
}

impl Negotiation {
    /// `device` behind transport `who`, with one doorbell per queue.
    pub fn new(
        who: &'static str,
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<VirtioInterrupt>,
        doorbells: Vec<Arc<EventFd>>,
    ) -> Self {
        let queues = device
            .queue_sizes()
            .into_iter()
            .map(QueueSetup::new)
            .collect();
        Self {
            device,
            mem,
            interrupt,
            doorbells,
            queues,
            status: 0,
            driver_features: 0,
            activated: false,
            log: RateLimiter::new(5, std::time::Duration::from_secs(1)),
            who,
        }
    }

    /// Queue `sel`'s setup while it may still change (not ready, driver not running).
    pub fn queue_mut(&mut self, sel: usize) -> Option<&mut QueueSetup> {
        if self.status & STATUS_DRIVER_OK != 0 {
            return None;
        }
        let q = self.queues.get_mut(sel)?;
        (!q.ready).then_some(q)
    }

    /// Sets queue `sel` ready or not (before DRIVER_OK only).
    pub fn set_ready(&mut self, sel: usize, ready: bool) {
        if self.status & STATUS_DRIVER_OK != 0 {
            return;
        }
        if let Some(q) = self.queues.get_mut(sel) {
            q.ready = ready;
        }
    }

    /// Sets 32 bits of the driver's features (`high`: bits 32-63), before FEATURES_OK.
    pub fn set_driver_features(&mut self, high: bool, v: u32) {
        if self.status & STATUS_FEATURES_OK != 0 {
            return;
        }
        self.driver_features = if high {
            (self.driver_features & 0xffff_ffff) | (u64::from(v) << 32)
        } else {
            (self.driver_features & !0xffff_ffff) | u64::from(v)
        };
    }

    /// The device's features, 32 bits at a time (`sel` 0 or 1; 0 beyond).
    pub fn device_features(&self, sel: u32) -> u32 {
        match sel {
            0 => self.device.features() as u32,
            1 => (self.device.features() >> 32) as u32,
            _ => 0,
        }
    }

    /// Device status as the driver reads it.
    pub fn status(&self) -> u32 {
        self.status
            | if self.device.needs_reset() {
                STATUS_NEEDS_RESET
            } else {
                0
            }
    }

    /// Back to the reset state (the device's workers stop).
    pub fn reset(&mut self) {
        self.device.reset();
        for q in &mut self.queues {
            q.reset();
        }
        self.status = 0;
        self.driver_features = 0;
        self.activated = false;
        self.interrupt.ack(u32::MAX);
    }

    /// The driver wrote the status. Returns whether it was a reset (0).
    pub fn set_status(&mut self, v: u32) -> bool {
        if v == 0 {
            self.reset();
            return true;
        }
        // Bits are only ever added, and FAILED stops everything.
        if v & !self.status
            & !(STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK | STATUS_FAILED)
            != 0
            || v & self.status != self.status
        {
            warn_ratelimited!(
                self.log,
                "{}: status {v:#x} after {:#x} ignored",
                self.who,
                self.status
            );
            return false;
        }
        let new = v & !self.status;
        if new & STATUS_FEATURES_OK != 0 {
            let offered = self.device.features();
            if self.driver_features & !offered != 0 || self.driver_features & F_VERSION_1 == 0 {
                warn_ratelimited!(
                    self.log,
                    "{}: driver features {:#x} refused (offered {offered:#x}, VERSION_1 required)",
                    self.who,
                    self.driver_features
                );
                // FEATURES_OK does not stick; the driver sees that and gives up.
                self.status = v & !STATUS_FEATURES_OK & !STATUS_DRIVER_OK;
                return false;
            }
        }
        if new & STATUS_DRIVER_OK != 0 {
            if self.status & STATUS_FEATURES_OK == 0 && v & STATUS_FEATURES_OK == 0 {
                warn_ratelimited!(
                    self.log,
                    "{}: DRIVER_OK without FEATURES_OK ignored",
                    self.who
                );
                return false;
            }
            self.status = v;
            self.activate();
            return false;
        }
        self.status = v;
        false
    }

    fn activate(&mut self) {
        let features = self.driver_features;
        let event_idx = features & super::F_EVENT_IDX != 0;
        let indirect = features & super::F_INDIRECT_DESC != 0;
        let mut queues = Vec::with_capacity(self.queues.len());
        for (i, q) in self.queues.iter().enumerate() {
            if !q.ready {
                queues.push(None);
                continue;
            }
            match q.start(&self.mem, event_idx, indirect) {
                Ok(q) => queues.push(Some(q)),
                Err(_) => {
                    warn_ratelimited!(
                        self.log,
                        "{}: queue {i} is set up outside guest memory or badly sized",
                        self.who
                    );
                    self.status |= STATUS_NEEDS_RESET;
                    self.interrupt.trigger(super::INT_CONFIG);
                    return;
                }
            }
        }
        let a = Activation {
            mem: self.mem.clone(),
            queues,
            features,
            interrupt: self.interrupt.clone(),
            doorbells: self.doorbells.clone(),
        };
        match self.device.activate(a) {
            Ok(()) => self.activated = true,
            Err(e) => {
                log::error!("{}: activating the device failed: {e}", self.who);
                self.status |= STATUS_NEEDS_RESET;
                self.interrupt.trigger(super::INT_CONFIG);
            }
        }
    }
}
