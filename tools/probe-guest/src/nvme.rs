//! A small NVMe driver for a passed-through controller (`probe.nvme=N`): the submission
//! shape of a GPU (rings in guest memory the device reads by DMA, a tail doorbell in BAR 0,
//! completions by MSI-X or a polled phase bit), driven from ring 3.
//!
//! What it does, in order, each step printed:
//! 1. finds the first function of class 01:08:02 (NVMe) on bus 0 through ECAM, sizes its
//!    BARs, turns memory decoding and bus mastering on;
//! 2. resets the controller, gives it an admin queue pair, enables it (CC: 4 KiB pages,
//!    64-byte submission and 16-byte completion entries);
//! 3. Identify controller and namespace 1 (model, serial, LBA size and count);
//! 4. two I/O queue pairs: pair 1's completions on MSI-X vector 1 (programmed to our
//!    vector), pair 2's with no interrupt at all (a polled read must not raise one: the
//!    host would take it on the vCPU's core and kick the vCPU out to deliver it);
//! 5. writes a 4 KiB pattern (seeded by `probe.nvme_seed`) at LBA `probe.nvme_lba` (default
//!    0) on pair 2, reads it back into a cleared buffer, compares and prints the FNV-1a
//!    checksum;
//! 6. times N one-block reads submit-to-completion, on pair 2 polling the completion's
//!    phase bit (`completion=poll`) and on pair 1 waiting for the MSI-X interrupt in the
//!    idle mode in force (`completion=irq`), and the doorbell store alone.
//!
//! Every doorbell and completion-queue head store is a plain store to BAR 0; where the VMM
//! maps BAR 0 into the guest (all of it but the MSI-X table and PBA pages), none of them
//! exits. The launch report's exit counts show whether that held.

use crate::bootinfo::BootInfo;
use crate::pcie::{Ecam, enable_msix_entry, find_cap, setup_bars};
use crate::sys::{self, peek, poke, rdtsc};

#[path = "../../../benchmarks/src/nvmecore.rs"]
#[allow(dead_code)]
mod nvmecore;

use nvmecore::{Bar0, Controller, Error, Page, bring_up, fnv1a, io, pattern, text};

/// The vector the I/O queue's completions arrive on.
const VECTOR: usize = 0x62;
/// The watchdog's vector (the LAPIC timer's, while reads wait for MSI-X): apart from
/// `VECTOR`, so a read its tick found complete is counted as one MSI-X never announced.
const WATCHDOG: usize = 0x63;
const CAP_MSIX: u8 = 0x11;

#[repr(C, align(4096))]
struct PageMem([u8; 4096]);

/// Admin SQ, admin CQ, I/O SQ 1, I/O CQ 1, identify buffer, I/O SQ 2, I/O CQ 2, data
/// buffer.
static mut PAGES: [PageMem; 8] = [const { PageMem([0; 4096]) }; 8];

/// Page `i`: identity mapped, so the CPU's address is the device's (guest physical; the
/// VMM maps guest memory for the device's DMA at the same addresses).
fn page(i: usize) -> Page {
    // SAFETY: only the address is taken.
    let cpu = unsafe { (&raw mut PAGES).cast::<PageMem>().add(i) } as *mut u8;
    Page {
        cpu,
        dma: cpu as u64,
    }
}

/// BAR 0 at its guest physical address.
struct Regs(u64);

impl Bar0 for Regs {
    fn rd(&self, off: u64) -> u32 {
        // SAFETY: BAR 0's registers and doorbells, placed by the VMM and sized by us.
        unsafe { peek(self.0 + off) }
    }
    fn wr(&self, off: u64, v: u32) {
        // SAFETY: as `rd`.
        unsafe { poke(self.0 + off, v) }
    }
}

/// The first NVMe function on bus 0.
fn find(e: Ecam) -> Option<u64> {
    (0..32).find(|&slot| {
        e.read(slot, 0) & 0xffff != 0xffff && e.read(slot, 8) >> 8 == nvmecore::CLASS_NVME
    })
}

fn hex(bi: &BootInfo, key: &str, default: u64) -> u64 {
    bi.arg(key)
        .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
        .unwrap_or(default)
}

/// Runs the driver when `probe.nvme=N` is given. Returns true on a failure.
pub fn run(bi: &BootInfo, tsc_khz: u64, apic: u32) -> bool {
    let Some(n) = bi.arg("probe.nvme") else {
        return false;
    };
    let n = n
        .parse::<usize>()
        .unwrap_or(100)
        .clamp(1, sys::SAMPLES * 9 / 10);
    let Some(e) = crate::pcie::ecam(bi) else {
        say!("nvme FAILED: no MCFG table (no PCI host bridge in the ACPI tables)");
        return true;
    };
    match drive(bi, e, n, tsc_khz, apic) {
        Ok(()) => false,
        Err(Error::Setup(why)) => {
            say!("nvme FAILED: {}", why);
            true
        }
        Err(Error::Status(what, st)) => {
            say!("nvme FAILED: {} completed with status {:#x}", what, st);
            true
        }
        Err(Error::Timeout(what, qid)) => {
            say!("nvme FAILED: {} did not complete on queue {}", what, qid);
            true
        }
    }
}

/// Programs MSI-X entry `v` of `slot` to `apic` and our vector, unmasked, and turns MSI-X
/// on. Returns the vector count.
fn program_msix(
    e: Ecam,
    slot: u64,
    bars: &[(u64, u64); 6],
    v: u64,
    apic: u32,
) -> Result<u32, Error> {
    let msix = find_cap(e, slot, CAP_MSIX).ok_or(Error::Setup("no MSI-X capability"))?;
    let control = e.read(slot, msix) >> 16;
    let table = e.read(slot, msix + 4);
    let (tbir, toff) = ((table & 7) as usize, u64::from(table & !7));
    if tbir >= 6 || bars[tbir].1 == 0 || u64::from(control & 0x7ff) < v {
        return Err(Error::Setup(
            "the MSI-X table is not in a BAR, or is too short",
        ));
    }
    let entry = bars[tbir].0 + toff + 16 * v;
    enable_msix_entry(e, slot, msix, entry, apic, VECTOR as u32);
    say!(
        "nvme msix vectors={} table=bar{}+{:#x}",
        (control & 0x7ff) + 1,
        tbir,
        toff
    );
    Ok((control & 0x7ff) + 1)
}

fn drive(bi: &BootInfo, e: Ecam, n: usize, tsc_khz: u64, apic: u32) -> Result<(), Error> {
    let slot = find(e).ok_or(Error::Setup("no NVMe controller (class 01:08:02) on bus 0"))?;
    let id = e.read(slot, 0);
    let mut next = 0xc000_0000;
    let bars = setup_bars(e, slot, "nvme", &mut next);
    let (regs, size) = bars[0];
    if size < 0x2000 {
        return Err(Error::Setup(
            "BAR 0 is too small for NVMe registers and doorbells",
        ));
    }
    let c = Controller::new(Regs(regs), rdtsc, tsc_khz);
    let vs = c.version();
    say!(
        "nvme found slot={} id={:#010x} bar0={:#x} size={:#x} mqes={} dstrd={} version={}.{}",
        slot,
        id,
        regs,
        size,
        c.max_entries,
        c.doorbell_stride,
        vs >> 16,
        vs >> 8 & 0xff
    );
    program_msix(e, slot, &bars, u64::from(nvmecore::IO_VECTOR), apic)?;
    let limit = tsc_khz.saturating_mul(2000);
    let up = bring_up(&c, core::array::from_fn(page), limit)?;
    say!(
        "nvme identify model=\"{}\" serial=\"{}\"",
        text(&up.id.model),
        text(&up.id.serial)
    );
    say!(
        "nvme namespace 1 blocks={} lba_bytes={}",
        up.id.blocks,
        up.id.lba_bytes
    );
    let (mut q, mut polled) = (up.io, up.polled);
    // Write, read back, compare (polled: no interrupt raised).
    let data = page(7);
    let per_page = (4096 / up.id.lba_bytes) as u32;
    let lba = hex(bi, "probe.nvme_lba", 0).min(up.id.blocks.saturating_sub(u64::from(per_page)));
    let seed = hex(bi, "probe.nvme_seed", 0x4e56_4d65);
    // SAFETY: the data page; no command names it now.
    pattern(seed, unsafe { data.bytes() });
    // SAFETY: as above.
    let sum = fnv1a(unsafe { data.bytes() });
    polled.run(&c.bar, "write", io(true, &data, lba, per_page), limit)?;
    // SAFETY: as above (the write completed).
    unsafe { data.bytes() }.fill(0);
    polled.run(&c.bar, "read", io(false, &data, lba, per_page), limit)?;
    // SAFETY: as above (the read completed).
    let back = fnv1a(unsafe { data.bytes() });
    say!(
        "nvme rw lba={} bytes=4096 written_fnv={:#018x} read_fnv={:#018x} ok={}",
        lba,
        sum,
        back,
        (sum == back) as u8
    );
    if sum != back {
        return Err(Error::Setup(
            "the bytes read back are not the bytes written",
        ));
    }
    timed(&c, [&mut polled, &mut q], &data, lba, n, tsc_khz, limit)?;
    // Give the controller back disabled (the VMM resets it too).
    c.disable()
}

/// Waits (in the idle mode in force) until our vector's count is no longer `seen` or a
/// watchdog tick comes.
fn wait_for_either(seen: u64) {
    use crate::wake::{Mode, irq_count, irq_count_addr, mode};
    let ticks = irq_count(WATCHDOG);
    let moved = || irq_count(VECTOR) != seen || irq_count(WATCHDOG) != ticks;
    match mode() {
        Mode::Spin => {
            while !moved() {
                core::hint::spin_loop();
            }
        }
        Mode::HaltPoll(cycles) => {
            let start = rdtsc();
            while !moved() {
                if rdtsc().wrapping_sub(start) > cycles {
                    sys::wait_either(
                        irq_count_addr(VECTOR),
                        seen,
                        irq_count_addr(WATCHDOG),
                        false,
                    );
                    break;
                }
                core::hint::spin_loop();
            }
        }
        m => {
            sys::wait_either(
                irq_count_addr(VECTOR),
                seen,
                irq_count_addr(WATCHDOG),
                m == Mode::Mwait,
            );
        }
    }
}

/// Whether our vector's count moves from `seen` within `grace` TSC cycles (a completion a
/// tick found first, whose MSI-X was only late).
fn msi_within(seen: u64, grace: u64) -> bool {
    let start = rdtsc();
    while rdtsc().wrapping_sub(start) < grace {
        if crate::wake::irq_count(VECTOR) != seen {
            return true;
        }
        core::hint::spin_loop();
    }
    false
}

/// Timed one-block reads, polled on the first queue then by MSI-X on the second; prints
/// both and the doorbell store.
fn timed(
    c: &Controller<Regs>,
    queues: [&mut nvmecore::Queue; 2],
    data: &Page,
    lba: u64,
    n: usize,
    tsc_khz: u64,
    limit: u64,
) -> Result<(), Error> {
    let read1 = io(false, data, lba, 1);
    let warm = n / 10;
    // SAFETY: the BSP runs this; these are the only borrows of the two sample buffers.
    let (s, db) = unsafe { (sys::scratch(0), sys::scratch(1)) };
    let mut irqs = 0;
    let mut ticks = 0;
    // Handler runs on either vector between marks 3 and 4, read just inside them: each
    // follows an injection KVM counted between the same marks, so more runs than
    // injections means an interrupt delivered twice (docs/testing.md).
    let mut marked = 0;
    let mut by_watchdog = 0u64;
    // How long a completion seen at a watchdog tick may wait for its own MSI-X (a late
    // interrupt, not a lost one): 10 ms.
    let grace = tsc_khz.saturating_mul(10);
    // Two marks with nothing between (5, 6): what a mark's own exit costs on this host
    // (the reader takes it off the loops' figures).
    sys::mark(5);
    sys::mark(6);
    let [polled, by_irq] = queues;
    for (irq, q) in [(false, &mut *polled), (true, &mut *by_irq)] {
        if irq {
            sys::set_interrupts(matches!(
                crate::wake::mode(),
                crate::wake::Mode::Spin | crate::wake::Mode::HaltPoll(_)
            ));
        }
        let before_all = crate::wake::irq_count(VECTOR);
        let ticks_before = crate::wake::irq_count(WATCHDOG);
        if irq {
            // A watchdog on a vector of its own every 100 ms: a lost interrupt then costs a
            // slow sample instead of a guest halted for good, and is seen as lost.
            crate::smp::set_lvt_timer_periodic(WATCHDOG as u8, 100_000);
        }
        // Marks around the timed reads (1, 2 polled; 3, 4 by MSI-X, the watchdog armed
        // before and stopped after): what KVM counted between them is what the reads cost.
        sys::mark(if irq { 3 } else { 1 });
        let marked_from = crate::wake::irq_count(VECTOR) + crate::wake::irq_count(WATCHDOG);
        for i in 0..n + warm {
            let before = crate::wake::irq_count(VECTOR);
            let t0 = rdtsc();
            let d = q.submit(&c.bar, read1);
            let done = if irq {
                // Wait for our vector or a watchdog tick; a wake-up with no completion
                // posted (a tick, an interrupt delivered late) waits again.
                let mut seen = before;
                loop {
                    wait_for_either(seen);
                    let t = rdtsc();
                    let msi = crate::wake::irq_count(VECTOR) != seen;
                    if let Some(r) = q.reap(&c.bar) {
                        if !msi && !msi_within(seen, grace) {
                            by_watchdog += 1;
                        }
                        break Some((r, t));
                    }
                    if t.wrapping_sub(t0) > limit {
                        break None;
                    }
                    seen = crate::wake::irq_count(VECTOR);
                }
            } else {
                q.poll(&c.bar, limit).map(|r| (r, rdtsc()))
            };
            match done {
                Some(((0, _), t)) => {
                    if i >= warm {
                        s[i - warm] = t.wrapping_sub(t0);
                        db[i - warm] = d;
                    }
                }
                Some(((st, _), _)) => {
                    sys::set_interrupts(false);
                    crate::smp::stop_lvt_timer();
                    return Err(Error::Status("a timed read", st));
                }
                None => {
                    sys::set_interrupts(false);
                    crate::smp::stop_lvt_timer();
                    let what = if irq {
                        "a read waited for by MSI-X"
                    } else {
                        "a polled read"
                    };
                    return Err(Error::Timeout(what, 1));
                }
            }
        }
        let marked_to = crate::wake::irq_count(VECTOR) + crate::wake::irq_count(WATCHDOG);
        sys::mark(if irq { 4 } else { 2 });
        sys::set_interrupts(false);
        crate::smp::stop_lvt_timer();
        let mode = if irq { "irq" } else { "poll" };
        crate::stats::summarise("nvme", "submit", "completion", mode, &mut s[..n], tsc_khz);
        if irq {
            irqs = crate::wake::irq_count(VECTOR) - before_all;
            ticks = crate::wake::irq_count(WATCHDOG) - ticks_before;
            marked = marked_to - marked_from;
        } else {
            crate::stats::summarise(
                "nvme",
                "doorbell",
                "completion",
                "none",
                &mut db[..n],
                tsc_khz,
            );
        }
    }
    // `submitted` is counted on both I/O queues (the write and read-back before and the
    // polled reads on pair 2, the reads by MSI-X on pair 1), `irqs` on the MSI-X vector
    // alone, `watchdog_ticks` on the watchdog's, `by_watchdog` the reads whose completion
    // only a tick found, `marked` the handler runs on either vector between marks 3 and 4.
    say!(
        "nvme submitted={} irqs={} watchdog_ticks={} by_watchdog={} marked={} polled_submitted={} sq_tail={} cq_head={}",
        polled.submitted + by_irq.submitted,
        irqs,
        ticks,
        by_watchdog,
        marked,
        polled.submitted,
        by_irq.tail,
        by_irq.head
    );
    if by_watchdog > 0 {
        return Err(Error::Setup(
            "reads completed with no MSI-X interrupt (the watchdog found them)",
        ));
    }
    if irqs < (n + warm) as u64 {
        return Err(Error::Setup("fewer MSI-X interrupts than reads waited for"));
    }
    Ok(())
}
