//! virtio-mmio, version 2 ("modern"): the register window of one device.
//!
//! Registers are 32-bit; config space starts at 0x100 and is byte-addressable. Queue setup
//! is accepted only while the queue is not ready and the driver is not running; features
//! must include VERSION_1 and be a subset of the offer before FEATURES_OK sticks; at
//! DRIVER_OK every ready queue is checked against guest memory before the device starts.
//! Writing 0 to Status resets the device (its workers stop). A device that found a queue
//! violation shows DEVICE_NEEDS_RESET in Status.

use std::sync::Arc;

use virtio_bindings::virtio_mmio::*;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::negotiation::Negotiation;
#[cfg(test)]
use super::negotiation::{
    STATUS_ACK, STATUS_DRIVER, STATUS_DRIVER_OK, STATUS_FEATURES_OK, STATUS_NEEDS_RESET,
};
use super::{VirtioDevice, VirtioInterrupt};
use crate::{BusDevice, VmEvent, warn_ratelimited};

/// Size of one device's window.
pub const WINDOW: u64 = 0x1000;
/// Offset of QueueNotify (where ioeventfds are bound).
pub const QUEUE_NOTIFY: u64 = VIRTIO_MMIO_QUEUE_NOTIFY as u64;
/// Where config space starts.
const CONFIG: u64 = VIRTIO_MMIO_CONFIG as u64;
const MAGIC: u32 = 0x7472_6976; // "virt"
const VENDOR: u32 = 0x4e52_5450; // "PTRN"

/// One virtio device's MMIO window.
pub struct MmioTransport {
    n: Negotiation,
    device_features_sel: u32,
    driver_features_sel: u32,
    queue_sel: u32,
    config_generation: u32,
    exit_notified: Vec<bool>,
}

impl MmioTransport {
    /// A window for `device`. `doorbells` has one eventfd per queue: the device's workers
    /// wait on them; an ioeventfd makes KVM write them, otherwise QueueNotify does.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<VirtioInterrupt>,
        doorbells: Vec<Arc<EventFd>>,
    ) -> Self {
        let n = Negotiation::new("virtio-mmio", device, mem, interrupt, doorbells);
        let queues = n.queues.len();
        Self {
            n,
            device_features_sel: 0,
            driver_features_sel: 0,
            queue_sel: 0,
            config_generation: 0,
            exit_notified: vec![false; queues],
        }
    }

    /// Guest-triggered messages dropped by the rate limits of the window and its device,
    /// over the VMM's life.
    pub fn log_suppressed(&self) -> u64 {
        self.n.log.dropped_total() + self.n.device.log_suppressed()
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

    fn set_status(&mut self, v: u32) {
        if self.n.set_status(v) {
            self.device_features_sel = 0;
            self.driver_features_sel = 0;
            self.queue_sel = 0;
        }
    }

    fn read_reg(&self, offset: u64) -> u32 {
        let q = self.n.queues.get(self.queue_sel as usize);
        let Ok(reg) = u32::try_from(offset) else {
            return 0;
        };
        match reg {
            VIRTIO_MMIO_MAGIC_VALUE => MAGIC,
            VIRTIO_MMIO_VERSION => 2,
            VIRTIO_MMIO_DEVICE_ID => self.n.device.device_type(),
            VIRTIO_MMIO_VENDOR_ID => VENDOR,
            VIRTIO_MMIO_DEVICE_FEATURES => self.n.device_features(self.device_features_sel),
            VIRTIO_MMIO_QUEUE_NUM_MAX => q.map_or(0, |q| q.max_size as u32),
            VIRTIO_MMIO_QUEUE_READY => q.map_or(0, |q| q.ready as u32),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.n.interrupt.status(),
            VIRTIO_MMIO_STATUS => self.n.status(),
            VIRTIO_MMIO_CONFIG_GENERATION => self.config_generation,
            _ => 0,
        }
    }

    fn write_reg(&mut self, offset: u64, v: u32) {
        let lo = |old: u64| (old & !0xffff_ffff) | v as u64;
        let hi = |old: u64| (old & 0xffff_ffff) | ((v as u64) << 32);
        let Ok(reg) = u32::try_from(offset) else {
            return;
        };
        let sel = self.queue_sel as usize;
        match reg {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = v,
            VIRTIO_MMIO_DRIVER_FEATURES => match self.driver_features_sel {
                0 => self.n.set_driver_features(false, v),
                1 => self.n.set_driver_features(true, v),
                _ => {}
            },
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = v,
            VIRTIO_MMIO_QUEUE_NUM => {
                if let Some(q) = self.n.queue_mut(sel) {
                    // Validated at DRIVER_OK (a power of two within max_size).
                    q.size = v.min(u16::MAX as u32) as u16;
                }
            }
            VIRTIO_MMIO_QUEUE_READY => self.n.set_ready(sel, v == 1),
            VIRTIO_MMIO_QUEUE_NOTIFY => self.notify(v),
            VIRTIO_MMIO_INTERRUPT_ACK => self.n.interrupt.ack(v),
            VIRTIO_MMIO_STATUS => self.set_status(v),
            VIRTIO_MMIO_QUEUE_DESC_LOW => self
                .n
                .queue_mut(sel)
                .into_iter()
                .for_each(|q| q.desc_table = lo(q.desc_table)),
            VIRTIO_MMIO_QUEUE_DESC_HIGH => self
                .n
                .queue_mut(sel)
                .into_iter()
                .for_each(|q| q.desc_table = hi(q.desc_table)),
            VIRTIO_MMIO_QUEUE_AVAIL_LOW => self
                .n
                .queue_mut(sel)
                .into_iter()
                .for_each(|q| q.avail_ring = lo(q.avail_ring)),
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH => self
                .n
                .queue_mut(sel)
                .into_iter()
                .for_each(|q| q.avail_ring = hi(q.avail_ring)),
            VIRTIO_MMIO_QUEUE_USED_LOW => self
                .n
                .queue_mut(sel)
                .into_iter()
                .for_each(|q| q.used_ring = lo(q.used_ring)),
            VIRTIO_MMIO_QUEUE_USED_HIGH => self
                .n
                .queue_mut(sel)
                .into_iter()
                .for_each(|q| q.used_ring = hi(q.used_ring)),
            _ => warn_ratelimited!(
                self.n.log,
                "virtio-mmio: write {v:#x} to register {offset:#x} ignored"
            ),
        }
    }

    /// A doorbell that came as a VM exit (no ioeventfd matched).
    fn notify(&mut self, index: u32) {
        let i = index as usize;
        let Some(evt) = self.n.doorbells.get(i) else {
            warn_ratelimited!(
                self.n.log,
                "virtio-mmio: notify for queue {index}, which does not exist"
            );
            return;
        };
        if !self.exit_notified[i] {
            self.exit_notified[i] = true;
            log::debug!(
                "virtio-mmio: queue {i}'s doorbell arrived through a VM exit (no ioeventfd)"
            );
        }
        let _ = evt.write(1);
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if let Some(at) = offset.checked_sub(CONFIG) {
            self.n.device.read_config(at, data);
            return;
        }
        if data.len() != 4 || offset % 4 != 0 {
            data.fill(0);
            return;
        }
        data.copy_from_slice(&self.read_reg(offset).to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<VmEvent> {
        if let Some(at) = offset.checked_sub(CONFIG) {
            self.n.device.write_config(at, data);
            self.config_generation = self.config_generation.wrapping_add(1);
            return None;
        }
        if data.len() != 4 || offset % 4 != 0 {
            warn_ratelimited!(
                self.n.log,
                "virtio-mmio: {}-byte write at {offset:#x} ignored",
                data.len()
            );
            return None;
        }
        let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        self.write_reg(offset, v);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::queue::tests::mem;
    use crate::virtio::{Activation, F_VERSION_1};
    use std::sync::Mutex;

    #[derive(Default)]
    struct Log {
        activations: u32,
        resets: u32,
        queues: Vec<Option<crate::virtio::queue::Queue>>,
    }

    struct Fake(Arc<Mutex<Log>>);
    impl VirtioDevice for Fake {
        fn device_type(&self) -> u32 {
            42
        }
        fn features(&self) -> u64 {
            F_VERSION_1 | super::super::F_EVENT_IDX | 1
        }
        fn queue_sizes(&self) -> Vec<u16> {
            vec![16, 8]
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write_config(&mut self, _: u64, _: &[u8]) {}
        fn activate(&mut self, a: Activation) -> Result<(), crate::virtio::DeviceError> {
            let mut l = self.0.lock().unwrap();
            l.activations += 1;
            l.queues = a.queues;
            Ok(())
        }
        fn reset(&mut self) {
            self.0.lock().unwrap().resets += 1;
        }
        fn needs_reset(&self) -> bool {
            false
        }
        fn stats(&self) -> Vec<crate::virtio::QueueCounters> {
            Vec::new()
        }
    }

    struct NoIrq;
    impl crate::Interrupt for NoIrq {
        fn trigger(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn transport() -> (MmioTransport, Arc<Mutex<Log>>, Vec<Arc<EventFd>>) {
        let log = Arc::new(Mutex::new(Log::default()));
        let bells: Vec<_> = (0..2)
            .map(|_| Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()))
            .collect();
        let t = MmioTransport::new(
            Box::new(Fake(log.clone())),
            mem(),
            Arc::new(VirtioInterrupt::new(Box::new(NoIrq))),
            bells.clone(),
        );
        (t, log, bells)
    }

    fn w(t: &mut MmioTransport, off: u64, v: u32) {
        t.write(off, &v.to_le_bytes());
    }
    fn r(t: &mut MmioTransport, off: u64) -> u32 {
        let mut d = [0u8; 4];
        t.read(off, &mut d);
        u32::from_le_bytes(d)
    }

    fn setup_queue(t: &mut MmioTransport, sel: u32, size: u32, base: u64) {
        w(t, 0x030, sel);
        w(t, 0x038, size);
        w(t, 0x080, base as u32);
        w(t, 0x090, (base + 0x1000) as u32);
        w(t, 0x0a0, (base + 0x2000) as u32);
        w(t, 0x044, 1);
    }

    #[test]
    fn the_driver_dance() {
        let (mut t, log, bells) = transport();
        assert_eq!((r(&mut t, 0), r(&mut t, 4), r(&mut t, 8)), (MAGIC, 2, 42));
        w(&mut t, 0x014, 1);
        assert_eq!(r(&mut t, 0x010), 1); // VERSION_1 is bit 32
        w(&mut t, 0x070, STATUS_ACK | STATUS_DRIVER);
        w(&mut t, 0x024, 1);
        w(&mut t, 0x020, 1);
        w(&mut t, 0x024, 0);
        w(&mut t, 0x020, 1 << 29);
        w(
            &mut t,
            0x070,
            STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        assert_ne!(r(&mut t, 0x070) & STATUS_FEATURES_OK, 0);
        w(&mut t, 0x030, 0);
        assert_eq!(r(&mut t, 0x034), 16);
        setup_queue(&mut t, 0, 8, 0x10000);
        w(
            &mut t,
            0x070,
            STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK,
        );
        {
            let l = log.lock().unwrap();
            assert_eq!(l.activations, 1);
            let q = l.queues[0].as_ref().expect("queue 0 is ready");
            assert!(q.event_idx() && !q.indirect());
            assert_eq!((q.size(), q.avail_ring()), (8, 0x11000));
            assert!(l.queues[1].is_none());
        }
        // Queue setup is frozen once running.
        w(&mut t, 0x030, 1);
        w(&mut t, 0x038, 4);
        assert_eq!(t.n.queues[1].size, 8);
        // Notify through the window reaches the queue's doorbell.
        w(&mut t, QUEUE_NOTIFY, 0);
        assert_eq!(bells[0].read().unwrap(), 1);
        w(&mut t, QUEUE_NOTIFY, 7); // no such queue: ignored
        // Config space is byte-addressable.
        let mut b = [0u8; 2];
        t.read(0x108, &mut b);
        assert_eq!(b, [8, 8]);
        // Reset.
        w(&mut t, 0x070, 0);
        assert_eq!(r(&mut t, 0x070), 0);
        assert_eq!(log.lock().unwrap().resets, 1);
        assert!(!t.n.queues[0].ready);
    }

    #[test]
    fn bad_drivers_do_not_get_far() {
        let (mut t, log, _) = transport();
        // Features without VERSION_1, or not offered: FEATURES_OK does not stick.
        w(&mut t, 0x070, STATUS_ACK | STATUS_DRIVER);
        w(&mut t, 0x020, 1);
        w(
            &mut t,
            0x070,
            STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        assert_eq!(r(&mut t, 0x070) & STATUS_FEATURES_OK, 0);
        w(&mut t, 0x024, 1);
        w(&mut t, 0x020, 1 | 0x80);
        w(
            &mut t,
            0x070,
            STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        assert_eq!(r(&mut t, 0x070) & STATUS_FEATURES_OK, 0);
        // DRIVER_OK without FEATURES_OK does nothing.
        w(&mut t, 0x070, STATUS_ACK | STATUS_DRIVER | STATUS_DRIVER_OK);
        assert_eq!(log.lock().unwrap().activations, 0);
        // A queue outside memory at DRIVER_OK: NEEDS_RESET, not activation.
        let (mut t, log, _) = transport();
        w(&mut t, 0x070, STATUS_ACK | STATUS_DRIVER);
        w(&mut t, 0x024, 1);
        w(&mut t, 0x020, 1);
        w(
            &mut t,
            0x070,
            STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        w(&mut t, 0x030, 0);
        w(&mut t, 0x038, 8);
        w(&mut t, 0x080, 0xffff_0000);
        w(&mut t, 0x084, 0xffff);
        w(&mut t, 0x044, 1);
        w(
            &mut t,
            0x070,
            STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK,
        );
        assert_eq!(log.lock().unwrap().activations, 0);
        assert_ne!(r(&mut t, 0x070) & STATUS_NEEDS_RESET, 0);
        // Odd-sized and unaligned register accesses are ignored.
        let mut d = [0xffu8; 2];
        t.read(0x000, &mut d);
        assert_eq!(d, [0, 0]);
        t.write(0x070, &[0]);
        assert_ne!(r(&mut t, 0x070), 0);
        // Out-of-range queue select reads as absent.
        w(&mut t, 0x030, 99);
        assert_eq!(r(&mut t, 0x034), 0);
    }
}
