//! Write a pattern over usable RAM, read it back, report a checksum anyone can recompute.
//!
//! Word at address `a` holds `splitmix64(a ^ seed)`; the checksum is the wrapping sum of
//! the words read back. The VMM's tests recompute it from the ranges printed.

use crate::sys::{peek, poke};

/// The pattern word for address `a`.
#[inline(always)]
pub fn pattern(a: u64, seed: u64) -> u64 {
    let mut z = (a ^ seed).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Result over one range.
#[derive(Default, Clone, Copy)]
pub struct Outcome {
    /// Bytes tested.
    pub bytes: u64,
    /// Wrapping sum of the words read back.
    pub checksum: u64,
    /// Words that did not read back as written.
    pub errors: u64,
    /// First bad address, if any.
    pub first_bad: Option<u64>,
}

/// Tests `[start, end)` (8-byte aligned).
///
/// # Safety
/// The range must be RAM that nothing else uses.
pub unsafe fn test_range(start: u64, end: u64, seed: u64) -> Outcome {
    let mut out = Outcome::default();
    let mut a = start;
    while a < end {
        // SAFETY: the caller owns [start, end).
        unsafe { poke::<u64>(a, pattern(a, seed)) };
        a += 8;
    }
    a = start;
    while a < end {
        // SAFETY: as above.
        let v: u64 = unsafe { peek(a) };
        if v != pattern(a, seed) {
            out.errors += 1;
            out.first_bad.get_or_insert(a);
        }
        out.checksum = out.checksum.wrapping_add(v);
        a += 8;
    }
    out.bytes = end - start;
    out
}

/// Counts non-zero 8-byte words in `[start, end)`; returns (count, first such address).
///
/// # Safety
/// The range must be mapped RAM.
pub unsafe fn nonzero_words(start: u64, end: u64) -> (u64, Option<u64>) {
    let mut n = 0;
    let mut first = None;
    let mut a = start;
    while a < end {
        // SAFETY: the caller guarantees the range is mapped.
        if unsafe { peek::<u64>(a) } != 0 {
            n += 1;
            first.get_or_insert(a);
        }
        a += 8;
    }
    (n, first)
}
