use super::*;
use crate::virtio::negotiation::{STATUS_ACK, STATUS_DRIVER, STATUS_DRIVER_OK, STATUS_FEATURES_OK};
use crate::virtio::queue::tests::mem;
use crate::virtio::{Activation, F_EVENT_IDX, F_VERSION_1, INT_CONFIG, INT_VRING};
use std::sync::Mutex;
use std::sync::atomic::AtomicU32;

#[derive(Default)]
struct Log {
    activations: u32,
    resets: u32,
    interrupt: Option<Arc<VirtioInterrupt>>,
    queues: Vec<Option<crate::virtio::queue::Queue>>,
}

struct Fake(Arc<Mutex<Log>>);
impl VirtioDevice for Fake {
    fn device_type(&self) -> u32 {
        crate::virtio::TYPE_BLOCK
    }
    fn features(&self) -> u64 {
        F_VERSION_1 | F_EVENT_IDX | 1
    }
    fn queue_sizes(&self) -> Vec<u16> {
        vec![16, 8]
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(offset as u8 + 0x10);
    }
    fn write_config(&mut self, _: u64, _: &[u8]) {}
    fn activate(&mut self, a: Activation) -> Result<(), crate::virtio::DeviceError> {
        let mut l = self.0.lock().unwrap();
        l.activations += 1;
        l.queues = a.queues;
        l.interrupt = Some(a.interrupt);
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

/// A line that counts how often it was raised.
struct Count(Arc<AtomicU32>);
impl Interrupt for Count {
    fn trigger(&self) -> std::io::Result<()> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

struct Rig {
    t: PciTransport,
    log: Arc<Mutex<Log>>,
    bells: Vec<Arc<EventFd>>,
    raised: Vec<Arc<AtomicU32>>,
}

fn rig() -> Rig {
    let log = Arc::new(Mutex::new(Log::default()));
    let bells: Vec<_> = (0..2)
        .map(|_| Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()))
        .collect();
    let raised: Vec<_> = (0..3).map(|_| Arc::new(AtomicU32::new(0))).collect();
    let lines = raised
        .iter()
        .map(|c| Box::new(Count(c.clone())) as Box<dyn Interrupt + Sync>)
        .collect();
    let t = PciTransport::new(
        Box::new(Fake(log.clone())),
        mem(),
        0xc000_0000,
        lines,
        bells.clone(),
    )
    .unwrap();
    Rig {
        t,
        log,
        bells,
        raised,
    }
}

fn w(t: &mut PciTransport, off: u64, len: usize, v: u64) {
    t.write_bar(0, off, &v.to_le_bytes()[..len]);
}
fn r(t: &mut PciTransport, off: u64, len: usize) -> u64 {
    let mut d = vec![0u8; len];
    t.read_bar(0, off, &mut d);
    le(&d)
}
fn cfg8(t: &PciTransport, at: usize) -> u8 {
    t.config().bytes(at, 1)[0]
}
fn cfg32(t: &PciTransport, at: usize) -> u32 {
    let b = t.config().bytes(at, 4);
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[test]
fn a_driver_finds_every_structure_through_the_capability_list() {
    let Rig { t, .. } = rig();
    let ids = t.config().bytes(0, 4);
    assert_eq!(
        ids,
        [0xf4, 0x1a, 0x42, 0x10],
        "vendor 1af4, device 1040 + block"
    );
    // Walk the list from the capabilities pointer.
    let mut at = usize::from(cfg8(&t, 0x34));
    let mut vendor = Vec::new();
    let mut msix = None;
    while at != 0 {
        match cfg8(&t, at) {
            CAP_VENDOR => vendor.push((
                cfg8(&t, at + 3),
                cfg8(&t, at + 4),
                cfg32(&t, at + 8),
                cfg32(&t, at + 12),
                (cfg8(&t, at + 3) == CFG_NOTIFY).then(|| cfg32(&t, at + 16)),
            )),
            CAP_MSIX => msix = Some(at),
            other => panic!("unexpected capability {other:#x}"),
        }
        at = usize::from(cfg8(&t, at + 1));
    }
    assert_eq!(
        vendor,
        [
            (CFG_COMMON, 0, 0, COMMON_LEN as u32, None),
            (CFG_NOTIFY, 0, NOTIFY as u32, 8, Some(NOTIFY_MULTIPLIER)),
            (CFG_ISR, 0, ISR as u32, 1, None),
            (CFG_DEVICE, 0, DEVICE as u32, DEVICE_LEN as u32, None),
        ]
    );
    // MSI-X: 3 vectors (two queues and configuration), table and PBA in BAR 0.
    let m = msix.unwrap();
    let control = u16::from_le_bytes([cfg8(&t, m + 2), cfg8(&t, m + 3)]);
    assert_eq!(control & 0x7ff, 2, "table size is N - 1");
    assert_eq!(cfg32(&t, m + 4), MSIX_TABLE as u32);
    assert_eq!(cfg32(&t, m + 8), MSIX_PBA as u32);
    // BAR 0: 32-bit memory at the address given.
    assert_eq!(cfg32(&t, 0x10), 0xc000_0000);
}

/// Features, two queues with vectors 0 and 1, configuration on vector 2, DRIVER_OK.
fn bring_up(t: &mut PciTransport) {
    w(t, 0x14, 1, u64::from(STATUS_ACK | STATUS_DRIVER));
    w(t, 0x08, 4, 0);
    w(t, 0x0c, 4, 1);
    w(t, 0x08, 4, 1);
    w(t, 0x0c, 4, 1);
    w(
        t,
        0x14,
        1,
        u64::from(STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK),
    );
    w(t, 0x10, 2, 2);
    for (q, base) in [(0u64, 0x10000u64), (1, 0x20000)] {
        w(t, 0x16, 2, q);
        w(t, 0x18, 2, 8);
        w(t, 0x1a, 2, q);
        w(t, 0x20, 8, base);
        w(t, 0x28, 4, base + 0x1000);
        w(t, 0x2c, 4, 0);
        w(t, 0x30, 4, base + 0x2000);
        w(t, 0x1c, 2, 1);
    }
    w(
        t,
        0x14,
        1,
        u64::from(STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK),
    );
}

#[test]
fn the_driver_dance_over_the_common_configuration() {
    let Rig {
        mut t, log, bells, ..
    } = rig();
    assert_eq!(r(&mut t, 0x12, 2), 2, "num_queues");
    w(&mut t, 0x00, 4, 1);
    assert_eq!(r(&mut t, 0x04, 4), 1, "VERSION_1 is bit 32");
    w(&mut t, 0x16, 2, 1);
    assert_eq!(r(&mut t, 0x18, 2), 8, "queue 1's maximum size");
    assert_eq!(r(&mut t, 0x1e, 2), 1, "queue 1's notify offset");
    assert_eq!(r(&mut t, 0x1a, 2), u64::from(NO_VECTOR));
    bring_up(&mut t);
    {
        let l = log.lock().unwrap();
        assert_eq!(l.activations, 1);
        let q = l.queues[0].as_ref().expect("queue 0 ready");
        assert_eq!((q.size(), q.avail_ring()), (8, 0x11000));
        assert!(l.queues[1].is_some());
    }
    // Addresses read back whole and by halves; the vectors as set.
    w(&mut t, 0x16, 2, 1);
    assert_eq!(r(&mut t, 0x20, 8), 0x20000);
    assert_eq!(r(&mut t, 0x30, 4), 0x22000);
    assert_eq!(r(&mut t, 0x1a, 2), 1);
    assert_eq!(r(&mut t, 0x10, 2), 2);
    // Setup is frozen once running.
    w(&mut t, 0x18, 2, 4);
    assert_eq!(r(&mut t, 0x18, 2), 8);
    // Each queue has its own notification address.
    w(&mut t, NOTIFY + 4, 2, 1);
    assert_eq!(bells[1].read().unwrap(), 1);
    assert!(bells[0].read().is_err(), "queue 0 was not notified");
    w(&mut t, NOTIFY + 2, 2, 0); // between two queues: nothing
    w(&mut t, NOTIFY + 8, 2, 2); // past the last queue: nothing
    assert!(bells[0].read().is_err() && bells[1].read().is_err());
    // Device configuration through its window.
    assert_eq!(r(&mut t, DEVICE + 4, 1), 0x14);
    // Reset: status 0, vectors gone, the device told.
    w(&mut t, 0x14, 1, 0);
    assert_eq!(r(&mut t, 0x14, 1), 0);
    assert_eq!(r(&mut t, 0x10, 2), u64::from(NO_VECTOR));
    assert_eq!(log.lock().unwrap().resets, 1);
    w(&mut t, 0x16, 2, 0);
    assert_eq!(r(&mut t, 0x1c, 2), 0, "queue 0 not ready after reset");
}

/// Turns MSI-X on and programs vector `v` with data `v + 0x30`, unmasked unless `masked`.
fn program(t: &mut PciTransport, v: u64, masked: bool) {
    let e = MSIX_TABLE + 16 * v;
    w(t, e, 4, 0xfee0_0000);
    w(t, e + 4, 4, 0);
    w(t, e + 8, 4, 0x30 + v);
    w(t, e + 12, 4, u64::from(masked));
}

fn enable_msix(t: &mut PciTransport) -> Vec<RouteChange> {
    let m = {
        let mut at = usize::from(cfg8(t, 0x34));
        while cfg8(t, at) != CAP_MSIX {
            at = usize::from(cfg8(t, at + 1));
        }
        at
    };
    t.write_config(m as u64 + 2, &0x8000u16.to_le_bytes()).msix
}

#[test]
fn each_queue_interrupts_on_its_own_vector_and_masked_ones_wait() {
    let Rig {
        mut t, log, raised, ..
    } = rig();
    for v in 0..3 {
        program(&mut t, v, v == 1);
    }
    let routes = enable_msix(&mut t);
    assert_eq!(
        routes.len(),
        2,
        "vectors 0 and 2 routed, 1 masked: {routes:?}"
    );
    bring_up(&mut t);
    let irq = log.lock().unwrap().interrupt.clone().unwrap();
    // Queue 0's used buffer: vector 0 only.
    irq.for_queue(0).trigger(INT_VRING);
    let counts = |r: &[Arc<AtomicU32>]| -> Vec<u32> {
        r.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    };
    assert_eq!(counts(&raised), [1, 0, 0]);
    // Queue 1's vector is masked: pending, not sent; unmasking hands it to the host.
    irq.for_queue(1).trigger(INT_VRING);
    assert_eq!(counts(&raised), [1, 0, 0]);
    assert_eq!(r(&mut t, MSIX_PBA, 8), 0b010);
    let (change, _) = t.write_bar(0, MSIX_TABLE + 16 + 12, &0u32.to_le_bytes());
    assert!(change.iter().any(|c| c.vector == 1 && c.fire_pending));
    // A configuration change on vector 2; the ISR stays clear with MSI-X on.
    irq.trigger(INT_CONFIG);
    assert_eq!(counts(&raised), [1, 0, 1]);
    assert_eq!(r(&mut t, ISR, 1), 0);
    // A vector past the table is none: the queue sends nothing.
    w(&mut t, 0x16, 2, 0);
    w(&mut t, 0x1a, 2, 3);
    assert_eq!(r(&mut t, 0x1a, 2), u64::from(NO_VECTOR));
    irq.for_queue(0).trigger(INT_VRING);
    assert_eq!(counts(&raised), [1, 0, 1]);
}

#[test]
fn without_msix_the_isr_holds_the_event_until_read() {
    let Rig {
        mut t, log, raised, ..
    } = rig();
    bring_up(&mut t);
    let irq = log.lock().unwrap().interrupt.clone().unwrap();
    irq.for_queue(0).trigger(INT_VRING);
    assert_eq!(r(&mut t, ISR, 1), u64::from(INT_VRING));
    assert_eq!(r(&mut t, ISR, 1), 0, "reading the ISR clears it");
    assert!(raised.iter().all(|c| c.load(Ordering::Relaxed) == 0));
}

#[test]
fn hostile_accesses_change_nothing() {
    let Rig { mut t, log, .. } = rig();
    // Wrong widths: read as zero, written nowhere.
    w(&mut t, 0x16, 4, 1);
    assert_eq!(r(&mut t, 0x16, 2), 0);
    assert_eq!(r(&mut t, 0x12, 4), 0);
    assert_eq!(r(&mut t, 0x21, 4), 0);
    // Queue enable takes only 1; a queue past the last has no fields.
    w(&mut t, 0x1c, 2, 7);
    assert_eq!(r(&mut t, 0x1c, 2), 0);
    w(&mut t, 0x16, 2, 9);
    assert_eq!(r(&mut t, 0x18, 2), 0);
    w(&mut t, 0x1a, 2, 0);
    assert_eq!(r(&mut t, 0x1a, 2), u64::from(NO_VECTOR));
    // Features without VERSION_1: FEATURES_OK does not stick, DRIVER_OK does nothing.
    w(&mut t, 0x14, 1, u64::from(STATUS_ACK | STATUS_DRIVER));
    w(&mut t, 0x0c, 4, 1);
    w(
        &mut t,
        0x14,
        1,
        u64::from(STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK),
    );
    assert_eq!(r(&mut t, 0x14, 1) as u32 & STATUS_FEATURES_OK, 0);
    w(
        &mut t,
        0x14,
        1,
        u64::from(STATUS_ACK | STATUS_DRIVER | STATUS_DRIVER_OK),
    );
    assert_eq!(log.lock().unwrap().activations, 0);
    // Other BARs and the space between structures answer nothing.
    let mut d = [0xffu8; 4];
    t.read_bar(2, 0, &mut d);
    assert_eq!(d, [0; 4]);
    t.read_bar(0, 0x0080, &mut d);
    assert_eq!(d, [0; 4]);
    assert_eq!(t.write_bar(3, 0, &[1, 2, 3, 4]), (Vec::new(), None));
}

#[test]
fn a_function_the_vmm_gets_wrong_is_refused() {
    let lines = |n: usize| {
        (0..n)
            .map(|_| Box::new(Count(Arc::new(AtomicU32::new(0)))) as Box<dyn Interrupt + Sync>)
            .collect::<Vec<_>>()
    };
    let bells = |n: usize| {
        (0..n)
            .map(|_| Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()))
            .collect::<Vec<_>>()
    };
    let fake = || Box::new(Fake(Arc::default()));
    assert_eq!(
        PciTransport::new(fake(), mem(), 0x10_0000, lines(2), bells(2)).err(),
        Some(PciTransportError::Lines {
            queues: 2,
            lines: 2
        })
    );
    assert_eq!(
        PciTransport::new(fake(), mem(), 0x10_0000, lines(3), bells(1)).err(),
        Some(PciTransportError::Queues {
            queues: 2,
            doorbells: 1
        })
    );
    assert_eq!(
        PciTransport::new(fake(), mem(), 0x10_0800, lines(3), bells(2)).err(),
        Some(PciTransportError::Base(0x10_0800))
    );
}
