//! VFIO passthrough, the parts that need no device (docs/passthrough.md): what the guest
//! sees of a host PCI function, which parts of its BARs may be mapped straight into the
//! guest, and the IOMMU mappings that let it DMA into guest memory. Pure, so every rule is
//! a unit test; the VFIO calls that feed and follow these are in `partition/src/board/vfio.rs`.
//!
//! The guest's view of the function ([`virtual_function`]):
//! - identity (vendor, device, class, revision, subsystem) is the device's;
//! - BARs are the device's sizes and types, placed by the VMM in the partition's BAR
//!   windows ([`Windows`]: 64-bit prefetchable BARs above 4 GiB, the others below; largest
//!   first, each aligned to its size and at least to a page, so a BAR smaller than a page
//!   has its page to itself and is trapped); I/O BARs are not offered; the expansion
//!   ROM (index [`ROM_BAR`], VFIO's ROM region) is placed below 4 GiB like a 32-bit BAR,
//!   off until the guest enables it, and served from a copy read once
//!   ([`PassthroughFunction::with_rom`]), read-only;
//! - capabilities in the standard list keep their offsets and bytes (read-only snapshots),
//!   except MSI-X (emulated: the same vector count and table/PBA location as the device's,
//!   its table trapped, each vector routed through KVM to an irqfd the device's VFIO
//!   interrupt signals) and MSI: hidden when the device also has MSI-X (the chain skips
//!   it, so a driver uses MSI-X), else emulated with one message (`super::msi`) routed the
//!   same way;
//! - PCIe extended capabilities (past 0x100, where the device has 4 KiB of configuration
//!   space): those in [`EXTENDED_SHOWN`] (serial number, vendor-specific) as read-only
//!   snapshots at their own offsets, chained in the device's order; every other one (AER,
//!   ACS, ATS, PRI, PASID, SR-IOV, resizable BAR, ...: controls the host owns or the VMM
//!   does not emulate) hidden, a placeholder header at 0x100 when the first is;
//! - no INTx (interrupt pin 0).

use super::config::{
    Bar, BarKind, CAP_MSIX, CONFIG_SIZE, ConfigError, ConfigSpace, EXTENDED_START, ROM_BAR,
};
pub use super::msi::CAP_MSI;
use super::msi::Msi;
use super::msix::{Msix, MsixError, MsixLayout};

/// Bytes of the standard configuration header and capability list.
pub const STANDARD_CONFIG: usize = 256;
/// Extended capability: Device Serial Number.
pub const EXT_DSN: u16 = 0x0003;
/// Extended capability: Vendor-Specific.
pub const EXT_VSEC: u16 = 0x000b;
/// Extended capability: Designated Vendor-Specific.
pub const EXT_DVSEC: u16 = 0x0023;
/// The extended capabilities a guest is shown, read-only: what drivers read to identify a
/// device and its features; none has a control the guest could turn against the host.
pub const EXTENDED_SHOWN: [u16; 3] = [EXT_DSN, EXT_VSEC, EXT_DVSEC];

/// Errors building a passthrough function's view (the device's or the VMM's limits).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PassthroughError {
    /// Fewer than 64 bytes of configuration space.
    #[error("the device's configuration space is {0} bytes, less than a header")]
    Short(usize),
    /// Not a type-0 (endpoint) header.
    #[error("header type {0:#x}: only endpoints (type 0) can be passed through")]
    HeaderType(u8),
    /// A memory BAR of a size the VMM cannot place.
    #[error("BAR {0}: size {1:#x} is not a power of two of at least 16 bytes")]
    BarSize(usize, u64),
    /// The BARs do not fit the window.
    #[error("the device's BARs need {need:#x} bytes; the BAR window has {have:#x}")]
    Window {
        /// Bytes the BARs need (after alignment).
        need: u64,
        /// Bytes the window has.
        have: u64,
    },
    /// The MSI-X capability names a BAR the device does not have, or is malformed.
    #[error("MSI-X: {0}")]
    Msix(String),
    /// The MSI capability is cut short by the next one.
    #[error("MSI: the capability at {0:#x} is cut short")]
    Msi(usize),
    /// The configuration space refused a definition.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// A guest memory region the IOMMU cannot map as it is.
    #[error("guest memory {gpa:#x}+{len:#x} at host {hva:#x}: {why}")]
    Dma {
        /// Guest physical address.
        gpa: u64,
        /// Length.
        len: u64,
        /// Host virtual address.
        hva: u64,
        /// What is wrong.
        why: &'static str,
    },
}

impl From<MsixError> for PassthroughError {
    fn from(e: MsixError) -> Self {
        Self::Msix(e.to_string())
    }
}

/// A BAR as VFIO reports it (region info) and the header's type bits say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhysicalBar {
    /// BAR index.
    pub index: usize,
    /// Size in bytes (VFIO's region size).
    pub size: u64,
    /// I/O space (not offered to the guest).
    pub io: bool,
    /// 64-bit memory BAR (takes this index and the next).
    pub is64: bool,
    /// Prefetchable.
    pub prefetchable: bool,
    /// VFIO allows mapping it (`VFIO_REGION_INFO_FLAG_MMAP`).
    pub mmap: bool,
}

fn u16_at(c: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([c[at], c[at + 1]])
}

fn u32_at(c: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]])
}

/// The device's BARs from its header's type bits and VFIO's region sizes (`sizes[i]` 0:
/// no BAR `i`). The upper half of a 64-bit BAR is not a BAR of its own.
pub fn physical_bars(
    config: &[u8],
    sizes: [u64; 6],
    mmap: [bool; 6],
) -> Result<Vec<PhysicalBar>, PassthroughError> {
    if config.len() < 64 {
        return Err(PassthroughError::Short(config.len()));
    }
    let header = config[0x0e] & 0x7f;
    if header != 0 {
        return Err(PassthroughError::HeaderType(header));
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < 6 {
        let raw = u32_at(config, 0x10 + 4 * i);
        let io = raw & 1 == 1;
        let is64 = !io && raw & 0b110 == 0b100;
        if sizes[i] != 0 {
            out.push(PhysicalBar {
                index: i,
                size: sizes[i],
                io,
                is64,
                prefetchable: !io && raw & 0b1000 != 0,
                mmap: mmap[i],
            });
        }
        i += if is64 { 2 } else { 1 };
    }
    Ok(out)
}

/// The capabilities in the standard list: (offset, id), in list order. A loop, a pointer
/// into the header or past 256 bytes ends the walk (a device's list is input like any).
pub fn capabilities(config: &[u8]) -> Vec<(usize, u8)> {
    let mut out = Vec::new();
    if config.len() < STANDARD_CONFIG || u16_at(config, 0x06) & (1 << 4) == 0 {
        return out;
    }
    let mut at = usize::from(config[0x34] & 0xfc);
    while at >= 0x40 && at + 2 <= STANDARD_CONFIG && out.len() < 48 {
        if out.iter().any(|&(o, _)| o == at) {
            break;
        }
        out.push((at, config[at]));
        at = usize::from(config[at + 1] & 0xfc);
    }
    out
}

/// Where a partition's BARs may go: the 32-bit window below 4 GiB and, when the host
/// bridge describes one, the 64-bit prefetchable window above it. `[start, end)` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    /// Below 4 GiB: every BAR that does not go above.
    pub low: (u64, u64),
    /// Above 4 GiB: 64-bit prefetchable BARs (a GPU's VRAM aperture).
    pub high: Option<(u64, u64)>,
}

/// The smallest memory BAR the PCI specification allows.
pub const MIN_BAR: u64 = 16;
/// BARs are placed at least this far apart (a page), so each can be mapped or trapped on
/// its own.
pub const BAR_ALIGN: u64 = 4096;

/// Places `bars` in `windows`: 64-bit prefetchable BARs in the high window when there is
/// one, the others in the low window; in each, largest first, each aligned to its size and
/// at least to [`BAR_ALIGN`]. Returns (index, guest address) per memory BAR.
pub fn place_bars(
    bars: &[PhysicalBar],
    windows: &Windows,
) -> Result<Vec<(usize, u64)>, PassthroughError> {
    let mem: Vec<&PhysicalBar> = bars.iter().filter(|b| !b.io).collect();
    for b in &mem {
        if b.size < MIN_BAR || !b.size.is_power_of_two() || (!b.is64 && b.size > 1 << 31) {
            return Err(PassthroughError::BarSize(b.index, b.size));
        }
    }
    let goes_high = |b: &PhysicalBar| windows.high.is_some() && b.is64 && b.prefetchable;
    let mut out = Vec::new();
    for (high, (start, end)) in [(false, Some(windows.low)), (true, windows.high)]
        .into_iter()
        .filter_map(|(h, w)| Some((h, w?)))
    {
        let mut group: Vec<&PhysicalBar> = mem
            .iter()
            .copied()
            .filter(|b| goes_high(b) == high)
            .collect();
        group.sort_by(|a, b| b.size.cmp(&a.size).then(a.index.cmp(&b.index)));
        let mut next = start;
        for b in &group {
            let span = b.size.max(BAR_ALIGN);
            let at = next
                .checked_next_multiple_of(span)
                .and_then(|a| a.checked_add(span).map(|e| (a, e)));
            match at {
                Some((a, e)) if e <= end && (b.is64 || e <= 1 << 32) => {
                    out.push((b.index, a));
                    next = e;
                }
                _ => {
                    let need = group.iter().map(|b| b.size.max(BAR_ALIGN)).sum::<u64>();
                    return Err(PassthroughError::Window {
                        need,
                        have: end.saturating_sub(start),
                    });
                }
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The guest's view of a passed-through function.
pub struct VirtualFunction {
    /// Its configuration space.
    pub config: ConfigSpace,
    /// The emulated MSI-X state and the capability's offset, if the device has MSI-X.
    pub msix: Option<(Msix, usize)>,
    /// The emulated MSI state and the capability's offset, if the device has MSI and no
    /// MSI-X.
    pub msi: Option<(Msi, usize)>,
    /// Each offered BAR and where the VMM placed it.
    pub bars: Vec<(PhysicalBar, u64)>,
    /// Capabilities hidden from the guest: (offset, id).
    pub hidden: Vec<(usize, u8)>,
    /// PCIe extended capabilities the guest sees.
    pub extended: Vec<ExtendedCap>,
    /// PCIe extended capabilities hidden from it.
    pub hidden_extended: Vec<ExtendedCap>,
}

/// A PCIe extended capability: (offset, id).
pub type ExtendedCap = (usize, u16);

/// The device's PCIe extended capabilities in chain order from 0x100: (offset, id,
/// version). The walk stops at an empty or all-ones header, a pointer below 0x100 or past
/// `config`, or a capability seen before (a loop). Placeholders (id 0) are skipped.
pub fn extended_capabilities(config: &[u8]) -> Vec<(usize, u16, u8)> {
    let mut out: Vec<(usize, u16, u8)> = Vec::new();
    let mut seen = Vec::new();
    let mut at = EXTENDED_START;
    while at >= EXTENDED_START && at + 4 <= config.len().min(CONFIG_SIZE) && !seen.contains(&at) {
        let h = u32_at(config, at);
        if h == 0 || h == u32::MAX {
            break;
        }
        seen.push(at);
        if h as u16 != 0 {
            out.push((at, h as u16, (h >> 16 & 0xf) as u8));
        }
        at = (h >> 20) as usize & !3;
    }
    out
}

/// The bytes after the header of extended capability `id` at `at` that the guest may see,
/// or None to hide it: a kind in [`EXTENDED_SHOWN`] whose length (fixed, or the
/// vendor-specific header's) ends before `limit` (the next capability or the end).
fn extended_body(config: &[u8], at: usize, id: u16, limit: usize) -> Option<&[u8]> {
    let len = match id {
        EXT_DSN => 12,
        EXT_VSEC | EXT_DVSEC if at + 8 <= limit => (u32_at(config, at + 4) >> 20) as usize,
        _ => return None,
    };
    (len >= 8 && at + len <= limit).then(|| &config[at + 4..at + len])
}

/// Puts the extended capabilities of `config` the guest may see into `space`, chained in
/// the device's order; returns (shown, hidden), each (offset, id).
fn virtual_extended(
    config: &[u8],
    space: &mut ConfigSpace,
) -> Result<(Vec<ExtendedCap>, Vec<ExtendedCap>), PassthroughError> {
    let caps = extended_capabilities(config);
    let end = config.len().min(CONFIG_SIZE);
    let mut starts: Vec<usize> = caps.iter().map(|c| c.0).collect();
    starts.sort_unstable();
    let mut shown = Vec::new();
    let mut hidden = Vec::new();
    for &(at, id, version) in &caps {
        let limit = starts.iter().copied().find(|&o| o > at).unwrap_or(end);
        match extended_body(config, at, id, limit) {
            Some(body) => shown.push((at, id, version, body)),
            None => hidden.push((at, id)),
        }
    }
    if let Some(first) = shown.first()
        && first.0 != EXTENDED_START
    {
        space.put_extended(EXTENDED_START, 0, 0, first.0, &[])?;
    }
    for (i, &(at, id, version, body)) in shown.iter().enumerate() {
        let next = shown.get(i + 1).map_or(0, |n| n.0);
        space.put_extended(at, id, version, next, body)?;
    }
    Ok((shown.iter().map(|c| (c.0, c.1)).collect(), hidden))
}

/// Builds the guest's view of a device from its configuration space (at least the first
/// 256 bytes, 4 KiB for a PCIe device, as VFIO's config region reads them), its BARs, and
/// the BAR windows.
pub fn virtual_function(
    config: &[u8],
    bars: &[PhysicalBar],
    windows: &Windows,
) -> Result<VirtualFunction, PassthroughError> {
    if config.len() < STANDARD_CONFIG {
        return Err(PassthroughError::Short(config.len()));
    }
    let header = config[0x0e] & 0x7f;
    if header != 0 {
        return Err(PassthroughError::HeaderType(header));
    }
    let class = u32_at(config, 0x08) >> 8;
    let mut space = ConfigSpace::new(u16_at(config, 0), u16_at(config, 2), class, config[0x08], 0);
    space.set_subsystem(u16_at(config, 0x2c), u16_at(config, 0x2e));
    let placed = place_bars(bars, windows)?;
    let mut offered = Vec::new();
    for &(index, addr) in &placed {
        let Some(b) = bars.iter().find(|b| b.index == index) else {
            continue;
        };
        if index == ROM_BAR {
            space.set_rom(b.size, addr)?;
            offered.push((*b, addr));
            continue;
        }
        let bar = Bar {
            size: b.size,
            kind: if b.is64 {
                BarKind::Mem64
            } else {
                BarKind::Mem32
            },
            prefetchable: b.prefetchable,
        };
        space.set_bar(index, bar, addr)?;
        offered.push((*b, addr));
    }
    let caps = capabilities(config);
    let has_msix = caps.iter().any(|c| c.1 == CAP_MSIX);
    let mut hidden = Vec::new();
    let mut msix = None;
    let mut msi = None;
    // Each capability's bytes run to the next capability above it (or the end of the
    // standard space), at most as far as its own kind is long.
    let mut starts: Vec<usize> = caps.iter().map(|c| c.0).collect();
    starts.sort_unstable();
    for &(at, id) in &caps {
        let end = starts
            .iter()
            .copied()
            .find(|&o| o > at)
            .unwrap_or(STANDARD_CONFIG);
        match id {
            CAP_MSI if has_msix => hidden.push((at, id)),
            CAP_MSI => {
                let m = Msi::new(u16_at(config, at + 2));
                if end - at < m.len() {
                    return Err(PassthroughError::Msi(at));
                }
                let (body, mask) = m.capability();
                let cap = space.add_capability_at(at, CAP_MSI, &body, &mask)?;
                msi = Some((m, cap));
            }
            CAP_MSIX => {
                if end - at < 12 {
                    return Err(PassthroughError::Msix(format!(
                        "the capability at {at:#x} is cut short"
                    )));
                }
                let control = u16_at(config, at + 2);
                let count = usize::from(control & 0x7ff) + 1;
                let table = u32_at(config, at + 4);
                let pba = u32_at(config, at + 8);
                let layout = MsixLayout {
                    table: ((table & 7) as u8, table & !7),
                    pba: ((pba & 7) as u8, pba & !7),
                };
                for (what, (bir, off), len) in [
                    ("table", layout.table, count as u64 * 16),
                    ("PBA", layout.pba, count.div_ceil(64) as u64 * 8),
                ] {
                    let bar = offered.iter().find(|(b, _)| b.index == usize::from(bir));
                    let fits = bar.is_some_and(|(b, _)| u64::from(off) + len <= b.size);
                    if !fits {
                        return Err(PassthroughError::Msix(format!(
                            "the {what} at BAR {bir} + {off:#x} ({len} bytes) is not inside an \
                             offered BAR"
                        )));
                    }
                }
                let m = Msix::new(count, layout)?;
                let (body, mask) = m.capability();
                let cap = space.add_capability_at(at, CAP_MSIX, &body, &mask)?;
                msix = Some((m, cap));
            }
            _ => {
                let len = (end - at).min(STANDARD_CONFIG - at);
                let body = &config[at + 2..at + len];
                space.add_capability_at(at, id, body, &[])?;
            }
        }
    }
    let (extended, hidden_extended) = virtual_extended(config, &mut space)?;
    Ok(VirtualFunction {
        config: space,
        msix,
        msi,
        bars: offered,
        hidden,
        extended,
        hidden_extended,
    })
}

/// The parts of a BAR of `size` bytes that may be mapped into the guest: everything
/// except the pages holding `traps` ((offset, length) each: the MSI-X table and PBA),
/// which must reach the VMM. `(offset, length)` pieces, page aligned, in order.
pub fn mappable(size: u64, traps: &[(u64, u64)], page: u64) -> Vec<(u64, u64)> {
    let mut holes: Vec<(u64, u64)> = traps
        .iter()
        .filter(|t| t.1 > 0)
        .map(|&(o, l)| {
            let s = o - o % page;
            let e = o
                .saturating_add(l)
                .min(size)
                .next_multiple_of(page)
                .min(size);
            (s.min(size), e)
        })
        .collect();
    holes.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0;
    for (s, e) in holes {
        if s > at {
            out.push((at, s - at));
        }
        at = at.max(e);
    }
    if at < size {
        out.push((at, size - at));
    }
    out
}

/// One IOMMU mapping: the device sees guest physical `iova` as the host memory at `hva`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaMap {
    /// I/O virtual address (the guest physical address).
    pub iova: u64,
    /// Length.
    pub len: u64,
    /// Host virtual address.
    pub hva: u64,
}

/// The IOMMU mappings for guest RAM given as (guest physical, length, host virtual)
/// regions: each region page aligned, none overlapping, and runs contiguous in both
/// address spaces merged (a partition's pool extent of hugepages is one mapping).
pub fn dma_plan(regions: &[(u64, u64, u64)], page: u64) -> Result<Vec<DmaMap>, PassthroughError> {
    let mut r: Vec<(u64, u64, u64)> = regions.to_vec();
    r.sort_unstable();
    let mut out: Vec<DmaMap> = Vec::new();
    for &(gpa, len, hva) in &r {
        let bad = |why| PassthroughError::Dma { gpa, len, hva, why };
        if len == 0 {
            return Err(bad("empty"));
        }
        if gpa % page != 0 || len % page != 0 || hva % page != 0 {
            return Err(bad("not page aligned"));
        }
        if gpa.checked_add(len).is_none() || hva.checked_add(len).is_none() {
            return Err(bad("wraps"));
        }
        if let Some(last) = out.last_mut() {
            if gpa < last.iova + last.len {
                return Err(bad("overlaps another region"));
            }
            if gpa == last.iova + last.len && hva == last.hva + last.len {
                last.len += len;
                continue;
            }
        }
        out.push(DmaMap {
            iova: gpa,
            len,
            hva,
        });
    }
    Ok(out)
}

/// What a passed-through function needs of the real device: VFIO in the VMM
/// (`partition/src/board/vfio.rs`), a recording fake in tests.
pub trait DeviceAccess: Send {
    /// Reads a trapped part of BAR `bar` at `offset`.
    fn read_bar(&self, bar: usize, offset: u64, data: &mut [u8]);
    /// Writes a trapped part of BAR `bar` at `offset`.
    fn write_bar(&self, bar: usize, offset: u64, data: &[u8]);
    /// Writes the device's own configuration space (the command register's enables).
    fn write_config(&self, offset: u64, data: &[u8]);
}

/// The command register bits the device itself must follow.
const COMMAND_FORWARDED: u16 = super::config::COMMAND_MEMORY
    | super::config::COMMAND_BUS_MASTER
    | super::config::COMMAND_INTX_DISABLE;

/// A range inside a BAR: (BAR index, offset, length).
pub type BarRange = (usize, u64, u64);

/// A passed-through function on the root bus: configuration space and MSI-X emulated as
/// [`virtual_function`] built them, the rest of every trapped BAR access sent to the device.
pub struct PassthroughFunction {
    view: VirtualFunction,
    device: Box<dyn DeviceAccess>,
    /// The expansion ROM's contents, read once from the device (read-only; a ROM read
    /// through VFIO maps it anew each time).
    rom: Vec<u8>,
}

impl PassthroughFunction {
    /// The function over `device`.
    pub fn new(view: VirtualFunction, device: Box<dyn DeviceAccess>) -> Self {
        Self {
            view,
            device,
            rom: Vec::new(),
        }
    }

    /// The function's expansion ROM contents, served to the guest's reads of its ROM BAR
    /// (when the view offers one; bytes past them read as all ones, as VFIO's do past the
    /// ROM image).
    pub fn with_rom(mut self, rom: Vec<u8>) -> Self {
        self.rom = rom;
        self
    }

    /// Where the MSI-X table and PBA are: (table, PBA).
    pub fn msix_ranges(&self) -> Option<(BarRange, BarRange)> {
        let (m, _) = self.view.msix.as_ref()?;
        let l = m.layout();
        Some((
            (usize::from(l.table.0), u64::from(l.table.1), m.table_size()),
            (usize::from(l.pba.0), u64::from(l.pba.1), m.pba_size()),
        ))
    }

    /// Capabilities hidden from the guest: (offset, id).
    pub fn hidden(&self) -> &[(usize, u8)] {
        &self.view.hidden
    }

    /// PCIe extended capabilities: (shown, hidden), each (offset, id).
    pub fn extended(&self) -> (&[ExtendedCap], &[ExtendedCap]) {
        (&self.view.extended, &self.view.hidden_extended)
    }

    /// Each offered BAR and where the VMM placed it.
    pub fn bars(&self) -> &[(PhysicalBar, u64)] {
        &self.view.bars
    }

    /// MSI-X vectors (0 without MSI-X).
    pub fn vectors(&self) -> usize {
        self.view.msix.as_ref().map_or(0, |(m, _)| m.count())
    }

    /// Whether the guest sees an MSI capability (the device has MSI and no MSI-X): one
    /// interrupt line, vector 0 of the route changes.
    pub fn has_msi(&self) -> bool {
        self.view.msi.is_some()
    }

    fn in_range(r: BarRange, bar: usize, offset: u64) -> Option<u64> {
        (bar == r.0 && offset >= r.1 && offset < r.1 + r.2).then(|| offset - r.1)
    }
}

impl super::PciFunction for PassthroughFunction {
    fn config(&self) -> &ConfigSpace {
        &self.view.config
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) -> super::ConfigEffects {
        let bars = self.view.config.write(offset, data);
        let end = offset + data.len() as u64;
        if offset < 6 && end > 4 {
            let mut c = [0u8; 2];
            self.view.config.read(4, &mut c);
            let cmd = u16::from_le_bytes(c) & COMMAND_FORWARDED;
            self.device.write_config(4, &cmd.to_le_bytes());
        }
        let mut msix = Vec::new();
        if let Some((m, cap)) = self.view.msix.as_mut() {
            msix = m.follow_config_write(&self.view.config, *cap, offset, data.len());
        }
        if let Some((m, cap)) = self.view.msi.as_mut() {
            let (at, len) = (*cap as u64, m.len() as u64);
            if offset < at + len && end > at {
                let bytes = self.view.config.bytes(*cap, m.len());
                msix.extend(m.update(bytes));
            }
        }
        super::ConfigEffects { bars, msix }
    }

    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        if bar == ROM_BAR {
            data.fill(0xff);
            if let Some(rest) = usize::try_from(offset).ok().and_then(|o| self.rom.get(o..)) {
                let n = rest.len().min(data.len());
                data[..n].copy_from_slice(&rest[..n]);
            }
            return;
        }
        if let Some(((t, p), (m, _))) = self.msix_ranges().zip(self.view.msix.as_ref()) {
            if let Some(o) = Self::in_range(t, bar, offset) {
                return m.read_table(o, data);
            }
            if let Some(o) = Self::in_range(p, bar, offset) {
                return m.read_pba(o, data);
            }
        }
        self.device.read_bar(bar, offset, data);
    }

    fn write_bar(
        &mut self,
        bar: usize,
        offset: u64,
        data: &[u8],
    ) -> (Vec<super::msix::RouteChange>, Option<crate::VmEvent>) {
        if bar == ROM_BAR {
            // Read-only.
            return (Vec::new(), None);
        }
        if let Some((t, p)) = self.msix_ranges() {
            if let Some(o) = Self::in_range(t, bar, offset) {
                let change = self
                    .view
                    .msix
                    .as_mut()
                    .and_then(|(m, _)| m.write_table(o, data));
                return (change.into_iter().collect(), None);
            }
            if Self::in_range(p, bar, offset).is_some() {
                // The pending bits are read-only.
                return (Vec::new(), None);
            }
        }
        self.device.write_bar(bar, offset, data);
        (Vec::new(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU-like header: 1234:abcd class 03/02, BAR 0 32-bit 16 MiB, BAR 1+2 64-bit
    /// prefetchable 256 MiB, BAR 3+4 64-bit 32 MiB, BAR 5 I/O; capabilities PM at 0x60, MSI
    /// at 0x68, PCIe at 0x78, MSI-X at 0xb4 (16 vectors, table BAR 0 + 0xb00000, PBA BAR 0
    /// + 0xbc0000), vendor at 0xc0.
    fn gpu() -> (Vec<u8>, [u64; 6]) {
        let mut c = vec![0u8; 256];
        c[0..4].copy_from_slice(&0xabcd_1234u32.to_le_bytes());
        c[0x06] = 1 << 4;
        c[0x08] = 0xa1;
        c[0x09..0x0c].copy_from_slice(&[0x00, 0x02, 0x03]);
        c[0x10..0x14].copy_from_slice(&0u32.to_le_bytes());
        c[0x14..0x18].copy_from_slice(&0b1100u32.to_le_bytes());
        c[0x1c..0x20].copy_from_slice(&0b0100u32.to_le_bytes());
        c[0x24..0x28].copy_from_slice(&1u32.to_le_bytes());
        c[0x2c..0x30].copy_from_slice(&0x5678_10deu32.to_le_bytes());
        c[0x34] = 0x60;
        c[0x60] = 0x01; // PM
        c[0x61] = 0x68;
        c[0x62] = 0x03;
        c[0x68] = CAP_MSI;
        c[0x69] = 0x78;
        c[0x78] = 0x10; // PCIe
        c[0x79] = 0xb4;
        c[0x7a] = 0x02;
        c[0xb4] = CAP_MSIX;
        c[0xb5] = 0xc0;
        c[0xb6..0xb8].copy_from_slice(&15u16.to_le_bytes());
        c[0xb8..0xbc].copy_from_slice(&0x00b0_0000u32.to_le_bytes());
        c[0xbc..0xc0].copy_from_slice(&0x00bc_0000u32.to_le_bytes());
        c[0xc0] = 0x09; // vendor-specific
        c[0xc1] = 0;
        c[0xc2] = 8;
        c[0xc3] = 0x77;
        (c, [16 << 20, 256 << 20, 0, 32 << 20, 0, 128])
    }

    fn low(start: u64, end: u64) -> Windows {
        Windows {
            low: (start, end),
            high: None,
        }
    }

    fn read(space: &ConfigSpace, at: u64, len: usize) -> u32 {
        let mut b = [0u8; 4];
        space.read(at, &mut b[..len]);
        u32::from_le_bytes(b)
    }

    #[test]
    fn bars_come_from_the_header_bits_and_vfio_sizes() {
        let (c, sizes) = gpu();
        let bars = physical_bars(&c, sizes, [true; 6]).unwrap();
        let got: Vec<_> = bars
            .iter()
            .map(|b| (b.index, b.size, b.io, b.is64, b.prefetchable))
            .collect();
        assert_eq!(
            got,
            [
                (0, 16 << 20, false, false, false),
                (1, 256 << 20, false, true, true),
                (3, 32 << 20, false, true, false),
                (5, 128, true, false, false),
            ]
        );
        let mut bridge = c.clone();
        bridge[0x0e] = 0x81;
        assert_eq!(
            physical_bars(&bridge, sizes, [true; 6]),
            Err(PassthroughError::HeaderType(1))
        );
        assert_eq!(
            physical_bars(&c[..32], sizes, [true; 6]),
            Err(PassthroughError::Short(32))
        );
    }

    #[test]
    fn the_capability_walk_survives_loops_and_bad_pointers() {
        let (c, _) = gpu();
        assert_eq!(
            capabilities(&c),
            [
                (0x60, 1),
                (0x68, CAP_MSI),
                (0x78, 0x10),
                (0xb4, CAP_MSIX),
                (0xc0, 9)
            ]
        );
        let mut looped = c.clone();
        looped[0xc1] = 0x60;
        assert_eq!(capabilities(&looped).len(), 5);
        let mut into_header = c.clone();
        into_header[0x34] = 0x10;
        assert!(capabilities(&into_header).is_empty());
        let mut no_list = c.clone();
        no_list[0x06] = 0;
        assert!(capabilities(&no_list).is_empty());
    }

    #[test]
    fn bars_are_placed_largest_first_aligned_and_must_fit() {
        let (c, sizes) = gpu();
        let bars = physical_bars(&c, sizes, [true; 6]).unwrap();
        let placed = place_bars(&bars, &low(0xc000_0000, 0x1_0000_0000)).unwrap();
        // 256 MiB at 0xc0000000, then 32 MiB, then 16 MiB; the I/O BAR is not offered.
        assert_eq!(
            placed,
            [(0, 0xd200_0000), (1, 0xc000_0000), (3, 0xd000_0000)]
        );
        assert_eq!(
            place_bars(&bars, &low(0xc000_0000, 0xd000_0000)),
            Err(PassthroughError::Window {
                need: (256 + 32 + 16) << 20,
                have: 256 << 20
            })
        );
        let odd = [PhysicalBar {
            index: 0,
            size: 3000,
            io: false,
            is64: false,
            prefetchable: false,
            mmap: true,
        }];
        assert_eq!(
            place_bars(&odd, &low(0, 1 << 32)),
            Err(PassthroughError::BarSize(0, 3000))
        );
        let tiny = [PhysicalBar { size: 8, ..odd[0] }];
        assert_eq!(
            place_bars(&tiny, &low(0, 1 << 32)),
            Err(PassthroughError::BarSize(0, 8))
        );
    }

    /// QEMU 7.2's NVMe (1b36:0010) as the rig's outer Linux read its configuration space
    /// (/sys/bus/pci/devices/0000:00:04.0/config, first 256 bytes): MSI-X at 0x40 ->
    /// PCIe at 0x80 -> PM at 0x60, out of order; BAR 0 64-bit, 16 KiB.
    const QEMU_NVME_CONFIG: [u8; 256] = [
        0x36, 0x1b, 0x10, 0x00, 0x03, 0x01, 0x10, 0x00, 0x02, 0x02, 0x08, 0x01, 0x00, 0x00, 0x00,
        0x00, 0x04, 0x00, 0x00, 0x40, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf4,
        0x1a, 0x00, 0x11, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x0a, 0x01, 0x00, 0x00, 0x11, 0x80, 0x40, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x30, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x03, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x60, 0x92, 0x00, 0x00, 0x80, 0x00,
        0x10, 0x00, 0x00, 0x00, 0x00, 0x11, 0x04, 0x00, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x30, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00,
    ];

    #[test]
    fn qemu_nvme_chains_its_capabilities_out_of_order_and_the_guest_sees_the_same_chain() {
        let c = &QEMU_NVME_CONFIG;
        assert_eq!(
            capabilities(c),
            [(0x40, CAP_MSIX), (0x80, 0x10), (0x60, 0x01)]
        );
        let bars = physical_bars(c, [16 << 10, 0, 0, 0, 0, 0], [true; 6]).unwrap();
        let both = Windows {
            low: (0xc010_0000, 0xd000_0000),
            high: Some((64 << 30, 128 << 30)),
        };
        let v = virtual_function(c, &bars, &both).unwrap();
        let seen: Vec<u8> = (0..256).map(|i| read(&v.config, i, 1) as u8).collect();
        assert_eq!(
            capabilities(&seen),
            [(0x40, CAP_MSIX), (0x80, 0x10), (0x60, 0x01)]
        );
        // PCIe and PM keep their bytes; MSI-X is emulated with the device's 65 vectors,
        // table and PBA in BAR 0.
        assert_eq!(seen[0x82..0xbc], c[0x82..0xbc]);
        assert_eq!(seen[0x62..0x68], c[0x62..0x68]);
        let (m, at) = v.msix.as_ref().unwrap();
        assert_eq!((m.count(), *at), (65, 0x40));
        // BAR 0 is 64-bit, not prefetchable: below 4 GiB.
        assert_eq!(v.config.bar_addr(0), Some(0xc010_0000));
    }

    /// QEMU's ivshmem-plain as the rig shows it: BAR 0 32-bit 256 bytes (registers), BAR 2
    /// 64-bit prefetchable 1 GiB (the shared memory, a GPU aperture's shape).
    fn ivshmem() -> Vec<PhysicalBar> {
        let mut c = vec![0u8; 256];
        c[0..4].copy_from_slice(&0x1110_1af4u32.to_le_bytes());
        c[0x18..0x1c].copy_from_slice(&0b1100u32.to_le_bytes());
        physical_bars(
            &c,
            [256, 0, 1 << 30, 0, 0, 0],
            [false, false, true, false, false, false],
        )
        .unwrap()
    }

    #[test]
    fn a_small_bar_gets_a_page_and_a_large_prefetchable_one_goes_above_4_gib() {
        let bars = ivshmem();
        let both = Windows {
            low: (0xc010_0000, 0xd000_0000),
            high: Some((64 << 30, 128 << 30)),
        };
        assert_eq!(
            place_bars(&bars, &both).unwrap(),
            [(0, 0xc010_0000), (2, 64 << 30)]
        );
        // Without a high window the 1 GiB BAR does not fit under 4 GiB's hole.
        assert_eq!(
            place_bars(&bars, &low(0xc010_0000, 0xd000_0000)),
            Err(PassthroughError::Window {
                need: (1 << 30) + 4096,
                have: 0xd000_0000 - 0xc010_0000
            })
        );
        // Two small BARs each take a page of their own.
        let two = [
            PhysicalBar {
                index: 0,
                ..bars[0]
            },
            PhysicalBar {
                index: 1,
                ..bars[0]
            },
        ];
        assert_eq!(
            place_bars(&two, &both).unwrap(),
            [(0, 0xc010_0000), (1, 0xc010_1000)]
        );
        // The guest sees the small BAR's real size (sizing reads back !0xff).
        let mut c = vec![0u8; 256];
        c[0x18..0x1c].copy_from_slice(&0b1100u32.to_le_bytes());
        let v = virtual_function(&c, &bars, &both).unwrap();
        let mut s = v.config.clone();
        s.write(0x10, &u32::MAX.to_le_bytes());
        assert_eq!(read(&s, 0x10, 4), 0xffff_ff00);
        assert_eq!(s.bar_addr(2), Some(64 << 30));
        assert_eq!(
            read(&v.config, 0x18, 4) & 0xf,
            0b1100,
            "64-bit prefetchable"
        );
    }

    #[test]
    fn the_guest_sees_the_device_with_msi_hidden_and_msix_emulated() {
        let (c, sizes) = gpu();
        let bars = physical_bars(&c, sizes, [true; 6]).unwrap();
        let v = virtual_function(&c, &bars, &low(0xc000_0000, 0x1_0000_0000)).unwrap();
        let s = &v.config;
        assert_eq!(read(s, 0, 4), 0xabcd_1234);
        assert_eq!(read(s, 0x08, 4), 0x0302_00a1);
        assert_eq!(read(s, 0x2c, 4), 0x5678_10de);
        assert_eq!(read(s, 0x3d, 1), 0, "no INTx");
        assert_eq!(s.bar_addr(1), Some(0xc000_0000));
        assert_eq!(s.bar_addr(0), Some(0xd200_0000));
        assert_eq!(s.bar(5), None, "no I/O BAR");
        // The chain: PM at 0x60 -> PCIe at 0x78 (MSI skipped) -> MSI-X at 0xb4 -> vendor.
        let chain = capabilities(&(0..256).map(|i| read(s, i, 1) as u8).collect::<Vec<_>>());
        assert_eq!(
            chain,
            [(0x60, 1), (0x78, 0x10), (0xb4, CAP_MSIX), (0xc0, 9)]
        );
        assert_eq!(v.hidden, [(0x68, CAP_MSI)]);
        // Copied capabilities keep their bytes and are read-only.
        assert_eq!(read(s, 0xc2, 2), 0x7708);
        let mut s2 = s.clone();
        s2.write(0xc3, &[0]);
        assert_eq!(read(&s2, 0xc3, 1), 0x77);
        // MSI-X: 16 vectors where the device has its table and PBA; only enable and
        // function mask writable.
        let (m, at) = v.msix.as_ref().unwrap();
        assert_eq!((m.count(), *at), (16, 0xb4));
        assert_eq!(read(s, 0xb8, 4), 0x00b0_0000);
        assert_eq!(read(s, 0xbc, 4), 0x00bc_0000);
        s2.write(0xb6, &0xffffu16.to_le_bytes());
        assert_eq!(read(&s2, 0xb6, 2), 0xc00f);
    }

    #[test]
    fn an_msix_table_outside_its_bar_is_refused() {
        let (mut c, sizes) = gpu();
        // Table in BAR 2: the upper half of a 64-bit BAR, not a BAR.
        c[0xb8..0xbc].copy_from_slice(&0x0000_0002u32.to_le_bytes());
        let bars = physical_bars(&c, sizes, [true; 6]).unwrap();
        let e = virtual_function(&c, &bars, &low(0xc000_0000, 0x1_0000_0000)).err();
        assert!(matches!(e, Some(PassthroughError::Msix(_))), "{e:?}");
        // PBA past the end of BAR 0.
        let (mut c, sizes) = gpu();
        c[0xbc..0xc0].copy_from_slice(&0x0100_0000u32.to_le_bytes());
        let bars = physical_bars(&c, sizes, [true; 6]).unwrap();
        let e = virtual_function(&c, &bars, &low(0xc000_0000, 0x1_0000_0000)).err();
        assert!(matches!(e, Some(PassthroughError::Msix(_))), "{e:?}");
    }

    /// QEMU's edu as the rig shows it: 1234:11e8, BAR 0 32-bit 1 MiB, one capability: MSI at
    /// 0x40 (64-bit, one message, no per-vector masking).
    fn edu() -> (Vec<u8>, [u64; 6]) {
        let mut c = vec![0u8; 256];
        c[0..4].copy_from_slice(&0x11e8_1234u32.to_le_bytes());
        c[0x06] = 1 << 4;
        c[0x09..0x0c].copy_from_slice(&[0x00, 0xff, 0x00]);
        c[0x34] = 0x40;
        c[0x40] = CAP_MSI;
        c[0x42..0x44].copy_from_slice(&0x0080u16.to_le_bytes());
        (c, [1 << 20, 0, 0, 0, 0, 0])
    }

    #[test]
    fn an_msi_only_device_gets_its_msi_emulated_and_routed_never_written() {
        use super::super::PciFunction;
        let (c, sizes) = edu();
        let bars = physical_bars(&c, sizes, [true; 6]).unwrap();
        let v = virtual_function(&c, &bars, &low(0xc000_0000, 0x1_0000_0000)).unwrap();
        assert!(v.hidden.is_empty());
        assert!(v.msix.is_none());
        let s = &v.config;
        assert_eq!(read(s, 0x34, 1), 0x40);
        assert_eq!(read(s, 0x40, 2), u32::from(CAP_MSI));
        assert_eq!(read(s, 0x42, 2), 0x0080);
        let fake = Fake::default();
        let mut f = PassthroughFunction::new(v, Box::new(fake.clone()));
        assert!(f.has_msi());
        assert_eq!(f.vectors(), 0);
        // The driver's order: address, data, then enable (Multiple Message Enable 0).
        assert!(
            f.write_config(0x44, &0xfee0_0000u32.to_le_bytes())
                .msix
                .is_empty()
        );
        assert!(f.write_config(0x48, &0u32.to_le_bytes()).msix.is_empty());
        assert!(f.write_config(0x4c, &0x61u16.to_le_bytes()).msix.is_empty());
        let on = f.write_config(0x40, &0x0001_0005u32.to_le_bytes()).msix;
        assert_eq!(on.len(), 1);
        assert_eq!(on[0].vector, 0);
        assert_eq!(
            on[0].route,
            Some(super::super::msix::MsiMessage {
                address: 0xfee0_0000,
                data: 0x61
            })
        );
        // Multiple Message Enable and the read-only bits did not stick.
        f.write_config(0x42, &0xffffu16.to_le_bytes());
        assert_eq!(read(f.config(), 0x42, 2), 0x0081);
        let off = f.write_config(0x42, &0x0080u16.to_le_bytes()).msix;
        assert_eq!(off.len(), 1);
        assert_eq!(off[0].route, None);
        // The device saw none of it: its MSI belongs to the host's VFIO driver.
        assert!(fake.0.lock().unwrap().is_empty());
        // An MSI capability cut short by the next one is refused.
        let (mut c, sizes) = edu();
        c[0x41] = 0x48;
        c[0x48] = 0x09;
        let bars = physical_bars(&c, sizes, [true; 6]).unwrap();
        let e = virtual_function(&c, &bars, &low(0xc000_0000, 0x1_0000_0000)).err();
        assert_eq!(e, Some(PassthroughError::Msi(0x40)));
    }

    fn ext(c: &mut [u8], at: usize, id: u16, version: u32, next: usize) {
        let h = u32::from(id) | version << 16 | (next as u32) << 20;
        c[at..at + 4].copy_from_slice(&h.to_le_bytes());
    }

    /// A PCIe function's 4 KiB: AER at 0x100 -> DSN at 0x140 -> ARI at 0x150 -> VSEC at 0x160
    /// (24 bytes) -> end.
    fn pcie_with_extended() -> (Vec<u8>, [u64; 6]) {
        let (mut c, sizes) = edu();
        c.resize(4096, 0);
        ext(&mut c, 0x100, 0x0001, 2, 0x140);
        c[0x104..0x108].copy_from_slice(&0xdead_beefu32.to_le_bytes());
        ext(&mut c, 0x140, EXT_DSN, 1, 0x150);
        c[0x144..0x14c].copy_from_slice(&0x0011_2233_4455_6677u64.to_le_bytes());
        ext(&mut c, 0x150, 0x000e, 1, 0x160);
        ext(&mut c, 0x160, EXT_VSEC, 1, 0);
        c[0x164..0x168].copy_from_slice(&(0x018u32 << 20 | 0x0001_0042).to_le_bytes());
        c[0x168..0x178].fill(0x5a);
        (c, sizes)
    }

    #[test]
    fn extended_capabilities_we_know_are_shown_read_only_and_the_rest_hidden() {
        use super::super::PciFunction;
        let (c, sizes) = pcie_with_extended();
        assert_eq!(
            extended_capabilities(&c),
            [
                (0x100, 1, 2),
                (0x140, EXT_DSN, 1),
                (0x150, 0x0e, 1),
                (0x160, EXT_VSEC, 1)
            ]
        );
        let bars = physical_bars(&c, sizes, [true; 6]).unwrap();
        let v = virtual_function(&c, &bars, &low(0xc000_0000, 0x1_0000_0000)).unwrap();
        assert_eq!(v.extended, [(0x140, EXT_DSN), (0x160, EXT_VSEC)]);
        assert_eq!(v.hidden_extended, [(0x100, 1), (0x150, 0x0e)]);
        let s = &v.config;
        // 0x100: a placeholder (id 0, version 0) leading to DSN; none of AER's bytes.
        assert_eq!(read(s, 0x100, 4), 0x140 << 20);
        assert_eq!(read(s, 0x104, 4), 0);
        // DSN -> VSEC -> end, bodies the device's.
        assert_eq!(
            read(s, 0x140, 4),
            u32::from(EXT_DSN) | 1 << 16 | 0x160 << 20
        );
        assert_eq!(read(s, 0x144, 4), 0x4455_6677);
        assert_eq!(read(s, 0x148, 4), 0x0011_2233);
        assert_eq!(read(s, 0x160, 4), u32::from(EXT_VSEC) | 1 << 16);
        assert_eq!(read(s, 0x164, 4), 0x0180_0042 | 0x0001_0000);
        assert_eq!(read(s, 0x174, 4), 0x5a5a_5a5a);
        // ARI's bytes are not there, and nothing past 0x100 is writable.
        assert_eq!(read(s, 0x150, 4), 0);
        let mut f = PassthroughFunction::new(v, Box::new(Fake::default()));
        f.write_config(0x144, &u32::MAX.to_le_bytes());
        f.write_config(0x100, &u32::MAX.to_le_bytes());
        assert_eq!(read(f.config(), 0x144, 4), 0x4455_6677);
        assert_eq!(read(f.config(), 0x100, 4), 0x140 << 20);
        assert_eq!(f.extended().1, [(0x100, 1), (0x150, 0x0e)]);
    }

    #[test]
    fn the_extended_walk_survives_loops_bad_pointers_and_short_lengths() {
        let (mut c, _) = pcie_with_extended();
        // VSEC points back at DSN: a loop, walked once.
        ext(&mut c, 0x160, EXT_VSEC, 1, 0x140);
        assert_eq!(extended_capabilities(&c).len(), 4);
        // A pointer below 0x100 ends the list; so does a 256-byte configuration space.
        ext(&mut c, 0x150, 0x000e, 1, 0x40);
        assert_eq!(extended_capabilities(&c).len(), 3);
        assert!(extended_capabilities(&c[..256]).is_empty());
        // A vendor-specific length that runs past the next capability, or under its own
        // header, is hidden rather than shown cut.
        let (mut c, sizes) = pcie_with_extended();
        ext(&mut c, 0x140, EXT_VSEC, 1, 0x150);
        c[0x144..0x148].copy_from_slice(&(0x020u32 << 20).to_le_bytes());
        let bars = physical_bars(&c, sizes, [true; 6]).unwrap();
        let v = virtual_function(&c, &bars, &low(0xc000_0000, 0x1_0000_0000)).unwrap();
        assert_eq!(v.extended, [(0x160, EXT_VSEC)]);
        c[0x144..0x148].copy_from_slice(&(0x004u32 << 20).to_le_bytes());
        let v = virtual_function(&c, &bars, &low(0xc000_0000, 0x1_0000_0000)).unwrap();
        assert!(v.hidden_extended.contains(&(0x140, EXT_VSEC)));
        // No extended capability at all (QEMU's NVMe: zeros at 0x100): nothing put there.
        let (mut c, sizes) = edu();
        c.resize(4096, 0);
        let v = virtual_function(&c, &bars_of(&c, sizes), &low(0xc000_0000, 0x1_0000_0000));
        let v = v.unwrap();
        assert!(v.extended.is_empty() && v.hidden_extended.is_empty());
        assert_eq!(read(&v.config, 0x100, 4), 0);
    }

    fn bars_of(c: &[u8], sizes: [u64; 6]) -> Vec<PhysicalBar> {
        physical_bars(c, sizes, [true; 6]).unwrap()
    }

    #[derive(Clone, Default)]
    struct Fake(std::sync::Arc<std::sync::Mutex<Vec<String>>>);
    impl DeviceAccess for Fake {
        fn read_bar(&self, bar: usize, offset: u64, data: &mut [u8]) {
            self.0
                .lock()
                .unwrap()
                .push(format!("read {bar} {offset:#x} {}", data.len()));
            data.fill(0xab);
        }
        fn write_bar(&self, bar: usize, offset: u64, data: &[u8]) {
            self.0
                .lock()
                .unwrap()
                .push(format!("write {bar} {offset:#x} {data:?}"));
        }
        fn write_config(&self, offset: u64, data: &[u8]) {
            self.0
                .lock()
                .unwrap()
                .push(format!("config {offset:#x} {data:?}"));
        }
    }

    #[test]
    fn trapped_accesses_reach_the_device_except_the_msix_table() {
        use super::super::PciFunction;
        use super::super::msix::CONTROL_ENABLE;
        let (c, sizes) = gpu();
        let bars = physical_bars(&c, sizes, [true; 6]).unwrap();
        let v = virtual_function(&c, &bars, &low(0xc000_0000, 0x1_0000_0000)).unwrap();
        let fake = Fake::default();
        let mut f = PassthroughFunction::new(v, Box::new(fake.clone()));
        assert_eq!(f.vectors(), 16);
        assert_eq!(
            f.msix_ranges(),
            Some(((0, 0xb0_0000, 256), (0, 0xbc_0000, 8)))
        );
        // A register elsewhere in BAR 0 is the device's.
        let mut d = [0u8; 4];
        f.read_bar(0, 0x1000, &mut d);
        assert_eq!(d, [0xab; 4]);
        f.write_bar(0, 0x2000, &7u32.to_le_bytes());
        // Vector 3 programmed and unmasked with MSI-X on: a route for the host, and the
        // device never saw the table.
        f.write_config(0xb6, &CONTROL_ENABLE.to_le_bytes());
        let e = 0xb0_0000 + 3 * 16;
        f.write_bar(0, e, &0xfee0_1000u32.to_le_bytes());
        f.write_bar(0, e + 8, &0x45u32.to_le_bytes());
        let (routes, _) = f.write_bar(0, e + 12, &0u32.to_le_bytes());
        assert_eq!(routes.len(), 1);
        assert_eq!(routes[0].vector, 3);
        f.read_bar(0, e + 8, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0x45);
        // The PBA is read-only and ours.
        f.write_bar(0, 0xbc_0000, &u32::MAX.to_le_bytes());
        // The command register's enables reach the device.
        f.write_config(4, &0x0406u16.to_le_bytes());
        let log = fake.0.lock().unwrap().clone();
        assert_eq!(
            log,
            [
                "read 0 0x1000 4",
                "write 0 0x2000 [7, 0, 0, 0]",
                "config 0x4 [6, 4]"
            ]
        );
    }

    #[test]
    fn the_expansion_rom_is_offered_below_4_gib_and_served_from_its_copy() {
        use super::super::PciFunction;
        let (c, sizes) = gpu();
        let mut bars = physical_bars(&c, sizes, [true; 6]).unwrap();
        bars.push(PhysicalBar {
            index: ROM_BAR,
            size: 128 << 10,
            io: false,
            is64: false,
            prefetchable: false,
            mmap: false,
        });
        let v = virtual_function(&c, &bars, &low(0xc000_0000, 0x1_0000_0000)).unwrap();
        let (rom, at) = *v.bars.iter().find(|b| b.0.index == ROM_BAR).unwrap();
        assert_eq!((rom.size, at % rom.size), (128 << 10, 0));
        assert!(at < 1 << 32);
        // Off until enabled: the register holds the address, the enable bit clear.
        assert_eq!(read(&v.config, 0x30, 4), at as u32);
        let fake = Fake::default();
        let image: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let mut f = PassthroughFunction::new(v, Box::new(fake.clone())).with_rom(image.clone());
        let effects = f.write_config(0x30, &(at as u32 | 1).to_le_bytes());
        assert_eq!(effects.bars[0].new, Some(at));
        let mut d = [0u8; 8];
        f.read_bar(ROM_BAR, 0, &mut d);
        assert_eq!(d[..], image[..8]);
        // Across the image's end: its last bytes, then all ones; far past it, all ones.
        f.read_bar(ROM_BAR, 2996, &mut d);
        assert_eq!(
            d,
            [
                image[2996],
                image[2997],
                image[2998],
                image[2999],
                0xff,
                0xff,
                0xff,
                0xff
            ]
        );
        f.read_bar(ROM_BAR, u64::MAX - 3, &mut d);
        assert_eq!(d, [0xff; 8]);
        // Writes go nowhere, and the device was never asked.
        f.write_bar(ROM_BAR, 0, &[0; 4]);
        f.read_bar(ROM_BAR, 0, &mut d);
        assert_eq!(d[..], image[..8]);
        assert!(fake.0.lock().unwrap().is_empty());
        // A function without a ROM: the register reads 0 even after sizing.
        let v = virtual_function(
            &c,
            &bars[..bars.len() - 1],
            &low(0xc000_0000, 0x1_0000_0000),
        );
        let mut f = PassthroughFunction::new(v.unwrap(), Box::new(Fake::default()));
        f.write_config(0x30, &0xffff_f800u32.to_le_bytes());
        assert_eq!(read(f.config(), 0x30, 4), 0);
    }

    #[test]
    fn the_msix_pages_are_cut_out_of_the_mapping() {
        // 16 MiB BAR, table at 0xb00000 (256 bytes), PBA at 0xbc0000 (8 bytes).
        let m = mappable(16 << 20, &[(0xb0_0000, 256), (0xbc_0000, 8)], 4096);
        assert_eq!(
            m,
            [
                (0, 0xb0_0000),
                (0xb0_1000, 0xbc_0000 - 0xb0_1000),
                (0xbc_1000, (16 << 20) - 0xbc_1000)
            ]
        );
        // Table and PBA on one page; a BAR of one page is all trap.
        assert_eq!(mappable(4096, &[(0, 32), (0x800, 8)], 4096), []);
        // Nothing to trap: the whole BAR.
        assert_eq!(mappable(1 << 20, &[], 4096), [(0, 1 << 20)]);
    }

    #[test]
    fn dma_maps_merge_contiguous_runs_and_refuse_bad_regions() {
        let g = 1u64 << 30;
        // A pool extent of 2 MiB pages given as three regions, contiguous in both spaces,
        // and a second range elsewhere.
        let plan = dma_plan(
            &[
                (0x20_0000, 0x20_0000, 0x7f00_0020_0000),
                (0, 0x20_0000, 0x7f00_0000_0000),
                (0x40_0000, g - 0x40_0000, 0x7f00_0040_0000),
                (4 * g, g, 0x7e00_0000_0000),
            ],
            2 << 20,
        )
        .unwrap();
        assert_eq!(
            plan,
            [
                DmaMap {
                    iova: 0,
                    len: g,
                    hva: 0x7f00_0000_0000
                },
                DmaMap {
                    iova: 4 * g,
                    len: g,
                    hva: 0x7e00_0000_0000
                }
            ]
        );
        // Contiguous in guest space only: two maps.
        let two = dma_plan(&[(0, 4096, 0x1000_0000), (4096, 4096, 0x2000_0000)], 4096).unwrap();
        assert_eq!(two.len(), 2);
        for (bad, why) in [
            (vec![(0, 0, 0)], "empty"),
            (vec![(0x1000, 0x1000, 0x1000)], "not page aligned"),
            (
                vec![(0, 0x40_0000, 0), (0x20_0000, 0x20_0000, 0x100_0000)],
                "overlaps another region",
            ),
            (vec![(u64::MAX - 0x1f_ffff, 0x20_0000, 0)], "wraps"),
        ] {
            match dma_plan(&bad, 2 << 20) {
                Err(PassthroughError::Dma { why: w, .. }) => assert_eq!(w, why, "{bad:?}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
