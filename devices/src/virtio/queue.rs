//! The split virtqueue, device side: rust-vmm's `virtio-queue` walks the rings and the
//! descriptor chains (fuzzed and Kani-proved upstream, no allocation per chain); this
//! module keeps our stricter rules for hostile input around it.
//!
//! Everything here comes from the guest: ring addresses, indices, descriptor addresses,
//! lengths, flags, `next` links, indirect tables. `virtio-queue` bounds every chain (a loop
//! ends) and every index, but it ends a malformed chain silently; here a malformed chain is
//! a structural violation the transport turns into NEEDS_RESET: a head or `next` index out
//! of range, a loop, a chain of more than 4 GiB, an indirect table that was not negotiated,
//! has NEXT set, is empty, not a multiple of 16, longer than [`MAX_INDIRECT`] entries or
//! outside one region of guest memory, an indirect table inside an indirect table, and the
//! driver's avail index running ahead by more than the queue size.
//!
//! [`QueueSetup`] is what the driver writes through the transport's registers;
//! [`QueueSetup::start`] checks it against guest memory and gives the running [`Queue`].

use std::sync::atomic::Ordering;

use virtio_bindings::virtio_ring as vr;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, QueueOwnedT, QueueT};
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
#[cfg(test)]
const USED_F_NO_NOTIFY: u16 = vr::VRING_USED_F_NO_NOTIFY as u16;
/// `VIRTQ_AVAIL_F_NO_INTERRUPT`.
const AVAIL_F_NO_INTERRUPT: u16 = vr::VRING_AVAIL_F_NO_INTERRUPT as u16;
/// Bytes of one descriptor.
const DESC_BYTES: u64 = 16;

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
    /// A chain whose buffers add up to more than 4 GiB.
    #[error("descriptor chain of more than 4 GiB")]
    ChainTooBig,
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

/// A queue as the driver sets it up through the transport's registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSetup {
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
}

impl QueueSetup {
    /// A queue offering `max_size` entries.
    pub fn new(max_size: u16) -> Self {
        Self {
            max_size,
            size: max_size,
            ready: false,
            desc_table: 0,
            avail_ring: 0,
            used_ring: 0,
        }
    }

    /// Back to the state after reset, keeping `max_size`.
    pub fn reset(&mut self) {
        *self = Self::new(self.max_size);
    }

    /// Whether the driver's setup is usable: a power-of-two size within bounds, rings
    /// aligned and each inside one region of guest memory.
    pub fn is_valid(&self, mem: &GuestMemoryMmap) -> bool {
        let n = self.size as u64;
        let size_ok = self.size > 0 && self.size <= self.max_size && self.size.is_power_of_two();
        size_ok
            && self.desc_table % 16 == 0
            && self.avail_ring % 2 == 0
            && self.used_ring % 4 == 0
            && host_range(mem, self.desc_table, DESC_BYTES * n).is_some()
            && host_range(mem, self.avail_ring, 6 + 2 * n).is_some()
            && host_range(mem, self.used_ring, 6 + 8 * n).is_some()
    }

    /// The running queue, with the negotiated ring features, if the setup is valid.
    pub fn start(
        &self,
        mem: &GuestMemoryMmap,
        event_idx: bool,
        indirect: bool,
    ) -> Result<Queue, QueueError> {
        // virtio-queue takes an avail ring at guest address 0 for a queue that was reset
        // and never set up again: refused here, at DRIVER_OK, rather than at the first pop.
        if !self.ready || self.avail_ring == 0 || !self.is_valid(mem) {
            return Err(QueueError::NotReady);
        }
        let mut q = virtio_queue::Queue::new(self.max_size).map_err(|_| QueueError::NotReady)?;
        q.try_set_size(self.size)
            .and_then(|()| q.try_set_desc_table_address(GuestAddress(self.desc_table)))
            .and_then(|()| q.try_set_avail_ring_address(GuestAddress(self.avail_ring)))
            .and_then(|()| q.try_set_used_ring_address(GuestAddress(self.used_ring)))
            .map_err(|_| QueueError::NotReady)?;
        q.set_event_idx(event_idx);
        q.set_ready(true);
        if !q.is_valid(mem) {
            return Err(QueueError::NotReady);
        }
        Ok(Queue { inner: q, indirect })
    }
}

/// A running split virtqueue.
#[derive(Debug)]
pub struct Queue {
    inner: virtio_queue::Queue,
    /// VIRTIO_RING_F_INDIRECT_DESC negotiated.
    indirect: bool,
}

/// A raw descriptor, read by us where `virtio-queue` would not tell why a chain ended.
fn read_desc(mem: &GuestMemoryMmap, table: u64, i: u64) -> Result<Descriptor, QueueError> {
    let at = DESC_BYTES
        .checked_mul(i)
        .and_then(|o| table.checked_add(o))
        .ok_or(QueueError::Ring(table))?;
    mem.read_obj::<Descriptor>(GuestAddress(at))
        .map_err(|_| QueueError::Ring(at))
}

impl Queue {
    /// Queue size.
    pub fn size(&self) -> u16 {
        self.inner.size()
    }

    /// VIRTIO_RING_F_EVENT_IDX negotiated.
    pub fn event_idx(&self) -> bool {
        self.inner.event_idx_enabled()
    }

    /// VIRTIO_RING_F_INDIRECT_DESC negotiated.
    pub fn indirect(&self) -> bool {
        self.indirect
    }

    /// Avail ring address.
    pub fn avail_ring(&self) -> u64 {
        self.inner.avail_ring()
    }

    /// Entries the driver has made available that we have not taken.
    pub fn pending(&self, mem: &GuestMemoryMmap) -> Result<u16, QueueError> {
        let avail = self
            .inner
            .avail_idx(mem, Ordering::Acquire)
            .map_err(|_| QueueError::Ring(self.inner.avail_ring()))?;
        let next = std::num::Wrapping(self.inner.next_avail());
        let ahead = (avail - next).0;
        if ahead > self.size() {
            return Err(QueueError::AvailJump {
                avail: avail.0,
                next: next.0,
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
        let ring = self.inner.avail_ring();
        let slot = ring + 4 + 2 * (self.inner.next_avail() % self.size()) as u64;
        let chain = self
            .inner
            .iter(mem)
            .map_err(|_| QueueError::Ring(ring))?
            .next()
            .ok_or(QueueError::Ring(slot))?;
        self.collect(chain, mem).map(Some)
    }

    /// The descriptors of `chain`, or why the chain is malformed.
    fn collect(
        &self,
        chain: DescriptorChain<&GuestMemoryMmap>,
        mem: &GuestMemoryMmap,
    ) -> Result<Chain, QueueError> {
        let head = chain.head_index();
        let size = self.size();
        if head >= size {
            return Err(QueueError::BadIndex(head));
        }
        // The table the chain lives in, and its length: the queue's descriptor table, or
        // the indirect table its head names (checked here: virtio-queue would follow it
        // without our limits).
        let first = read_desc(mem, self.inner.desc_table(), head as u64)?;
        let (table, entries) = if first.refers_to_indirect_table() {
            if !self.indirect {
                return Err(QueueError::Indirect("INDIRECT_DESC was not negotiated"));
            }
            if first.has_next() {
                return Err(QueueError::Indirect("INDIRECT together with NEXT"));
            }
            let len = first.len();
            if len == 0 || len % 16 != 0 || len / 16 > MAX_INDIRECT {
                return Err(QueueError::Indirect(
                    "table length is not a non-zero multiple of 16 within bounds",
                ));
            }
            if host_range(mem, first.addr().0, len as u64).is_none() {
                return Err(QueueError::Indirect("table outside guest memory"));
            }
            (first.addr().0, len / 16)
        } else {
            (self.inner.desc_table(), size as u32)
        };
        let mut descs = Vec::new();
        let mut last = None;
        for d in chain {
            descs.push(Desc {
                addr: d.addr().0,
                len: d.len(),
                write: d.is_write_only(),
            });
            last = Some(d);
        }
        // virtio-queue ends a chain early, without a word, at whatever it will not follow:
        // the last descriptor it gave still says NEXT. Find out why.
        let Some(last) = last else {
            // Only an indirect head yields nothing: its table's first entry was refused.
            let d = read_desc(mem, table, 0)?;
            return Err(if d.refers_to_indirect_table() {
                QueueError::Indirect("an indirect table inside an indirect table")
            } else {
                QueueError::Ring(table)
            });
        };
        if !last.has_next() {
            return Ok(Chain { head, descs });
        }
        let next = last.next();
        if next as u32 >= entries {
            return Err(QueueError::BadIndex(next));
        }
        if descs.len() as u32 >= entries {
            return Err(QueueError::ChainTooLong(entries));
        }
        let d = read_desc(mem, table, next as u64)?;
        if d.refers_to_indirect_table() {
            return Err(QueueError::Indirect(if table == self.inner.desc_table() {
                "an indirect table after direct descriptors"
            } else {
                "an indirect table inside an indirect table"
            }));
        }
        Err(QueueError::ChainTooBig)
    }

    /// Returns a chain to the driver with `len` bytes written.
    pub fn add_used(
        &mut self,
        mem: &GuestMemoryMmap,
        head: u16,
        len: u32,
    ) -> Result<(), QueueError> {
        self.inner
            .add_used(mem, head, len)
            .map_err(|_| QueueError::Ring(self.inner.used_ring()))
    }

    /// Whether the driver wants an interrupt for what was used since the last one.
    pub fn needs_interrupt(&mut self, mem: &GuestMemoryMmap) -> bool {
        if !self.event_idx() {
            // virtio-queue leaves VRING_AVAIL_F_NO_INTERRUPT to us.
            std::sync::atomic::fence(Ordering::SeqCst);
            return mem
                .read_obj::<u16>(GuestAddress(self.inner.avail_ring()))
                .map(|f| u16::from_le(f) & AVAIL_F_NO_INTERRUPT == 0)
                .unwrap_or(true);
        }
        self.inner.needs_notification(mem).unwrap_or(true)
    }

    /// Asks the driver to notify us again; returns whether entries are already pending (the
    /// caller must look again before sleeping).
    pub fn enable_notification(&mut self, mem: &GuestMemoryMmap) -> Result<bool, QueueError> {
        self.inner
            .enable_notification(mem)
            .map_err(|_| QueueError::Ring(self.inner.used_ring()))?;
        Ok(self.pending(mem)? > 0)
    }

    /// Asks the driver not to notify us (we are polling).
    pub fn disable_notification(&mut self, mem: &GuestMemoryMmap) -> Result<(), QueueError> {
        // With EVENT_IDX the driver only notifies when it passes avail_event, which is not
        // advanced while polling; without it, USED_F_NO_NOTIFY is set.
        self.inner
            .disable_notification(mem)
            .map_err(|_| QueueError::Ring(self.inner.used_ring()))
    }
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

    pub(crate) fn setup(size: u16) -> QueueSetup {
        QueueSetup {
            size,
            desc_table: DESC,
            avail_ring: AVAIL,
            used_ring: USED,
            ready: true,
            ..QueueSetup::new(MAX_QUEUE_SIZE)
        }
    }

    fn queue_with(m: &GuestMemoryMmap, size: u16, event_idx: bool, indirect: bool) -> Queue {
        setup(size).start(m, event_idx, indirect).unwrap()
    }

    pub(crate) fn queue(m: &GuestMemoryMmap, size: u16) -> Queue {
        queue_with(m, size, false, false)
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
        m.write_obj(
            Descriptor::new(addr, len, flags, next),
            GuestAddress(table + 16 * i as u64),
        )
        .unwrap();
    }

    /// Publishes `heads` in the avail ring starting at slot `from`.
    pub(crate) fn publish(m: &GuestMemoryMmap, size: u16, from: u16, heads: &[u16]) {
        for (k, h) in heads.iter().enumerate() {
            let slot = (from as usize + k) % size as usize;
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
        assert!(setup(8).is_valid(&m));
        let mut q = queue(&m, 8);
        set_desc(&m, DESC, 0, 0x8000, 16, DESC_F_NEXT, 3);
        set_desc(&m, DESC, 3, 0x9000, 512, DESC_F_NEXT | DESC_F_WRITE, 5);
        set_desc(&m, DESC, 5, 0xa000, 1, DESC_F_WRITE, 0);
        publish(&m, 8, 0, &[0]);
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
        let mut q = queue(&m, 4);
        set_desc(&m, DESC, 0, 0x8000, 16, DESC_F_NEXT, 1);
        set_desc(&m, DESC, 1, 0x8000, 16, DESC_F_NEXT, 0);
        publish(&m, 4, 0, &[0]);
        assert_eq!(q.pop(&m), Err(QueueError::ChainTooLong(4)));
        // Head out of range.
        let mut q = queue(&m, 4);
        publish(&m, 4, 0, &[9]);
        assert_eq!(q.pop(&m), Err(QueueError::BadIndex(9)));
        // Next out of range.
        let mut q = queue(&m, 4);
        set_desc(&m, DESC, 0, 0x8000, 16, DESC_F_NEXT, 200);
        publish(&m, 4, 0, &[0]);
        assert_eq!(q.pop(&m), Err(QueueError::BadIndex(200)));
        // The driver claims more entries than the queue holds.
        let q = queue(&m, 4);
        m.write_obj(100u16, GuestAddress(AVAIL + 2)).unwrap();
        assert!(matches!(q.pending(&m), Err(QueueError::AvailJump { .. })));
        // Indirect without the feature, with NEXT, nested.
        let mut q = queue(&m, 4);
        set_desc(&m, DESC, 0, 0x6000, 32, DESC_F_INDIRECT, 0);
        publish(&m, 4, 0, &[0]);
        assert!(matches!(q.pop(&m), Err(QueueError::Indirect(_))));
        let mut q = queue_with(&m, 4, false, true);
        set_desc(&m, DESC, 0, 0x6000, 32, DESC_F_INDIRECT | DESC_F_NEXT, 1);
        publish(&m, 4, 0, &[0]);
        assert!(matches!(q.pop(&m), Err(QueueError::Indirect(_))));
        let mut q = queue_with(&m, 4, false, true);
        set_desc(&m, DESC, 0, 0x6000, 32, DESC_F_INDIRECT, 0);
        set_desc(&m, 0x6000, 0, 0x6000, 32, DESC_F_INDIRECT, 0);
        publish(&m, 4, 0, &[0]);
        assert!(matches!(q.pop(&m), Err(QueueError::Indirect(_))));
        // Nested one level down the table: the chain reaches it through NEXT.
        let mut q = queue_with(&m, 4, false, true);
        set_desc(&m, DESC, 0, 0x6000, 32, DESC_F_INDIRECT, 0);
        set_desc(&m, 0x6000, 0, 0x8000, 16, DESC_F_NEXT, 1);
        set_desc(&m, 0x6000, 1, 0x6000, 32, DESC_F_INDIRECT, 0);
        publish(&m, 4, 0, &[0]);
        assert_eq!(
            q.pop(&m),
            Err(QueueError::Indirect(
                "an indirect table inside an indirect table"
            ))
        );
        // An indirect table outside memory, or of a bad length.
        for (addr, len) in [(u64::MAX - 8, 32), (0x6000, 17), (0x6000, 0)] {
            let mut q = queue_with(&m, 4, false, true);
            set_desc(&m, DESC, 0, addr, len, DESC_F_INDIRECT, 0);
            publish(&m, 4, 0, &[0]);
            assert!(
                matches!(q.pop(&m), Err(QueueError::Indirect(_))),
                "{addr:#x} {len}"
            );
        }
        // Buffers adding up to more than 4 GiB.
        let mut q = queue(&m, 4);
        set_desc(&m, DESC, 0, 0x8000, u32::MAX, DESC_F_NEXT, 1);
        set_desc(&m, DESC, 1, 0x8000, 2, 0, 0);
        publish(&m, 4, 0, &[0]);
        assert_eq!(q.pop(&m), Err(QueueError::ChainTooBig));
        // Rings outside memory or misaligned make the queue invalid.
        let mut s = setup(4);
        s.used_ring = (1 << 20) - 4;
        assert!(!s.is_valid(&m));
        assert_eq!(s.start(&m, false, false).unwrap_err(), QueueError::NotReady);
        let mut s = setup(4);
        s.desc_table = 0x1008;
        assert!(!s.is_valid(&m));
        assert!(!setup(3).is_valid(&m));
        // Not ready, or an avail ring left at 0 after a reset.
        let mut s = setup(4);
        s.ready = false;
        assert!(s.start(&m, false, false).is_err());
        let mut s = setup(4);
        s.avail_ring = 0;
        assert!(s.start(&m, false, false).is_err());
    }

    #[test]
    fn indirect_tables_expand() {
        let m = mem();
        let mut q = queue_with(&m, 4, false, true);
        set_desc(&m, DESC, 2, 0x6000, 48, DESC_F_INDIRECT, 0);
        set_desc(&m, 0x6000, 0, 0x8000, 16, DESC_F_NEXT, 2);
        set_desc(&m, 0x6000, 2, 0x9000, 4096, DESC_F_NEXT | DESC_F_WRITE, 1);
        set_desc(&m, 0x6000, 1, 0xa000, 1, DESC_F_WRITE, 0);
        publish(&m, 4, 0, &[2]);
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
        let mut q = queue_with(&m, 4, false, true);
        set_desc(&m, 0x6000, 1, 0xa000, 1, DESC_F_NEXT, 0);
        publish(&m, 4, 0, &[2]);
        assert!(matches!(q.pop(&m), Err(QueueError::ChainTooLong(3))));
    }

    #[test]
    fn event_index_suppression() {
        let m = mem();
        let mut q = queue_with(&m, 8, true, false);
        // used_event = 1: interrupt when the used index passes 1.
        m.write_obj(1u16, GuestAddress(AVAIL + 4 + 16)).unwrap();
        q.add_used(&m, 0, 1).unwrap();
        assert!(!q.needs_interrupt(&m)); // 0 -> 1 does not pass 1
        q.add_used(&m, 0, 1).unwrap();
        assert!(q.needs_interrupt(&m)); // 1 -> 2 passes 1
        q.add_used(&m, 0, 1).unwrap();
        assert!(!q.needs_interrupt(&m)); // 2 -> 3 does not
        // Without EVENT_IDX the avail flags decide.
        let mut q = queue(&m, 8);
        m.write_obj(1u16, GuestAddress(AVAIL)).unwrap();
        assert!(!q.needs_interrupt(&m));
        m.write_obj(0u16, GuestAddress(AVAIL)).unwrap();
        assert!(q.needs_interrupt(&m));
        // Notification enabling writes avail_event / flags and reports pending work.
        publish(&m, 8, 0, &[]);
        let mut q = queue_with(&m, 8, true, false);
        assert!(!q.enable_notification(&m).unwrap());
        let ev: u16 = m.read_obj(GuestAddress(USED + 4 + 64)).unwrap();
        assert_eq!(ev, 0);
        let mut q = queue(&m, 8);
        q.disable_notification(&m).unwrap();
        let f: u16 = m.read_obj(GuestAddress(USED)).unwrap();
        assert_eq!(f, USED_F_NO_NOTIFY);
        publish(&m, 8, 0, &[1]);
        assert!(q.enable_notification(&m).unwrap());
        let f: u16 = m.read_obj(GuestAddress(USED)).unwrap();
        assert_eq!(f, 0);
    }
}
