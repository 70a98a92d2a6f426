//! PCI functions on the partition's ECAM, as every driver in the probe finds them: walk
//! bus 0, size and place BARs, find capabilities, program an MSI-X entry.

use crate::bootinfo::BootInfo;
use crate::sys::{peek, poke};

pub const CAP_MSIX: u8 = 0x11;
/// Bus 0 through ECAM.
#[derive(Clone, Copy)]
pub struct Ecam(pub u64);

impl Ecam {
    fn at(self, slot: u64, off: u64) -> u64 {
        self.0 + (slot << 15) + off
    }
    /// A 4-byte configuration read.
    pub fn read(self, slot: u64, off: u64) -> u32 {
        // SAFETY: the ECAM window the MCFG table names (identity mapped, uncached).
        unsafe { peek(self.at(slot, off)) }
    }
    /// A 4-byte configuration write.
    pub fn write(self, slot: u64, off: u64, v: u32) {
        // SAFETY: as `read`.
        unsafe { poke(self.at(slot, off), v) }
    }
}

/// The ECAM base for bus 0: `probe.ecam=ADDR` (hex) if given (QEMU's microvm describes its
/// ECAM only in the DSDT), else the MCFG table's.
pub fn ecam(bi: &BootInfo) -> Option<Ecam> {
    if let Some(a) = bi.arg("probe.ecam") {
        let a = u64::from_str_radix(a.trim_start_matches("0x"), 16).ok()?;
        return (a != 0 && a % (1 << 20) == 0 && a < 1 << 36).then_some(Ecam(a));
    }
    let rsdp = crate::firmware::find_rsdp(bi.rsdp)?;
    let mcfg = crate::firmware::find_table(rsdp, b"MCFG")?;
    // SAFETY: find_table checked the table's signature, length and checksum.
    let (len, base, seg, bus) = unsafe {
        (
            peek::<u32>(mcfg + 4),
            peek::<u64>(mcfg + 44),
            peek::<u16>(mcfg + 52),
            peek::<u8>(mcfg + 54),
        )
    };
    (len >= 60 && seg == 0 && bus == 0 && base != 0 && base < 1 << 36).then_some(Ecam(base))
}

/// Sizes BAR `i` (memory decoding must be off) and returns (base, size, 64-bit).
fn size_bar(e: Ecam, slot: u64, i: u64) -> (u64, u64, bool) {
    let off = 0x10 + 4 * i;
    let lo = e.read(slot, off);
    let is64 = lo & 0b110 == 0b100;
    let hi = if is64 { e.read(slot, off + 4) } else { 0 };
    e.write(slot, off, u32::MAX);
    let mut mask = u64::from(e.read(slot, off) & !0xf);
    if is64 {
        e.write(slot, off + 4, u32::MAX);
        mask |= u64::from(e.read(slot, off + 4)) << 32;
        e.write(slot, off + 4, hi);
    } else {
        mask |= 0xffff_ffff_0000_0000;
    }
    e.write(slot, off, lo);
    let base = u64::from(lo & !0xf) | u64::from(hi) << 32;
    let size = if mask & !0xffff_ffff_0000_0000 == 0 && !is64 {
        0
    } else {
        (!mask).wrapping_add(1)
    };
    (base, size, is64)
}

/// Functions found on bus 0: (slot, vendor, device).
pub struct Found {
    items: [(u64, u16, u16); 32],
    len: usize,
}

impl Found {
    /// The slot of the first `vendor:device`.
    pub fn slot(&self, vendor: u16, device: u16) -> Option<u64> {
        self.items[..self.len]
            .iter()
            .find(|&&(_, v, d)| v == vendor && d == device)
            .map(|x| x.0)
    }
}

/// The function the argument `arg` (`VENDOR:DEVICE`, hex) names on bus 0, with the ECAM
/// it is reached through: None when `arg` is absent. A malformed argument, a host bridge
/// without MCFG or a function not on the bus is said as `<test> FAILED: ...` and gives
/// `Some(None)` (the caller fails the run).
pub fn named_function(bi: &BootInfo, test: &str, arg: &str) -> Option<Option<(Ecam, u64)>> {
    let want = bi.arg(arg)?;
    let hex = |s: &str| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let Some((vendor, device)) = want
        .split_once(':')
        .and_then(|(v, d)| Some((hex(v)?, hex(d)?)))
    else {
        say!("{} FAILED: {}={} is not VENDOR:DEVICE", test, arg, want);
        return Some(None);
    };
    let Some(e) = ecam(bi) else {
        say!("{} FAILED: no MCFG table", test);
        return Some(None);
    };
    let Some(slot) = (0..32).find(|&s| e.read(s, 0) == device << 16 | vendor) else {
        say!("{} FAILED: no {:04x}:{:04x} on bus 0", test, vendor, device);
        return Some(None);
    };
    Some(Some((e, slot)))
}

/// Lists bus 0 through `e`.
pub fn enumerate(e: Ecam) -> Found {
    let mut f = Found {
        items: [(0, 0, 0); 32],
        len: 0,
    };
    for slot in 0..32 {
        let id = e.read(slot, 0);
        if id & 0xffff == 0xffff {
            continue;
        }
        let class = e.read(slot, 8) >> 8;
        say!(
            "pci 00:{:02x}.0 vendor={:#06x} device={:#06x} class={:#08x}",
            slot,
            id & 0xffff,
            id >> 16,
            class
        );
        // The PCIe extended capabilities past 0x100, as the chain links them.
        let mut at = 0x100;
        for _ in 0..64 {
            let h = e.read(slot, at);
            if h == 0 || h == u32::MAX {
                break;
            }
            say!(
                "pci 00:{:02x}.0 ext_cap at={:#x} id={:#06x} version={}",
                slot,
                at,
                h & 0xffff,
                (h >> 16) & 0xf
            );
            at = u64::from(h >> 20) & !3;
            if at < 0x100 {
                break;
            }
        }
        f.items[f.len] = (slot, id as u16, (id >> 16) as u16);
        f.len += 1;
    }
    f
}

/// Sizes every BAR of `slot` (decoding off), gives an address from `*next` to a memory BAR
/// that has none (QEMU's microvm leaves BARs unassigned, as Linux assigns them itself),
/// turns memory decoding and bus mastering on, and returns (base, size) per BAR (I/O BARs
/// are left alone and reported with size 0).
pub fn setup_bars(e: Ecam, slot: u64, name: &str, next: &mut u64) -> [(u64, u64); 6] {
    let cmd = e.read(slot, 4) & 0xffff;
    e.write(slot, 4, cmd & !0b111);
    let mut bars = [(0u64, 0u64); 6];
    let mut i = 0;
    while i < 6 {
        let raw = e.read(slot, 0x10 + 4 * i);
        if raw & 1 == 1 {
            i += 1;
            continue;
        }
        let (mut base, size, is64) = size_bar(e, slot, i);
        if size != 0 && base == 0 {
            base = next.next_multiple_of(size);
            *next = base + size;
            e.write(slot, 0x10 + 4 * i, base as u32 | (raw & 0xf));
            if is64 {
                e.write(slot, 0x14 + 4 * i, (base >> 32) as u32);
            }
        }
        bars[i as usize] = (base, size);
        if size != 0 {
            say!(
                "pci {} bar{} base={:#x} size={:#x} {}",
                name,
                i,
                base,
                size,
                if is64 { "64-bit" } else { "32-bit" }
            );
        }
        i += if is64 { 2 } else { 1 };
    }
    e.write(slot, 4, cmd | 0b110);
    bars
}

/// The offset of capability `id` in `slot`'s list, if present.
pub fn find_cap(e: Ecam, slot: u64, id: u8) -> Option<u64> {
    let mut cap = (e.read(slot, 0x34) & 0xfc) as u64;
    for _ in 0..48 {
        if cap == 0 {
            return None;
        }
        let h = e.read(slot, cap);
        if h & 0xff == u32::from(id) {
            return Some(cap);
        }
        cap = ((h >> 8) & 0xfc) as u64;
    }
    None
}

/// Programs the MSI-X table entry at `entry` (an address inside the BAR the capability at
/// `cap` names) for fixed delivery of `vector` to `apic`, unmasked, then turns MSI-X on.
pub fn enable_msix_entry(e: Ecam, slot: u64, cap: u64, entry: u64, apic: u32, vector: u32) {
    // SAFETY: the caller's entry of the MSI-X table, in a BAR placed and sized by us.
    unsafe {
        poke::<u32>(entry, 0xfee0_0000 | (apic & 0xff) << 12);
        poke::<u32>(entry + 4, 0);
        poke::<u32>(entry + 8, vector);
        poke::<u32>(entry + 12, 0);
    }
    let control = e.read(slot, cap) >> 16;
    e.write(
        slot,
        cap,
        (e.read(slot, cap) & 0xffff) | (control | 0x8000) << 16,
    );
}

/// Prints `engine test=NAME completion=MODE n= median_ns= p99_ns= min_ns= max_ns=`.
pub fn summarise(test: &str, mode: &str, s: &mut [u64], tsc_khz: u64) {
    crate::stats::summarise("engine", test, "completion", mode, s, tsc_khz);
}
