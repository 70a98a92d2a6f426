//! The guest's RAM: one flat host mapping (a [`GuestRam`]) seen through vm-memory, split
//! around the MMIO hole as [`MemoryLayout`] says. All guest-memory access in the VMM goes
//! through [`GuestMemory::mem`] (vm-memory's bounds-checked `Bytes` methods).

use boot::layout::{MemoryLayout, RamRange};
use pool::GuestRam;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

/// Errors assembling guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The backing is not the size of the layout.
    #[error("memory backing is {backing} bytes but the guest needs {layout}")]
    SizeMismatch {
        /// Backing size.
        backing: usize,
        /// Layout size.
        layout: u64,
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

/// Guest RAM and the host mapping behind it.
pub struct GuestMemory {
    // Field order matters: `mem` refers into `ram` and is dropped first.
    mem: GuestMemoryMmap,
    layout: MemoryLayout,
    ram: Box<dyn GuestRam>,
}

impl GuestMemory {
    /// Wraps `ram` as the guest memory described by `layout`.
    pub fn new(ram: Box<dyn GuestRam>, layout: MemoryLayout) -> Result<Self, MemoryError> {
        if ram.len() as u64 != layout.size() {
            return Err(MemoryError::SizeMismatch {
                backing: ram.len(),
                layout: layout.size(),
            });
        }
        let mut regions = Vec::new();
        for r in layout.ram_ranges() {
            // SAFETY: host_offset < ram.len() (MemoryLayout splits exactly its size).
            let host = unsafe { ram.as_ptr().add(r.host_offset as usize) };
            // SAFETY: host..host + len lies inside `ram` (offset + len <= size), and the
            // mapping outlives `mem` (field order above; `ram` is never replaced).
            let region = unsafe {
                MmapRegion::build_raw(
                    host,
                    r.len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                )
            }
            .map_err(|e| MemoryError::Region {
                addr: r.guest_addr,
                reason: e.to_string(),
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
        Ok(Self { mem, layout, ram })
    }

    /// vm-memory view for bounds-checked access.
    pub fn mem(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// The layout.
    pub fn layout(&self) -> &MemoryLayout {
        &self.layout
    }

    /// Host address of guest range `r` (for KVM memslots).
    pub fn host_addr(&self, r: &RamRange) -> u64 {
        self.ram.as_ptr() as u64 + r.host_offset
    }

    /// What backs the memory.
    pub fn describe(&self) -> String {
        self.ram.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pool::{AnonRam, Backing};
    use vm_memory::Bytes;

    #[test]
    fn regions_map_to_the_right_host_bytes() {
        let layout = MemoryLayout::new(16 << 20).unwrap();
        let ram = AnonRam::new(16 << 20, Backing::Anonymous).unwrap();
        let gm = GuestMemory::new(Box::new(ram), layout).unwrap();
        gm.mem()
            .write_obj(0xdead_beefu32, GuestAddress(0x1000))
            .unwrap();
        let r = layout.ram_ranges()[0];
        // SAFETY: host_addr(r) + 0x1000 is inside the mapping.
        let v = unsafe { std::ptr::read((gm.host_addr(&r) + 0x1000) as *const u32) };
        assert_eq!(v, 0xdead_beef);
        // Out of bounds is an error, not a crash.
        assert!(gm.mem().write_obj(1u64, GuestAddress(16 << 20)).is_err());
    }

    #[test]
    fn size_mismatch() {
        let layout = MemoryLayout::new(16 << 20).unwrap();
        let ram = AnonRam::new(8 << 20, Backing::Anonymous).unwrap();
        assert!(matches!(
            GuestMemory::new(Box::new(ram), layout),
            Err(MemoryError::SizeMismatch { .. })
        ));
    }
}
