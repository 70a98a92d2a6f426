//! One PCI function's configuration space (a type 0 header and its capability list), as the
//! guest sees it through CF8/CFC or ECAM. Pure register logic: reads return bytes, writes go
//! through per-byte write masks, BARs answer the sizing protocol (write all ones, read back
//! the size mask) and report when the guest moves them.
//!
//! Everything written here is guest input: offsets past the space read as zero and drop
//! writes, widths other than 1, 2 and 4 bytes are refused, a BAR only ever holds an
//! address aligned to its size with its type bits unchanged, and read-only fields stay so.

/// Bytes of a PCIe function's configuration space (ECAM); CF8/CFC reaches the first 256.
pub const CONFIG_SIZE: usize = 4096;
/// Where PCIe extended capabilities start.
pub const EXTENDED_START: usize = 0x100;
/// Where the capability list starts (the first capability we add).
pub const FIRST_CAPABILITY: usize = 0x40;

const VENDOR_ID: usize = 0x00;
const COMMAND: usize = 0x04;
const STATUS: usize = 0x06;
const REVISION: usize = 0x08;
const HEADER_TYPE: usize = 0x0e;
const BAR0: usize = 0x10;
/// The expansion ROM BAR's register.
const ROM_REG: usize = 0x30;
/// The expansion ROM BAR's enable bit.
pub const ROM_ENABLE: u32 = 1;
/// The index a function's expansion ROM takes beside BARs 0-5 (VFIO's ROM region index
/// too): [`BarChange::index`], [`ConfigSpace::bar`], [`ConfigSpace::bar_addr`].
pub const ROM_BAR: usize = 6;
/// The smallest expansion ROM (its address bits start at bit 11).
pub const ROM_MIN: u64 = 2048;
const SUBSYSTEM_VENDOR: usize = 0x2c;
const CAPABILITIES_POINTER: usize = 0x34;
const INTERRUPT_LINE: usize = 0x3c;
const INTERRUPT_PIN: usize = 0x3d;

/// COMMAND: memory space decode.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// COMMAND: bus master (DMA).
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
/// COMMAND: INTx disabled.
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// STATUS: a capability list exists.
const STATUS_CAPABILITIES: u16 = 1 << 4;

/// What a memory BAR is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    /// 32-bit memory BAR.
    Mem32,
    /// 64-bit memory BAR (takes this slot and the next).
    Mem64,
}

/// A memory BAR as the VMM defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bar {
    /// Size in bytes: a power of two of at least 16 (the VMM's own BARs are pages; a
    /// passed-through device's may be smaller).
    pub size: u64,
    /// 32- or 64-bit.
    pub kind: BarKind,
    /// Prefetchable.
    pub prefetchable: bool,
}

/// Errors defining a function (the VMM's own mistakes, caught before the guest runs).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A BAR of a size that is not a power of two of at least 16 bytes.
    #[error("BAR {0}: size {1:#x} is not a power of two of at least 16 bytes")]
    BarSize(usize, u64),
    /// An expansion ROM of a size that is not a power of two of 2 KiB to 2 GiB.
    #[error("expansion ROM: size {0:#x} is not a power of two from 2 KiB to 2 GiB")]
    RomSize(u64),
    /// A BAR index past 5, or a 64-bit BAR in slot 5.
    #[error("BAR {0} does not exist (or a 64-bit BAR has no slot after it)")]
    BarIndex(usize),
    /// A BAR slot already taken.
    #[error("BAR {0} is already defined")]
    BarTaken(usize),
    /// No room for a capability.
    #[error("no room for a {0}-byte capability")]
    NoRoom(usize),
}

/// The guest moved a BAR (or turned memory decoding on or off): the VMM must follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarChange {
    /// Which BAR.
    pub index: usize,
    /// Where it was (None: not decoding).
    pub old: Option<u64>,
    /// Where it is now (None: not decoding).
    pub new: Option<u64>,
}

/// A function's configuration space.
#[derive(Clone)]
pub struct ConfigSpace {
    bytes: Box<[u8; CONFIG_SIZE]>,
    writable: Box<[u8; CONFIG_SIZE]>,
    /// Extended capabilities put so far: [start, end).
    extended: Vec<(usize, usize)>,
    /// BARs 0-5 and the expansion ROM ([`ROM_BAR`]).
    bars: [Option<Bar>; 7],
    /// Where [`ConfigSpace::add_capability`] puts the next one: past every capability.
    next_cap: usize,
    last_cap: Option<usize>,
    /// The bytes each capability takes, `[start, end)`, in the order they were added.
    caps: Vec<(usize, usize)>,
}

impl std::fmt::Debug for ConfigSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSpace")
            .field(
                "id",
                &format_args!("{:04x}:{:04x}", self.read16(0), self.read16(2)),
            )
            .field("bars", &self.bars)
            .finish()
    }
}

impl ConfigSpace {
    /// A function `vendor:device` of `class` (class, subclass, programming interface),
    /// header type 0, with its subsystem ids, revision and an interrupt pin (0: none).
    pub fn new(vendor: u16, device: u16, class: u32, revision: u8, pin: u8) -> Self {
        let mut c = Self {
            bytes: Box::new([0; CONFIG_SIZE]),
            writable: Box::new([0; CONFIG_SIZE]),
            extended: Vec::new(),
            bars: [None; 7],
            next_cap: FIRST_CAPABILITY,
            last_cap: None,
            caps: Vec::new(),
        };
        c.put16(VENDOR_ID, vendor);
        c.put16(VENDOR_ID + 2, device);
        c.bytes[REVISION] = revision;
        c.bytes[REVISION + 1..REVISION + 4].copy_from_slice(&class.to_le_bytes()[..3]);
        c.bytes[HEADER_TYPE] = 0;
        c.put16(SUBSYSTEM_VENDOR, vendor);
        c.put16(SUBSYSTEM_VENDOR + 2, device);
        c.bytes[INTERRUPT_PIN] = pin;
        // The VMM places BARs as firmware would, and leaves memory decoding on as firmware
        // does; the guest may turn it off to size or move them.
        c.put16(COMMAND, COMMAND_MEMORY);
        // COMMAND: memory decode, bus master, INTx disable. INTERRUPT_LINE: scratch.
        let cmd = COMMAND_MEMORY | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE;
        c.writable[COMMAND..COMMAND + 2].copy_from_slice(&cmd.to_le_bytes());
        c.writable[INTERRUPT_LINE] = 0xff;
        c
    }

    fn put16(&mut self, at: usize, v: u16) {
        self.bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn put32(&mut self, at: usize, v: u32) {
        self.bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn read16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]])
    }

    fn read32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap_or([0; 4]))
    }

    /// Sets the subsystem vendor and device ids (a passed-through function shows its own).
    pub fn set_subsystem(&mut self, vendor: u16, device: u16) {
        self.put16(SUBSYSTEM_VENDOR, vendor);
        self.put16(SUBSYSTEM_VENDOR + 2, device);
    }

    /// Defines BAR `index` at guest address `addr` (aligned to its size).
    pub fn set_bar(&mut self, index: usize, bar: Bar, addr: u64) -> Result<(), ConfigError> {
        let slots = if bar.kind == BarKind::Mem64 { 2 } else { 1 };
        if index + slots > 6 {
            return Err(ConfigError::BarIndex(index));
        }
        if bar.size < 16
            || !bar.size.is_power_of_two()
            || (bar.kind == BarKind::Mem32 && bar.size > 1 << 31)
        {
            return Err(ConfigError::BarSize(index, bar.size));
        }
        if (index..index + slots).any(|i| self.bars[i].is_some() || self.is_upper_half(i)) {
            return Err(ConfigError::BarTaken(index));
        }
        self.bars[index] = Some(bar);
        let lo = BAR0 + 4 * index;
        let type_bits =
            u32::from(bar.kind == BarKind::Mem64) << 2 | u32::from(bar.prefetchable) << 3;
        self.put32(lo, (addr as u32 & !0xf) | type_bits);
        // Only the address bits at or above the size are writable.
        let mask = !(bar.size - 1);
        self.writable[lo..lo + 4].copy_from_slice(&((mask as u32) & !0xf).to_le_bytes());
        if bar.kind == BarKind::Mem64 {
            self.put32(lo + 4, (addr >> 32) as u32);
            self.writable[lo + 4..lo + 8].copy_from_slice(&((mask >> 32) as u32).to_le_bytes());
        }
        Ok(())
    }

    /// Defines the expansion ROM, `size` bytes at guest address `addr` (aligned to its
    /// size), off until the guest sets its enable bit. Read-only to the guest.
    pub fn set_rom(&mut self, size: u64, addr: u64) -> Result<(), ConfigError> {
        if size < ROM_MIN || !size.is_power_of_two() || size > 1 << 31 {
            return Err(ConfigError::RomSize(size));
        }
        if self.bars[ROM_BAR].is_some() {
            return Err(ConfigError::BarTaken(ROM_BAR));
        }
        self.bars[ROM_BAR] = Some(Bar {
            size,
            kind: BarKind::Mem32,
            prefetchable: false,
        });
        self.put32(ROM_REG, addr as u32 & !(ROM_MIN as u32 - 1));
        let mask = (!(size - 1) as u32 & !(ROM_MIN as u32 - 1)) | ROM_ENABLE;
        self.writable[ROM_REG..ROM_REG + 4].copy_from_slice(&mask.to_le_bytes());
        Ok(())
    }

    fn is_upper_half(&self, i: usize) -> bool {
        i > 0
            && matches!(
                self.bars[i - 1],
                Some(Bar {
                    kind: BarKind::Mem64,
                    ..
                })
            )
    }

    /// BAR `index`'s definition.
    pub fn bar(&self, index: usize) -> Option<Bar> {
        self.bars.get(index).copied().flatten()
    }

    /// Where BAR `index` is now, as the guest programmed it; for the expansion ROM
    /// ([`ROM_BAR`]), only while its enable bit is set (it decodes nothing otherwise).
    pub fn bar_addr(&self, index: usize) -> Option<u64> {
        let bar = self.bar(index)?;
        if index == ROM_BAR {
            let reg = self.read32(ROM_REG);
            return (reg & ROM_ENABLE != 0).then_some(u64::from(reg & !(ROM_MIN as u32 - 1)));
        }
        let lo = u64::from(self.read32(BAR0 + 4 * index) & !0xf);
        let hi = match bar.kind {
            BarKind::Mem64 => u64::from(self.read32(BAR0 + 4 * index + 4)) << 32,
            BarKind::Mem32 => 0,
        };
        Some(hi | lo)
    }

    /// Whether memory decoding is on (COMMAND bit 1).
    pub fn memory_enabled(&self) -> bool {
        self.read16(COMMAND) & COMMAND_MEMORY != 0
    }

    /// Whether the function may master the bus (DMA).
    pub fn bus_master(&self) -> bool {
        self.read16(COMMAND) & COMMAND_BUS_MASTER != 0
    }

    /// Adds a capability (`body` without the id and next-pointer bytes); `writable` masks
    /// `body`'s bytes the guest may change. Returns its offset.
    pub fn add_capability(
        &mut self,
        id: u8,
        body: &[u8],
        writable: &[u8],
    ) -> Result<usize, ConfigError> {
        self.add_capability_at(self.next_cap, id, body, writable)
    }

    /// As [`ConfigSpace::add_capability`], at offset `at`: 4-byte aligned, past the
    /// header, inside the first 256 bytes and overlapping no capability added before. It
    /// is linked after the last one added, so the list keeps the order of the calls
    /// whatever the offsets: a passed-through function keeps its capabilities where the
    /// device has them (drivers may know the offsets), and devices chain them out of
    /// order (QEMU's NVMe: 0x40 -> 0x80 -> 0x60).
    pub fn add_capability_at(
        &mut self,
        at: usize,
        id: u8,
        body: &[u8],
        writable: &[u8],
    ) -> Result<usize, ConfigError> {
        let len = 2 + body.len();
        let end = at + len;
        if at % 4 != 0
            || at < FIRST_CAPABILITY
            || end > 0x100
            || self.caps.iter().any(|&(s, e)| at < e && s < end)
        {
            return Err(ConfigError::NoRoom(len));
        }
        self.bytes[at] = id;
        self.bytes[at + 1] = 0;
        self.bytes[at + 2..end].copy_from_slice(body);
        for (i, m) in writable.iter().take(body.len()).enumerate() {
            self.writable[at + 2 + i] = *m;
        }
        match self.last_cap {
            None => {
                self.bytes[CAPABILITIES_POINTER] = at as u8;
                let st = self.read16(STATUS) | STATUS_CAPABILITIES;
                self.put16(STATUS, st);
            }
            Some(prev) => self.bytes[prev + 1] = at as u8,
        }
        self.last_cap = Some(at);
        self.caps.push((at, end));
        self.next_cap = self.next_cap.max((end + 3) & !3);
        Ok(at)
    }

    /// Puts a read-only PCIe extended capability at `at` (4-byte aligned, 0x100..0x1000):
    /// its header (`id`, `version`, the next capability's offset, 0 for the last) and the
    /// body after it. Overlaps with what was put before are refused.
    pub fn put_extended(
        &mut self,
        at: usize,
        id: u16,
        version: u8,
        next: usize,
        body: &[u8],
    ) -> Result<(), ConfigError> {
        let end = at + 4 + body.len();
        let next_ok = next == 0 || (next % 4 == 0 && (EXTENDED_START..CONFIG_SIZE).contains(&next));
        if at % 4 != 0
            || at < EXTENDED_START
            || end > CONFIG_SIZE
            || !next_ok
            || self.extended.iter().any(|&(s, e)| at < e && s < end)
        {
            return Err(ConfigError::NoRoom(end.saturating_sub(at)));
        }
        let header = u32::from(id) | u32::from(version & 0xf) << 16 | (next as u32) << 20;
        self.bytes[at..at + 4].copy_from_slice(&header.to_le_bytes());
        self.bytes[at + 4..end].copy_from_slice(body);
        self.extended.push((at, end));
        Ok(())
    }

    /// The current bytes at `offset` (for a device's own use of its capabilities).
    pub fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        let end = offset.saturating_add(len).min(CONFIG_SIZE);
        &self.bytes[offset.min(end)..end]
    }

    /// A guest read. Out of range or odd widths read as zero.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        let ok = matches!(data.len(), 1 | 2 | 4)
            && offset % data.len() as u64 == 0
            && offset
                .checked_add(data.len() as u64)
                .is_some_and(|e| e <= CONFIG_SIZE as u64);
        if !ok {
            data.fill(0);
            return;
        }
        let at = offset as usize;
        data.copy_from_slice(&self.bytes[at..at + data.len()]);
    }

    /// A guest write, through the write masks. Returns what happened to the BARs.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Vec<BarChange> {
        let ok = matches!(data.len(), 1 | 2 | 4)
            && offset % data.len() as u64 == 0
            && offset
                .checked_add(data.len() as u64)
                .is_some_and(|e| e <= CONFIG_SIZE as u64);
        if !ok {
            return Vec::new();
        }
        let before: Vec<Option<u64>> = (0..=ROM_BAR).map(|i| self.decoded(i)).collect();
        let at = offset as usize;
        for (i, b) in data.iter().enumerate() {
            let m = self.writable[at + i];
            self.bytes[at + i] = (self.bytes[at + i] & !m) | (b & m);
        }
        (0..=ROM_BAR)
            .filter_map(|i| {
                let now = self.decoded(i);
                (now != before[i]).then_some(BarChange {
                    index: i,
                    old: before[i],
                    new: now,
                })
            })
            .collect()
    }

    /// Where BAR `index` decodes: its address while memory decoding is on.
    fn decoded(&self, index: usize) -> Option<u64> {
        self.memory_enabled()
            .then(|| self.bar_addr(index))
            .flatten()
    }
}

/// A capability's id.
pub const CAP_MSIX: u8 = 0x11;
/// A vendor-specific capability's id.
pub const CAP_VENDOR: u8 = 0x09;

#[cfg(test)]
mod tests {
    use super::*;

    fn r32(c: &ConfigSpace, at: u64) -> u32 {
        let mut b = [0u8; 4];
        c.read(at, &mut b);
        u32::from_le_bytes(b)
    }

    fn w32(c: &mut ConfigSpace, at: u64, v: u32) -> Vec<BarChange> {
        c.write(at, &v.to_le_bytes())
    }

    #[test]
    fn ids_class_and_read_only_fields() {
        let mut c = ConfigSpace::new(0x1234, 0xabcd, 0x0b_4000, 1, 0);
        assert_eq!(r32(&c, 0), 0xabcd_1234);
        assert_eq!(r32(&c, 8), 0x0b40_0001);
        // Ids, class and header type do not change.
        w32(&mut c, 0, 0);
        w32(&mut c, 8, 0xffff_ffff);
        assert_eq!(r32(&c, 0), 0xabcd_1234);
        assert_eq!(r32(&c, 8), 0x0b40_0001);
        // Odd widths, misaligned and out-of-range accesses read zero and write nothing.
        let mut b = [0xffu8; 3];
        c.read(0, &mut b);
        assert_eq!(b, [0, 0, 0]);
        let mut b = [0xffu8; 4];
        c.read(2, &mut b);
        assert_eq!(b, [0; 4]);
        c.read(4094, &mut b[..2]);
        assert_eq!(r32(&c, 0x1000), 0);
        assert!(c.write(u64::MAX - 1, &[1, 2]).is_empty());
        // The interrupt line is scratch.
        c.write(0x3c, &[0x0b]);
        assert_eq!(r32(&c, 0x3c) & 0xff, 0x0b);
    }

    #[test]
    fn bars_answer_the_sizing_protocol_and_report_moves() {
        let mut c = ConfigSpace::new(1, 2, 0, 0, 0);
        c.set_bar(
            0,
            Bar {
                size: 0x1000,
                kind: BarKind::Mem32,
                prefetchable: false,
            },
            0xe000_0000,
        )
        .unwrap();
        c.set_bar(
            2,
            Bar {
                size: 1 << 20,
                kind: BarKind::Mem64,
                prefetchable: true,
            },
            0x1_0000_0000,
        )
        .unwrap();
        assert_eq!(c.bar_addr(0), Some(0xe000_0000));
        assert_eq!(c.bar_addr(2), Some(0x1_0000_0000));
        assert_eq!(r32(&c, 0x18) & 0xf, 0b1100); // 64-bit, prefetchable
        // Sizing: write all ones, read the mask; the type bits survive.
        w32(&mut c, 0x10, 0xffff_ffff);
        assert_eq!(r32(&c, 0x10), 0xffff_f000);
        w32(&mut c, 0x18, 0xffff_ffff);
        w32(&mut c, 0x1c, 0xffff_ffff);
        assert_eq!(r32(&c, 0x18), 0xfff0_000c);
        assert_eq!(r32(&c, 0x1c), 0xffff_ffff);
        // Decoding is off: no change is reported until it is turned on.
        c.write(4, &[0, 0]);
        let ch = w32(&mut c, 0x10, 0xe010_0000);
        assert!(ch.is_empty());
        w32(&mut c, 0x18, 0x4000_0000);
        w32(&mut c, 0x1c, 0x2);
        let ch = c.write(4, &COMMAND_MEMORY.to_le_bytes());
        assert_eq!(ch.len(), 2);
        assert_eq!(
            ch[0],
            BarChange {
                index: 0,
                old: None,
                new: Some(0xe010_0000)
            }
        );
        assert_eq!(ch[1].new, Some(0x2_4000_0000));
        // An unaligned address is cut to the BAR's size.
        let ch = w32(&mut c, 0x10, 0xe010_0abc);
        assert!(ch.is_empty(), "{ch:?}");
        assert_eq!(c.bar_addr(0), Some(0xe010_0000));
        // Undefined BARs read zero and ignore writes.
        w32(&mut c, 0x14, 0xffff_ffff);
        assert_eq!(r32(&c, 0x14), 0);
    }

    #[test]
    fn bad_bar_definitions_are_refused() {
        let mut c = ConfigSpace::new(1, 2, 0, 0, 0);
        let b = |size, kind| Bar {
            size,
            kind,
            prefetchable: false,
        };
        assert_eq!(
            c.set_bar(0, b(8, BarKind::Mem32), 0),
            Err(ConfigError::BarSize(0, 8))
        );
        assert_eq!(
            c.set_bar(0, b(0x3000, BarKind::Mem32), 0),
            Err(ConfigError::BarSize(0, 0x3000))
        );
        assert_eq!(
            c.set_bar(5, b(0x1000, BarKind::Mem64), 0),
            Err(ConfigError::BarIndex(5))
        );
        assert_eq!(
            c.set_bar(6, b(0x1000, BarKind::Mem32), 0),
            Err(ConfigError::BarIndex(6))
        );
        c.set_bar(0, b(0x1000, BarKind::Mem64), 0).unwrap();
        assert_eq!(
            c.set_bar(1, b(0x1000, BarKind::Mem32), 0),
            Err(ConfigError::BarTaken(1))
        );
        assert_eq!(
            c.set_bar(0, b(0x1000, BarKind::Mem32), 0),
            Err(ConfigError::BarTaken(0))
        );
    }

    #[test]
    fn capabilities_chain_and_keep_their_masks() {
        let mut c = ConfigSpace::new(1, 2, 0, 0, 0);
        assert_eq!(r32(&c, 4) >> 16 & STATUS_CAPABILITIES as u32, 0);
        let a = c.add_capability(CAP_VENDOR, &[4, 0], &[0, 0]).unwrap();
        let b = c
            .add_capability(CAP_MSIX, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[0, 0xc0])
            .unwrap();
        assert_eq!(a, 0x40);
        assert_eq!(b, 0x44);
        assert_ne!(r32(&c, 4) >> 16 & STATUS_CAPABILITIES as u32, 0);
        assert_eq!(r32(&c, 0x34) & 0xff, 0x40);
        assert_eq!(c.bytes(0x41, 1), &[0x44]);
        assert_eq!(c.bytes(0x45, 1), &[0]);
        // Only the masked bits of the body change.
        c.write(0x46, &[0xff, 0xff]);
        assert_eq!(c.bytes(0x46, 2), &[0, 0xc0]);
        // The chain's pointers are read-only.
        c.write(0x41, &[0x80]);
        assert_eq!(c.bytes(0x41, 1), &[0x44]);
        // It runs out of room before 0x100.
        let mut n = 0;
        while c.add_capability(CAP_VENDOR, &[0; 30], &[]).is_ok() {
            n += 1;
        }
        assert!(n > 0);
        assert!(matches!(
            c.add_capability(CAP_VENDOR, &[0; 30], &[]),
            Err(ConfigError::NoRoom(_))
        ));
    }

    #[test]
    fn capabilities_keep_their_offsets_in_any_order_but_never_overlap() {
        // QEMU's NVMe: 0x40 (12 bytes) -> 0x80 (60 bytes) -> 0x60 (8 bytes).
        let mut c = ConfigSpace::new(1, 2, 0, 0, 0);
        c.add_capability_at(0x40, CAP_MSIX, &[0; 10], &[]).unwrap();
        c.add_capability_at(0x80, 0x10, &[0; 58], &[]).unwrap();
        c.add_capability_at(0x60, 0x01, &[0; 6], &[]).unwrap();
        assert_eq!(r32(&c, 0x34) & 0xff, 0x40);
        assert_eq!(c.bytes(0x41, 1), &[0x80]);
        assert_eq!(c.bytes(0x81, 1), &[0x60]);
        assert_eq!(c.bytes(0x61, 1), &[0]);
        // Overlapping one already there, in the header, unaligned or past 256: refused.
        for (at, len) in [(0x44, 2), (0x7c, 8), (0x3c, 2), (0x66, 2), (0xfc, 6)] {
            assert_eq!(
                c.add_capability_at(at, CAP_VENDOR, &vec![0; len - 2], &[]),
                Err(ConfigError::NoRoom(len)),
                "{at:#x}"
            );
        }
        // The next appended one goes past every capability.
        assert_eq!(c.add_capability(CAP_VENDOR, &[0; 2], &[]), Ok(0xbc));
    }

    #[test]
    fn the_expansion_rom_is_sized_enabled_and_read_only_in_its_bits() {
        let mut c = ConfigSpace::new(0x8086, 0x10d3, 0x02_0000, 0, 0);
        // No ROM: the register stays 0 whatever the guest writes.
        w32(&mut c, 0x30, 0xffff_ffff);
        assert_eq!(r32(&c, 0x30), 0);
        assert_eq!(c.bar(ROM_BAR), None);
        for bad in [0, 1024, 3 << 12, 4 << 30] {
            assert_eq!(c.set_rom(bad, 0), Err(ConfigError::RomSize(bad)));
        }
        c.set_rom(256 << 10, 0xcfe0_0000).unwrap();
        assert_eq!(c.set_rom(4096, 0), Err(ConfigError::BarTaken(ROM_BAR)));
        assert_eq!(r32(&c, 0x30), 0xcfe0_0000);
        // Size probing: all ones read back as the size mask, the enable bit kept.
        assert!(w32(&mut c, 0x30, 0xffff_f800).is_empty());
        assert_eq!(r32(&c, 0x30), 0xfffc_0000);
        w32(&mut c, 0x30, 0xcfe0_0000);
        // Enabled without memory decoding: nothing decodes; with it, the ROM does.
        c.write(4, &0u16.to_le_bytes());
        assert!(w32(&mut c, 0x30, 0xcfe0_0001).is_empty());
        assert_eq!(c.bar_addr(ROM_BAR), Some(0xcfe0_0000));
        let on = c.write(4, &COMMAND_MEMORY.to_le_bytes());
        assert_eq!(
            on,
            vec![BarChange {
                index: ROM_BAR,
                old: None,
                new: Some(0xcfe0_0000)
            }]
        );
        // Disabled again: it stops decoding, and the address bits below its size stay 0.
        let off = w32(&mut c, 0x30, 0xcfe1_2340);
        assert_eq!(off[0].new, None);
        assert_eq!(r32(&c, 0x30), 0xcfe0_0000);
        assert_eq!(c.bar_addr(ROM_BAR), None);
    }
}
