//! The boot GDT and the segment registers that match it.
//!
//! One table serves both entry protocols:
//!
//! | selector | descriptor            | used by                     |
//! |----------|-----------------------|-----------------------------|
//! | 0x08     | 32-bit flat code      | PVH entry (CS)              |
//! | 0x10     | 64-bit code           | Linux 64-bit entry (CS)     |
//! | 0x18     | flat data             | both (DS, ES, SS, FS, GS)   |
//! | 0x20     | busy TSS (16 bytes)   | both (TR)                   |
//!
//! Linux's 64-bit boot protocol asks for `__BOOT_CS` = 0x10 and `__BOOT_DS` = 0x18. The
//! nested KVM on the development hosts also insists that the GDT lives in guest memory and
//! that TR holds a busy TSS (type 11).

use crate::layout::{GDT_ADDR, TSS_ADDR};

/// 32-bit code selector (PVH).
pub const CODE32_SEL: u16 = 0x08;
/// 64-bit code selector (Linux 64-bit boot protocol `__BOOT_CS`).
pub const CODE64_SEL: u16 = 0x10;
/// Data selector (`__BOOT_DS`).
pub const DATA_SEL: u16 = 0x18;
/// TSS selector.
pub const TSS_SEL: u16 = 0x20;

/// Access/flag words (bits 8..15 access byte, 12..15 of the second word the flags nibble),
/// in the layout `gdt_entry` takes: `0xF0FF` = flags << 12 | access.
const CODE32_FLAGS: u16 = 0xc09b; // G, D/B, present, code, read, accessed
const CODE64_FLAGS: u16 = 0xa09b; // G, L, present, code, read, accessed
const DATA_FLAGS: u16 = 0xc093; // G, D/B, present, data, write, accessed
const TSS_FLAGS: u16 = 0x008b; // present, busy TSS (type 11)

/// The boot GDT, as 64-bit words (the TSS descriptor takes two).
pub fn boot_gdt() -> [u64; 6] {
    let (tss_lo, tss_hi) = system_entry(TSS_FLAGS, TSS_ADDR, 0x67);
    [
        0,
        gdt_entry(CODE32_FLAGS, 0, 0xfffff),
        gdt_entry(CODE64_FLAGS, 0, 0xfffff),
        gdt_entry(DATA_FLAGS, 0, 0xfffff),
        tss_lo,
        tss_hi,
    ]
}

/// Where [`boot_gdt`] goes, and its limit for GDTR.
pub const GDT_BASE: u64 = GDT_ADDR;
/// GDTR limit for [`boot_gdt`].
pub const GDT_LIMIT: u16 = (6 * 8 - 1) as u16;

/// Encodes an 8-byte segment descriptor. `flags` = (flags nibble << 12) | access byte.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << (56 - 24))
        | ((flags as u64 & 0x0000_f0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << (48 - 16))
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// Encodes a 16-byte system descriptor (TSS/LDT) with a 64-bit base.
pub const fn system_entry(flags: u16, base: u64, limit: u32) -> (u64, u64) {
    (gdt_entry(flags, base as u32, limit), base >> 32)
}

/// A segment register's hidden state, decoded from a descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    /// Base address.
    pub base: u64,
    /// Limit in bytes (already scaled by granularity).
    pub limit: u32,
    /// Selector.
    pub selector: u16,
    /// Descriptor type (4 bits).
    pub type_: u8,
    /// Present.
    pub present: u8,
    /// Privilege level.
    pub dpl: u8,
    /// Default operand size.
    pub db: u8,
    /// Code/data (1) or system (0).
    pub s: u8,
    /// 64-bit code.
    pub l: u8,
    /// Granularity.
    pub g: u8,
    /// Available bit.
    pub avl: u8,
}

/// Decodes descriptor `entry` loaded through `selector`.
pub const fn segment_from_entry(entry: u64, selector: u16) -> Segment {
    let base = ((entry >> 16) & 0x00ff_ffff) | ((entry >> 32) & 0xff00_0000);
    let raw_limit = ((entry & 0xffff) | ((entry >> 32) & 0x000f_0000)) as u32;
    let g = ((entry >> 55) & 1) as u8;
    let limit = if g == 1 {
        (raw_limit << 12) | 0xfff
    } else {
        raw_limit
    };
    Segment {
        base,
        limit,
        selector,
        type_: ((entry >> 40) & 0xf) as u8,
        present: ((entry >> 47) & 1) as u8,
        dpl: ((entry >> 45) & 3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g,
        avl: ((entry >> 52) & 1) as u8,
    }
}

/// The segment for `selector` in [`boot_gdt`] (TSS base includes the high half).
pub fn boot_segment(selector: u16) -> Segment {
    let gdt = boot_gdt();
    let idx = (selector >> 3) as usize;
    let mut seg = segment_from_entry(gdt[idx], selector);
    if selector == TSS_SEL {
        seg.base |= gdt[idx + 1] << 32;
    }
    seg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_encodings() {
        // The classic flat descriptors.
        assert_eq!(gdt_entry(0xa09b, 0, 0xfffff), 0x00af_9b00_0000_ffff);
        assert_eq!(gdt_entry(0xc09b, 0, 0xfffff), 0x00cf_9b00_0000_ffff);
        assert_eq!(gdt_entry(0xc093, 0, 0xfffff), 0x00cf_9300_0000_ffff);
    }

    #[test]
    fn decode_round_trips() {
        let e = gdt_entry(0x808b, 0x1234_5678, 0xabcde);
        let s = segment_from_entry(e, 0x20);
        assert_eq!(s.base, 0x1234_5678);
        assert_eq!(s.limit, 0xabcd_efff);
        assert_eq!(s.type_, 0xb);
        assert_eq!((s.present, s.g, s.s, s.l, s.db), (1, 1, 0, 0, 0));
    }

    #[test]
    fn boot_segments_are_what_linux_wants() {
        let cs = boot_segment(CODE64_SEL);
        assert_eq!((cs.l, cs.db, cs.present, cs.s, cs.type_), (1, 0, 1, 1, 0xb));
        let cs32 = boot_segment(CODE32_SEL);
        assert_eq!((cs32.l, cs32.db, cs32.limit), (0, 1, 0xffff_ffff));
        let ds = boot_segment(DATA_SEL);
        assert_eq!((ds.type_, ds.limit, ds.base), (3, 0xffff_ffff, 0));
        let tr = boot_segment(TSS_SEL);
        assert_eq!(
            (tr.type_, tr.s, tr.base, tr.limit),
            (0xb, 0, TSS_ADDR, 0x67)
        );
    }
}
