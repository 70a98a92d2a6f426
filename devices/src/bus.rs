//! A bus: sorted, non-overlapping address ranges, each owned by one device.
//!
//! Built once before the guest runs, then frozen: lookups take no lock on the map, and each
//! device has its own lock, held only for the duration of its own register access.
//! Accesses nobody claims read as all ones and are logged at a rate limit.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::ratelimit::RateLimiter;
use crate::{VmEvent, warn_ratelimited};

/// A device on a bus. It sees offsets from the start of its range.
pub trait BusDevice: Send {
    /// Reads `data.len()` bytes at `offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Writes `data` at `offset`; may ask the VM for something.
    fn write(&mut self, offset: u64, data: &[u8]) -> Option<VmEvent>;
}

/// Errors building a bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The range overlaps one already on the bus.
    #[error("{name}: range {base:#x}+{len:#x} overlaps {other} at {other_base:#x}+{other_len:#x}")]
    Overlap {
        /// New device.
        name: String,
        /// Its base.
        base: u64,
        /// Its length.
        len: u64,
        /// Existing device.
        other: String,
        /// Its base.
        other_base: u64,
        /// Its length.
        other_len: u64,
    },
    /// Zero-length or wrapping range.
    #[error("{name}: invalid range {base:#x}+{len:#x}")]
    BadRange {
        /// Device.
        name: String,
        /// Base.
        base: u64,
        /// Length.
        len: u64,
    },
}

struct Entry {
    len: u64,
    name: String,
    dev: Arc<Mutex<dyn BusDevice>>,
}

/// An address space (port I/O or MMIO).
pub struct Bus {
    name: &'static str,
    ranges: BTreeMap<u64, Entry>,
    unclaimed: RateLimiter,
}

impl Bus {
    /// An empty bus called `name` ("pio" or "mmio", for logs).
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            ranges: BTreeMap::new(),
            unclaimed: RateLimiter::new(10, Duration::from_secs(1)),
        }
    }

    /// Adds `dev` at `[base, base + len)`.
    pub fn insert(
        &mut self,
        name: &str,
        base: u64,
        len: u64,
        dev: Arc<Mutex<dyn BusDevice>>,
    ) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::BadRange {
                name: name.to_string(),
                base,
                len,
            })?;
        let overlap = self
            .ranges
            .range(..end)
            .next_back()
            .filter(|(b, e)| **b + e.len > base);
        if let Some((b, e)) = overlap {
            return Err(BusError::Overlap {
                name: name.to_string(),
                base,
                len,
                other: e.name.clone(),
                other_base: *b,
                other_len: e.len,
            });
        }
        self.ranges.insert(
            base,
            Entry {
                len,
                name: name.to_string(),
                dev,
            },
        );
        Ok(())
    }

    fn find(&self, addr: u64, size: usize) -> Option<(u64, &Entry)> {
        let (base, e) = self.ranges.range(..=addr).next_back()?;
        let off = addr - base;
        // The whole access must fall inside the device.
        (off.checked_add(size as u64)? <= e.len).then_some((off, e))
    }

    /// Dispatches a read. Unclaimed addresses read as all ones. Returns whether a device
    /// claimed it.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((off, e)) => {
                e.dev
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .read(off, data);
                true
            }
            None => {
                data.fill(0xff);
                warn_ratelimited!(
                    self.unclaimed,
                    "{}: unclaimed read of {} bytes at {:#x}",
                    self.name,
                    data.len(),
                    addr
                );
                false
            }
        }
    }

    /// Dispatches a write. Unclaimed writes are dropped.
    pub fn write(&self, addr: u64, data: &[u8]) -> Option<VmEvent> {
        match self.find(addr, data.len()) {
            Some((off, e)) => e
                .dev
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .write(off, data),
            None => {
                warn_ratelimited!(
                    self.unclaimed,
                    "{}: unclaimed write of {} bytes at {:#x}: {:02x?}",
                    self.name,
                    data.len(),
                    addr,
                    data
                );
                None
            }
        }
    }

    /// (name, base, length) of every device, in address order.
    pub fn devices(&self) -> Vec<(String, u64, u64)> {
        self.ranges
            .iter()
            .map(|(b, e)| (e.name.clone(), *b, e.len))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Regs {
        last: Vec<(u64, Vec<u8>)>,
    }
    impl BusDevice for Regs {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) -> Option<VmEvent> {
            self.last.push((offset, data.to_vec()));
            (data == [0xaa]).then_some(VmEvent::Reset)
        }
    }

    #[test]
    fn routes_by_offset_and_rejects_overlap() {
        let mut bus = Bus::new("test");
        let a = Arc::new(Mutex::new(Regs::default()));
        bus.insert("a", 0x100, 0x10, a.clone()).unwrap();
        bus.insert("b", 0x110, 0x10, Arc::new(Mutex::new(Regs::default())))
            .unwrap();
        for (base, len) in [(0x10f, 1), (0xf0, 0x20), (0x100, 0x100), (0x105, 2)] {
            assert!(matches!(
                bus.insert("c", base, len, Arc::new(Mutex::new(Regs::default()))),
                Err(BusError::Overlap { .. })
            ));
        }
        assert!(matches!(
            bus.insert("z", 0x200, 0, Arc::new(Mutex::new(Regs::default()))),
            Err(BusError::BadRange { .. })
        ));
        assert!(matches!(
            bus.insert("w", u64::MAX, 2, Arc::new(Mutex::new(Regs::default()))),
            Err(BusError::BadRange { .. })
        ));
        let mut d = [0u8; 2];
        assert!(bus.read(0x103, &mut d));
        assert_eq!(d, [3, 3]);
        assert_eq!(bus.write(0x10f, &[0xaa]), Some(VmEvent::Reset));
        assert_eq!(a.lock().unwrap().last, vec![(0xf, vec![0xaa])]);
        assert_eq!(bus.devices().len(), 2);
    }

    #[test]
    fn unclaimed_reads_all_ones_and_straddles_are_unclaimed() {
        let mut bus = Bus::new("test");
        bus.insert("a", 0x100, 0x10, Arc::new(Mutex::new(Regs::default())))
            .unwrap();
        let mut d = [0u8; 4];
        assert!(!bus.read(0x50, &mut d));
        assert_eq!(d, [0xff; 4]);
        // An access running past the end of a device is not the device's.
        assert!(!bus.read(0x10e, &mut d));
        assert_eq!(d, [0xff; 4]);
        assert_eq!(bus.write(0x10e, &[1, 2, 3, 4]), None);
        assert_eq!(bus.write(u64::MAX, &[1]), None);
    }
}
