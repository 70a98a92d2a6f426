//! Reading the firmware tables a VMM provides: ACPI (RSDP, XSDT/RSDT, MADT, FADT) and the
//! Intel MP table. Each is checked (signature, checksum, bounds) before use.

use crate::sys::peek;

/// Most CPUs tracked.
pub const MAX_CPUS: usize = 64;

/// CPUs found in a table, by APIC ID.
pub struct CpuList {
    /// APIC IDs, BSP included.
    pub ids: [u32; MAX_CPUS],
    /// Count.
    pub len: usize,
}

impl CpuList {
    const fn new() -> Self {
        Self {
            ids: [0; MAX_CPUS],
            len: 0,
        }
    }
    fn push(&mut self, id: u32) {
        if self.len < MAX_CPUS {
            self.ids[self.len] = id;
            self.len += 1;
        }
    }
    /// The IDs.
    pub fn ids(&self) -> &[u32] {
        &self.ids[..self.len]
    }
}

fn checksum_ok(addr: u64, len: u64) -> bool {
    let mut s = 0u8;
    for i in 0..len {
        // SAFETY: callers pass ranges inside the tables they located in mapped memory.
        s = s.wrapping_add(unsafe { peek::<u8>(addr + i) });
    }
    s == 0
}

fn sig(addr: u64) -> [u8; 4] {
    // SAFETY: addr is a table header found through a checked pointer.
    unsafe { peek(addr) }
}

/// Finds a valid RSDP: at `hint` if non-zero, else by scanning 0xe0000..0x100000.
pub fn find_rsdp(hint: u64) -> Option<u64> {
    let valid = |a: u64| {
        // SAFETY: a is inside guest RAM or the low firmware area, both mapped.
        let magic: [u8; 8] = unsafe { peek(a) };
        &magic == b"RSD PTR " && checksum_ok(a, 20)
    };
    if hint != 0 && valid(hint) {
        return Some(hint);
    }
    (0xe0000..0x100000).step_by(16).find(|&a| valid(a))
}

/// Walks RSDT/XSDT for a table with `signature`.
pub fn find_table(rsdp: u64, signature: &[u8; 4]) -> Option<u64> {
    // SAFETY: rsdp passed find_rsdp's checks; table pointers are checked before use.
    unsafe {
        let rev: u8 = peek(rsdp + 15);
        let (root, entry) = if rev >= 2 {
            (peek::<u64>(rsdp + 24), 8)
        } else {
            (peek::<u32>(rsdp + 16) as u64, 4)
        };
        if root == 0 || root >= 1 << 36 {
            return None;
        }
        let len = peek::<u32>(root + 4) as u64;
        if !(36..=4096).contains(&len) || !checksum_ok(root, len) {
            return None;
        }
        for i in 0..(len - 36) / entry {
            let p = if entry == 8 {
                peek::<u64>(root + 36 + 8 * i)
            } else {
                peek::<u32>(root + 36 + 4 * i) as u64
            };
            if p == 0 || p >= 1 << 36 {
                continue;
            }
            let tl = peek::<u32>(p + 4) as u64;
            if &sig(p) == signature && (36..=65536).contains(&tl) && checksum_ok(p, tl) {
                return Some(p);
            }
        }
    }
    None
}

/// Enabled CPUs in the MADT.
pub fn madt_cpus(madt: u64) -> CpuList {
    let mut cpus = CpuList::new();
    // SAFETY: madt passed find_table's checks, entries are bounded by its length.
    unsafe {
        let len = peek::<u32>(madt + 4) as u64;
        let mut o = 44;
        while o + 2 <= len {
            let t: u8 = peek(madt + o);
            let l = peek::<u8>(madt + o + 1) as u64;
            if l < 2 || o + l > len {
                break;
            }
            match t {
                0 if l >= 8 && peek::<u32>(madt + o + 4) & 3 != 0 => {
                    cpus.push(peek::<u8>(madt + o + 3) as u32)
                }
                9 if l >= 16 && peek::<u32>(madt + o + 8) & 3 != 0 => {
                    cpus.push(peek::<u32>(madt + o + 4))
                }
                _ => {}
            }
            o += l;
        }
    }
    cpus
}

/// FADT sleep control register port, if the FADT is hardware-reduced with one in I/O space.
pub fn fadt_sleep_control(fadt: u64) -> Option<u16> {
    // SAFETY: fadt passed find_table's checks; we read inside its length.
    unsafe {
        let len = peek::<u32>(fadt + 4) as u64;
        if len < 256 {
            return None;
        }
        let space: u8 = peek(fadt + 244);
        let port: u64 = peek(fadt + 248);
        (space == 1 && port != 0 && port <= 0xffff).then_some(port as u16)
    }
}

/// Processor entries in the MP table, if one is found.
pub fn mptable_cpus() -> Option<CpuList> {
    let valid = |a: u64| {
        // SAFETY: scanned ranges are low RAM or the firmware area, all mapped.
        let m: [u8; 4] = unsafe { peek(a) };
        &m == b"_MP_" && checksum_ok(a, 16)
    };
    let fp = (0x9fc00..0xa0000)
        .step_by(16)
        .chain((0xf0000..0x100000).step_by(16))
        .find(|&a| valid(a))?;
    // SAFETY: fp is a checked floating pointer; the table is checked before use.
    unsafe {
        let table = peek::<u32>(fp + 4) as u64;
        if table == 0 || &sig(table) != b"PCMP" {
            return None;
        }
        let len = peek::<u16>(table + 4) as u64;
        if len < 44 || !checksum_ok(table, len) {
            return None;
        }
        // Walk the entries by the table length, as Linux does: some firmware (qboot, which
        // QEMU's microvm runs) leaves the header's entry count at zero.
        let mut cpus = CpuList::new();
        let mut o = 44;
        while o < len {
            let size = match peek::<u8>(table + o) {
                0 => 20,
                1..=4 => 8,
                _ => break,
            };
            if o + size > len {
                break;
            }
            if size == 20 && peek::<u8>(table + o + 3) & 1 != 0 {
                cpus.push(peek::<u8>(table + o + 1) as u32);
            }
            o += size;
        }
        Some(cpus)
    }
}
