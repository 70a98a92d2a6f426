//! Minimal hardware-reduced ACPI: RSDP → XSDT → {FADT → DSDT, MADT}.
//!
//! What a Linux guest gets from it:
//! - the CPUs and the IOAPIC (MADT); Debian kernels have no MP-table parser;
//! - a power-off path: FADT's sleep control register is I/O port [`SLEEP_CONTROL_PORT`],
//!   and the DSDT's `\_S5_` package gives sleep type 5, so `poweroff` writes
//!   `(5 << 2) | SLP_EN` = 0x34 there ([`S5_SLEEP_VALUE`]);
//! - a reset path: FADT's reset register is the i8042 command port 0x64 with value 0xfe,
//!   the same line a keyboard-controller reset pulls.
//!
//! The image is written into a caller buffer, so this module needs no `std`.

use crate::layout::{IOAPIC_ADDR, LAPIC_ADDR};

/// I/O port of the sleep control register.
pub const SLEEP_CONTROL_PORT: u16 = 0x600;
/// I/O port of the sleep status register.
pub const SLEEP_STATUS_PORT: u16 = 0x601;
/// What Linux writes to the sleep control register to enter S5 (soft off).
pub const S5_SLEEP_VALUE: u8 = (5 << 2) | 0x20;
/// I/O port of the reset register (the i8042 command port).
pub const RESET_PORT: u16 = 0x64;
/// Value written to [`RESET_PORT`] to reset.
pub const RESET_VALUE: u8 = 0xfe;
/// Most CPUs the MADT describes.
pub const MAX_CPUS: usize = 254;

const HEADER_LEN: usize = 36;
const RSDP_LEN: usize = 36;
const FADT_LEN: usize = 276;
const OEM_ID: &[u8; 6] = b"PARTIT";
const OEM_TABLE_ID: &[u8; 8] = b"PARTITN ";
const CREATOR_ID: &[u8; 4] = b"PRTN";

/// The `\_S5_` object: Name(_S5_, Package(4) {5, 0, 0, 0}).
const DSDT_AML: [u8; 13] = [
    0x08, b'_', b'S', b'5', b'_', 0x12, 0x07, 0x04, 0x0a, 0x05, 0x00, 0x00, 0x00,
];

/// Why the ACPI tables could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcpiError {
    /// Zero or more than [`MAX_CPUS`] CPUs.
    CpuCount(usize),
    /// The buffer is smaller than the tables.
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
    },
}

impl core::error::Error for AcpiError {}

impl core::fmt::Display for AcpiError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::CpuCount(n) => write!(f, "ACPI: {n} CPUs (1..={MAX_CPUS} supported)"),
            Self::BufferTooSmall { needed } => write!(f, "ACPI: needs {needed} bytes"),
        }
    }
}

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)))
}

const fn align16(x: usize) -> usize {
    (x + 15) & !15
}

const fn madt_len(cpus: usize) -> usize {
    HEADER_LEN + 8 + 8 * cpus + 12 + 6
}

/// Bytes needed for `cpus` CPUs.
pub const fn size(cpus: usize) -> usize {
    align16(RSDP_LEN)
        + align16(HEADER_LEN + 16)
        + align16(FADT_LEN)
        + align16(HEADER_LEN + DSDT_AML.len())
        + align16(madt_len(cpus))
}

fn header(t: &mut [u8], sig: &[u8; 4], len: usize, rev: u8) {
    t[0..4].copy_from_slice(sig);
    t[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    t[8] = rev;
    t[10..16].copy_from_slice(OEM_ID);
    t[16..24].copy_from_slice(OEM_TABLE_ID);
    t[24..28].copy_from_slice(&1u32.to_le_bytes());
    t[28..32].copy_from_slice(CREATOR_ID);
    t[32..36].copy_from_slice(&1u32.to_le_bytes());
}

fn seal(t: &mut [u8]) {
    t[9] = 0;
    t[9] = checksum(t);
}

/// Generic address structure for a byte-wide I/O port.
fn gas_io(dst: &mut [u8], port: u16) {
    dst[0] = 1; // system I/O
    dst[1] = 8; // bit width
    dst[2] = 0; // bit offset
    dst[3] = 1; // byte access
    dst[4..12].copy_from_slice(&(port as u64).to_le_bytes());
}

/// Writes the tables for `cpus` CPUs (APIC IDs 0..cpus) into `buf`, placed at guest address
/// `base` (16-byte aligned, inside 0xe0000..0x100000 for an RSDP scan to find it).
/// Returns the bytes used; the RSDP is at `base`.
pub fn write(buf: &mut [u8], base: u64, cpus: usize) -> Result<usize, AcpiError> {
    if cpus == 0 || cpus > MAX_CPUS {
        return Err(AcpiError::CpuCount(cpus));
    }
    let needed = size(cpus);
    if buf.len() < needed {
        return Err(AcpiError::BufferTooSmall { needed });
    }
    let buf = &mut buf[..needed];
    buf.fill(0);
    let xsdt_off = align16(RSDP_LEN);
    let fadt_off = xsdt_off + align16(HEADER_LEN + 16);
    let dsdt_off = fadt_off + align16(FADT_LEN);
    let madt_off = dsdt_off + align16(HEADER_LEN + DSDT_AML.len());
    let addr = |off: usize| base + off as u64;

    // DSDT.
    {
        let len = HEADER_LEN + DSDT_AML.len();
        let t = &mut buf[dsdt_off..dsdt_off + len];
        header(t, b"DSDT", len, 2);
        t[HEADER_LEN..].copy_from_slice(&DSDT_AML);
        seal(t);
    }
    // FADT (revision 6, hardware reduced).
    {
        let t = &mut buf[fadt_off..fadt_off + FADT_LEN];
        header(t, b"FACP", FADT_LEN, 6);
        t[40..44].copy_from_slice(&(addr(dsdt_off) as u32).to_le_bytes());
        // IAPC_BOOT_ARCH: 8042 present (bit 1), VGA not present (bit 2).
        t[109..111].copy_from_slice(&0x0006u16.to_le_bytes());
        // Flags: WBINVD (0), RESET_REG_SUP (10), HW_REDUCED_ACPI (20).
        let flags: u32 = (1 << 0) | (1 << 10) | (1 << 20);
        t[112..116].copy_from_slice(&flags.to_le_bytes());
        gas_io(&mut t[116..128], RESET_PORT);
        t[128] = RESET_VALUE;
        t[131] = 0; // FADT minor version
        t[140..148].copy_from_slice(&addr(dsdt_off).to_le_bytes());
        gas_io(&mut t[244..256], SLEEP_CONTROL_PORT);
        gas_io(&mut t[256..268], SLEEP_STATUS_PORT);
        t[268..276].copy_from_slice(b"PARTITN ");
        seal(t);
    }
    // MADT.
    {
        let len = madt_len(cpus);
        let t = &mut buf[madt_off..madt_off + len];
        header(t, b"APIC", len, 5);
        t[36..40].copy_from_slice(&(LAPIC_ADDR as u32).to_le_bytes());
        t[40..44].copy_from_slice(&1u32.to_le_bytes()); // PCAT_COMPAT: the 8259s exist
        let mut o = 44;
        for id in 0..cpus {
            let e = &mut t[o..o + 8];
            e[0] = 0; // processor local APIC
            e[1] = 8;
            e[2] = id as u8; // ACPI processor UID
            e[3] = id as u8; // APIC ID
            e[4..8].copy_from_slice(&1u32.to_le_bytes()); // enabled
            o += 8;
        }
        {
            let e = &mut t[o..o + 12];
            e[0] = 1; // IOAPIC
            e[1] = 12;
            e[2] = cpus as u8; // IOAPIC ID after the CPUs
            e[4..8].copy_from_slice(&(IOAPIC_ADDR as u32).to_le_bytes());
            e[8..12].copy_from_slice(&0u32.to_le_bytes()); // GSI base
            o += 12;
        }
        {
            let e = &mut t[o..o + 6];
            e[0] = 4; // local APIC NMI
            e[1] = 6;
            e[2] = 0xff; // all processors
            e[3..5].copy_from_slice(&0u16.to_le_bytes());
            e[5] = 1; // LINT1
            o += 6;
        }
        debug_assert_eq!(o, len);
        seal(t);
    }
    // XSDT.
    {
        let len = HEADER_LEN + 16;
        let t = &mut buf[xsdt_off..xsdt_off + len];
        header(t, b"XSDT", len, 1);
        t[36..44].copy_from_slice(&addr(fadt_off).to_le_bytes());
        t[44..52].copy_from_slice(&addr(madt_off).to_le_bytes());
        seal(t);
    }
    // RSDP (revision 2).
    {
        let r = &mut buf[0..RSDP_LEN];
        r[0..8].copy_from_slice(b"RSD PTR ");
        r[9..15].copy_from_slice(OEM_ID);
        r[15] = 2;
        r[20..24].copy_from_slice(&(RSDP_LEN as u32).to_le_bytes());
        r[24..32].copy_from_slice(&addr(xsdt_off).to_le_bytes());
        r[8] = checksum(&r[0..20]);
        r[32] = checksum(&r[0..RSDP_LEN]);
    }
    Ok(needed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }
    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }

    /// Walks the tables like a guest would and returns (FADT, MADT) offsets.
    fn walk(buf: &[u8], base: u64) -> (usize, usize) {
        assert_eq!(&buf[0..8], b"RSD PTR ");
        assert_eq!(sum(&buf[0..20]), 0);
        assert_eq!(sum(&buf[0..36]), 0);
        let xsdt = (u64_at(buf, 24) - base) as usize;
        assert_eq!(&buf[xsdt..xsdt + 4], b"XSDT");
        let xlen = u32_at(buf, xsdt + 4) as usize;
        assert_eq!(sum(&buf[xsdt..xsdt + xlen]), 0);
        let mut fadt = 0;
        let mut madt = 0;
        for i in 0..(xlen - 36) / 8 {
            let t = (u64_at(buf, xsdt + 36 + 8 * i) - base) as usize;
            let len = u32_at(buf, t + 4) as usize;
            assert_eq!(sum(&buf[t..t + len]), 0, "table at {t:#x}");
            match &buf[t..t + 4] {
                b"FACP" => fadt = t,
                b"APIC" => madt = t,
                other => panic!("unexpected table {other:?}"),
            }
        }
        (fadt, madt)
    }

    #[test]
    fn tables_walk_and_checksum() {
        let base = 0xe0000;
        let mut buf = [0u8; 4096];
        let n = write(&mut buf, base, 3).unwrap();
        assert_eq!(n, size(3));
        let (fadt, madt) = walk(&buf, base);
        // DSDT behind the FADT, with the _S5_ package.
        let dsdt = (u64_at(&buf, fadt + 140) - base) as usize;
        assert_eq!(&buf[dsdt..dsdt + 4], b"DSDT");
        assert_eq!(sum(&buf[dsdt..dsdt + u32_at(&buf, dsdt + 4) as usize]), 0);
        assert_eq!(&buf[dsdt + 36..dsdt + 41], b"\x08_S5_");
        // Hardware reduced, sleep control at our port.
        assert_ne!(u32_at(&buf, fadt + 112) & (1 << 20), 0);
        assert_eq!(u64_at(&buf, fadt + 248), SLEEP_CONTROL_PORT as u64);
        assert_eq!(buf[fadt + 128], RESET_VALUE);
        // Three enabled local APICs with ids 0, 1, 2.
        let mlen = u32_at(&buf, madt + 4) as usize;
        let mut o = madt + 44;
        let mut ids = [0u8; 8];
        let mut n = 0;
        while o < madt + mlen {
            if buf[o] == 0 {
                ids[n] = buf[o + 3];
                n += 1;
            }
            o += buf[o + 1] as usize;
        }
        assert_eq!(&ids[..n], &[0, 1, 2]);
    }

    #[test]
    fn errors() {
        let mut buf = [0u8; 16];
        assert_eq!(write(&mut buf, 0, 0), Err(AcpiError::CpuCount(0)));
        assert_eq!(
            write(&mut buf, 0, 1),
            Err(AcpiError::BufferTooSmall { needed: size(1) })
        );
        assert!(size(MAX_CPUS) <= crate::layout::ACPI_MAX);
    }
}
