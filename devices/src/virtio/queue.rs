//! The split virtqueue, device side, written by hand for hostile input.
//!
//! Everything here comes from the guest: ring addresses, indices, descriptor addresses,
//! lengths, flags, `next` links, indirect tables. Every index is bounded by the queue size,
//! every chain by a length limit (so a loop ends), every address and length is checked
//! against guest memory with checked arithmetic, and structural violations (a bad index, a
//! loop, a misused indirect table, the driver's avail index running ahead by more than the
//! queue size) are errors the transport turns into NEEDS_RESET.

use std::num::Wrapping;
use std::sync::atomic::{Ordering, fence};

use virtio_bindings::virtio_ring as vr;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Largest queue we offer.
pub const MAX_QUEUE_SIZE: u16 = 256;
/// Largest indirect table we accept.
pub const MAX_INDIRECT: u32 = 1024;
/// `VIRTQ_DESC_F_NEXT`.
pub const DESC_F_NEXT: u16 = vr::VRING_DESC_F_NEXT as u16;
/// `VIRTQ_DESC_F_WRITE`: device-writable.
pub const DESC_F_WRITE: u16 = vr::VRING_DESC_F_WRITE as u16;
/// `VIRTQ_DESC_F_INDIRECT`.
pub const DESC_F_INDIRECT: u16 = vr::VRING_DESC_F_INDIRECT as u16;
/// `VIRTQ_USED_F_NO_NOTIFY`.
const USED_F_NO_NOTIFY: u16 = vr::VRING_USED_F_NO_NOTIFY as u16;
/// `VIRTQ_AVAIL_F_NO_INTERRUPT`.
const AVAIL_F_NO_INTERRUPT: u16 = vr::VRING_AVAIL_F_NO_INTERRUPT as u16;

/// Structural violations of the queue (the transport resets the device for them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The queue is not set up (or its rings are not in guest memory).
    #[error("queue not ready or its rings are outside guest memory")]
    NotReady,
    /// A ring could not be read or written.
    #[error("ring access at {0:#x} failed")]
    Ring(u64),
    /// The driver published more entries than the queue holds.
    #[error("avail index {avail} is {ahead} entries ahead of {next}, more than the queue size")]
    AvailJump {
        /// Driver's index.
        avail: u16,
        /// Ours.
        next: u16,
        /// Difference.
        ahead: u16,
    },
    /// A head index out of range.
    #[error("descriptor index {0} out of range")]
    BadIndex(u16),
    /// A chain longer than the queue (a loop).
    #[error("descriptor chain longer than {0} (a loop?)")]
    ChainTooLong(u32),
    /// INDIRECT and NEXT together, an indirect table in an indirect table, or indirect
    /// descriptors without the feature.
    #[error("indirect descriptor misused: {0}")]
    Indirect(&'static str),
}

/// One descriptor of a chain, as the guest gave it (addresses not yet checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    /// Guest physical address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Device-writable.
    pub write: bool,
}

/// A descriptor chain taken from the avail ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// Head index (returned in the used ring).
    pub head: u16,
    /// The descriptors in order (indirect tables already expanded).
    pub descs: Vec<Desc>,
}

/// A raw descriptor read from guest memory.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
struct RawDesc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

// SAFETY: plain little-endian integers, every bit pattern valid.
unsafe impl vm_memory::ByteValued for RawDesc {}

/// Host address of `[addr, addr + len)` if it lies in one region of guest memory.
pub fn host_range(mem: &GuestMemoryMmap, addr: u64, len: u64) -> Option<*mut u8> {
    let region = mem.find_region(GuestAddress(addr))?;
    let start = region.start_addr().0;
    let end = start.checked_add(region.len())?;
    if addr.checked_add(len)? > end {
        return None;
    }
    mem.get_host_address(GuestAddress(addr)).ok()
}

/// A split virtqueue.
#[derive(Clone, Debug)]
pub struct Queue {
    /// Largest size offered.
    pub max_size: u16,
    /// Size set by the driver.
    pub size: u16,
    /// QueueReady.
    pub ready: bool,
    /// Descriptor table address.
    pub desc_table: u64,
    /// Avail ring address.
    pub avail_ring: u64,
    /// Used ring address.
    pub used_ring: u64,
    /// VIRTIO_RING_F_EVENT_IDX negotiated.
    pub event_idx: bool,
    /// VIRTIO_RING_F_INDIRECT_DESC negotiated.
    pub indirect: bool,
    next_avail: Wrapping<u16>,
    next_used: Wrapping<u16>,
    signalled_used: Option<Wrapping<u16>>,
}

impl Queue {
    /// A queue offering `max_size` entries.
    pub fn new(max_size: u16) -> Self {
        Self {
            max_size,
            size: max_size,
            ready: false,
            desc_table: 0,
            avail_ring: 0,
            used_ring: 0,
            event_idx: false,
            indirect: false,
            next_avail: Wrapping(0),
            next_used: Wrapping(0),
            signalled_used: None,
        }
    }

    /// Back to the state after reset, keeping `max_size`.
    pub fn reset(&mut self) {
        *self = Self::new(self.max_size);
    }

    fn avail_bytes(&self) -> u64 {
        6 + 2 * self.size as u64
    }

    fn used_bytes(&self) -> u64 {
        6 + 8 * self.size as u64
    }

    /// Whether the driver's setup is usable: size a power of two within bounds, rings
    /// aligned and inside guest memory.
    pub fn is_valid(&self, mem: &GuestMemoryMmap) -> bool {
        let size_ok = self.size > 0 && self.size <= self.max_size && self.size.is_power_of_two();
        size_ok
            && self.desc_table % 16 == 0
            && self.avail_ring % 2 == 0
            && self.used_ring % 4 == 0
            && host_range(mem, self.desc_table, 16 * self.size as u64).is_some()
            && host_range(mem, self.avail_ring, self.avail_bytes()).is_some()
            && host_range(mem, self.used_ring, self.used_bytes()).is_some()
    }

    fn read_u16(mem: &GuestMemoryMmap, addr: u64) -> Result<u16, QueueError> {
        mem.read_obj::<u16>(GuestAddress(addr))
            .map_err(|_| QueueError::Ring(addr))
    }

    fn write_u16(mem: &GuestMemoryMmap, addr: u64, v: u16) -> Result<(), QueueError> {
        mem.write_obj(v, GuestAddress(addr))
            .map_err(|_| QueueError::Ring(addr))
    }

    /// Entries the driver has made available that we have not taken.
    pub fn pending(&self, mem: &GuestMemoryMmap) -> Result<u16, QueueError> {
        if !self.ready {
            return Err(QueueError::NotReady);
        }
        let avail = Wrapping(Self::read_u16(mem, self.avail_ring + 2)?);
        let ahead = (avail - self.next_avail).0;
        if ahead > self.size {
            return Err(QueueError::AvailJump {
                avail: avail.0,
                next: self.next_avail.0,
                ahead,
            });
        }
        Ok(ahead)
    }

    /// Takes the next available chain, if any.
    pub fn pop(&mut self, mem: &GuestMemoryMmap) -> Result<Option<Chain>, QueueError> {
        if self.pending(mem)? == 0 {
            return Ok(None);
        }
        // Read the ring entry only after seeing the index that covers it.
        fence(Ordering::Acquire);
        let slot = (self.next_avail.0 % self.size) as u64;
        let head = Self::read_u16(mem, self.avail_ring + 4 + 2 * slot)?;
        let descs = self.walk(mem, head)?;
        self.next_avail += Wrapping(1);
        Ok(Some(Chain { head, descs }))
    }

    fn read_desc(mem: &GuestMemoryMmap, table: u64, i: u64) -> Result<RawDesc, QueueError> {
        let at = table.checked_add(16 * i).ok_or(QueueError::Ring(table))?;
        mem.read_obj::<RawDesc>(GuestAddress(at))
            .map_err(|_| QueueError::Ring(at))
    }

    /// Follows a chain from `head`, expanding an indirect table.
    fn walk(&self, mem: &GuestMemoryMmap, head: u16) -> Result<Vec<Desc>, QueueError> {
        if head >= self.size {
            return Err(QueueError::BadIndex(head));
        }
        let mut out = Vec::new();
        let mut i = head;
        let mut count = 0u32;
        loop {
            count += 1;
            if count > self.size as u32 {
                return Err(QueueError::ChainTooLong(self.size as u32));
            }
            let d = Self::read_desc(mem, self.desc_table, i as u64)?;
            if d.flags & DESC_F_INDIRECT != 0 {
                if !self.indirect {
                    return Err(QueueError::Indirect("INDIRECT_DESC was not negotiated"));
                }
                if d.flags & DESC_F_NEXT != 0 {
                    return Err(QueueError::Indirect("INDIRECT together with NEXT"));
                }
                if !out.is_empty() {
                    return Err(QueueError::Indirect(
                        "an indirect table after direct descriptors",
                    ));
                }
                return self.walk_indirect(mem, d);
            }
            out.push(Desc {
                addr: d.addr,
                len: d.len,
                write: d.flags & DESC_F_WRITE != 0,
            });
            if d.flags & DESC_F_NEXT == 0 {
                return Ok(out);
            }
            if d.next >= self.size {
                return Err(QueueError::BadIndex(d.next));
            }
            i = d.next;
        }
    }

    fn walk_indirect(
        &self,
        mem: &GuestMemoryMmap,
        table: RawDesc,
    ) -> Result<Vec<Desc>, QueueError> {
        if table.len == 0 || table.len % 16 != 0 || table.len / 16 > MAX_INDIRECT {
            return Err(QueueError::Indirect(
                "table length is not a non-zero multiple of 16 within bounds",
            ));
        }
        if host_range(mem, table.addr, table.len as u64).is_none() {
            return Err(QueueError::Indirect("table outside guest memory"));
        }
        let n = table.len / 16;
        let mut out = Vec::new();
        let mut i = 0u32;
        let mut count = 0u32;
        loop {
            count += 1;
            if count > n {
                return Err(QueueError::ChainTooLong(n));
            }
            let d = Self::read_desc(mem, table.addr, i as u64)?;
            if d.flags & DESC_F_INDIRECT != 0 {
                return Err(QueueError::Indirect(
                    "an indirect table inside an indirect table",
                ));
            }
            out.push(Desc {
                addr: d.addr,
                len: d.len,
                write: d.flags & DESC_F_WRITE != 0,
            });
            if d.flags & DESC_F_NEXT == 0 {
                return Ok(out);
            }
            if d.next as u32 >= n {
                return Err(QueueError::BadIndex(d.next));
            }
            i = d.next as u32;
        }
    }

    /// Returns a chain to the driver with `len` bytes written.
    pub fn add_used(
        &mut self,
        mem: &GuestMemoryMmap,
        head: u16,
        len: u32,
    ) -> Result<(), QueueError> {
        let slot = (self.next_used.0 % self.size) as u64;
        let at = self.used_ring + 4 + 8 * slot;
        mem.write_obj(head as u32, GuestAddress(at))
            .and_then(|_| mem.write_obj(len, GuestAddress(at + 4)))
            .map_err(|_| QueueError::Ring(at))?;
        self.next_used += Wrapping(1);
        // The element must be visible before the index that publishes it.
        fence(Ordering::Release);
        Self::write_u16(mem, self.used_ring + 2, self.next_used.0)
    }

    /// Whether the driver wants an interrupt for what was used since the last one.
    pub fn needs_interrupt(&mut self, mem: &GuestMemoryMmap) -> bool {
        fence(Ordering::SeqCst);
        let new = self.next_used;
        if !self.event_idx {
            return Self::read_u16(mem, self.avail_ring)
                .map(|f| f & AVAIL_F_NO_INTERRUPT == 0)
                .unwrap_or(true);
        }
        let old = self.signalled_used.replace(new);
        let Some(old) = old else { return true };
        let Ok(event) = Self::read_u16(mem, self.avail_ring + 4 + 2 * self.size as u64) else {
            return true;
        };
        need_event(event, new.0, old.0)
    }

    /// Asks the driver to notify us again; returns whether entries are already pending (the
    /// caller must look again before sleeping).
    pub fn enable_notification(&mut self, mem: &GuestMemoryMmap) -> Result<bool, QueueError> {
        if self.event_idx {
            Self::write_u16(
                mem,
                self.used_ring + 4 + 8 * self.size as u64,
                self.next_avail.0,
            )?;
        } else {
            Self::write_u16(mem, self.used_ring, 0)?;
        }
        fence(Ordering::SeqCst);
        Ok(self.pending(mem)? > 0)
    }

    /// Asks the driver not to notify us (we are polling).
    pub fn disable_notification(&mut self, mem: &GuestMemoryMmap) -> Result<(), QueueError> {
        if !self.event_idx {
            Self::write_u16(mem, self.used_ring, USED_F_NO_NOTIFY)?;
        }
        // With EVENT_IDX the driver only notifies when it passes avail_event, which we stop
        // advancing while polling.
        Ok(())
    }
}

/// `vring_need_event`: whether moving from `old` to `new` passes `event`.
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const DESC: u64 = 0x1000;
    pub(crate) const AVAIL: u64 = 0x2000;
    pub(crate) const USED: u64 = 0x3000;

    pub(crate) fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    pub(crate) fn queue(size: u16) -> Queue {
        let mut q = Queue::new(MAX_QUEUE_SIZE);
        q.size = size;
        q.desc_table = DESC;
        q.avail_ring = AVAIL;
        q.used_ring = USED;
        q.ready = true;
        q
    }

    pub(crate) fn set_desc(
        m: &GuestMemoryMmap,
        table: u64,
        i: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let d = RawDesc {
            addr,
            len,
            flags,
            next,
        };
        m.write_obj(d, GuestAddress(table + 16 * i as u64)).unwrap();
    }

    /// Publishes `heads` in the avail ring starting at slot `from`.
    pub(crate) fn publish(m: &GuestMemoryMmap, q: &Queue, from: u16, heads: &[u16]) {
        for (k, h) in heads.iter().enumerate() {
            let slot = (from as usize + k) % q.size as usize;
            m.write_obj(*h, GuestAddress(AVAIL + 4 + 2 * slot as u64))
                .unwrap();
        }
        m.write_obj(
            from.wrapping_add(heads.len() as u16),
            GuestAddress(AVAIL + 2),
        )
        .unwrap();
    }

    #[test]
    fn pops_chains_and_publishes_used() {
        let m = mem();
        let mut q = queue(8);
        assert!(q.is_valid(&m));
        set_desc(&m, DESC, 0, 0x8000, 16, DESC_F_NEXT, 3);
        set_desc(&m, DESC, 3, 0x9000, 512, DESC_F_NEXT | DESC_F_WRITE, 5);
        set_desc(&m, DESC, 5, 0xa000, 1, DESC_F_WRITE, 0);
        publish(&m, &q, 0, &[0]);
        let c = q.pop(&m).unwrap().unwrap();
        assert_eq!(c.head, 0);
        assert_eq!(
            c.descs,
            vec![
                Desc {
                    addr: 0x8000,
                    len: 16,
                    write: false
                },
                Desc {
                    addr: 0x9000,
                    len: 512,
                    write: true
                },
                Desc {
                    addr: 0xa000,
                    len: 1,
                    write: true
                },
            ]
        );
        assert_eq!(q.pop(&m).unwrap(), None);
        q.add_used(&m, 0, 513).unwrap();
        let idx: u16 = m.read_obj(GuestAddress(USED + 2)).unwrap();
        let id: u32 = m.read_obj(GuestAddress(USED + 4)).unwrap();
        let len: u32 = m.read_obj(GuestAddress(USED + 8)).unwrap();
        assert_eq!((idx, id, len), (1, 0, 513));
    }

    #[test]
    fn structural_violations() {
        let m = mem();
        // A loop.
        let mut q = queue(4);
        set_desc(&m, DESC, 0, 0x8000, 16, DESC_F_NEXT, 1);
        set_desc(&m, DESC, 1, 0x8000, 16, DESC_F_NEXT, 0);
        publish(&m, &q, 0, &[0]);
        assert_eq!(q.pop(&m), Err(QueueError::ChainTooLong(4)));
        // Head out of range.
        let mut q = queue(4);
        publish(&m, &q, 0, &[9]);
        assert_eq!(q.pop(&m), Err(QueueError::BadIndex(9)));
        // Next out of range.
        let mut q = queue(4);
        set_desc(&m, DESC, 0, 0x8000, 16, DESC_F_NEXT, 200);
        publish(&m, &q, 0, &[0]);
        assert_eq!(q.pop(&m), Err(QueueError::BadIndex(200)));
        // The driver claims more entries than the queue holds.
        let q = queue(4);
        m.write_obj(100u16, GuestAddress(AVAIL + 2)).unwrap();
        assert!(matches!(q.pending(&m), Err(QueueError::AvailJump { .. })));
        // Indirect without the feature, with NEXT, nested.
        let mut q = queue(4);
        set_desc(&m, DESC, 0, 0x6000, 32, DESC_F_INDIRECT, 0);
        publish(&m, &q, 0, &[0]);
        assert!(matches!(q.pop(&m), Err(QueueError::Indirect(_))));
        let mut q = queue(4);
        q.indirect = true;
        set_desc(&m, DESC, 0, 0x6000, 32, DESC_F_INDIRECT | DESC_F_NEXT, 1);
        publish(&m, &q, 0, &[0]);
        assert!(matches!(q.pop(&m), Err(QueueError::Indirect(_))));
        let mut q = queue(4);
        q.indirect = true;
        set_desc(&m, DESC, 0, 0x6000, 32, DESC_F_INDIRECT, 0);
        set_desc(&m, 0x6000, 0, 0x6000, 32, DESC_F_INDIRECT, 0);
        publish(&m, &q, 0, &[0]);
        assert!(matches!(q.pop(&m), Err(QueueError::Indirect(_))));
        // An indirect table outside memory, or of a bad length.
        for (addr, len) in [(u64::MAX - 8, 32), (0x6000, 17), (0x6000, 0)] {
            let mut q = queue(4);
            q.indirect = true;
            set_desc(&m, DESC, 0, addr, len, DESC_F_INDIRECT, 0);
            publish(&m, &q, 0, &[0]);
            assert!(
                matches!(q.pop(&m), Err(QueueError::Indirect(_))),
                "{addr:#x} {len}"
            );
        }
        // Rings outside memory or misaligned make the queue invalid.
        let mut q = queue(4);
        q.used_ring = (1 << 20) - 4;
        assert!(!q.is_valid(&m));
        let mut q = queue(4);
        q.desc_table = 0x1008;
        assert!(!q.is_valid(&m));
        let mut q = queue(3);
        q.size = 3;
        assert!(!q.is_valid(&m));
    }

    #[test]
    fn indirect_tables_expand() {
        let m = mem();
        let mut q = queue(4);
        q.indirect = true;
        set_desc(&m, DESC, 2, 0x6000, 48, DESC_F_INDIRECT, 0);
        set_desc(&m, 0x6000, 0, 0x8000, 16, DESC_F_NEXT, 2);
        set_desc(&m, 0x6000, 2, 0x9000, 4096, DESC_F_NEXT | DESC_F_WRITE, 1);
        set_desc(&m, 0x6000, 1, 0xa000, 1, DESC_F_WRITE, 0);
        publish(&m, &q, 0, &[2]);
        let c = q.pop(&m).unwrap().unwrap();
        assert_eq!(c.head, 2);
        assert_eq!(c.descs.len(), 3);
        assert_eq!(
            c.descs[1],
            Desc {
                addr: 0x9000,
                len: 4096,
                write: true
            }
        );
        // A loop inside an indirect table ends.
        let mut q = queue(4);
        q.indirect = true;
        set_desc(&m, 0x6000, 1, 0xa000, 1, DESC_F_NEXT, 0);
        publish(&m, &q, 0, &[2]);
        assert!(matches!(q.pop(&m), Err(QueueError::ChainTooLong(3))));
    }

    #[test]
    fn event_index_suppression() {
        assert!(need_event(0, 1, 0));
        assert!(!need_event(5, 3, 2));
        assert!(need_event(5, 6, 2));
        assert!(need_event(0xffff, 0, 0xfffe)); // wraps
        let m = mem();
        let mut q = queue(8);
        q.event_idx = true;
        // used_event = 1: interrupt when the used index passes 1.
        m.write_obj(1u16, GuestAddress(AVAIL + 4 + 16)).unwrap();
        assert!(q.needs_interrupt(&m)); // first time always
        q.next_used = Wrapping(1);
        assert!(!q.needs_interrupt(&m)); // 0 -> 1 does not pass 1
        q.next_used = Wrapping(2);
        assert!(q.needs_interrupt(&m)); // 1 -> 2 passes 1
        // Without EVENT_IDX the avail flags decide.
        let mut q = queue(8);
        m.write_obj(1u16, GuestAddress(AVAIL)).unwrap();
        assert!(!q.needs_interrupt(&m));
        m.write_obj(0u16, GuestAddress(AVAIL)).unwrap();
        assert!(q.needs_interrupt(&m));
        // Notification enabling writes avail_event / flags and reports pending work.
        let mut q = queue(8);
        q.event_idx = true;
        publish(&m, &q, 0, &[]);
        assert!(!q.enable_notification(&m).unwrap());
        let ev: u16 = m.read_obj(GuestAddress(USED + 4 + 64)).unwrap();
        assert_eq!(ev, 0);
        let mut q = queue(8);
        q.disable_notification(&m).unwrap();
        let f: u16 = m.read_obj(GuestAddress(USED)).unwrap();
        assert_eq!(f, USED_F_NO_NOTIFY);
        publish(&m, &q, 0, &[1]);
        assert!(q.enable_notification(&m).unwrap());
        let f: u16 = m.read_obj(GuestAddress(USED)).unwrap();
        assert_eq!(f, 0);
    }
}
