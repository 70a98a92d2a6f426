//! An MSI-X capability with its table and pending-bit array (PBA), emulated. Pure register
//! logic: the guest programs vectors (address, data, mask) through the table; the VMM asks
//! [`Msix::signal`] what to do when the device raises a vector, and follows the
//! [`RouteChange`]s the guest's writes cause (each one is a KVM GSI route to install, change
//! or remove in front of that vector's irqfd).
//!
//! Guest input rules: table and PBA accesses must be 4 or 8 bytes and naturally aligned
//! (PCI Local Bus 3.0, 6.8.2); anything else reads as zero and writes nothing, offsets past
//! the table or PBA likewise, and the PBA is read-only.

/// Bytes per table entry: address low, address high, data, vector control.
pub const ENTRY_SIZE: u64 = 16;
/// Most vectors one function can have.
pub const MAX_VECTORS: u16 = 2048;
/// Message control: MSI-X enable.
pub const CONTROL_ENABLE: u16 = 1 << 15;
/// Message control: function mask.
pub const CONTROL_FUNCTION_MASK: u16 = 1 << 14;
/// Vector control: masked.
const VECTOR_MASKED: u32 = 1;

/// Errors defining the capability (the VMM's own mistakes).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MsixError {
    /// Zero vectors or more than 2048.
    #[error("an MSI-X capability has 1 to {MAX_VECTORS} vectors, not {0}")]
    VectorCount(usize),
    /// A table or PBA offset that is not 8-byte aligned, or a BAR index past 5.
    #[error("MSI-X {0} location (BAR {1}, offset {2:#x}) is not a BAR and 8-byte offset")]
    Location(&'static str, u8, u32),
}

/// One MSI message: what the device writes, where, to interrupt a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsiMessage {
    /// Message address (0xfeeX_XXXX on x86).
    pub address: u64,
    /// Message data (vector, delivery mode).
    pub data: u32,
}

/// What raising a vector comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Send this message (the vector's irqfd, routed to it).
    Send(MsiMessage),
    /// Masked: the pending bit is now set; it goes out when unmasked.
    Pending,
    /// MSI-X is off, or the vector does not exist: nothing happens.
    Dropped,
}

/// A vector's route changed: install `Some(message)` for it, or take its route away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteChange {
    /// Vector index.
    pub vector: u16,
    /// The message the route delivers, or None while the vector cannot deliver.
    pub route: Option<MsiMessage>,
    /// The vector was pending and is now deliverable: raise it once now.
    pub fire_pending: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    address: u64,
    data: u32,
    control: u32,
}

/// Where the table and PBA live: (BAR index, offset in that BAR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixLayout {
    /// BAR index and offset of the table.
    pub table: (u8, u32),
    /// BAR index and offset of the pending-bit array.
    pub pba: (u8, u32),
}

/// The capability's state.
#[derive(Clone, Debug)]
pub struct Msix {
    entries: Vec<Entry>,
    pending: Vec<u64>,
    enabled: bool,
    function_masked: bool,
    layout: MsixLayout,
}

impl Msix {
    /// `count` vectors, all masked, MSI-X off (the reset state).
    pub fn new(count: usize, layout: MsixLayout) -> Result<Self, MsixError> {
        if count == 0 || count > usize::from(MAX_VECTORS) {
            return Err(MsixError::VectorCount(count));
        }
        for (what, (bar, off)) in [("table", layout.table), ("PBA", layout.pba)] {
            if bar > 5 || off % 8 != 0 {
                return Err(MsixError::Location(what, bar, off));
            }
        }
        Ok(Self {
            entries: vec![
                Entry {
                    control: VECTOR_MASKED,
                    ..Entry::default()
                };
                count
            ],
            pending: vec![0; count.div_ceil(64)],
            enabled: false,
            function_masked: false,
            layout,
        })
    }

    /// Number of vectors.
    pub fn count(&self) -> usize {
        self.entries.len()
    }

    /// Bytes of table the BAR must hold.
    pub fn table_size(&self) -> u64 {
        self.entries.len() as u64 * ENTRY_SIZE
    }

    /// Bytes of PBA the BAR must hold (whole quadwords).
    pub fn pba_size(&self) -> u64 {
        self.pending.len() as u64 * 8
    }

    /// Where the table and PBA are.
    pub fn layout(&self) -> MsixLayout {
        self.layout
    }

    /// The capability body after the id and next pointer (message control, table
    /// offset/BIR, PBA offset/BIR) and its write mask (only enable and function mask).
    pub fn capability(&self) -> ([u8; 10], [u8; 10]) {
        let mut body = [0u8; 10];
        let control = (self.entries.len() - 1) as u16;
        body[0..2].copy_from_slice(&control.to_le_bytes());
        let (tb, to) = self.layout.table;
        let (pb, po) = self.layout.pba;
        body[2..6].copy_from_slice(&(to | u32::from(tb)).to_le_bytes());
        body[6..10].copy_from_slice(&(po | u32::from(pb)).to_le_bytes());
        let mut mask = [0u8; 10];
        mask[1] = ((CONTROL_ENABLE | CONTROL_FUNCTION_MASK) >> 8) as u8;
        (body, mask)
    }

    /// Whether MSI-X is enabled.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether vector `v` can deliver now (enabled, function and vector unmasked).
    fn deliverable(&self, v: usize) -> bool {
        self.enabled
            && !self.function_masked
            && self
                .entries
                .get(v)
                .is_some_and(|e| e.control & VECTOR_MASKED == 0)
    }

    fn message(&self, v: usize) -> Option<MsiMessage> {
        self.deliverable(v).then(|| {
            let e = self.entries[v];
            MsiMessage {
                address: e.address,
                data: e.data,
            }
        })
    }

    fn is_pending(&self, v: usize) -> bool {
        self.pending[v / 64] & (1 << (v % 64)) != 0
    }

    fn set_pending(&mut self, v: usize, on: bool) {
        let bit = 1u64 << (v % 64);
        if on {
            self.pending[v / 64] |= bit;
        } else {
            self.pending[v / 64] &= !bit;
        }
    }

    /// Every vector's route, as after a change of enable or function mask.
    fn all_routes(&mut self, before: &[Option<MsiMessage>]) -> Vec<RouteChange> {
        (0..self.entries.len())
            .filter_map(|v| self.route_change(v, before[v]))
            .collect()
    }

    fn route_change(&mut self, v: usize, before: Option<MsiMessage>) -> Option<RouteChange> {
        let now = self.message(v);
        let fire = now.is_some() && self.is_pending(v);
        if fire {
            self.set_pending(v, false);
        }
        (now != before || fire).then_some(RouteChange {
            vector: v as u16,
            route: now,
            fire_pending: fire,
        })
    }

    /// The guest wrote message control (the two writable bits are all that count).
    pub fn write_control(&mut self, control: u16) -> Vec<RouteChange> {
        let before: Vec<_> = (0..self.entries.len()).map(|v| self.message(v)).collect();
        self.enabled = control & CONTROL_ENABLE != 0;
        self.function_masked = control & CONTROL_FUNCTION_MASK != 0;
        self.all_routes(&before)
    }

    /// A configuration write of `len` bytes at `offset` landed in `config`, whose MSI-X
    /// capability is at `cap`: when it touched message control (the capability's bytes
    /// 2-3), follow its enable and function-mask bits. Every function with an emulated
    /// capability calls this from its `write_config`.
    pub fn follow_config_write(
        &mut self,
        config: &super::config::ConfigSpace,
        cap: usize,
        offset: u64,
        len: usize,
    ) -> Vec<RouteChange> {
        let control_at = (cap + 2) as u64;
        if offset >= control_at + 2 || offset + len as u64 <= control_at {
            return Vec::new();
        }
        let b = config.bytes(control_at as usize, 2);
        self.write_control(u16::from_le_bytes([b[0], b[1]]))
    }

    /// The device raises vector `v`.
    pub fn signal(&mut self, v: usize) -> Delivery {
        if v >= self.entries.len() || !self.enabled {
            return Delivery::Dropped;
        }
        match self.message(v) {
            Some(m) => Delivery::Send(m),
            None => {
                self.set_pending(v, true);
                Delivery::Pending
            }
        }
    }

    fn access_ok(offset: u64, len: usize, size: u64) -> bool {
        matches!(len, 4 | 8)
            && offset % len as u64 == 0
            && offset
                .checked_add(len as u64)
                .is_some_and(|end| end <= size)
    }

    /// A guest read of the table at `offset` from its start.
    pub fn read_table(&self, offset: u64, data: &mut [u8]) {
        if !Self::access_ok(offset, data.len(), self.table_size()) {
            data.fill(0);
            return;
        }
        let dword = |at: u64| -> [u8; 4] {
            let e = &self.entries[(at / ENTRY_SIZE) as usize];
            let v = match at % ENTRY_SIZE {
                0 => e.address as u32,
                4 => (e.address >> 32) as u32,
                8 => e.data,
                _ => e.control,
            };
            v.to_le_bytes()
        };
        data[..4].copy_from_slice(&dword(offset));
        if data.len() == 8 {
            data[4..].copy_from_slice(&dword(offset + 4));
        }
    }

    /// A guest write to the table at `offset`. Returns the route change it causes, if any.
    pub fn write_table(&mut self, offset: u64, data: &[u8]) -> Option<RouteChange> {
        if !Self::access_ok(offset, data.len(), self.table_size()) {
            return None;
        }
        let v = (offset / ENTRY_SIZE) as usize;
        let before = self.message(v);
        for (i, chunk) in data.chunks_exact(4).enumerate() {
            let value = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let e = &mut self.entries[v];
            match (offset + 4 * i as u64) % ENTRY_SIZE {
                0 => e.address = (e.address & !0xffff_ffff) | u64::from(value),
                4 => e.address = (e.address & 0xffff_ffff) | u64::from(value) << 32,
                8 => e.data = value,
                // Only the mask bit of vector control is defined; the rest reads zero.
                _ => e.control = value & VECTOR_MASKED,
            }
        }
        self.route_change(v, before)
    }

    /// A guest read of the PBA at `offset` from its start.
    pub fn read_pba(&self, offset: u64, data: &mut [u8]) {
        if !Self::access_ok(offset, data.len(), self.pba_size()) {
            data.fill(0);
            return;
        }
        let word = self.pending[(offset / 8) as usize].to_le_bytes();
        let at = (offset % 8) as usize;
        data.copy_from_slice(&word[at..at + data.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: MsixLayout = MsixLayout {
        table: (0, 0x2000),
        pba: (0, 0x3000),
    };

    fn program(m: &mut Msix, v: u64, address: u64, data: u32, masked: bool) -> Option<RouteChange> {
        m.write_table(v * 16, &address.to_le_bytes());
        m.write_table(v * 16 + 8, &data.to_le_bytes());
        m.write_table(v * 16 + 12, &u32::from(masked).to_le_bytes())
    }

    #[test]
    fn definitions_are_checked() {
        assert_eq!(Msix::new(0, LAYOUT).err(), Some(MsixError::VectorCount(0)));
        assert_eq!(
            Msix::new(2049, LAYOUT).err(),
            Some(MsixError::VectorCount(2049))
        );
        let bad = MsixLayout {
            table: (6, 0),
            ..LAYOUT
        };
        assert!(matches!(
            Msix::new(1, bad),
            Err(MsixError::Location("table", 6, 0))
        ));
        let bad = MsixLayout {
            pba: (0, 4),
            ..LAYOUT
        };
        assert!(matches!(
            Msix::new(1, bad),
            Err(MsixError::Location("PBA", 0, 4))
        ));
        let m = Msix::new(65, LAYOUT).unwrap();
        assert_eq!(m.table_size(), 65 * 16);
        assert_eq!(m.pba_size(), 16);
    }

    #[test]
    fn capability_encodes_size_and_locations() {
        let m = Msix::new(3, LAYOUT).unwrap();
        let (body, mask) = m.capability();
        assert_eq!(u16::from_le_bytes([body[0], body[1]]), 2);
        assert_eq!(u32::from_le_bytes(body[2..6].try_into().unwrap()), 0x2000);
        assert_eq!(u32::from_le_bytes(body[6..10].try_into().unwrap()), 0x3000);
        assert_eq!(mask[1], 0xc0);
        assert_eq!(mask.iter().filter(|b| **b != 0).count(), 1);
    }

    #[test]
    fn vectors_route_only_when_enabled_and_unmasked() {
        let mut m = Msix::new(2, LAYOUT).unwrap();
        // Reset state: all masked, MSI-X off; programming a vector routes nothing yet.
        assert_eq!(program(&mut m, 0, 0xfee0_0000, 0x41, false), None);
        assert_eq!(m.signal(0), Delivery::Dropped);
        let ch = m.write_control(CONTROL_ENABLE);
        let msg = MsiMessage {
            address: 0xfee0_0000,
            data: 0x41,
        };
        assert_eq!(
            ch,
            vec![RouteChange {
                vector: 0,
                route: Some(msg),
                fire_pending: false
            }]
        );
        assert_eq!(m.signal(0), Delivery::Send(msg));
        // Vector 1 is still masked: raising it sets its pending bit...
        assert_eq!(m.signal(1), Delivery::Pending);
        let mut pba = [0u8; 8];
        m.read_pba(0, &mut pba);
        assert_eq!(u64::from_le_bytes(pba), 0b10);
        // ...and unmasking it delivers once and clears the bit.
        let ch = program(&mut m, 1, 0xfee0_1000, 0x42, false).unwrap();
        assert!(ch.fire_pending);
        assert_eq!(ch.route.unwrap().data, 0x42);
        m.read_pba(0, &mut pba);
        assert_eq!(u64::from_le_bytes(pba), 0);
        // The function mask takes every route away; lifting it restores them.
        let ch = m.write_control(CONTROL_ENABLE | CONTROL_FUNCTION_MASK);
        assert_eq!(ch.len(), 2);
        assert!(ch.iter().all(|c| c.route.is_none()));
        assert_eq!(m.signal(0), Delivery::Pending);
        let ch = m.write_control(CONTROL_ENABLE);
        assert_eq!(ch.len(), 2);
        assert!(ch[0].fire_pending && !ch[1].fire_pending);
        // Vectors past the table are dropped.
        assert_eq!(m.signal(2), Delivery::Dropped);
    }

    #[test]
    fn table_reads_back_and_hostile_accesses_do_nothing() {
        let mut m = Msix::new(1, LAYOUT).unwrap();
        m.write_control(CONTROL_ENABLE);
        program(&mut m, 0, 0x1_fee0_0000, 7, true);
        let mut q = [0u8; 8];
        m.read_table(0, &mut q);
        assert_eq!(u64::from_le_bytes(q), 0x1_fee0_0000);
        let mut d = [0u8; 4];
        m.read_table(12, &mut d);
        assert_eq!(u32::from_le_bytes(d), 1);
        // Reserved vector-control bits read zero.
        m.write_table(12, &0xffff_fffeu32.to_le_bytes());
        m.read_table(12, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0);
        // 2-byte, misaligned and out-of-range accesses.
        assert_eq!(m.write_table(8, &[1, 2]), None);
        assert_eq!(m.write_table(2, &[1, 2, 3, 4]), None);
        assert_eq!(m.write_table(16, &[1, 2, 3, 4]), None);
        assert_eq!(m.write_table(u64::MAX - 3, &[1, 2, 3, 4]), None);
        m.read_table(8, &mut d);
        assert_eq!(u32::from_le_bytes(d), 7);
        let mut b = [0xffu8; 2];
        m.read_table(0, &mut b);
        assert_eq!(b, [0, 0]);
        m.read_pba(8, &mut q);
        assert_eq!(q, [0; 8]);
    }
}
