//! A large BAR above 4 GiB, read and written from the guest (`probe.bigbar=VENDOR:DEVICE`,
//! hex, e.g. `1af4:1110` for QEMU's ivshmem-plain): the shape of a GPU's VRAM aperture.
//!
//! Finds the function on bus 0, takes its largest memory BAR (sized by the BAR protocol),
//! and at three places in it (the first page, the middle, the last page) prints the first
//! 8 bytes it finds (what the host wrote there before the launch), then writes a 4 KiB
//! pattern seeded by `probe.bigbar_seed` (hex) and the place's index, reads it back and
//! prints its FNV-1a checksum. The host reads the same pages after the launch and checks
//! the checksums (tools/partition-cli/tests/vfio.rs).
//!
//! The page tables map 64 GiB..1 TiB (the VMM's 64-bit BAR window, sized to the BARs) with
//! 1 GiB pages, uncached: the probe checks CPUID for 1 GiB pages first, and that the BAR
//! ends within the guest's physical address width (CPUID 0x80000008).

use crate::bootinfo::BootInfo;
use crate::pcie::{Ecam, setup_bars};
use crate::sys::{self, peek, poke};

/// Highest address the page tables map.
const MAPPED_END: u64 = 1 << 40;

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

fn fnv1a(h: u64, x: u64) -> u64 {
    x.to_le_bytes()
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Runs when `probe.bigbar` is given. Returns true on a failure.
pub fn run(bi: &BootInfo) -> bool {
    let Some(found) = crate::pcie::named_function(bi, "bigbar", "probe.bigbar") else {
        return false;
    };
    let Some((e, slot)) = found else {
        return true;
    };
    if sys::cpuid(0x8000_0001, 0)[3] & 1 << 26 == 0 {
        say!("bigbar FAILED: no 1 GiB pages (CPUID 0x80000001 EDX.26) to map the window");
        return true;
    }
    drive(bi, e, slot)
}

fn drive(bi: &BootInfo, e: Ecam, slot: u64) -> bool {
    let mut next = 0xc000_0000;
    let bars = setup_bars(e, slot, "bigbar", &mut next);
    let Some((i, &(base, size))) = bars.iter().enumerate().max_by_key(|b| b.1.1) else {
        return true;
    };
    say!("bigbar bar{} base={:#x} size={:#x}", i, base, size);
    let width = 1u64 << (sys::cpuid(0x8000_0008, 0)[0] & 0xff);
    say!("bigbar phys_bits_end={:#x}", width);
    if size < 3 * 4096
        || base
            .checked_add(size)
            .is_none_or(|end| end > MAPPED_END || end > width)
    {
        say!(
            "bigbar FAILED: the BAR is too small, past what the probe maps or past the address width"
        );
        return true;
    }
    let seed = bi
        .arg("probe.bigbar_seed")
        .and_then(hex)
        .unwrap_or(0x6269_6762);
    let mut failed = false;
    for (k, off) in [0, size / 2, size - 4096].into_iter().enumerate() {
        let at = base + off;
        // SAFETY: inside the BAR, which the page tables map (checked above).
        let found: u64 = unsafe { peek(at) };
        let mut x = seed ^ (k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let (mut wrote, mut read) = (0xcbf2_9ce4_8422_2325u64, 0xcbf2_9ce4_8422_2325u64);
        for q in 0..512 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // SAFETY: as above.
            unsafe { poke(at + 8 * q, x) };
            wrote = fnv1a(wrote, x);
        }
        for q in 0..512 {
            // SAFETY: as above.
            read = fnv1a(read, unsafe { peek::<u64>(at + 8 * q) });
        }
        say!(
            "bigbar place={} offset={:#x} found={:#018x} written_fnv={:#018x} read_fnv={:#018x}",
            k,
            off,
            found,
            wrote,
            read
        );
        failed |= wrote != read;
    }
    failed
}
