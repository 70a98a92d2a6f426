//! The e820 memory map a guest is handed: exactly its RAM, nothing more, nothing less.
//!
//! Every byte of the partition's memory appears in exactly one entry; the only gap is the
//! MMIO hole. The low firmware area (MP table, ACPI) is RAM marked reserved so the guest
//! keeps its hands off it. Inside the hole, ranges the guest must leave alone (a PCI ECAM
//! window, which Linux accepts only when it is reserved here) can be added as reserved.

use crate::layout::{
    HIMEM_START, LOW_RESERVED_START, MMIO_HOLE_END, MMIO_HOLE_START, MemoryLayout,
};

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

/// A reserved range that cannot go into the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E820Error {
    /// Start.
    pub addr: u64,
    /// Length.
    pub size: u64,
}

impl core::error::Error for E820Error {}

impl core::fmt::Display for E820Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "e820: reserved range {:#x}+{:#x} is not inside the MMIO hole, overlaps another, \
             or the map is full",
            self.addr, self.size
        )
    }
}

/// [`build`], plus `reserved` ranges (address, size), each inside the MMIO hole and not
/// overlapping another.
pub fn build_with(
    layout: &MemoryLayout,
    reserved: &[(u64, u64)],
) -> Result<heapless::Vec<E820Entry, MAX_ENTRIES>, E820Error> {
    let mut map = build(layout);
    for &(addr, size) in reserved {
        let err = E820Error { addr, size };
        let end = addr.checked_add(size).ok_or(err)?;
        if size == 0 || addr < MMIO_HOLE_START || end > MMIO_HOLE_END {
            return Err(err);
        }
        if map.iter().any(|e| addr < e.end() && e.addr < end) {
            return Err(err);
        }
        map.push(E820Entry {
            addr,
            size,
            kind: E820_RESERVED,
        })
        .map_err(|_| err)?;
    }
    map.sort_unstable_by_key(|e| e.addr);
    Ok(map)
}

/// Total bytes covered by `map` (every type).
pub fn total(map: &[E820Entry]) -> u64 {
    map.iter().map(|e| e.size).sum()
}

/// Bytes of the partition's memory in `map`: every entry outside the MMIO hole.
pub fn memory(map: &[E820Entry]) -> u64 {
    map.iter()
        .filter(|e| e.end() <= MMIO_HOLE_START || e.addr >= MMIO_HOLE_END)
        .map(|e| e.size)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{PCI_ECAM_BASE, PCI_ECAM_SIZE};

    #[test]
    fn reserved_ranges_go_in_the_hole_and_nowhere_else() {
        let l = MemoryLayout::new(8 << 30).unwrap();
        let m = build_with(&l, &[(PCI_ECAM_BASE, PCI_ECAM_SIZE)]).unwrap();
        assert_eq!(m.len(), build(&l).len() + 1);
        for w in m.windows(2) {
            assert!(w[0].end() <= w[1].addr, "sorted: {m:?}");
        }
        let ecam = m.iter().find(|e| e.addr == PCI_ECAM_BASE).unwrap();
        assert_eq!((ecam.size, ecam.kind), (PCI_ECAM_SIZE, E820_RESERVED));
        assert_eq!(memory(&m), 8 << 30);
        assert_eq!(total(&m), (8 << 30) + PCI_ECAM_SIZE);
        // Outside the hole, overlapping, empty, wrapping.
        for bad in [
            (0x10_0000, 0x1000),
            (MMIO_HOLE_END - 0x1000, 0x2000),
            (PCI_ECAM_BASE, 0),
            (u64::MAX - 1, 4),
        ] {
            assert_eq!(
                build_with(&l, &[bad]),
                Err(E820Error {
                    addr: bad.0,
                    size: bad.1
                })
            );
        }
        let twice = [
            (PCI_ECAM_BASE, PCI_ECAM_SIZE),
            (PCI_ECAM_BASE + 0x1000, 0x1000),
        ];
        assert!(build_with(&l, &twice).is_err());
    }

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
