//! PCI enumeration and a driver for the VMM's submission engine (`probe.engine=...`,
//! comma-separated):
//!
//! - `list`: enumerate bus 0 through ECAM (the ACPI MCFG table gives its base, as Linux
//!   finds it) and print every function with its PCIe extended capabilities, and for the
//!   engine its BARs (sized by the BAR protocol) and MSI-X vectors;
//! - `lat`: submit one fence command at a time and time submit-to-fence in ring 3, the
//!   driver polling the fence (`poll`) and waiting for the MSI-X interrupt in the idle mode
//!   in force (`irq`): median and p99 over `probe.engine_n` submissions;
//! - `hostile`: a bad fence address, an unknown opcode, a tail a ring ahead and a flood of
//!   doorbells with nothing behind them; each must leave the engine stopped with the right
//!   `ERROR` code (or, for the flood, still running), and a reset must bring it back.
//!
//! The engine's protocol is in the VMM's `devices/src/pci/engine.rs`: a ring of 32-byte
//! commands behind a 64-byte header whose first `u32` is the tail; the doorbell is any
//! 4-byte write to BAR 4 (we write the tail, so a polled doorbell page always changes).

use core::sync::atomic::{Ordering, fence};

use crate::bootinfo::BootInfo;
use crate::pcie::{
    CAP_MSIX, Ecam, Found, ecam, enable_msix_entry, enumerate, find_cap, setup_bars, summarise,
};
use crate::sys::{self, peek, poke, rdtsc};

const VENDOR: u16 = 0x1234;
const DEVICE: u16 = 0x5e01;
const ENGINE_ID: u32 = 0x5345_0001;
/// The vector the engine's completion arrives on.
const VECTOR: usize = 0x60;
const RING: u32 = 64;
const MAX_N: usize = sys::SAMPLES;

mod reg {
    pub const ID: u64 = 0x00;
    pub const STATUS: u64 = 0x04;
    pub const ERROR: u64 = 0x08;
    pub const HEAD: u64 = 0x0c;
    pub const RING_LO: u64 = 0x10;
    pub const RING_HI: u64 = 0x14;
    pub const RING_SIZE: u64 = 0x18;
    pub const CONTROL: u64 = 0x1c;
}
const STATUS_ENABLED: u32 = 1;
const STATUS_ERROR: u32 = 2;
const OP_FENCE: u32 = 1;
const FLAG_INTERRUPT: u32 = 1;

#[repr(C, align(4096))]
struct Ring {
    tail: u32,
    _header: [u32; 15],
    cmds: [[u64; 4]; RING as usize],
}

#[repr(C, align(64))]
struct Fence(u64);

static mut RING_MEM: Ring = Ring {
    tail: 0,
    _header: [0; 15],
    cmds: [[0; 4]; RING as usize],
};
static mut FENCE: Fence = Fence(0);

/// A found engine.
struct Dev {
    slot: u64,
    regs: u64,
    doorbell: u64,
}

impl Dev {
    fn rd(&self, off: u64) -> u32 {
        // SAFETY: BAR 0, 4 KiB of registers, placed by the VMM and read back by us.
        unsafe { peek(self.regs + off) }
    }
    fn wr(&self, off: u64, v: u32) {
        // SAFETY: as `rd`.
        unsafe { poke(self.regs + off, v) }
    }
    fn ring_doorbell(&self, v: u32) {
        // SAFETY: BAR 4, the doorbell page.
        unsafe { poke(self.doorbell, v) }
    }
}

/// Finds the engine on bus 0 and programs its MSI-X vector 0 to `apic`.
fn probe(e: Ecam, found: &Found, apic: u32) -> Result<Dev, &'static str> {
    let slot = found
        .slot(VENDOR, DEVICE)
        .ok_or("no submission engine (1234:5e01) on bus 0")?;
    let mut next = 0xc000_0000;
    let bars = setup_bars(e, slot, "engine", &mut next);
    let msix = find_cap(e, slot, CAP_MSIX);
    let cap = msix.ok_or("the engine has no MSI-X capability")?;
    let control = e.read(slot, cap) >> 16;
    let vectors = (control & 0x7ff) + 1;
    let table = e.read(slot, cap + 4);
    let pba = e.read(slot, cap + 8);
    let (tbir, toff) = ((table & 7) as usize, u64::from(table & !7));
    say!(
        "pci engine msix vectors={} table=bar{}+{:#x} pba=bar{}+{:#x}",
        vectors,
        tbir,
        toff,
        pba & 7,
        pba & !7
    );
    if tbir >= 6 || bars[tbir].1 == 0 || bars[0].1 == 0 || bars[4].1 == 0 {
        return Err("the engine's BARs are not where its protocol says");
    }
    // Entry 0 to `apic` and our vector; then MSI-X on.
    enable_msix_entry(e, slot, cap, bars[tbir].0 + toff, apic, VECTOR as u32);
    let dev = Dev {
        slot,
        regs: bars[0].0,
        doorbell: bars[4].0,
    };
    let id = dev.rd(reg::ID);
    if id != ENGINE_ID {
        say!("pci engine id={:#x}, expected {:#x}", id, ENGINE_ID);
        return Err("the engine's ID register is wrong");
    }
    Ok(dev)
}

fn ring_addr() -> u64 {
    &raw const RING_MEM as u64
}
fn fence_addr() -> u64 {
    &raw const FENCE as u64
}
fn fence_value() -> u64 {
    // SAFETY: our static, written by the engine; read volatile.
    unsafe { core::ptr::read_volatile(&raw const FENCE.0) }
}

/// Resets the engine, clears our ring, gives it the ring and enables it. Returns STATUS.
fn start(d: &Dev, ring: u64, size: u32) -> u32 {
    d.wr(reg::CONTROL, 0);
    // SAFETY: our ring's tail.
    unsafe { core::ptr::write_volatile(&raw mut RING_MEM.tail, 0) };
    fence(Ordering::SeqCst);
    d.wr(reg::RING_LO, ring as u32);
    d.wr(reg::RING_HI, (ring >> 32) as u32);
    d.wr(reg::RING_SIZE, size);
    d.wr(reg::CONTROL, 1);
    d.rd(reg::STATUS)
}

/// Writes command `cmd` at the tail, publishes the tail and rings the doorbell. With `timed`,
/// the doorbell write alone is timed (a full fence and a TSC read before it, a TSC read after
/// it) and its cycles returned; without, nothing but the stores runs (0 returned), which is
/// what the bare-host twin's driver does.
fn submit(d: &Dev, cmd: [u64; 4], timed: bool) -> u64 {
    // SAFETY: our ring (only this CPU writes it; the engine reads it after the doorbell).
    let tail = unsafe {
        let tail = core::ptr::read_volatile(&raw const RING_MEM.tail);
        let slot = (&raw mut RING_MEM.cmds as *mut [u64; 4]).add((tail % RING) as usize);
        core::ptr::write_volatile(slot, cmd);
        fence(Ordering::Release);
        let t = tail.wrapping_add(1);
        core::ptr::write_volatile(&raw mut RING_MEM.tail, t);
        t
    };
    if !timed {
        d.ring_doorbell(tail);
        return 0;
    }
    fence(Ordering::SeqCst);
    let t0 = rdtsc();
    d.ring_doorbell(tail);
    rdtsc().wrapping_sub(t0)
}

fn command(opcode: u32, flags: u32, fence: u64, value: u64) -> [u64; 4] {
    [u64::from(opcode) | u64::from(flags) << 32, fence, value, 0]
}

/// Waits until the fence reads `v`, up to `limit` TSC cycles. False on time-out.
fn poll_fence(v: u64, limit: u64) -> bool {
    let t0 = rdtsc();
    while fence_value() != v {
        if rdtsc().wrapping_sub(t0) > limit {
            return false;
        }
        core::hint::spin_loop();
    }
    true
}

fn lat(d: &Dev, n: usize, tsc_khz: u64) -> bool {
    let mut failed = false;
    let warm = n / 10;
    let limit = tsc_khz.saturating_mul(2000); // 2 s per submission at most
    let mut value = 0u64;
    // SAFETY: the BSP runs this, and these are the only borrows of the two buffers.
    let (buf, db) = unsafe { (sys::scratch(0), sys::scratch(1)) };
    if start(d, ring_addr(), RING) != STATUS_ENABLED {
        say!("engine FAILED: not enabled (error {})", d.rd(reg::ERROR));
        return true;
    }
    // Three passes: the fence polled, then waited for by interrupt, both with nothing but
    // the driver's stores before the doorbell; then polled again with the doorbell write
    // itself timed (`submit-timed`, and `doorbell`): what timing the write adds to the row.
    for (irq, timed) in [(false, false), (true, false), (false, true)] {
        let mut timeouts = 0;
        if irq {
            sys::set_interrupts(matches!(
                crate::wake::mode(),
                crate::wake::Mode::Spin | crate::wake::Mode::HaltPoll(_)
            ));
        }
        for (s, dbs) in buf.iter_mut().zip(db.iter_mut()).take(n + warm) {
            value += 1;
            let flags = if irq { FLAG_INTERRUPT } else { 0 };
            let before = crate::wake::irq_count(VECTOR);
            let t0 = rdtsc();
            *dbs = submit(d, command(OP_FENCE, flags, fence_addr(), value), timed);
            let ok = if irq {
                let w0 = rdtsc();
                while crate::wake::irq_count(VECTOR) == before {
                    crate::wake::wait_word(
                        crate::wake::irq_count_addr(VECTOR),
                        before,
                        crate::wake::mode(),
                    );
                    if rdtsc().wrapping_sub(w0) > limit {
                        break;
                    }
                }
                crate::wake::irq_count(VECTOR) != before && fence_value() == value
            } else {
                poll_fence(value, limit)
            };
            *s = rdtsc().wrapping_sub(t0);
            if !ok {
                timeouts += 1;
                if timeouts > 3 {
                    break;
                }
            }
        }
        sys::set_interrupts(false);
        if timeouts > 0 {
            say!(
                "engine FAILED: {} submissions not completed ({}; status {:#x} error {} head {})",
                timeouts,
                if irq { "irq" } else { "poll" },
                d.rd(reg::STATUS),
                d.rd(reg::ERROR),
                d.rd(reg::HEAD)
            );
            failed = true;
            continue;
        }
        summarise(
            if timed { "submit-timed" } else { "submit" },
            if irq { "irq" } else { "poll" },
            &mut buf[warm..n + warm],
            tsc_khz,
        );
        if timed {
            summarise("doorbell", "none", &mut db[warm..n + warm], tsc_khz);
        }
    }
    say!(
        "engine submitted={} head={} status={:#x}",
        value,
        d.rd(reg::HEAD),
        d.rd(reg::STATUS)
    );
    failed
}

/// Waits a little for the engine to reach an error state.
fn settle(d: &Dev, tsc_khz: u64) -> (u32, u32) {
    let t0 = rdtsc();
    loop {
        let st = d.rd(reg::STATUS);
        if st & STATUS_ERROR != 0 || rdtsc().wrapping_sub(t0) > tsc_khz.saturating_mul(500) {
            return (st, d.rd(reg::ERROR));
        }
        core::hint::spin_loop();
    }
}

fn hostile(d: &Dev, tsc_khz: u64) -> bool {
    let mut failed = false;
    let mut check = |name: &str, got: (u32, u32), want_error: u32| {
        let ok = if want_error == 0 {
            got == (STATUS_ENABLED, 0)
        } else {
            got.0 & STATUS_ERROR != 0 && got.1 == want_error
        };
        say!(
            "engine hostile={} status={:#x} error={} expected_error={} ok={}",
            name,
            got.0,
            got.1,
            want_error,
            ok
        );
        failed |= !ok;
    };
    // A ring outside guest memory, and one that is not a power of two.
    let st = start(d, 0x7_ffff_f000, RING);
    check("ring_outside_memory", (st, d.rd(reg::ERROR)), 1);
    let st = start(d, ring_addr(), 48);
    check("ring_size_48", (st, d.rd(reg::ERROR)), 2);
    // A fence outside memory.
    start(d, ring_addr(), RING);
    submit(d, command(OP_FENCE, 0, 0x7_ffff_fff8, 1), false);
    check("fence_outside_memory", settle(d, tsc_khz), 5);
    // An unknown opcode.
    start(d, ring_addr(), RING);
    submit(d, command(0xdead, 0, fence_addr(), 1), false);
    check("unknown_opcode", settle(d, tsc_khz), 4);
    // A tail more than a ring ahead.
    start(d, ring_addr(), RING);
    // SAFETY: our ring's tail.
    unsafe { core::ptr::write_volatile(&raw mut RING_MEM.tail, RING + 5) };
    fence(Ordering::SeqCst);
    d.ring_doorbell(RING + 5);
    check("tail_past_ring", settle(d, tsc_khz), 3);
    // A flood of doorbells with nothing new behind them: the engine stays up, idle.
    start(d, ring_addr(), RING);
    for i in 0..10_000u32 {
        d.ring_doorbell(i);
    }
    let st = d.rd(reg::STATUS);
    check("doorbell_flood", (st, d.rd(reg::ERROR)), 0);
    // Reset and work again.
    let st = start(d, ring_addr(), RING);
    let v = fence_value().wrapping_add(0x1000);
    submit(d, command(OP_FENCE, 0, fence_addr(), v), false);
    let ok = st == STATUS_ENABLED && poll_fence(v, tsc_khz.saturating_mul(2000));
    say!("engine hostile=reset_and_resubmit completed={}", ok);
    failed |= !ok;
    failed
}

/// Runs the tests named in `probe.engine`. Returns true on a failure.
pub fn run(bi: &BootInfo, tsc_khz: u64, apic: u32) -> bool {
    let Some(tests) = bi.arg("probe.engine") else {
        return false;
    };
    let Some(e) = ecam(bi) else {
        say!("engine FAILED: no MCFG table (no PCI host bridge in the ACPI tables)");
        return true;
    };
    say!("pci ecam={:#x}", e.0);
    let found = enumerate(e);
    let n: usize = bi
        .arg("probe.engine_n")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
        .clamp(1, MAX_N * 9 / 10);
    let mut dev = None;
    if tests
        .split(',')
        .any(|t| t == "lat" || t == "hostile" || t == "list")
    {
        match probe(e, &found, apic) {
            Ok(d) => {
                say!(
                    "engine found slot={} regs={:#x} doorbell={:#x}",
                    d.slot,
                    d.regs,
                    d.doorbell
                );
                dev = Some(d);
            }
            Err(why) if tests.split(',').any(|t| t == "lat" || t == "hostile") => {
                say!("engine FAILED: {}", why);
                return true;
            }
            Err(why) => say!("engine none: {}", why),
        }
    }
    let mut failed = false;
    for t in tests.split(',') {
        match (t, &dev) {
            ("list", _) => {}
            ("lat", Some(d)) => failed |= lat(d, n, tsc_khz),
            ("hostile", Some(d)) => failed |= hostile(d, tsc_khz),
            ("edu", _) => failed |= crate::peers::edu(e, &found, n, tsc_khz, apic),
            ("testdev", _) => failed |= crate::peers::testdev(e, &found, n, tsc_khz),
            (other, _) => {
                say!("engine FAILED: unknown test {}", other);
                failed = true;
            }
        }
    }
    failed
}
