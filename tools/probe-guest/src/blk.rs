//! A small virtio-blk driver (virtio-mmio version 2 or virtio-pci, one split queue) and the block tests
//! (`probe.blk=...`, comma-separated):
//!
//! - `read`: read the whole disk in 64 KiB requests and print a checksum of its content;
//! - `write`: write a pattern over the last MiB, FLUSH, read it back and compare;
//! - `lat`: 4 KiB random reads at depth 1, completed by polling the used ring and by
//!   interrupt (median, p99);
//! - `qd32`: 4 KiB random reads with 32 in flight (IOPS, MB/s);
//! - `fence`: GET_ID round trips that move no data, polled and by interrupt;
//! - `again`: reset the device and set it up again (the tests after it use the new
//!   activation);
//! - `flood`: a hostile driver activating the device with a bad queue size
//!   `probe.blk_flood` times (default 5000), for the VMM's log rate limits; run it last.
//!
//! Devices are found as Linux finds them: `virtio_mmio.device=SIZE@ADDR:IRQ` on the command
//! line, else a virtio-pci block function on bus 0 ([`crate::virtio_pci`], MSI-X). Options: `probe.blk_n` (default 1000, at most 3723: with its tenth of warm-up it
//! fills one sample buffer), `probe.blk_event_idx=0`,
//! `probe.blk_indirect=1` (requests through an indirect table), `probe.blk_gap_us=N` (think
//! time between the latency test's requests, so a device worker has time to fall asleep).

use core::sync::atomic::{Ordering, fence};

use crate::bootinfo::BootInfo;
use crate::sys::{self, peek, poke, rdtsc};

const MAGIC: u32 = 0x7472_6976;
const ST_ACK: u32 = 1;
const ST_DRIVER: u32 = 2;
const ST_DRIVER_OK: u32 = 4;
const ST_FEATURES_OK: u32 = 8;
const F_VERSION_1: u64 = 1 << 32;
const F_INDIRECT: u64 = 1 << 28;
const F_EVENT_IDX: u64 = 1 << 29;
const F_FLUSH: u64 = 1 << 9;
const F_RO: u64 = 1 << 5;
const QSIZE: u16 = 128;
const SLOTS: usize = 32;
const BUF: usize = 64 << 10;
const IRQ_VECTOR: usize = 0x50;
const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;

#[repr(C, align(4096))]
struct Rings {
    desc: [u64; 2 * QSIZE as usize],
    avail: [u16; 3 + QSIZE as usize],
    _pad: [u8; 4096 - (6 + 2 * QSIZE as usize) % 4096],
    used: [u32; 2 * QSIZE as usize + 2],
}

#[repr(C, align(4096))]
struct Buffers {
    data: [[u8; BUF]; 2],
    small: [[u8; 4096]; SLOTS],
    hdr: [[u64; 2]; SLOTS],
    status: [u8; SLOTS],
    indirect: [[u64; 6]; SLOTS],
}

static mut RINGS: Rings = Rings {
    desc: [0; 2 * QSIZE as usize],
    avail: [0; 3 + QSIZE as usize],
    _pad: [0; 4096 - (6 + 2 * QSIZE as usize) % 4096],
    used: [0; 2 * QSIZE as usize + 2],
};
static mut BUFS: Buffers = Buffers {
    data: [[0; BUF]; 2],
    small: [[0; 4096]; SLOTS],
    hdr: [[0; 2]; SLOTS],
    status: [0; SLOTS],
    indirect: [[0; 6]; SLOTS],
};

fn addr_of_bufs() -> u64 {
    &raw const BUFS as u64
}

/// How the device is reached.
#[derive(Clone, Copy)]
enum Bus {
    /// A virtio-mmio window and its IOAPIC pin.
    Mmio { base: u64, irq: u32 },
    /// A virtio-pci function, its queue on MSI-X vector 0.
    Pci(crate::virtio_pci::Pci),
}

impl Bus {
    fn status(&self) -> u32 {
        match self {
            Bus::Mmio { base, .. } => rd(*base, 0x70),
            Bus::Pci(p) => p.status(),
        }
    }
    fn set_status(&self, v: u32) {
        match self {
            Bus::Mmio { base, .. } => wr(*base, 0x70, v),
            Bus::Pci(p) => p.set_status(v),
        }
    }
    fn features(&self) -> u64 {
        match self {
            Bus::Mmio { base, .. } => {
                wr(*base, 0x14, 0);
                let lo = rd(*base, 0x10) as u64;
                wr(*base, 0x14, 1);
                lo | (rd(*base, 0x10) as u64) << 32
            }
            Bus::Pci(p) => p.features(),
        }
    }
    fn set_features(&self, want: u64) {
        match self {
            Bus::Mmio { base, .. } => {
                wr(*base, 0x24, 0);
                wr(*base, 0x20, want as u32);
                wr(*base, 0x24, 1);
                wr(*base, 0x20, (want >> 32) as u32);
            }
            Bus::Pci(p) => p.set_features(want),
        }
    }
    fn queue_max(&self) -> u16 {
        match self {
            Bus::Mmio { base, .. } => {
                wr(*base, 0x30, 0);
                rd(*base, 0x34) as u16
            }
            Bus::Pci(p) => p.queue_max(),
        }
    }
    /// Queue 0's size and rings, then ready; whether the interrupt was taken.
    fn setup_queue(&self, size: u16, desc: u64, avail: u64, used: u64) -> bool {
        match self {
            Bus::Mmio { base, .. } => {
                wr(*base, 0x30, 0);
                wr(*base, 0x38, size as u32);
                for (off, a) in [(0x80, desc), (0x90, avail), (0xa0, used)] {
                    wr(*base, off, a as u32);
                    wr(*base, off + 4, (a >> 32) as u32);
                }
                wr(*base, 0x44, 1);
                true
            }
            Bus::Pci(p) => p.setup_queue(size, desc, avail, used),
        }
    }
    fn capacity(&self) -> u64 {
        match self {
            Bus::Mmio { base, .. } => rd(*base, 0x100) as u64 | (rd(*base, 0x104) as u64) << 32,
            Bus::Pci(p) => p.capacity(),
        }
    }
    fn notify(&self) {
        match self {
            Bus::Mmio { base, .. } => wr(*base, 0x50, 0),
            Bus::Pci(p) => p.notify(),
        }
    }
    /// After an interrupt: virtio-mmio's status read and acknowledgement (MSI-X needs none).
    fn ack(&self) {
        if let Bus::Mmio { base, .. } = self {
            let st = rd(*base, 0x60);
            wr(*base, 0x64, st);
        }
    }
    fn name(&self) -> &'static str {
        match self {
            Bus::Mmio { .. } => "virtio-mmio",
            Bus::Pci(_) => "virtio-pci",
        }
    }
}

struct Blk {
    bus: Bus,
    capacity: u64,
    event_idx: bool,
    indirect: bool,
    avail_idx: u16,
    last_used: u16,
    /// Whether the next completions should interrupt (else the driver polls the used ring
    /// and tells the device not to bother, as Linux's virtqueue_disable_cb does).
    want_irq: bool,
}

fn rd(base: u64, off: u64) -> u32 {
    // SAFETY: the device window is mapped (uncached) and user-accessible.
    unsafe { peek(base + off) }
}
fn wr(base: u64, off: u64, v: u32) {
    // SAFETY: as above.
    unsafe { poke(base + off, v) }
}

/// `virtio_mmio.device=SIZE@ADDR:IRQ` entries on the command line.
fn devices(bi: &BootInfo) -> heapless_list::List {
    let mut out = heapless_list::List::new();
    for w in bi.cmdline().split_ascii_whitespace() {
        let Some(v) = w.strip_prefix("virtio_mmio.device=") else {
            continue;
        };
        let Some((_, rest)) = v.split_once('@') else {
            continue;
        };
        let Some((a, irq)) = rest.split_once(':') else {
            continue;
        };
        let a = a.trim_start_matches("0x");
        if let (Ok(a), Ok(i)) = (u64::from_str_radix(a, 16), irq.parse::<u32>()) {
            out.push(a, i);
        }
    }
    out
}

mod heapless_list {
    pub struct List {
        pub items: [(u64, u32); 8],
        pub len: usize,
    }
    impl List {
        pub const fn new() -> Self {
            Self {
                items: [(0, 0); 8],
                len: 0,
            }
        }
        pub fn push(&mut self, a: u64, i: u32) {
            if self.len < 8 {
                self.items[self.len] = (a, i);
                self.len += 1;
            }
        }
    }
}

/// Routes IOAPIC pin `gsi` to `vector` on APIC 0, edge, unmasked.
fn route_irq(gsi: u32, vector: u8) {
    const IOAPIC: u64 = 0xfec0_0000;
    let set = |reg: u32, v: u32| {
        // SAFETY: the IOAPIC window is mapped; IOREGSEL then IOWIN.
        unsafe {
            poke::<u32>(IOAPIC, reg);
            poke::<u32>(IOAPIC + 0x10, v);
        }
    };
    set(0x11 + 2 * gsi, 0);
    set(0x10 + 2 * gsi, vector as u32);
}

impl Blk {
    fn init(bus: Bus, bi: &BootInfo) -> Result<Self, &'static str> {
        if let Bus::Mmio { base, .. } = bus {
            if rd(base, 0) != MAGIC || rd(base, 4) != 2 {
                return Err("not a virtio-mmio v2 device");
            }
            if rd(base, 8) != 2 {
                return Err("not a block device");
            }
        }
        bus.set_status(0);
        bus.set_status(ST_ACK);
        bus.set_status(ST_ACK | ST_DRIVER);
        let offered = bus.features();
        if offered & F_VERSION_1 == 0 {
            return Err("device does not offer VERSION_1");
        }
        let mut want = F_VERSION_1 | (offered & (F_FLUSH | F_RO));
        if bi.arg("probe.blk_event_idx") != Some("0") {
            want |= offered & F_EVENT_IDX;
        }
        if bi.arg("probe.blk_indirect") == Some("1") {
            want |= offered & F_INDIRECT;
        }
        bus.set_features(want);
        bus.set_status(ST_ACK | ST_DRIVER | ST_FEATURES_OK);
        if bus.status() & ST_FEATURES_OK == 0 {
            return Err("device refused our features");
        }
        if bus.queue_max() < QSIZE {
            return Err("queue 0 too small");
        }
        // Fresh rings, as a driver allocates them (this one may be set up again).
        // SAFETY: our own static rings; the device is reset, so nothing reads them now.
        unsafe {
            (&raw mut RINGS.desc).write_bytes(0, 1);
            (&raw mut RINGS.avail).write_bytes(0, 1);
            (&raw mut RINGS.used).write_bytes(0, 1);
        }
        // SAFETY: field offsets of our own static.
        let (desc, avail, used) = unsafe {
            (
                (&raw const RINGS.desc) as u64,
                (&raw const RINGS.avail) as u64,
                (&raw const RINGS.used) as u64,
            )
        };
        if !bus.setup_queue(QSIZE, desc, avail, used) {
            return Err("the device took no MSI-X vector for queue 0");
        }
        bus.set_status(ST_ACK | ST_DRIVER | ST_FEATURES_OK | ST_DRIVER_OK);
        let capacity = bus.capacity();
        let (base, irq) = match bus {
            Bus::Mmio { base, irq } => {
                route_irq(irq, IRQ_VECTOR as u8);
                (base, irq)
            }
            Bus::Pci(_) => (0, 0),
        };
        say!(
            "blk dev transport={} base={:#x} irq={} capacity_sectors={} features={:#x} queue_size={} event_idx={} indirect={}",
            bus.name(),
            base,
            irq,
            capacity,
            want,
            QSIZE,
            want & F_EVENT_IDX != 0,
            want & F_INDIRECT != 0
        );
        Ok(Self {
            bus,
            capacity,
            event_idx: want & F_EVENT_IDX != 0,
            indirect: want & F_INDIRECT != 0,
            avail_idx: 0,
            last_used: 0,
            want_irq: true,
        })
    }

    fn desc_at(i: usize) -> *mut u64 {
        // SAFETY: i < QSIZE: a descriptor slot of our static ring.
        unsafe { (&raw mut RINGS.desc as *mut u64).add(2 * i) }
    }

    fn set_desc(p: *mut u64, addr: u64, len: u32, flags: u16, next: u16) {
        // SAFETY: p is a 16-byte descriptor slot we own.
        unsafe {
            p.write_volatile(addr);
            p.add(1)
                .write_volatile(len as u64 | (flags as u64) << 32 | (next as u64) << 48);
        }
    }

    /// Posts request slot `slot`: header (type, sector), one data buffer, status byte.
    fn post(&mut self, slot: usize, kind: u32, sector: u64, data: u64, len: u32, write_data: bool) {
        let b = addr_of_bufs();
        // SAFETY: slot < SLOTS: our own header and status cells.
        let (hdr, status) = unsafe {
            let h = (&raw mut BUFS.hdr as *mut [u64; 2]).add(slot);
            (*h)[0] = kind as u64;
            (*h)[1] = sector;
            let s = (&raw mut BUFS.status as *mut u8).add(slot);
            s.write_volatile(0xff);
            (h as u64, s as u64)
        };
        let _ = b;
        let dflags = if write_data { WRITE } else { 0 };
        let head = (3 * slot) as u16;
        if self.indirect {
            // SAFETY: slot < SLOTS: our own indirect table.
            let t = unsafe { (&raw mut BUFS.indirect as *mut [u64; 6]).add(slot) as *mut u64 };
            Self::set_desc(t, hdr, 16, NEXT, 1);
            // SAFETY: entries 1 and 2 of the same 48-byte table.
            let (t1, t2) = unsafe { (t.add(2), t.add(4)) };
            Self::set_desc(t1, data, len, dflags | NEXT, 2);
            Self::set_desc(t2, status, 1, WRITE, 0);
            Self::set_desc(Self::desc_at(head as usize), t as u64, 48, INDIRECT, 0);
        } else {
            Self::set_desc(Self::desc_at(head as usize), hdr, 16, NEXT, head + 1);
            Self::set_desc(
                Self::desc_at(head as usize + 1),
                data,
                len,
                dflags | NEXT,
                head + 2,
            );
            Self::set_desc(Self::desc_at(head as usize + 2), status, 1, WRITE, 0);
        }
        let old = self.avail_idx;
        // SAFETY: avail ring of our static: flags at 0, ring[old % QSIZE] at index 2 + slot,
        // used_event after the ring.
        unsafe {
            let a = &raw mut RINGS.avail as *mut u16;
            // Interrupt suppression: VRING_AVAIL_F_NO_INTERRUPT without EVENT_IDX; with it,
            // used_event at the next entry (interrupts on) or half the index space away (off).
            a.write_volatile(if self.want_irq { 0 } else { 1 });
            let event = if self.want_irq {
                self.last_used
            } else {
                self.last_used.wrapping_add(0x8000)
            };
            a.add(2 + QSIZE as usize).write_volatile(event);
            a.add(2 + (old % QSIZE) as usize).write_volatile(head);
            fence(Ordering::Release);
            self.avail_idx = old.wrapping_add(1);
            a.add(1).write_volatile(self.avail_idx);
        }
        fence(Ordering::SeqCst);
        // SAFETY: used ring of our static: flags at 0, avail_event after the ring.
        let notify = unsafe {
            let u = &raw const RINGS.used as *const u16;
            if self.event_idx {
                let ev = u.add(2 + 4 * QSIZE as usize).read_volatile();
                self.avail_idx.wrapping_sub(ev).wrapping_sub(1) < self.avail_idx.wrapping_sub(old)
            } else {
                u.read_volatile() & 1 == 0
            }
        };
        if notify {
            self.bus.notify();
        }
    }

    fn used_idx() -> u16 {
        // SAFETY: the used ring's index, written by the device.
        unsafe { ((&raw const RINGS.used as *const u16).add(1)).read_volatile() }
    }

    /// Waits for the next used entry; returns (slot, status byte).
    fn reap(&mut self, irq: bool) -> (usize, u8) {
        if irq {
            // post() asked for an interrupt at the next used entry; wait for it.
            fence(Ordering::SeqCst);
            while Self::used_idx() == self.last_used {
                let c = crate::wake::irq_count(IRQ_VECTOR);
                if Self::used_idx() != self.last_used {
                    break;
                }
                sys::wait(crate::wake::irq_count_addr(IRQ_VECTOR), c, false);
                self.bus.ack();
            }
        } else {
            while Self::used_idx() == self.last_used {
                core::hint::spin_loop();
            }
        }
        fence(Ordering::Acquire);
        let i = (self.last_used % QSIZE) as usize;
        // SAFETY: used ring element i of our static.
        let id = unsafe {
            (&raw const RINGS.used as *const u32)
                .add(1 + 2 * i)
                .read_volatile()
        };
        self.last_used = self.last_used.wrapping_add(1);
        let slot = id as usize / 3;
        // SAFETY: our own status cell.
        let st = unsafe {
            (&raw const BUFS.status as *const u8)
                .add(slot.min(SLOTS - 1))
                .read_volatile()
        };
        (slot, st)
    }

    fn io(
        &mut self,
        kind: u32,
        sector: u64,
        data: u64,
        len: u32,
        device_writes: bool,
        irq: bool,
    ) -> u8 {
        self.want_irq = irq;
        self.post(0, kind, sector, data, len, device_writes);
        self.reap(irq).1
    }
}

fn hash_words(h: &mut u64, p: u64, len: usize) {
    for i in 0..len / 8 {
        // SAFETY: the caller's buffer of len bytes.
        let w: u64 = unsafe { peek(p + 8 * i as u64) };
        *h = (*h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// The write test's pattern word for disk byte offset `o`.
pub fn pattern(o: u64) -> u64 {
    crate::memtest::pattern(o, 0x5752_4954_4521_0002)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn summarise(name: &str, mode: &str, s: &mut [u64], tsc_khz: u64) {
    crate::stats::summarise("blk", name, "mode", mode, s, tsc_khz);
}

/// Runs the block tests named in `probe.blk`. Returns true on a failure.
pub fn run(bi: &BootInfo, tsc_khz: u64) -> bool {
    let Some(tests) = bi.arg("probe.blk") else {
        return false;
    };
    // A virtio-mmio device announced on the command line, else a virtio-pci one on bus 0.
    let list = devices(bi);
    let mmio = list.items[..list.len]
        .iter()
        .find(|&&(a, _)| rd(a, 0) == MAGIC && rd(a, 8) == 2)
        .map(|&(base, irq)| Bus::Mmio { base, irq });
    let bus = match mmio {
        Some(b) => b,
        None => match crate::virtio_pci::find(bi) {
            Some((e, slot)) => match crate::virtio_pci::Pci::open(e, slot, IRQ_VECTOR as u32) {
                Ok(p) => Bus::Pci(p),
                Err(why) => {
                    say!("blk FAILED: {}", why);
                    return true;
                }
            },
            None => {
                say!(
                    "blk FAILED: probe.blk given but no virtio-mmio block device among {} announced and no virtio-pci one on bus 0",
                    list.len
                );
                return true;
            }
        },
    };
    let mut d = match Blk::init(bus, bi) {
        Ok(d) => d,
        Err(e) => {
            say!("blk FAILED: {}", e);
            return true;
        }
    };
    sys::set_interrupts(false);
    let n: usize = bi
        .arg("probe.blk_n")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
        // The timed reads and their tenth of warm-up share one scratch buffer: a count
        // near its length once ran past its end (the noise section's neighbour, 5000).
        .clamp(1, sys::SAMPLES * 10 / 11);
    let mut failed = false;
    // SAFETY: addresses of our own static buffers.
    let (data0, small0) = unsafe { ((&raw mut BUFS.data) as u64, (&raw mut BUFS.small) as u64) };
    for t in tests.split(',') {
        match t {
            "read" => {
                let mut h = 0xcbf2_9ce4_8422_2325u64;
                let mut sector = 0;
                let start = rdtsc();
                while sector < d.capacity {
                    let secs = (d.capacity - sector).min((BUF / 512) as u64);
                    let len = secs as u32 * 512;
                    let st = d.io(0, sector, data0, len, true, false);
                    if st != 0 {
                        say!("blk read FAILED at sector {} status {}", sector, st);
                        failed = true;
                        break;
                    }
                    hash_words(&mut h, data0, len as usize);
                    sector += secs;
                }
                let cycles = rdtsc() - start;
                say!(
                    "blk read bytes={} checksum={:#018x} tsc_cycles={}",
                    sector * 512,
                    h,
                    cycles
                );
            }
            "write" => {
                let first = d.capacity.saturating_sub(2048);
                let mut ok = true;
                for k in 0..(d.capacity - first) / 128 {
                    let sector = first + k * 128;
                    for i in 0..BUF / 8 {
                        // SAFETY: inside our data buffer.
                        unsafe {
                            poke::<u64>(data0 + 8 * i as u64, pattern(sector * 512 + 8 * i as u64))
                        };
                    }
                    ok &= d.io(1, sector, data0, BUF as u32, false, false) == 0;
                }
                ok &= d.io(4, 0, data0, 0, false, false) == 0;
                // Read it back through the device.
                for k in 0..(d.capacity - first) / 128 {
                    let sector = first + k * 128;
                    ok &= d.io(0, sector, data0, BUF as u32, true, false) == 0;
                    for i in 0..BUF / 8 {
                        // SAFETY: inside our data buffer.
                        let w: u64 = unsafe { peek(data0 + 8 * i as u64) };
                        ok &= w == pattern(sector * 512 + 8 * i as u64);
                    }
                }
                say!(
                    "blk write first_sector={} bytes={} flushed_and_read_back={}",
                    first,
                    (d.capacity - first) * 512,
                    ok
                );
                failed |= !ok;
            }
            "lat" => {
                let mut rng = Rng(0x1234_5678_9abc_def1);
                let warm = n / 10;
                let gap = bi
                    .arg("probe.blk_gap_us")
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
                    * tsc_khz
                    / 1000;
                // SAFETY: the BSP runs the block tests; the only borrow of buffer 0.
                let buf = unsafe { sys::scratch(0) };
                for irq in [false, true] {
                    for s in buf.iter_mut().take(n + warm) {
                        let sector = (rng.next() % (d.capacity / 8)) * 8;
                        let g = rdtsc();
                        while rdtsc() - g < gap {
                            core::hint::spin_loop();
                        }
                        let t0 = rdtsc();
                        let st = d.io(0, sector, small0, 4096, true, irq);
                        *s = rdtsc() - t0;
                        failed |= st != 0;
                    }
                    summarise(
                        "lat4k",
                        if irq { "irq" } else { "poll" },
                        &mut buf[warm..n + warm],
                        tsc_khz,
                    );
                }
            }
            "again" => {
                // Reset and set the device up again, as a driver that reloads does: the
                // VMM's queue workers serve the new activation on the rings they keep.
                match Blk::init(bus, bi) {
                    Ok(again) => {
                        d = again;
                        say!("blk again: reset and set up again");
                    }
                    Err(e) => {
                        say!("blk FAILED: setting up again: {}", e);
                        failed = true;
                        break;
                    }
                }
            }
            "flood" => {
                // A hostile driver, over and over: reset, features, queue 0 of size 3 (not
                // a power of two), ready, DRIVER_OK. Each activation is refused, and would
                // be a line in the VMM's log without its rate limit. Leaves the device
                // reset: run it last.
                let rounds: u64 = bi
                    .arg("probe.blk_flood")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(5000);
                for _ in 0..rounds {
                    bus.set_status(0);
                    bus.set_status(ST_ACK | ST_DRIVER);
                    bus.set_features(F_VERSION_1);
                    bus.set_status(ST_ACK | ST_DRIVER | ST_FEATURES_OK);
                    bus.setup_queue(3, 0, 0, 0);
                    bus.set_status(ST_ACK | ST_DRIVER | ST_FEATURES_OK | ST_DRIVER_OK);
                }
                bus.set_status(0);
                say!("blk flood rounds={}", rounds);
            }
            "fence" => {
                let warm = n / 10;
                // SAFETY: the BSP runs the block tests; the only borrow of buffer 0.
                let buf = unsafe { sys::scratch(0) };
                for irq in [false, true] {
                    for s in buf.iter_mut().take(n + warm) {
                        let t0 = rdtsc();
                        let st = d.io(8, 0, small0, 20, true, irq);
                        *s = rdtsc() - t0;
                        failed |= st != 0;
                    }
                    summarise(
                        "fence",
                        if irq { "irq" } else { "poll" },
                        &mut buf[warm..n + warm],
                        tsc_khz,
                    );
                }
                // SAFETY: the ID GET_ID wrote into our buffer.
                let id: [u8; 20] = unsafe { peek(small0) };
                let end = id.iter().position(|&b| b == 0).unwrap_or(20);
                say!("blk id={}", core::str::from_utf8(&id[..end]).unwrap_or("?"));
            }
            "qd32" => {
                let mut rng = Rng(0xfeed_f00d_dead_beef);
                let total = (n * 4).max(SLOTS * 4);
                d.want_irq = false;
                let start = rdtsc();
                let mut posted = 0;
                let mut done = 0;
                for slot in 0..SLOTS {
                    let sector = (rng.next() % (d.capacity / 8)) * 8;
                    d.post(slot, 0, sector, small0 + 4096 * slot as u64, 4096, true);
                    posted += 1;
                }
                while done < total {
                    let (slot, st) = d.reap(false);
                    done += 1;
                    failed |= st != 0;
                    if posted < total {
                        let sector = (rng.next() % (d.capacity / 8)) * 8;
                        d.post(
                            slot % SLOTS,
                            0,
                            sector,
                            small0 + 4096 * (slot % SLOTS) as u64,
                            4096,
                            true,
                        );
                        posted += 1;
                    }
                }
                let cycles = rdtsc() - start;
                let ns = cycles.saturating_mul(1_000_000) / tsc_khz.max(1);
                let iops = (total as u64).saturating_mul(1_000_000_000) / ns.max(1);
                say!(
                    "blk test=qd32 n={} ns={} iops={} mb_per_s={}",
                    total,
                    ns,
                    iops,
                    iops * 4096 / 1_000_000
                );
            }
            other => {
                say!("blk FAILED: unknown test {}", other);
                failed = true;
            }
        }
    }
    failed
}
