//! A passed-through function's expansion ROM read through its ROM BAR
//! (`probe.rom=VENDOR:DEVICE`, hex, e.g. `8086:10d3` for QEMU's e1000e): the way a guest
//! driver reads a GPU's VBIOS.
//!
//! Finds the function on bus 0 and sizes its ROM BAR (all ones to 0x30, read back, the
//! old value put back). No ROM: prints `rom none`. Otherwise reads the ROM's first dword
//! with the enable bit clear (nothing may answer: all ones), sets the enable bit with
//! memory decoding on, reads the whole ROM 8 bytes at a time and prints its size, the
//! signature of its first image (0xaa55) and the FNV-1a checksum of every byte; the host
//! compares it with the function's sysfs `rom` (tools/partition-cli/tests/vfio.rs).

use crate::bootinfo::BootInfo;
use crate::sys::peek;

const ROM_REG: u64 = 0x30;
const ROM_ADDR_MASK: u32 = 0xffff_f800;

/// Runs when `probe.rom` is given. Returns true on a failure.
pub fn run(bi: &BootInfo) -> bool {
    let Some(found) = crate::pcie::named_function(bi, "rom", "probe.rom") else {
        return false;
    };
    let Some((e, slot)) = found else {
        return true;
    };
    let old = e.read(slot, ROM_REG);
    e.write(slot, ROM_REG, ROM_ADDR_MASK);
    let mask = e.read(slot, ROM_REG) & ROM_ADDR_MASK;
    e.write(slot, ROM_REG, old & !1);
    if mask == 0 {
        say!("rom none slot={}", slot);
        return false;
    }
    let size = u64::from(!mask) + 1;
    let base = u64::from(old & ROM_ADDR_MASK);
    if base == 0 || base + size > 1 << 32 {
        say!("rom FAILED: the VMM placed it at {:#x}", base);
        return true;
    }
    let cmd = e.read(slot, 4) & 0xffff;
    e.write(slot, 4, cmd | 0b10);
    // SAFETY: inside the 32-bit MMIO hole, mapped uncached; with the ROM off nothing
    // decodes there and the read answers all ones.
    let off: u32 = unsafe { peek(base) };
    e.write(slot, ROM_REG, base as u32 | 1);
    let mut fnv = 0xcbf2_9ce4_8422_2325u64;
    let mut first = 0u64;
    let mut at = 0;
    while at < size {
        // SAFETY: inside the ROM BAR, which the VMM answers while it is enabled.
        let q: u64 = unsafe { peek(base + at) };
        if at == 0 {
            first = q;
        }
        for b in q.to_le_bytes() {
            fnv = (fnv ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        at += 8;
    }
    e.write(slot, ROM_REG, old & !1);
    say!(
        "rom slot={} base={:#x} size={:#x} off_read={:#010x} signature={:#06x} fnv={:#018x}",
        slot,
        base,
        size,
        off,
        first & 0xffff,
        fnv
    );
    off != u32::MAX
}
