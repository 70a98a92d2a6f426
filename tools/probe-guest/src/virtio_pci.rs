//! The virtio-pci side of the block driver (virtio 1.2, 4.1, modern only): a block function
//! (1af4:1042) found on bus 0 through ECAM, its structures found through its vendor
//! capabilities, queue 0 set up through the common configuration and given MSI-X vector 0
//! (to our APIC, on the block driver's vector), notified at its own address. With MSI-X a
//! completion needs no ISR read and no acknowledgement.

use crate::bootinfo::BootInfo;
use crate::pcie::{CAP_MSIX, Ecam, enable_msix_entry, find_cap, setup_bars};
use crate::sys::{peek, poke};

const VENDOR: u32 = 0x1af4;
const BLOCK: u32 = 0x1042;
const CAP_VENDOR: u8 = 0x09;
const NO_VECTOR: u16 = 0xffff;

/// A set-up function's structures (guest-physical addresses, identity mapped).
#[derive(Clone, Copy)]
pub struct Pci {
    common: u64,
    notify: u64,
    device: u64,
}

fn rd<T: Copy>(a: u64) -> T {
    // SAFETY: an address inside the function's BAR, which we sized and placed.
    unsafe { peek(a) }
}
fn wr<T: Copy>(a: u64, v: T) {
    // SAFETY: as `rd`.
    unsafe { poke(a, v) }
}

/// The first virtio-pci block function on bus 0, if the machine has PCI.
pub fn find(bi: &BootInfo) -> Option<(Ecam, u64)> {
    let e = crate::pcie::ecam(bi)?;
    (0..32)
        .find(|&s| e.read(s, 0) == BLOCK << 16 | VENDOR)
        .map(|s| (e, s))
}

impl Pci {
    /// BAR placement, the capability walk, MSI-X vector 0 to `vector` on APIC 0.
    pub fn open(e: Ecam, slot: u64, vector: u32) -> Result<Self, &'static str> {
        let mut next = 0xc010_0000;
        let bars = setup_bars(e, slot, "virtio-blk", &mut next);
        let mut found = [None::<u64>; 5];
        let mut notify_mult = 0u32;
        let mut cap = (e.read(slot, 0x34) & 0xfc) as u64;
        for _ in 0..48 {
            if cap == 0 {
                break;
            }
            let h = e.read(slot, cap);
            if h & 0xff == u32::from(CAP_VENDOR) {
                let cfg_type = ((h >> 24) & 0xff) as usize;
                let bar = (e.read(slot, cap + 4) & 0xff) as usize;
                let off = u64::from(e.read(slot, cap + 8));
                if (1..=4).contains(&cfg_type) && bar < 6 && bars[bar].1 != 0 {
                    found[cfg_type] = Some(bars[bar].0 + off);
                    if cfg_type == 2 {
                        notify_mult = e.read(slot, cap + 16);
                    }
                }
            }
            cap = ((h >> 8) & 0xfc) as u64;
        }
        let (Some(common), Some(notify), Some(device)) = (found[1], found[2], found[4]) else {
            return Err("virtio-pci: no common, notify or device capability");
        };
        let msix = find_cap(e, slot, CAP_MSIX).ok_or("virtio-pci: no MSI-X capability")?;
        let table = e.read(slot, msix + 4);
        let (bar, off) = ((table & 7) as usize, u64::from(table & !7));
        if bars[bar].1 == 0 {
            return Err("virtio-pci: the MSI-X table is in no BAR");
        }
        enable_msix_entry(e, slot, msix, bars[bar].0 + off, 0, vector);
        let queue_notify_off = {
            wr::<u16>(common + 0x16, 0);
            u64::from(rd::<u16>(common + 0x1e))
        };
        Ok(Self {
            common,
            notify: notify + queue_notify_off * u64::from(notify_mult),
            device,
        })
    }

    /// Device status.
    pub fn status(&self) -> u32 {
        u32::from(rd::<u8>(self.common + 0x14))
    }
    /// Sets the device status.
    pub fn set_status(&self, v: u32) {
        wr::<u8>(self.common + 0x14, v as u8);
    }
    /// The device's features.
    pub fn features(&self) -> u64 {
        wr::<u32>(self.common, 0);
        let lo = u64::from(rd::<u32>(self.common + 4));
        wr::<u32>(self.common, 1);
        lo | u64::from(rd::<u32>(self.common + 4)) << 32
    }
    /// The driver's features.
    pub fn set_features(&self, f: u64) {
        wr::<u32>(self.common + 8, 0);
        wr::<u32>(self.common + 0xc, f as u32);
        wr::<u32>(self.common + 8, 1);
        wr::<u32>(self.common + 0xc, (f >> 32) as u32);
    }
    /// Queue 0's largest size.
    pub fn queue_max(&self) -> u16 {
        wr::<u16>(self.common + 0x16, 0);
        rd::<u16>(self.common + 0x18)
    }
    /// Queue 0: its size, rings and vector 0, then enabled; configuration changes get no
    /// vector. Whether the device took the vector.
    pub fn setup_queue(&self, size: u16, desc: u64, avail: u64, used: u64) -> bool {
        wr::<u16>(self.common + 0x10, NO_VECTOR);
        wr::<u16>(self.common + 0x16, 0);
        wr::<u16>(self.common + 0x18, size);
        wr::<u16>(self.common + 0x1a, 0);
        for (off, a) in [(0x20, desc), (0x28, avail), (0x30, used)] {
            wr::<u32>(self.common + off, a as u32);
            wr::<u32>(self.common + off + 4, (a >> 32) as u32);
        }
        let took = rd::<u16>(self.common + 0x1a) == 0;
        wr::<u16>(self.common + 0x1c, 1);
        took
    }
    /// The capacity in sectors (the block device's configuration, offset 0).
    pub fn capacity(&self) -> u64 {
        u64::from(rd::<u32>(self.device)) | u64::from(rd::<u32>(self.device + 4)) << 32
    }
    /// Notifies queue 0.
    pub fn notify(&self) {
        wr::<u16>(self.notify, 0);
    }
}
