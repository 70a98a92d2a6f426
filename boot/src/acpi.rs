//! Hardware-reduced ACPI: RSDP → XSDT → {FADT → DSDT, MADT}, built with the rust-vmm
//! `acpi_tables` crate (its table layouts and AML encoder, not hand-placed bytes).
//!
//! What a Linux guest gets from it:
//! - the CPUs and the IOAPIC (MADT); Debian kernels have no MP-table parser;
//! - its legacy devices (DSDT): COM1 (`PNP0501`, ports and IRQ 4) and the RTC
//!   (`PNP0B00`). On a hardware-reduced platform Linux sets up no ISA interrupts itself, so
//!   without this its serial driver finds no IRQ for ttyS0 and drops what userspace
//!   writes (the kernel's own console output is polled and goes through);
//! - its virtio-mmio devices (DSDT): one `LNRO0005` device per window, with the window as a
//!   32-bit fixed memory resource and its GSI as an edge-triggered, active-high interrupt,
//!   as QEMU's microvm describes them. Stock kernels built without
//!   `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES` (Debian's) find virtio-mmio devices only this way;
//! - a power-off path: FADT's sleep control register is the I/O port the VMM names
//!   ([`AcpiConfig::sleep_port`]),
//!   and the DSDT's `\_S5_` package gives sleep type 5, so `poweroff` writes
//!   `(5 << 2) | SLP_EN` = 0x34 there ([`S5_SLEEP_VALUE`]);
//! - a reset path: FADT's reset register is the i8042 command port 0x64 with value 0xfe,
//!   the same line a keyboard-controller reset pulls;
//! - the CMOS clock's century register ([`RTC_CENTURY_REG`]);
//! - when the partition has PCI functions, a PCI host bridge ([`PciHostBridge`]): an MCFG
//!   table with the ECAM of segment 0, bus 0, and a `PNP0A08` device (`_CID` `PNP0A03`)
//!   whose `_CRS` gives bus 0, the CF8/CFC ports and the BAR window, as QEMU's microvm
//!   with PCIe describes its GPEX bridge. No `_PRT`: our functions interrupt by MSI-X.
//!
//! The image is written into a caller buffer; this module needs `alloc`, not `std`.

extern crate alloc;

use alloc::format;
use alloc::vec::Vec;

use acpi_tables::Aml;
use acpi_tables::aml;
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, MADT, ProcessorLocalApic,
};
use acpi_tables::mcfg::MCFG;
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use zerocopy::{Immutable, IntoBytes};

use crate::layout::{IOAPIC_ADDR, LAPIC_ADDR};

/// What Linux writes to the sleep control register to enter S5 (soft off).
pub const S5_SLEEP_VALUE: u8 = (5 << 2) | 0x20;
/// I/O port of the reset register (the i8042 command port).
pub const RESET_PORT: u16 = 0x64;
/// Value written to [`RESET_PORT`] to reset.
pub const RESET_VALUE: u8 = 0xfe;
/// The CMOS register holding the century (FADT `CENTURY`).
pub const RTC_CENTURY_REG: u8 = 0x32;
/// Most CPUs the MADT describes.
pub const MAX_CPUS: usize = 254;
/// Most virtio-mmio devices the DSDT describes.
pub const MAX_MMIO_DEVICES: usize = 32;
/// virtio-mmio's ACPI hardware ID.
pub const VIRTIO_MMIO_HID: &str = "LNRO0005";

const OEM_ID: [u8; 6] = *b"PARTIT";
const OEM_TABLE_ID: [u8; 8] = *b"PARTITN ";
const OEM_REVISION: u32 = 1;
/// MADT flags: PCAT_COMPAT (the 8259s exist; KVM's irqchip has them).
const MADT_PCAT_COMPAT: u32 = 1;
/// Offset of the MADT's flags field.
const MADT_FLAGS_OFFSET: usize = 40;
/// IAPC_BOOT_ARCH: 8042 present (bit 1), VGA not present (bit 2).
const IAPC_BOOT_ARCH: u16 = 0x0006;

/// A virtio-mmio device window and its interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioDevice {
    /// Guest physical base (below 4 GiB).
    pub base: u64,
    /// Window length.
    pub len: u64,
    /// IOAPIC input.
    pub gsi: u32,
}

/// A legacy port-I/O device (a UART, the RTC): on a hardware-reduced ACPI platform Linux
/// sets up no ISA interrupts of its own, so a device's IRQ works only if the DSDT names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IsaDevice {
    /// Four-character ACPI name (`COM1`, `RTC0`).
    pub name: &'static str,
    /// EISA id (`PNP0501` a 16550 UART, `PNP0B00` the AT real-time clock).
    pub hid: &'static str,
    /// First port.
    pub port: u16,
    /// Number of ports.
    pub len: u8,
    /// Its interrupt (GSI, edge-triggered, active high), if it has one.
    pub irq: Option<u32>,
}

/// A PCI host bridge: segment 0, bus 0 only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciHostBridge {
    /// ECAM base of bus 0 (1 MiB aligned, below 4 GiB).
    pub ecam_base: u64,
    /// Start of the 32-bit BAR window.
    pub window_start: u64,
    /// End of the window (exclusive, at most 4 GiB).
    pub window_end: u64,
    /// The 64-bit prefetchable window, `[start, end)` above 4 GiB, if BARs may go there.
    pub window64: Option<(u64, u64)>,
}

/// What the tables describe.
#[derive(Clone, Copy, Debug)]
pub struct AcpiConfig<'a> {
    /// A PCI host bridge, when the partition has PCI functions.
    pub pci: Option<PciHostBridge>,
    /// vCPUs (APIC IDs 0..cpus).
    pub cpus: usize,
    /// virtio-mmio devices.
    pub virtio_mmio: &'a [MmioDevice],
    /// Legacy port-I/O devices.
    pub isa: &'a [IsaDevice],
    /// I/O port of the FADT's sleep control register (the status register is the next
    /// port): where the VMM's power device listens.
    pub sleep_port: u16,
}

/// Why the ACPI tables could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcpiError {
    /// Zero or more than [`MAX_CPUS`] CPUs.
    CpuCount(usize),
    /// More than [`MAX_MMIO_DEVICES`] devices, or a window not below 4 GiB.
    MmioDevice(MmioDevice),
    /// A legacy device whose ACPI name or EISA id is malformed.
    IsaDevice(&'static str),
    /// A PCI host bridge whose ECAM is not 1 MiB aligned below 4 GiB, or whose window is
    /// empty or not below 4 GiB.
    PciHost(PciHostBridge),
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
            Self::MmioDevice(d) => write!(
                f,
                "ACPI: virtio-mmio window {:#x}+{:#x} (gsi {}) cannot be described \
                 (at most {MAX_MMIO_DEVICES}, below 4 GiB)",
                d.base, d.len, d.gsi
            ),
            Self::IsaDevice(n) => write!(f, "ACPI: legacy device {n:?}: bad name or EISA id"),
            Self::PciHost(p) => write!(
                f,
                "ACPI: PCI host bridge with ECAM at {:#x} and window {:#x}..{:#x} cannot be \
                 described (ECAM 1 MiB aligned, both below 4 GiB, the window not empty)",
                p.ecam_base, p.window_start, p.window_end
            ),
            Self::BufferTooSmall { needed } => write!(f, "ACPI: needs {needed} bytes"),
        }
    }
}

/// MADT entry type 4: local APIC NMI (the crate has no type for it).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable)]
struct LocalApicNmi {
    kind: u8,
    length: u8,
    processor_uid: u8,
    flags: u16,
    lint: u8,
}

impl Aml for LocalApicNmi {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(self.as_bytes());
    }
}

fn serialize(t: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    t.to_aml_bytes(&mut v);
    v
}

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)))
}

fn io_port(port: u16) -> GAS {
    GAS::new(
        AddressSpace::SystemIo,
        8,
        0,
        AccessSize::ByteAccess,
        port as u64,
    )
}

/// One legacy device: `_HID`, `_UID`, `_CRS` with its ports and interrupt.
fn isa_device(d: &IsaDevice, uid: u32) -> RawAml {
    let io = aml::IO::new(d.port, d.port, 1, d.len);
    let irq = d
        .irq
        .map(|gsi| aml::Interrupt::new(true, true, false, false, gsi));
    let mut res: Vec<&dyn Aml> = alloc::vec![&io];
    if let Some(i) = &irq {
        res.push(i);
    }
    let crs = aml::ResourceTemplate::new(res);
    let hid = aml::EISAName::new(d.hid);
    let hid = aml::Name::new("_HID".into(), &hid);
    let uid = aml::Name::new("_UID".into(), &uid);
    let crs = aml::Name::new("_CRS".into(), &crs);
    RawAml(serialize(&aml::Device::new(
        d.name.into(),
        alloc::vec![&hid, &uid, &crs],
    )))
}

/// The PCI host bridge device `PCI0`: bus 0, the CF8/CFC ports, the BAR window.
fn pci_host(p: &PciHostBridge) -> RawAml {
    let bus = aml::AddressSpace::<u16>::new_bus_number(0, 0);
    let io = aml::IO::new(0xcf8, 0xcf8, 1, 8);
    let mem = aml::AddressSpace::<u32>::new_memory(
        aml::AddressSpaceCacheable::NotCacheable,
        true,
        p.window_start as u32,
        (p.window_end - 1) as u32,
        None,
    );
    let mem64 = p.window64.map(|(start, end)| {
        aml::AddressSpace::<u64>::new_memory(
            aml::AddressSpaceCacheable::PreFetchable,
            true,
            start,
            end - 1,
            None,
        )
    });
    let mut resources: Vec<&dyn Aml> = alloc::vec![&bus, &io, &mem];
    if let Some(m) = &mem64 {
        resources.push(m);
    }
    let crs = aml::ResourceTemplate::new(resources);
    let hid = aml::EISAName::new("PNP0A08");
    let cid = aml::EISAName::new("PNP0A03");
    let hid = aml::Name::new("_HID".into(), &hid);
    let cid = aml::Name::new("_CID".into(), &cid);
    let seg = aml::Name::new("_SEG".into(), &aml::ZERO);
    let bbn = aml::Name::new("_BBN".into(), &aml::ZERO);
    let uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let cca = aml::Name::new("_CCA".into(), &aml::ONE);
    let crs = aml::Name::new("_CRS".into(), &crs);
    RawAml(serialize(&aml::Device::new(
        "PCI0".into(),
        alloc::vec![&hid, &cid, &seg, &bbn, &uid, &cca, &crs],
    )))
}

/// The DSDT body: the legacy, PCI host and virtio-mmio devices under `\_SB`, and `\_S5_`.
fn dsdt(devices: &[MmioDevice], isa: &[IsaDevice], pci: Option<&PciHostBridge>) -> Vec<u8> {
    let mut body = Vec::new();
    let mut devs: Vec<RawAml> = isa
        .iter()
        .enumerate()
        .map(|(i, d)| isa_device(d, i as u32))
        .collect();
    devs.extend(pci.map(pci_host));
    for (i, d) in devices.iter().enumerate() {
        let mem = aml::Memory32Fixed::new(true, d.base as u32, d.len as u32);
        let irq = aml::Interrupt::new(true, true, false, false, d.gsi);
        let crs = aml::ResourceTemplate::new(alloc::vec![&mem, &irq]);
        let uid = i as u32;
        let hid = aml::Name::new("_HID".into(), &VIRTIO_MMIO_HID);
        let uid = aml::Name::new("_UID".into(), &uid);
        let cca = aml::Name::new("_CCA".into(), &aml::ONE);
        let crs = aml::Name::new("_CRS".into(), &crs);
        let dev = aml::Device::new(
            format!("VR{i:02X}").as_str().into(),
            alloc::vec![&hid, &uid, &cca, &crs],
        );
        devs.push(RawAml(serialize(&dev)));
    }
    let dev_refs: Vec<&dyn Aml> = devs.iter().map(|d| d as &dyn Aml).collect();
    aml::Scope::new("\\_SB_".into(), dev_refs).to_aml_bytes(&mut body);
    let s5 = [5u8, 0, 0, 0];
    aml::Name::new(
        "_S5_".into(),
        &aml::Package::new(s5.iter().map(|b| b as &dyn Aml).collect()),
    )
    .to_aml_bytes(&mut body);
    body
}

/// AML already encoded: each device is encoded in its own scope (its resources are
/// locals there), then nested in `\_SB` as it is.
struct RawAml(Vec<u8>);

impl Aml for RawAml {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(&self.0);
    }
}

/// Builds the tables for `cfg`, to be placed at guest address `base` (16-byte aligned,
/// inside 0xe0000..0x100000 for an RSDP scan to find it). The RSDP is first.
pub fn build(base: u64, cfg: &AcpiConfig<'_>) -> Result<Vec<u8>, AcpiError> {
    if cfg.cpus == 0 || cfg.cpus > MAX_CPUS {
        return Err(AcpiError::CpuCount(cfg.cpus));
    }
    if let Some(d) = cfg.virtio_mmio.iter().enumerate().find_map(|(i, d)| {
        let fits = d.base.checked_add(d.len).is_some_and(|e| e <= 1 << 32) && d.len > 0;
        (i >= MAX_MMIO_DEVICES || !fits).then_some(*d)
    }) {
        return Err(AcpiError::MmioDevice(d));
    }
    let align = |v: &mut Vec<u8>| v.resize(v.len().next_multiple_of(16), 0);
    let mut out = Vec::new();
    // Layout: RSDP, XSDT, FADT, DSDT, MADT, MCFG (with PCI); offsets known before the
    // tables are built.
    let rsdp_len = Rsdp::len();
    if let Some(d) = cfg.isa.iter().find(|d| {
        d.name.len() != 4
            || !d
                .name
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
            || d.hid.len() != 7
            || !d.hid[..3].bytes().all(|b| b.is_ascii_uppercase())
            || !d.hid[3..].bytes().all(|b| b.is_ascii_hexdigit())
    }) {
        return Err(AcpiError::IsaDevice(d.name));
    }
    if let Some(p) = cfg.pci {
        let ok = p.ecam_base % (1 << 20) == 0
            && p.ecam_base
                .checked_add(1 << 20)
                .is_some_and(|e| e <= 1 << 32)
            && p.window_start < p.window_end
            && p.window_end <= 1 << 32
            && p.window64.is_none_or(|(s, e)| (1 << 32) <= s && s < e);
        if !ok {
            return Err(AcpiError::PciHost(p));
        }
    }
    let dsdt_body = dsdt(cfg.virtio_mmio, cfg.isa, cfg.pci.as_ref());
    let mut dsdt = Sdt::new(*b"DSDT", 36, 2, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    dsdt.append_slice(&dsdt_body);
    let dsdt = dsdt.as_slice().to_vec();

    let mut madt = MADT::new(
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
        LocalInterruptController::Address(LAPIC_ADDR as u32),
    );
    for id in 0..cfg.cpus {
        madt.add_structure(ProcessorLocalApic::new(
            id as u8,
            id as u8,
            EnabledStatus::Enabled,
        ));
    }
    // The IOAPIC's ID follows the CPUs'.
    madt.add_structure(IoApic::new(cfg.cpus as u8, IOAPIC_ADDR as u32, 0));
    madt.add_structure(LocalApicNmi {
        kind: 4,
        length: 6,
        processor_uid: 0xff, // all processors
        flags: 0,
        lint: 1,
    });
    let mut madt = serialize(&madt);
    // The crate has no setter for the MADT flags: set PCAT_COMPAT and re-seal.
    madt[MADT_FLAGS_OFFSET..MADT_FLAGS_OFFSET + 4].copy_from_slice(&MADT_PCAT_COMPAT.to_le_bytes());
    madt[9] = 0;
    madt[9] = checksum(&madt);

    let mcfg = cfg.pci.map(|p| {
        let mut m = MCFG::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
        m.add_ecam(p.ecam_base, 0, 0, 0);
        serialize(&m)
    });
    let fadt_len = acpi_tables::fadt::FADT::len();
    let xsdt_len = 36 + (2 + usize::from(mcfg.is_some())) * 8;
    let off = |n: usize| n.next_multiple_of(16);
    let xsdt_off = off(rsdp_len);
    let fadt_off = xsdt_off + off(xsdt_len);
    let dsdt_off = fadt_off + off(fadt_len);
    let madt_off = dsdt_off + off(dsdt.len());
    let mcfg_off = madt_off + off(madt.len());
    let addr = |o: usize| base + o as u64;

    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .dsdt_64(addr(dsdt_off))
        .flag(Flags::Wbinvd)
        .flag(Flags::ResetRegSup)
        .flag(Flags::HwReducedAcpi);
    fadt.iapc_boot_arch = IAPC_BOOT_ARCH.into();
    fadt.century = RTC_CENTURY_REG;
    fadt.reset_reg = io_port(RESET_PORT);
    fadt.reset_value = RESET_VALUE;
    fadt.sleep_control_reg = io_port(cfg.sleep_port);
    fadt.sleep_status_reg = io_port(cfg.sleep_port.wrapping_add(1));
    fadt.hypervisor_vendor_identity = u64::from_le_bytes(*b"PARTITN ").into();
    let fadt = serialize(&fadt.finalize());

    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    xsdt.add_entry(addr(fadt_off));
    xsdt.add_entry(addr(madt_off));
    if mcfg.is_some() {
        xsdt.add_entry(addr(mcfg_off));
    }
    let xsdt = serialize(&xsdt);
    debug_assert_eq!(xsdt.len(), xsdt_len);

    let tables = [
        (0, serialize(&Rsdp::new(OEM_ID, addr(xsdt_off)))),
        (xsdt_off, xsdt),
        (fadt_off, fadt),
        (dsdt_off, dsdt),
        (madt_off, madt),
    ];
    for (o, t) in tables.into_iter().chain(mcfg.map(|m| (mcfg_off, m))) {
        debug_assert_eq!(out.len(), o);
        out.extend_from_slice(&t);
        align(&mut out);
    }
    Ok(out)
}

/// Writes the tables for `cfg` into `buf` (see [`build`]); returns the bytes used.
pub fn write(buf: &mut [u8], base: u64, cfg: &AcpiConfig<'_>) -> Result<usize, AcpiError> {
    let t = build(base, cfg)?;
    let dst = buf
        .get_mut(..t.len())
        .ok_or(AcpiError::BufferTooSmall { needed: t.len() })?;
    dst.copy_from_slice(&t);
    Ok(t.len())
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
                b"MCFG" => {}
                other => panic!("unexpected table {other:?}"),
            }
        }
        (fadt, madt)
    }

    fn dsdt_of(buf: &[u8], base: u64, fadt: usize) -> &[u8] {
        let dsdt = (u64_at(buf, fadt + 140) - base) as usize;
        assert_eq!(&buf[dsdt..dsdt + 4], b"DSDT");
        let len = u32_at(buf, dsdt + 4) as usize;
        assert_eq!(sum(&buf[dsdt..dsdt + len]), 0);
        &buf[dsdt..dsdt + len]
    }

    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }

    /// The offset of the table with signature `sig` the XSDT points at.
    fn table(buf: &[u8], base: u64, sig: &[u8; 4]) -> Option<usize> {
        let xsdt = (u64_at(buf, 24) - base) as usize;
        let xlen = u32_at(buf, xsdt + 4) as usize;
        (0..(xlen - 36) / 8)
            .map(|i| (u64_at(buf, xsdt + 36 + 8 * i) - base) as usize)
            .find(|&t| &buf[t..t + 4] == sig)
    }

    #[test]
    fn a_pci_host_bridge_has_its_mcfg_and_device() {
        let base = 0xe0000;
        let mut buf = [0u8; 4096];
        let pci = PciHostBridge {
            ecam_base: 0xe000_0000,
            window_start: 0xc000_0000,
            window_end: 0xd000_0000,
            window64: Some((64 << 30, 128 << 30)),
        };
        let cfg = AcpiConfig {
            pci: Some(pci),
            cpus: 1,
            virtio_mmio: &[],
            isa: &[],
            sleep_port: 0x600,
        };
        write(&mut buf, base, &cfg).unwrap();
        let (fadt, _) = walk(&buf, base);
        // MCFG: one allocation, ECAM base, segment 0, buses 0..=0.
        let mcfg = table(&buf, base, b"MCFG").expect("MCFG in the XSDT");
        assert_eq!(u32_at(&buf, mcfg + 4), 44 + 16);
        assert_eq!(u64_at(&buf, mcfg + 44), 0xe000_0000);
        assert_eq!(&buf[mcfg + 52..mcfg + 56], &[0, 0, 0, 0]);
        // PCI0: PNP0A08 (EISA 0x080ad041), PNP0A03 as _CID, the window in a DWord memory
        // descriptor (min, max), the config ports.
        let dsdt = dsdt_of(&buf, base, fadt);
        let at = find(dsdt, b"PCI0").expect("PCI0 device");
        let dev = &dsdt[at..];
        assert!(find(dev, b"_HID\x0c\x41\xd0\x0a\x08").is_some());
        assert!(find(dev, b"_CID\x0c\x41\xd0\x0a\x03").is_some());
        let mut window = Vec::new();
        window.extend_from_slice(&0xc000_0000u32.to_le_bytes());
        window.extend_from_slice(&0xcfff_ffffu32.to_le_bytes());
        assert!(find(dev, &window).is_some(), "window in _CRS");
        // The 64-bit window in a QWord memory descriptor (0x8a, then length, type, general
        // flags, type flags, granularity, min, max), prefetchable (type flags 0b111:
        // prefetchable, read-write).
        let mut window64 = Vec::new();
        window64.extend_from_slice(&(64u64 << 30).to_le_bytes());
        window64.extend_from_slice(&((128u64 << 30) - 1).to_le_bytes());
        let q = find(dev, &window64).expect("64-bit window in _CRS");
        assert_eq!(dev[q - 14], 0x8a, "QWord address space descriptor");
        assert_eq!(dev[q - 9], 0b111, "prefetchable, read-write");
        assert!(
            find(dev, &[0x47, 0x01, 0xf8, 0x0c, 0xf8, 0x0c, 0x01, 0x08]).is_some(),
            "IO(0xcf8, 8)"
        );
        // Without PCI there is neither.
        let n = write(&mut buf, base, &AcpiConfig { pci: None, ..cfg }).unwrap();
        assert!(table(&buf, base, b"MCFG").is_none());
        assert!(find(&buf[..n], b"PCI0").is_none());
        // A misaligned ECAM or an empty window is refused.
        for bad in [
            PciHostBridge {
                ecam_base: 0xe000_1000,
                ..pci
            },
            PciHostBridge {
                window_end: 0xc000_0000,
                ..pci
            },
            PciHostBridge {
                ecam_base: 0xffff_f000_0000,
                ..pci
            },
            PciHostBridge {
                window64: Some((0xc000_0000, 0xd000_0000)),
                ..pci
            },
        ] {
            assert_eq!(
                build(
                    base,
                    &AcpiConfig {
                        pci: Some(bad),
                        ..cfg
                    }
                ),
                Err(AcpiError::PciHost(bad))
            );
        }
    }

    #[test]
    fn tables_walk_and_checksum() {
        let base = 0xe0000;
        let mut buf = [0u8; 4096];
        let cfg = AcpiConfig {
            pci: None,
            cpus: 3,
            virtio_mmio: &[],
            isa: &[],
            sleep_port: 0x6a0,
        };
        let n = write(&mut buf, base, &cfg).unwrap();
        assert_eq!(n, build(base, &cfg).unwrap().len());
        let (fadt, madt) = walk(&buf, base);
        // The DSDT behind the FADT has the _S5_ package: Name(_S5_, Package(4){5,0,0,0}).
        let dsdt = dsdt_of(&buf, base, fadt);
        assert!(find(dsdt, b"\x08_S5_\x12\x07\x04\x0a\x05\x00\x00\x00").is_some());
        // Hardware reduced, sleep control at our port, reset through the i8042, century.
        assert_ne!(u32_at(&buf, fadt + 112) & (1 << 20), 0);
        // The control and status registers are the ports the config names (the VMM's
        // power device).
        assert_eq!(u64_at(&buf, fadt + 248), 0x6a0);
        assert_eq!(u64_at(&buf, fadt + 260), 0x6a1);
        assert_eq!(buf[fadt + 244], 1, "sleep control is in system I/O space");
        assert_eq!(u64_at(&buf, fadt + 120), RESET_PORT as u64);
        assert_eq!(buf[fadt + 128], RESET_VALUE);
        assert_eq!(buf[fadt + 108], RTC_CENTURY_REG);
        // Three enabled local APICs with ids 0, 1, 2; PCAT_COMPAT; the IOAPIC after them.
        assert_eq!(u32_at(&buf, madt + 40), MADT_PCAT_COMPAT);
        let mlen = u32_at(&buf, madt + 4) as usize;
        let mut o = madt + 44;
        let (mut ids, mut ioapic, mut nmi) = (Vec::new(), None, None);
        while o < madt + mlen {
            match buf[o] {
                0 => ids.push(buf[o + 3]),
                1 => ioapic = Some((buf[o + 2], u32_at(&buf, o + 4))),
                4 => nmi = Some((buf[o + 2], buf[o + 5])),
                t => panic!("MADT entry type {t}"),
            }
            o += buf[o + 1] as usize;
        }
        assert_eq!(o, madt + mlen);
        assert_eq!(ids, [0, 1, 2]);
        assert_eq!(ioapic, Some((3, IOAPIC_ADDR as u32)));
        assert_eq!(nmi, Some((0xff, 1)));
    }

    #[test]
    fn virtio_mmio_devices_are_in_the_dsdt() {
        let base = 0xe0000;
        let devs = [
            MmioDevice {
                base: 0xd000_0000,
                len: 0x1000,
                gsi: 5,
            },
            MmioDevice {
                base: 0xd000_1000,
                len: 0x1000,
                gsi: 6,
            },
        ];
        let t = build(
            base,
            &AcpiConfig {
                pci: None,
                cpus: 1,
                virtio_mmio: &devs,
                isa: &[],
                sleep_port: 0x600,
            },
        )
        .unwrap();
        let (fadt, _) = walk(&t, base);
        let dsdt = dsdt_of(&t, base, fadt);
        for (i, d) in devs.iter().enumerate() {
            // Device(VR0i) { Name(_HID, "LNRO0005") ... }
            let name = format!("VR{i:02X}");
            let at = find(dsdt, name.as_bytes()).expect("device name");
            // ExtOpPrefix DeviceOp, then a 1- to 4-byte PkgLength, then the name.
            let op = find(&dsdt[at - 6..at], &[0x5b, 0x82]).expect("DeviceOp");
            assert!((3..=6).contains(&(6 - op)), "DeviceOp right before {name}");
            let hid = find(&dsdt[at..], b"_HID\x0dLNRO0005\x00").expect("_HID string");
            // Memory32Fixed: 0x86, length 9, read-write, base, length.
            let mut m = alloc::vec![0x86, 0x09, 0x00, 0x01];
            m.extend_from_slice(&(d.base as u32).to_le_bytes());
            m.extend_from_slice(&(d.len as u32).to_le_bytes());
            let mem = find(&dsdt[at..], &m).expect("memory window");
            // Extended interrupt: consumer, edge, active high, exclusive, one GSI.
            let mut irq = alloc::vec![0x89, 0x06, 0x00, 0x03, 0x01];
            irq.extend_from_slice(&d.gsi.to_le_bytes());
            let int = find(&dsdt[at..], &irq).expect("interrupt");
            assert!(hid < mem && mem < int);
            // Each device's resources belong to it: the next device comes after them.
            if i + 1 < devs.len() {
                let next = find(dsdt, format!("VR{:02X}", i + 1).as_bytes()).unwrap();
                assert!(at + int < next);
            }
        }
    }

    #[test]
    fn legacy_devices_are_in_the_dsdt_with_their_ports_and_irq() {
        let base = 0xe0000;
        let isa = [
            IsaDevice {
                name: "COM1",
                hid: "PNP0501",
                port: 0x3f8,
                len: 8,
                irq: Some(4),
            },
            IsaDevice {
                name: "RTC0",
                hid: "PNP0B00",
                port: 0x70,
                len: 2,
                irq: None,
            },
        ];
        let t = build(
            base,
            &AcpiConfig {
                pci: None,
                cpus: 1,
                virtio_mmio: &[],
                isa: &isa,
                sleep_port: 0x600,
            },
        )
        .unwrap();
        let (fadt, _) = walk(&t, base);
        let dsdt = dsdt_of(&t, base, fadt);
        let com1 = find(dsdt, b"COM1").expect("COM1");
        // _HID EisaId("PNP0501") = DWordConst 0x0105d041.
        assert!(find(&dsdt[com1..], b"_HID\x0c\x41\xd0\x05\x01").is_some());
        // IO(Decode16, 0x3f8, 0x3f8, 1, 8), then the extended interrupt for GSI 4.
        let io = find(
            &dsdt[com1..],
            &[0x47, 0x01, 0xf8, 0x03, 0xf8, 0x03, 0x01, 0x08],
        )
        .unwrap();
        let irq = find(&dsdt[com1..], &[0x89, 0x06, 0x00, 0x03, 0x01, 4, 0, 0, 0]).unwrap();
        assert!(io < irq);
        let rtc = find(dsdt, b"RTC0").expect("RTC0");
        assert!(com1 + irq < rtc, "COM1's interrupt is COM1's");
        assert!(
            find(
                &dsdt[rtc..],
                &[0x47, 0x01, 0x70, 0x00, 0x70, 0x00, 0x01, 0x02]
            )
            .is_some()
        );
        assert!(
            find(&dsdt[rtc..], &[0x89]).is_none(),
            "no interrupt for the RTC"
        );
        let bad = [IsaDevice {
            name: "com1",
            ..isa[0]
        }];
        assert_eq!(
            build(
                base,
                &AcpiConfig {
                    pci: None,
                    cpus: 1,
                    virtio_mmio: &[],
                    isa: &bad,
                    sleep_port: 0x600,
                }
            ),
            Err(AcpiError::IsaDevice("com1"))
        );
    }

    #[test]
    fn errors() {
        let cfg = |cpus, virtio_mmio| AcpiConfig {
            pci: None,
            cpus,
            virtio_mmio,
            isa: &[],
            sleep_port: 0x600,
        };
        assert_eq!(build(0, &cfg(0, &[])), Err(AcpiError::CpuCount(0)));
        assert_eq!(
            build(0, &cfg(MAX_CPUS + 1, &[])),
            Err(AcpiError::CpuCount(MAX_CPUS + 1))
        );
        let high = MmioDevice {
            base: 0xffff_f000,
            len: 0x2000,
            gsi: 5,
        };
        let highs = [high];
        assert_eq!(build(0, &cfg(1, &highs)), Err(AcpiError::MmioDevice(high)));
        let mut small = [0u8; 16];
        let needed = build(0, &cfg(1, &[])).unwrap().len();
        assert_eq!(
            write(&mut small, 0, &cfg(1, &[])),
            Err(AcpiError::BufferTooSmall { needed })
        );
        let many = [MmioDevice {
            base: 0xd000_0000,
            len: 0x1000,
            gsi: 5,
        }; MAX_MMIO_DEVICES];
        let most = build(0, &cfg(MAX_CPUS, &many)).unwrap().len();
        assert!(most <= crate::layout::ACPI_MAX, "{most} bytes");
    }
}
