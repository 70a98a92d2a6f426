//! Guest physical address map shared by the VMM and the guest structures.
//!
//! ```text
//! 0x0000_0500  GDT (boot)                 0x0000_9000  PML4, PDPT, 4 PDs (identity 0..4 GiB)
//! 0x0000_0580  TSS (boot)                 0x0002_0000  kernel command line
//! 0x0000_6000  PVH hvm_start_info + memmap
//! 0x0000_7000  zero page (boot_params)    0x0009_fc00 .. 0x0010_0000  reserved (e820 type 2):
//! 0x0000_8ff0  boot stack top                 0x000e_0000 ACPI (RSDP first), 0x000f_0000 MP table
//! 0x0010_0000  high memory: kernel, initrd, the rest of RAM
//! 0xc000_0000 .. 0x1_0000_0000  MMIO hole (IOAPIC 0xfec0_0000, LAPIC 0xfee0_0000, virtio-mmio)
//! 0x1_0000_0000  RAM above the hole, when the guest has more than 3 GiB
//! ```
//!
//! Everything here is plain arithmetic and builds without `std`.

/// Where the boot GDT lives.
pub const GDT_ADDR: u64 = 0x500;
/// A 104-byte TSS that TR points at during boot (never used by a guest that sets its own).
pub const TSS_ADDR: u64 = 0x580;
/// PVH `hvm_start_info`, followed by its memory map.
pub const PVH_INFO_ADDR: u64 = 0x6000;
/// The PVH memory map array, right after the start info.
pub const PVH_MEMMAP_ADDR: u64 = 0x6040;
/// The Linux zero page (`struct boot_params`).
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Initial stack pointer for the 64-bit entry.
pub const BOOT_STACK_TOP: u64 = 0x8ff0;
/// Level-4 page table; the PDPT and four page directories follow it page by page.
pub const PML4_ADDR: u64 = 0x9000;
/// Page-directory-pointer table.
pub const PDPT_ADDR: u64 = 0xa000;
/// First of four page directories (2 MiB pages) that identity-map 0..4 GiB.
pub const PD_ADDR: u64 = 0xb000;
/// End of the page-table area.
pub const PAGE_TABLES_END: u64 = 0xf000;
/// Kernel command line.
pub const CMDLINE_ADDR: u64 = 0x20000;
/// Largest command line we place (Linux on x86 uses COMMAND_LINE_SIZE = 2048).
pub const CMDLINE_MAX: usize = 2048;
/// Start of the reserved low area that holds the firmware-style tables.
pub const LOW_RESERVED_START: u64 = 0x9_fc00;
/// ACPI tables; RSDP first, on a 16-byte boundary inside 0xe0000..0x100000 so a scan finds it.
pub const ACPI_ADDR: u64 = 0xe_0000;
/// Space for the ACPI tables.
pub const ACPI_MAX: usize = 0x1_0000;
/// Intel MP table (floating pointer first), inside the BIOS ROM area an MP scan covers.
pub const MPTABLE_ADDR: u64 = 0xf_0000;
/// Space for the MP table.
pub const MPTABLE_MAX: usize = 0x1_0000;
/// Start of "high memory": kernels and initrds load at or above it.
pub const HIMEM_START: u64 = 0x10_0000;
/// Start of the 32-bit MMIO hole.
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
/// End of the 32-bit MMIO hole.
pub const MMIO_HOLE_END: u64 = 0x1_0000_0000;
/// IOAPIC MMIO base.
pub const IOAPIC_ADDR: u64 = 0xfec0_0000;
/// Local APIC MMIO base.
pub const LAPIC_ADDR: u64 = 0xfee0_0000;
/// Start of the PCI BAR window (32-bit memory BARs are placed in
/// `[PCI_WINDOW_START, PCI_WINDOW_END)`), the bottom of the MMIO hole.
pub const PCI_WINDOW_START: u64 = MMIO_HOLE_START;
/// End of the PCI BAR window, where the virtio-mmio windows start.
pub const PCI_WINDOW_END: u64 = VIRTIO_MMIO_BASE;
/// Start of the 64-bit PCI BAR window: 64-bit prefetchable BARs (a GPU's VRAM aperture,
/// which rarely fits below 4 GiB) are placed in `[PCI_WINDOW64_START, PCI_WINDOW64_END)`,
/// above the most memory a guest can have ([`MAX_MEMORY`] plus the hole) and inside 38
/// address bits.
pub const PCI_WINDOW64_START: u64 = 64 << 30;
/// End of the 64-bit PCI BAR window.
pub const PCI_WINDOW64_END: u64 = 128 << 30;
/// ECAM of PCI segment 0, bus 0 (1 MiB: 32 devices × 8 functions × 4 KiB), described by the
/// MCFG table and reserved in the e820 map.
pub const PCI_ECAM_BASE: u64 = 0xe000_0000;
/// Size of [`PCI_ECAM_BASE`]'s window.
pub const PCI_ECAM_SIZE: u64 = 1 << 20;
/// First address handed out to virtio-mmio devices (each window's size is the device's:
/// `devices::virtio::mmio::WINDOW`).
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;

/// Smallest guest we build: the low megabyte plus room for a small kernel.
pub const MIN_MEMORY: u64 = 8 << 20;
/// Largest guest we build (bounded by the 64-bit identity map a probe keeps: 64 GiB of
/// address space, minus the hole).
pub const MAX_MEMORY: u64 = 60 << 30;
/// Guest memory sizes must be a multiple of this.
pub const PAGE_SIZE: u64 = 4096;

/// A contiguous range of guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamRange {
    /// Guest physical start.
    pub guest_addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Offset of this range inside the flat host backing of the guest's memory.
    pub host_offset: u64,
}

impl RamRange {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.guest_addr + self.len
    }
}

/// Why a memory size cannot be laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// Not a multiple of the page size.
    NotPageMultiple {
        /// Requested size.
        size: u64,
    },
    /// Below [`MIN_MEMORY`].
    TooSmall {
        /// Requested size.
        size: u64,
    },
    /// Above [`MAX_MEMORY`].
    TooLarge {
        /// Requested size.
        size: u64,
    },
}

impl core::error::Error for LayoutError {}

impl core::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NotPageMultiple { size } => {
                write!(f, "memory size {size} bytes is not a multiple of 4 KiB")
            }
            Self::TooSmall { size } => write!(
                f,
                "memory size {size} bytes is too small: a guest needs at least {} MiB",
                MIN_MEMORY >> 20
            ),
            Self::TooLarge { size } => write!(
                f,
                "memory size {size} bytes is too large: at most {} GiB",
                MAX_MEMORY >> 30
            ),
        }
    }
}

/// The guest's RAM: `size` bytes of one flat host backing, split around the MMIO hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLayout {
    size: u64,
}

impl MemoryLayout {
    /// Lays out `size` bytes of guest RAM.
    pub fn new(size: u64) -> Result<Self, LayoutError> {
        if size % PAGE_SIZE != 0 {
            return Err(LayoutError::NotPageMultiple { size });
        }
        if size < MIN_MEMORY {
            return Err(LayoutError::TooSmall { size });
        }
        if size > MAX_MEMORY {
            return Err(LayoutError::TooLarge { size });
        }
        Ok(Self { size })
    }

    /// Total RAM in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// End of RAM below the MMIO hole.
    pub fn low_end(&self) -> u64 {
        self.size.min(MMIO_HOLE_START)
    }

    /// The RAM ranges in guest-physical order: below the hole, and above it if any.
    pub fn ram_ranges(&self) -> heapless::Vec<RamRange, 2> {
        let mut v = heapless::Vec::new();
        let low = self.low_end();
        // Cannot fail: capacity 2, at most two pushes.
        let _ = v.push(RamRange {
            guest_addr: 0,
            len: low,
            host_offset: 0,
        });
        if self.size > low {
            let _ = v.push(RamRange {
                guest_addr: MMIO_HOLE_END,
                len: self.size - low,
                host_offset: low,
            });
        }
        v
    }

    /// Highest guest physical address + 1.
    pub fn guest_end(&self) -> u64 {
        self.ram_ranges().last().map(RamRange::end).unwrap_or(0)
    }

    /// Whether `[addr, addr + len)` lies entirely inside one RAM range.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.ram_ranges()
            .iter()
            .any(|r| addr >= r.guest_addr && end <= r.end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_guest_is_one_range() {
        let l = MemoryLayout::new(128 << 20).unwrap();
        let r = l.ram_ranges();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].guest_addr, 0);
        assert_eq!(r[0].len, 128 << 20);
        assert_eq!(l.guest_end(), 128 << 20);
    }

    #[test]
    fn big_guest_skips_the_hole() {
        let l = MemoryLayout::new(8 << 30).unwrap();
        let r = l.ram_ranges();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].end(), MMIO_HOLE_START);
        assert_eq!(r[1].guest_addr, MMIO_HOLE_END);
        assert_eq!(r[0].len + r[1].len, 8 << 30);
        assert_eq!(r[1].host_offset, MMIO_HOLE_START);
        assert!(!l.contains(MMIO_HOLE_START, 1));
        assert!(l.contains(MMIO_HOLE_END, 4096));
        assert!(!l.contains(u64::MAX, 2));
    }

    #[test]
    fn exactly_three_gib_has_no_high_range() {
        let l = MemoryLayout::new(MMIO_HOLE_START).unwrap();
        assert_eq!(l.ram_ranges().len(), 1);
    }

    #[test]
    fn rejects_bad_sizes() {
        assert_eq!(
            MemoryLayout::new((64 << 20) + 1),
            Err(LayoutError::NotPageMultiple {
                size: (64 << 20) + 1
            })
        );
        assert_eq!(
            MemoryLayout::new(4 << 20),
            Err(LayoutError::TooSmall { size: 4 << 20 })
        );
        assert!(matches!(
            MemoryLayout::new(MAX_MEMORY + PAGE_SIZE),
            Err(LayoutError::TooLarge { .. })
        ));
        assert_eq!(MemoryLayout::new(0), Err(LayoutError::TooSmall { size: 0 }));
    }

    #[test]
    fn fixed_areas_do_not_overlap() {
        let areas = [
            (GDT_ADDR, 0x80),
            (TSS_ADDR, 0x68),
            (PVH_INFO_ADDR, 0x1000),
            (ZERO_PAGE_ADDR, 0x1000),
            (PML4_ADDR, PAGE_TABLES_END - PML4_ADDR),
            (CMDLINE_ADDR, CMDLINE_MAX as u64),
            (ACPI_ADDR, ACPI_MAX as u64),
            (MPTABLE_ADDR, MPTABLE_MAX as u64),
        ];
        for (i, a) in areas.iter().enumerate() {
            assert!(a.0 + a.1 <= HIMEM_START);
            for b in &areas[i + 1..] {
                assert!(
                    a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0,
                    "{a:x?} overlaps {b:x?}"
                );
            }
        }
    }

    // The boot stack sits between the zero page and the page tables.
    const _: () = assert!(BOOT_STACK_TOP < PML4_ADDR && BOOT_STACK_TOP > ZERO_PAGE_ADDR + 0x1000);
}
