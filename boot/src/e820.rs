//! The e820 memory map a guest is handed: exactly its RAM, nothing more, nothing less.
//!
//! Every byte of the partition's memory appears in exactly one entry; the only gap is the
//! MMIO hole. The low firmware area (MP table, ACPI) is RAM marked reserved so the guest
//! keeps its hands off it.

use crate::layout::{HIMEM_START, LOW_RESERVED_START, MemoryLayout};

/// e820 type: usable RAM.
pub const E820_RAM: u32 = 1;
/// e820 type: reserved.
pub const E820_RESERVED: u32 = 2;

/// Most entries we ever produce.
pub const MAX_ENTRIES: usize = 8;

/// One e820 entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E820Entry {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// [`E820_RAM`] or [`E820_RESERVED`].
    pub kind: u32,
}

impl E820Entry {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.addr + self.size
    }
}

/// Builds the e820 map for `layout`.
pub fn build(layout: &MemoryLayout) -> heapless::Vec<E820Entry, MAX_ENTRIES> {
    let mut map = heapless::Vec::new();
    let mut push = |addr, size, kind| {
        if size > 0 {
            // Cannot overflow: at most five entries.
            let _ = map.push(E820Entry { addr, size, kind });
        }
    };
    for r in layout.ram_ranges() {
        if r.guest_addr == 0 {
            // MemoryLayout guarantees the low range reaches past HIMEM_START.
            push(0, LOW_RESERVED_START, E820_RAM);
            push(
                LOW_RESERVED_START,
                HIMEM_START - LOW_RESERVED_START,
                E820_RESERVED,
            );
            push(HIMEM_START, r.end() - HIMEM_START, E820_RAM);
        } else {
            push(r.guest_addr, r.len, E820_RAM);
        }
    }
    map
}

/// Total bytes covered by `map` (every type).
pub fn total(map: &[E820Entry]) -> u64 {
    map.iter().map(|e| e.size).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{MMIO_HOLE_END, MMIO_HOLE_START};

    #[test]
    fn map_covers_exactly_the_memory() {
        for size in [
            8u64 << 20,
            128 << 20,
            3 << 30,
            (3 << 30) + (2 << 20),
            8 << 30,
        ] {
            let l = MemoryLayout::new(size).unwrap();
            let m = build(&l);
            assert_eq!(total(&m), size, "size {size}");
            // Sorted, non-overlapping.
            for w in m.windows(2) {
                assert!(w[0].end() <= w[1].addr);
            }
            // Nothing in the hole.
            assert!(
                m.iter()
                    .all(|e| e.end() <= MMIO_HOLE_START || e.addr >= MMIO_HOLE_END)
            );
        }
    }

    #[test]
    fn low_area_is_reserved() {
        let m = build(&MemoryLayout::new(128 << 20).unwrap());
        assert_eq!(
            m.as_slice(),
            &[
                E820Entry {
                    addr: 0,
                    size: 0x9fc00,
                    kind: E820_RAM
                },
                E820Entry {
                    addr: 0x9fc00,
                    size: 0x100000 - 0x9fc00,
                    kind: E820_RESERVED
                },
                E820Entry {
                    addr: 0x100000,
                    size: (128 << 20) - 0x100000,
                    kind: E820_RAM
                },
            ]
        );
    }
}
