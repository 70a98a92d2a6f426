//! Drivers for QEMU's own PCI test devices, the peers of our submission engine
//! (`probe.engine=edu,testdev` on QEMU's microvm with `pcie=on` and `probe.ecam=0xe0000000`):
//!
//! - `testdev`: QEMU's `pci-testdev` (1b36:0005), the device KVM's unit tests use for
//!   ioeventfd. Its MMIO BAR holds numbered tests; a test is selected by writing its number
//!   at offset 0, and then a 1-byte write of the test's data at the test's offset is a
//!   doorbell: `no-eventfd` traps to QEMU, which counts it; `wildcard-eventfd` is an
//!   ioeventfd KVM answers in the kernel (nothing counts it). We time the doorbell write,
//!   as the engine's `test=doorbell` row does.
//! - `edu`: QEMU's `edu` (1234:11e8), an MMIO register file with a worker thread: writing
//!   n to the factorial register (an exit to QEMU) wakes the thread, which computes n! and,
//!   if asked, raises an MSI. We time write-to-result, the driver polling the status
//!   register (each read an exit) or waiting for the MSI: the peer of the engine's trapping
//!   doorbell with a polled fence or MSI-X.

use crate::pcie::{Ecam, Found, find_cap, setup_bars, summarise};
use crate::sys::{self, peek, poke, rdtsc};

const MAX_N: usize = sys::SAMPLES;
/// The vector edu's MSI arrives on.
const EDU_VECTOR: usize = 0x61;

/// Times `n` (after a tenth as warm-up) runs of `f`, which returns its own cycles or None
/// when it failed.
fn timed(
    n: usize,
    mut f: impl FnMut() -> Option<u64>,
) -> Option<(&'static mut [u64; MAX_N], usize)> {
    let warm = n / 10;
    // SAFETY: the BSP runs this; callers drop the previous borrow before calling again.
    let buf = unsafe { sys::scratch(0) };
    for i in 0..n + warm {
        let c = f()?;
        if i >= warm {
            buf[i - warm] = c;
        }
    }
    Some((buf, n))
}

/// QEMU's pci-testdev: the doorbell write, trapping and through an ioeventfd.
pub fn testdev(e: Ecam, found: &Found, n: usize, tsc_khz: u64) -> bool {
    let Some(slot) = found.slot(0x1b36, 0x0005) else {
        say!("peer FAILED: no pci-testdev (1b36:0005) on bus 0");
        return true;
    };
    let mut next = 0xc000_0000;
    let bars = setup_bars(e, slot, "testdev", &mut next);
    let (base, size) = bars[0];
    if size < 4096 {
        say!("peer FAILED: pci-testdev BAR 0 is {:#x} bytes", size);
        return true;
    }
    let mut failed = false;
    for (test, name) in [(0u8, "no-eventfd"), (1u8, "wildcard-eventfd")] {
        // SAFETY: BAR 0 of the test device, sized and placed above.
        let (offset, data) = unsafe {
            poke::<u8>(base, test);
            (peek::<u32>(base + 4), peek::<u8>(base + 8))
        };
        if u64::from(offset) >= size {
            say!("peer FAILED: pci-testdev {} offset {:#x}", name, offset);
            failed = true;
            continue;
        }
        let r = timed(n, || {
            let t0 = rdtsc();
            // SAFETY: the test's doorbell byte inside BAR 0.
            unsafe { poke::<u8>(base + u64::from(offset), data) };
            Some(rdtsc().wrapping_sub(t0))
        });
        // SAFETY: the count field of the selected test.
        let count = unsafe { peek::<u32>(base + 12) };
        if let Some((buf, n)) = r {
            summarise("testdev", name, &mut buf[..n], tsc_khz);
        }
        say!("peer testdev test={} counted={}", name, count);
        // The trapping test counts every write; an ioeventfd one counts none.
        let warm = n / 10;
        let want = if test == 0 { (n + warm) as u32 } else { 0 };
        if count != want {
            say!(
                "peer FAILED: testdev {} counted {} of {}",
                name,
                count,
                want
            );
            failed = true;
        }
    }
    failed
}

/// Programs `slot`'s MSI capability to `apic`/`vector`. False when it has none.
fn program_msi(e: Ecam, slot: u64, apic: u32, vector: usize) -> bool {
    let Some(cap) = find_cap(e, slot, 0x05) else {
        return false;
    };
    let control = e.read(slot, cap) >> 16;
    let is64 = control & 0x80 != 0;
    e.write(slot, cap + 4, 0xfee0_0000 | (apic & 0xff) << 12);
    let data_at = if is64 {
        e.write(slot, cap + 8, 0);
        cap + 12
    } else {
        cap + 8
    };
    e.write(slot, data_at, vector as u32);
    // Enable, one message.
    e.write(
        slot,
        cap,
        (e.read(slot, cap) & 0xffff) | ((control & !0x70) | 1) << 16,
    );
    true
}

/// QEMU's edu: a factorial written, computed by its thread, read back.
pub fn edu(e: Ecam, found: &Found, n: usize, tsc_khz: u64, apic: u32) -> bool {
    let Some(slot) = found.slot(0x1234, 0x11e8) else {
        say!("peer FAILED: no edu (1234:11e8) on bus 0");
        return true;
    };
    let mut next = 0xc000_0000;
    let bars = setup_bars(e, slot, "edu", &mut next);
    let base = bars[0].0;
    let rd = |o: u64| -> u32 {
        // SAFETY: edu's BAR 0 register file, placed above.
        unsafe { peek(base + o) }
    };
    let wr = |o: u64, v: u32| {
        // SAFETY: as `rd`.
        unsafe { poke(base + o, v) }
    };
    if bars[0].1 == 0 || rd(0) & 0xff != 0xed || {
        wr(4, 0x1234_5678);
        rd(4) != !0x1234_5678
    } {
        say!("peer FAILED: edu does not answer (id {:#x})", rd(0));
        return true;
    }
    if !program_msi(e, slot, apic, EDU_VECTOR) {
        say!("peer FAILED: edu has no MSI capability");
        return true;
    }
    let mut failed = false;
    let limit = tsc_khz.saturating_mul(2000);
    // Polled: the status register's "computing" bit, each read an exit.
    wr(0x20, 0);
    let poll = timed(n, || {
        let t0 = rdtsc();
        wr(0x08, 4);
        while rd(0x20) & 1 != 0 {
            if rdtsc().wrapping_sub(t0) > limit {
                return None;
            }
        }
        let c = rdtsc().wrapping_sub(t0);
        (rd(0x08) == 24).then_some(c)
    });
    match poll {
        Some((buf, n)) => summarise("edu", "poll", &mut buf[..n], tsc_khz),
        None => {
            say!("peer FAILED: edu polled factorial did not complete");
            failed = true;
        }
    }
    // MSI: edu raises it when its thread finishes, if status bit 7 is set.
    wr(0x20, 0x80);
    sys::set_interrupts(matches!(
        crate::wake::mode(),
        crate::wake::Mode::Spin | crate::wake::Mode::HaltPoll(_)
    ));
    let irq = timed(n, || {
        let before = crate::wake::irq_count(EDU_VECTOR);
        let t0 = rdtsc();
        wr(0x08, 4);
        while crate::wake::irq_count(EDU_VECTOR) == before {
            crate::wake::wait_word(
                crate::wake::irq_count_addr(EDU_VECTOR),
                before,
                crate::wake::mode(),
            );
            if rdtsc().wrapping_sub(t0) > limit {
                return None;
            }
        }
        let c = rdtsc().wrapping_sub(t0);
        // Acknowledge what raised it (not timed).
        let st = rd(0x24);
        wr(0x64, st);
        (rd(0x08) == 24).then_some(c)
    });
    sys::set_interrupts(false);
    wr(0x20, 0);
    match irq {
        Some((buf, n)) => summarise("edu", "irq", &mut buf[..n], tsc_khz),
        None => {
            say!("peer FAILED: edu MSI did not arrive");
            failed = true;
        }
    }
    failed
}
