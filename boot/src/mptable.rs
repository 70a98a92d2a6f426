//! Intel MultiProcessor Specification 1.4 table: one processor entry per vCPU, one ISA bus,
//! one IOAPIC with 24 pins wired 1:1 to ISA IRQs, LINT0 = ExtINT and LINT1 = NMI.
//!
//! Kernels built without ACPI (or booted with `acpi=off`) find their CPUs here; Debian's
//! kernels are built without `CONFIG_X86_MPPARSE` and use the ACPI MADT instead (see
//! [`crate::acpi`]). The image is built into a caller buffer, so this module needs no `std`.

use crate::layout::{IOAPIC_ADDR, LAPIC_ADDR};

/// Most vCPUs described (APIC IDs must stay below the IOAPIC's ID and 0xff).
pub const MAX_CPUS: usize = 64;
/// IOAPIC pins.
pub const IOAPIC_PINS: u8 = 24;

const FP_LEN: usize = 16;
const HEADER_LEN: usize = 44;
const CPU_LEN: usize = 20;
const BUS_LEN: usize = 8;
const IOAPIC_LEN: usize = 8;
const INTSRC_LEN: usize = 8;
const LINTSRC_LEN: usize = 8;

/// Why the MP table could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MptableError {
    /// Zero or more than [`MAX_CPUS`] CPUs.
    CpuCount(usize),
    /// The buffer is smaller than the table.
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
    },
}

impl core::error::Error for MptableError {}

impl core::fmt::Display for MptableError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::CpuCount(n) => write!(f, "MP table: {n} CPUs (1..={MAX_CPUS} supported)"),
            Self::BufferTooSmall { needed } => write!(f, "MP table: needs {needed} bytes"),
        }
    }
}

/// Size of the table for `cpus` CPUs, floating pointer included.
pub const fn size(cpus: usize) -> usize {
    FP_LEN
        + HEADER_LEN
        + CPU_LEN * cpus
        + BUS_LEN
        + IOAPIC_LEN
        + INTSRC_LEN * IOAPIC_PINS as usize
        + 2 * LINTSRC_LEN
}

fn checksum(bytes: &[u8]) -> u8 {
    let sum = bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b));
    0u8.wrapping_sub(sum)
}

/// Writes the table for `cpus` CPUs (APIC IDs 0..cpus) into `buf`, which will be placed at
/// guest address `base`. Returns the bytes used.
pub fn write(buf: &mut [u8], base: u64, cpus: usize) -> Result<usize, MptableError> {
    if cpus == 0 || cpus > MAX_CPUS {
        return Err(MptableError::CpuCount(cpus));
    }
    let needed = size(cpus);
    if buf.len() < needed {
        return Err(MptableError::BufferTooSmall { needed });
    }
    let buf = &mut buf[..needed];
    buf.fill(0);
    let ioapic_id = cpus as u8;

    // Configuration table entries, after the header.
    let mut off = FP_LEN + HEADER_LEN;
    let mut entries: u16 = 0;
    for id in 0..cpus {
        let e = &mut buf[off..off + CPU_LEN];
        e[0] = 0; // processor
        e[1] = id as u8; // local APIC ID
        e[2] = 0x14; // local APIC version
        e[3] = 0x01 | if id == 0 { 0x02 } else { 0 }; // enabled, bootstrap
        e[4..8].copy_from_slice(&0x0000_0600_u32.to_le_bytes()); // family 6 signature
        e[8..12].copy_from_slice(&0x0000_0201u32.to_le_bytes()); // FPU + APIC feature flags
        off += CPU_LEN;
        entries += 1;
    }
    {
        let e = &mut buf[off..off + BUS_LEN];
        e[0] = 1; // bus
        e[1] = 0; // bus id
        e[2..8].copy_from_slice(b"ISA   ");
        off += BUS_LEN;
        entries += 1;
    }
    {
        let e = &mut buf[off..off + IOAPIC_LEN];
        e[0] = 2; // IOAPIC
        e[1] = ioapic_id;
        e[2] = 0x11; // version
        e[3] = 1; // enabled
        e[4..8].copy_from_slice(&(IOAPIC_ADDR as u32).to_le_bytes());
        off += IOAPIC_LEN;
        entries += 1;
    }
    for pin in 0..IOAPIC_PINS {
        let e = &mut buf[off..off + INTSRC_LEN];
        e[0] = 3; // I/O interrupt assignment
        e[1] = 0; // INT
        // e[2..4] flags: conforms to bus
        e[4] = 0; // source bus
        e[5] = pin; // source IRQ
        e[6] = ioapic_id;
        e[7] = pin;
        off += INTSRC_LEN;
        entries += 1;
    }
    for (kind, lint) in [(3u8, 0u8), (1, 1)] {
        // ExtINT on LINT0, NMI on LINT1, to every local APIC.
        let e = &mut buf[off..off + LINTSRC_LEN];
        e[0] = 4; // local interrupt assignment
        e[1] = kind;
        e[4] = 0;
        e[5] = 0;
        e[6] = 0xff;
        e[7] = lint;
        off += LINTSRC_LEN;
        entries += 1;
    }
    debug_assert_eq!(off, needed);

    // Header.
    let table_len = (needed - FP_LEN) as u16;
    {
        let h = &mut buf[FP_LEN..FP_LEN + HEADER_LEN];
        h[0..4].copy_from_slice(b"PCMP");
        h[4..6].copy_from_slice(&table_len.to_le_bytes());
        h[6] = 4; // spec revision 1.4
        h[8..16].copy_from_slice(b"PARTITN ");
        h[16..28].copy_from_slice(b"PARTITION   ");
        h[34..36].copy_from_slice(&entries.to_le_bytes());
        h[36..40].copy_from_slice(&(LAPIC_ADDR as u32).to_le_bytes());
    }
    let sum = checksum(&buf[FP_LEN..needed]);
    buf[FP_LEN + 7] = sum;

    // Floating pointer.
    {
        let fp = &mut buf[0..FP_LEN];
        fp[0..4].copy_from_slice(b"_MP_");
        fp[4..8].copy_from_slice(&((base + FP_LEN as u64) as u32).to_le_bytes());
        fp[8] = 1; // length in 16-byte units
        fp[9] = 4; // spec revision
        fp[11] = 0; // feature byte 1: configuration table present
    }
    buf[10] = checksum(&buf[0..FP_LEN]);
    Ok(needed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }

    #[test]
    fn checksums_and_counts() {
        let mut buf = [0u8; 4096];
        let n = write(&mut buf, 0xf0000, 2).unwrap();
        assert_eq!(n, size(2));
        assert_eq!(&buf[0..4], b"_MP_");
        assert_eq!(sum(&buf[0..16]), 0);
        let table = u32::from_le_bytes(buf[4..8].try_into().unwrap()) as usize - 0xf0000;
        assert_eq!(&buf[table..table + 4], b"PCMP");
        let len = u16::from_le_bytes(buf[table + 4..table + 6].try_into().unwrap()) as usize;
        assert_eq!(sum(&buf[table..table + len]), 0);
        let count = u16::from_le_bytes(buf[table + 34..table + 36].try_into().unwrap());
        assert_eq!(count as usize, 2 + 1 + 1 + 24 + 2);
        // Processor entries: ids 0 and 1, only the first is the BSP.
        assert_eq!(
            (buf[table + 44], buf[table + 45], buf[table + 47]),
            (0, 0, 3)
        );
        assert_eq!(
            (buf[table + 64], buf[table + 65], buf[table + 67]),
            (0, 1, 1)
        );
    }

    #[test]
    fn rejects_bad_counts_and_small_buffers() {
        let mut buf = [0u8; 64];
        assert_eq!(write(&mut buf, 0, 0), Err(MptableError::CpuCount(0)));
        assert_eq!(
            write(&mut buf, 0, MAX_CPUS + 1),
            Err(MptableError::CpuCount(MAX_CPUS + 1))
        );
        assert_eq!(
            write(&mut buf, 0, 1),
            Err(MptableError::BufferTooSmall { needed: size(1) })
        );
        assert!(size(MAX_CPUS) <= crate::layout::MPTABLE_MAX);
    }
}
