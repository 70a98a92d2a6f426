//! The guest's RAM: vm-memory regions that own their host mappings, split around the MMIO
//! hole as [`MemoryLayout`] says, mapped from a [`RamSource`]. Every clone of
//! [`GuestMemory::mem`] (the vCPUs', the transports', the block workers') keeps the pages
//! mapped; all guest-memory access goes through vm-memory's bounds-checked `Bytes` methods.

use boot::layout::{MemoryLayout, RamRange};
use pool::RamSource;
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, MmapRegion,
};

/// Errors assembling guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The source is not the size of the layout.
    #[error("memory backing is {backing} bytes but the guest needs {layout}")]
    SizeMismatch {
        /// Backing size.
        backing: u64,
        /// Layout size.
        layout: u64,
    },
    /// A RAM range is not a whole number of the source's pages.
    #[error(
        "guest RAM range at {addr:#x} ({len:#x} bytes) is not a multiple of the {page} byte page size"
    )]
    Alignment {
        /// Guest address.
        addr: u64,
        /// Length.
        len: u64,
        /// Page size.
        page: u64,
    },
    /// Mapping a range failed.
    #[error("mapping guest RAM at {addr:#x} ({len:#x} bytes, {what}): {reason}")]
    Map {
        /// Guest address.
        addr: u64,
        /// Length.
        len: u64,
        /// What backs it.
        what: String,
        /// Why.
        reason: String,
    },
    /// vm-memory refused a region.
    #[error("building guest memory region at {addr:#x}: {reason}")]
    Region {
        /// Guest address.
        addr: u64,
        /// Why.
        reason: String,
    },
}

/// Guest RAM: vm-memory regions owning their mappings.
pub struct GuestMemory {
    mem: GuestMemoryMmap,
    layout: MemoryLayout,
    describe: String,
}

impl GuestMemory {
    /// Maps the guest memory described by `layout` from `source`, one region per RAM range.
    pub fn new(source: &RamSource, layout: MemoryLayout) -> Result<Self, MemoryError> {
        if let Some(len) = source.fixed_len()
            && len != layout.size()
        {
            return Err(MemoryError::SizeMismatch {
                backing: len,
                layout: layout.size(),
            });
        }
        let page = source.page_size();
        let mut regions = Vec::new();
        for r in layout.ram_ranges() {
            if r.len == 0 || r.len % page != 0 || r.host_offset % page != 0 {
                return Err(MemoryError::Alignment {
                    addr: r.guest_addr,
                    len: r.len,
                    page,
                });
            }
            let m = source.mapping(r.host_offset);
            let region = MmapRegion::build(
                m.file.map(|(f, at)| FileOffset::from_arc(f, at)),
                r.len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                m.flags,
            )
            .map_err(|e| MemoryError::Map {
                addr: r.guest_addr,
                len: r.len,
                what: source.describe(),
                reason: explain_map_failure(source, &e.to_string()),
            })?;
            let region = GuestRegionMmap::new(region, GuestAddress(r.guest_addr)).ok_or(
                MemoryError::Region {
                    addr: r.guest_addr,
                    reason: "region wraps the address space".into(),
                },
            )?;
            regions.push(region);
        }
        let mem = GuestMemoryMmap::from_regions(regions).map_err(|e| MemoryError::Region {
            addr: 0,
            reason: e.to_string(),
        })?;
        Ok(Self {
            mem,
            layout,
            describe: source.describe(),
        })
    }

    /// vm-memory view for bounds-checked access; clones keep the mappings alive.
    pub fn mem(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// The layout.
    pub fn layout(&self) -> &MemoryLayout {
        &self.layout
    }

    /// Host address of guest range `r` (for KVM memslots), if `r` is one of ours.
    pub fn host_addr(&self, r: &RamRange) -> Option<u64> {
        let region = self.mem.find_region(GuestAddress(r.guest_addr))?;
        (region.start_addr() == GuestAddress(r.guest_addr) && region.len() == r.len)
            .then(|| region.as_ptr() as u64)
    }

    /// Every RAM range as (guest address, length, host address): what an IOMMU maps for a
    /// passed-through device.
    pub fn regions(&self) -> Vec<(u64, u64, u64)> {
        self.layout
            .ram_ranges()
            .iter()
            .filter_map(|r| Some((r.guest_addr, r.len, self.host_addr(r)?)))
            .collect()
    }

    /// What backs the memory.
    pub fn describe(&self) -> String {
        self.describe.clone()
    }
}

/// `reason`, with what to do about it when the cause is a short hugepage pool.
fn explain_map_failure(source: &RamSource, reason: &str) -> String {
    if !matches!(source, RamSource::Anonymous(pool::Backing::Hugetlb)) {
        return reason.to_string();
    }
    let free = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("HugePages_Free:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .map_or_else(|| "unknown".to_string(), |n| n.to_string());
    format!(
        "{reason}; --backing hugetlb takes 2 MiB pages from the kernel's free pool \
         (HugePages_Free: {free}): free more with `sysctl vm.nr_hugepages=N`, or launch \
         from a reserved pool (--name)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use pool::Backing;
    use vm_memory::Bytes;

    #[test]
    fn regions_map_to_the_right_host_bytes() {
        let layout = MemoryLayout::new(16 << 20).unwrap();
        let gm = GuestMemory::new(&RamSource::Anonymous(Backing::Anonymous), layout).unwrap();
        gm.mem()
            .write_obj(0xdead_beefu32, GuestAddress(0x1000))
            .unwrap();
        let r = layout.ram_ranges()[0];
        let host = gm.host_addr(&r).unwrap();
        // SAFETY: host + 0x1000 is inside the first region's live mapping, owned by `gm`.
        let v = unsafe { std::ptr::read((host + 0x1000) as *const u32) };
        assert_eq!(v, 0xdead_beef);
        // Out of bounds is an error, not a crash.
        assert!(gm.mem().write_obj(1u64, GuestAddress(16 << 20)).is_err());
        assert_eq!(gm.describe(), "anonymous");
    }

    #[test]
    fn a_clone_keeps_the_memory_mapped() {
        let layout = MemoryLayout::new(8 << 20).unwrap();
        let gm = GuestMemory::new(&RamSource::Anonymous(Backing::Anonymous), layout).unwrap();
        gm.mem().write_obj(7u64, GuestAddress(0x2000)).unwrap();
        let clone = gm.mem().clone();
        drop(gm);
        assert_eq!(clone.read_obj::<u64>(GuestAddress(0x2000)).unwrap(), 7);
    }

    #[test]
    fn ranges_around_the_mmio_hole_are_separate_regions() {
        // Big enough to be split by the hole below 4 GiB; MAP_NORESERVE, never touched.
        let layout = MemoryLayout::new(5 << 30).unwrap();
        let ranges = layout.ram_ranges();
        assert!(ranges.len() > 1);
        let gm = GuestMemory::new(&RamSource::Anonymous(Backing::Anonymous), layout).unwrap();
        assert_eq!(gm.mem().num_regions(), ranges.len());
        for r in &ranges {
            assert!(gm.host_addr(r).is_some(), "{r:?}");
            let region = gm.mem().find_region(GuestAddress(r.guest_addr)).unwrap();
            assert_eq!(region.len(), r.len);
        }
        // A range that is not ours has no host address.
        let mut odd = ranges[0];
        odd.len -= 4096;
        assert_eq!(gm.host_addr(&odd), None);
    }

    #[test]
    fn size_and_page_mismatches_are_refused() {
        let dir = std::env::temp_dir().join(format!("guestmem-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pf =
            pool::poolfile::PoolFile::create(&dir.join("pool"), 16 << 20, 4096, &mut |_, _| {})
                .unwrap();
        let extent = pool::Extent {
            offset: 0,
            len: 8 << 20,
        };
        let src = RamSource::Extent(pf.extent(extent).unwrap());
        let layout = MemoryLayout::new(16 << 20).unwrap();
        assert!(matches!(
            GuestMemory::new(&src, layout),
            Err(MemoryError::SizeMismatch { .. })
        ));
        // An extent the size of the layout maps the file's bytes, shared.
        let layout = MemoryLayout::new(8 << 20).unwrap();
        let gm = GuestMemory::new(&src, layout).unwrap();
        gm.mem().write_obj(0x55aau16, GuestAddress(0x10)).unwrap();
        let mut scrub = pf.map(extent).unwrap();
        assert!(!scrub.is_zero());
        scrub.scrub();
        assert_eq!(gm.mem().read_obj::<u16>(GuestAddress(0x10)).unwrap(), 0);
        // Hugetlb pages cannot back a range that is not 2 MiB aligned.
        let layout = MemoryLayout::new(9 << 20).unwrap();
        assert!(matches!(
            GuestMemory::new(&RamSource::Anonymous(Backing::Hugetlb), layout),
            Err(MemoryError::Alignment { .. })
        ));
        drop(gm);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_short_hugepage_pool_is_a_clear_error_not_a_sigbus() {
        // 8 GiB more than the kernel has free: no test on this machine frees that many.
        let free = std::fs::read_to_string("/proc/meminfo")
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("HugePages_Free:")
                    .map(|v| v.trim().parse::<u64>().unwrap())
            })
            .unwrap();
        let layout = MemoryLayout::new((free + 4096) * (2 << 20)).unwrap();
        match GuestMemory::new(&RamSource::Anonymous(Backing::Hugetlb), layout) {
            Err(MemoryError::Map { reason, .. }) => {
                assert!(reason.contains("HugePages_Free"), "{reason}");
                assert!(reason.contains("vm.nr_hugepages"), "{reason}");
            }
            Err(e) => panic!("unexpected error: {e}"),
            Ok(_) => panic!("{} free hugepages backed {} more", free, 4096),
        }
    }
}
