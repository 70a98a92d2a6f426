//! Every resource a device takes from the machine, handed out in one place: interrupt lines
//! (IOAPIC pins and MSI GSIs), guest-physical MMIO ranges (the virtio-mmio window, the 32-
//! and 64-bit PCI BAR windows), port ranges, PCI slots on bus 0 and KVM memory slots.
//!
//! Each kind is a [`Pool`]: a half-open range of numbers from which a device either
//! *takes* the lowest free, aligned block of a size, or *reserves* a block at a fixed place
//! (an ISA port, our guest ABI's PCI slots). A block that runs past the pool or onto another
//! device's is refused, naming both; nothing is ever handed out twice. [`Resources::board`]
//! starts with what the board itself occupies (the legacy ports and pins, the ECAM, the
//! IOAPIC and LAPIC pages) so a device can never land on them.

use std::collections::BTreeMap;

use boot::layout::{
    IOAPIC_ADDR, LAPIC_ADDR, MMIO_HOLE_END, MMIO_HOLE_START, PCI_ECAM_BASE, PCI_ECAM_SIZE,
    PCI_WINDOW_END, PCI_WINDOW_START, PCI_WINDOW64_END, PCI_WINDOW64_START, VIRTIO_MMIO_BASE,
};

use boot::acpi::MmioDevice;
use devices::i8042::{I8042_BASE, I8042_LEN};
use devices::pci::passthrough::{PhysicalBar, Windows};
use devices::pci::windows::{WindowError, WindowLimits};
use devices::pci::{PCI_CONFIG_BASE, PCI_CONFIG_LEN};
use devices::power::{ACPI_PM_BASE, ACPI_PM_LEN, DEBUG_EXIT_LEN, DEBUG_EXIT_PORT};
use devices::rtc::{RTC_LEN, RTC_PORT};
use devices::virtio::mmio::WINDOW;

use crate::kvm::IOAPIC_PINS;

/// The ports the board's own legacy devices answer: (name, base, length). A device kind on
/// the ISA ports (the console's COM1) asks for its own ([`Needs::Isa`]).
pub const LEGACY_PORTS: [(&str, u16, u16); 5] = [
    ("i8042", I8042_BASE as u16, I8042_LEN as u16),
    ("rtc", RTC_PORT as u16, RTC_LEN as u16),
    ("acpi-pm", ACPI_PM_BASE as u16, ACPI_PM_LEN as u16),
    ("debug-exit", DEBUG_EXIT_PORT as u16, DEBUG_EXIT_LEN as u16),
    ("pci-config", PCI_CONFIG_BASE as u16, PCI_CONFIG_LEN as u16),
];

/// GSIs KVM routes (KVM_MAX_IRQ_ROUTES).
pub const MAX_GSI: u64 = 4096;
/// KVM memory slots we use (x86 KVM offers at least 509 user slots).
pub const MAX_MEMORY_SLOTS: u64 = 509;
/// Slots on bus 0.
pub const PCI_SLOTS: u64 = 32;
/// IOAPIC pins 0..5 are the ISA lines the board wires (PIT 0, keyboard 1, cascade 2, COM2
/// 3, COM1 4); devices take pins from 5 up.
pub const ISA_PINS: u64 = 5;
/// Our guest ABI's PCI slots (docs/pci.md): the host bridge, the submission engine, a
/// passed-through function.
pub const HOST_BRIDGE_SLOT: u8 = 0;
/// The submission engine's slot.
pub const ENGINE_SLOT: u8 = 1;
/// The first passed-through function's slot (the others follow it, in `--device` order).
pub const VFIO_SLOT: u8 = 2;

/// A request the pools refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResourceError {
    /// No free block of the size is left.
    #[error(
        "{owner}: no {len:#x} free in the {what} (from {start:#x} to {end:#x}; taken: {taken})"
    )]
    Exhausted {
        /// The pool.
        what: &'static str,
        /// Who asked.
        owner: String,
        /// How much.
        len: u64,
        /// The pool's range.
        start: u64,
        /// Its end.
        end: u64,
        /// What is taken, for the message.
        taken: String,
    },
    /// A fixed block overlaps another device's.
    #[error("{owner}: {what} {at:#x}+{len:#x} overlaps {with}'s")]
    Overlap {
        /// The pool.
        what: &'static str,
        /// Who asked.
        owner: String,
        /// Where.
        at: u64,
        /// How much.
        len: u64,
        /// Who holds it.
        with: String,
    },
    /// A legacy device asked for a line that is not one of the ISA lines.
    #[error("{owner}: IOAPIC pin {line} is not an ISA line (0 to {})", ISA_PINS - 1)]
    IsaLine {
        /// Who asked.
        owner: String,
        /// The line.
        line: u32,
    },
    /// A passed-through function's BARs do not fit the windows.
    #[error("--device {written}: {source}")]
    Bars {
        /// The function, as the user wrote it after `--device`.
        written: String,
        /// What did not fit.
        source: WindowError,
    },
    /// A fixed block lies outside the pool (or is empty).
    #[error("{owner}: {what} {at:#x}+{len:#x} is outside {start:#x}..{end:#x}")]
    Outside {
        /// The pool.
        what: &'static str,
        /// Who asked.
        owner: String,
        /// Where.
        at: u64,
        /// How much.
        len: u64,
        /// The pool's range.
        start: u64,
        /// Its end.
        end: u64,
    },
}

/// One kind of resource: the numbers `start..end`, and who holds which block.
#[derive(Clone, Debug)]
pub struct Pool {
    what: &'static str,
    start: u64,
    end: u64,
    /// Block start → (length, owner).
    taken: BTreeMap<u64, (u64, String)>,
}

impl Pool {
    /// An empty pool of `start..end`.
    pub fn new(what: &'static str, start: u64, end: u64) -> Self {
        Self {
            what,
            start,
            end,
            taken: BTreeMap::new(),
        }
    }

    fn overlapping(&self, at: u64, len: u64) -> Option<&String> {
        // The last block starting before the end of ours is the only one that can overlap
        // it from below or inside.
        self.taken
            .range(..at.saturating_add(len))
            .next_back()
            .filter(|(s, (l, _))| s.saturating_add(*l) > at)
            .map(|(_, (_, o))| o)
    }

    /// Reserves `at..at+len` for `owner`.
    pub fn reserve(&mut self, at: u64, len: u64, owner: &str) -> Result<u64, ResourceError> {
        let end = at.checked_add(len);
        if len == 0 || at < self.start || end.is_none_or(|e| e > self.end) {
            return Err(ResourceError::Outside {
                what: self.what,
                owner: owner.into(),
                at,
                len,
                start: self.start,
                end: self.end,
            });
        }
        if let Some(with) = self.overlapping(at, len) {
            return Err(ResourceError::Overlap {
                what: self.what,
                owner: owner.into(),
                at,
                len,
                with: with.clone(),
            });
        }
        self.taken.insert(at, (len, owner.into()));
        Ok(at)
    }

    /// Takes the lowest free block of `len` aligned to `align` (a power of two) for `owner`.
    pub fn take(&mut self, len: u64, align: u64, owner: &str) -> Result<u64, ResourceError> {
        let align = align.max(1);
        let up = |x: u64| x.checked_add(align - 1).map(|v| v & !(align - 1));
        let mut cand = up(self.start);
        for (s, (l, _)) in &self.taken {
            let Some(c) = cand else { break };
            if c.checked_add(len).is_some_and(|e| e <= *s) {
                break;
            }
            cand = up(cand.map_or(*s, |c| c.max(s + l)));
        }
        match cand {
            Some(c) if len > 0 && c.checked_add(len).is_some_and(|e| e <= self.end) => {
                self.reserve(c, len, owner)
            }
            _ => Err(ResourceError::Exhausted {
                what: self.what,
                owner: owner.into(),
                len,
                start: self.start,
                end: self.end,
                taken: self.describe(),
            }),
        }
    }

    /// Takes everything from the lowest free address aligned to `align` to the first block
    /// after it (or the pool's end): a window a device places its own pieces in.
    pub fn take_rest(&mut self, align: u64, owner: &str) -> Result<(u64, u64), ResourceError> {
        let align = align.max(1);
        let mut at = self.start.next_multiple_of(align);
        for (s, (l, _)) in &self.taken {
            if *s > at {
                break;
            }
            at = at.max((s + l).next_multiple_of(align));
        }
        let end = self
            .taken
            .range(at..)
            .next()
            .map_or(self.end, |(s, _)| *s)
            .min(self.end);
        if at >= end {
            return Err(ResourceError::Exhausted {
                what: self.what,
                owner: owner.into(),
                len: 1,
                start: self.start,
                end: self.end,
                taken: self.describe(),
            });
        }
        self.reserve(at, end - at, owner)?;
        Ok((at, end))
    }

    /// `owner start+len` of every block, in order.
    pub fn describe(&self) -> String {
        let v: Vec<String> = self
            .taken
            .iter()
            .map(|(s, (l, o))| format!("{o} {s:#x}+{l:#x}"))
            .collect();
        if v.is_empty() {
            "nothing".into()
        } else {
            v.join(", ")
        }
    }

    /// The blocks held: (start, len, owner).
    pub fn blocks(&self) -> impl Iterator<Item = (u64, u64, &str)> {
        self.taken.iter().map(|(s, (l, o))| (*s, *l, o.as_str()))
    }
}

/// The machine's pools.
#[derive(Clone, Debug)]
pub struct Resources {
    /// IOAPIC pins (level or edge lines a device raises).
    pub pins: Pool,
    /// GSIs above the pins, each routed to an MSI.
    pub msi: Pool,
    /// The 32-bit MMIO hole: every fixed page and every window below.
    pub mmio: Pool,
    /// The virtio-mmio window.
    pub virtio: Pool,
    /// The 32-bit PCI BAR window.
    pub pci32: Pool,
    /// The 64-bit PCI BAR window.
    pub pci64: Pool,
    /// I/O ports.
    pub pio: Pool,
    /// Slots on PCI bus 0.
    pub pci_slots: Pool,
    /// KVM memory slots.
    pub memory_slots: Pool,
}

impl Resources {
    /// The pools with what the board itself holds: the ISA pins, the legacy ports
    /// (`legacy`: name, base, length), and in the hole the windows, the ECAM and the APIC
    /// pages, so that they are checked against each other too.
    pub fn board(legacy: &[(&str, u16, u16)]) -> Result<Self, ResourceError> {
        let mut r = Self {
            pins: Pool::new("IOAPIC pins", 0, u64::from(IOAPIC_PINS)),
            msi: Pool::new("MSI GSIs", u64::from(IOAPIC_PINS), MAX_GSI),
            mmio: Pool::new("32-bit MMIO hole", MMIO_HOLE_START, MMIO_HOLE_END),
            virtio: Pool::new("virtio-mmio window", VIRTIO_MMIO_BASE, PCI_ECAM_BASE),
            pci32: Pool::new("32-bit PCI window", PCI_WINDOW_START, PCI_WINDOW_END),
            pci64: Pool::new("64-bit PCI window", PCI_WINDOW64_START, PCI_WINDOW64_END),
            pio: Pool::new("I/O ports", 0, 0x1_0000),
            pci_slots: Pool::new("PCI slots", 0, PCI_SLOTS),
            memory_slots: Pool::new("KVM memory slots", 0, MAX_MEMORY_SLOTS),
        };
        r.pins.reserve(0, ISA_PINS, "the ISA lines")?;
        for (name, base, len) in legacy {
            r.pio.reserve(u64::from(*base), u64::from(*len), name)?;
        }
        for (name, at, len) in [
            (
                "the PCI window",
                PCI_WINDOW_START,
                PCI_WINDOW_END - PCI_WINDOW_START,
            ),
            (
                "the virtio-mmio window",
                VIRTIO_MMIO_BASE,
                PCI_ECAM_BASE - VIRTIO_MMIO_BASE,
            ),
            ("the ECAM", PCI_ECAM_BASE, PCI_ECAM_SIZE),
            ("the IOAPIC", IOAPIC_ADDR, 0x1000),
            ("the LAPIC", LAPIC_ADDR, 0x1000),
        ] {
            r.mmio.reserve(at, len, name)?;
        }
        Ok(r)
    }

    /// Every block of every pool, one line each: `pool: owner start+len`.
    pub fn describe(&self) -> String {
        [
            &self.pins,
            &self.msi,
            &self.mmio,
            &self.virtio,
            &self.pci32,
            &self.pci64,
            &self.pio,
            &self.pci_slots,
            &self.memory_slots,
        ]
        .iter()
        .map(|p| format!("{}: {}", p.what, p.describe()))
        .collect::<Vec<_>>()
        .join("\n")
    }
}

/// What one device takes from the board, for [`MachinePlan`] (its kind says, `crate::board::kind::Kind::ask`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    /// Who asks, in the pools' records and their refusals ("virtio-blk0", "the submission
    /// engine").
    pub owner: String,
    /// The request as the user wrote it after its option, for refusals that name it.
    pub written: String,
    /// What it needs.
    pub needs: Needs,
}

/// Where a device goes on the board.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Needs {
    /// A virtio-mmio window and an IOAPIC pin ([`crate::board::virtio_mmio`]).
    VirtioMmio,
    /// A function on PCI bus 0.
    Pci(PciNeeds),
    /// A legacy device at fixed ports with an ISA line (the console's COM1), as the ACPI
    /// DSDT names it: its ports are taken from the board's, its line is one of the ISA
    /// lines the board keeps below the devices' pins.
    Isa(boot::acpi::IsaDevice),
}

/// What a PCI function takes from the board.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PciNeeds {
    /// The slot our guest ABI gives the kind (docs/pci.md); None: the first free one from
    /// [`VFIO_SLOT`] up, in the order asked.
    pub slot: Option<u8>,
    /// BARs of its own, one page each, placed together at the bottom of the 32-bit window
    /// in a megabyte of their own.
    pub pages: u64,
    /// MSI GSIs taken with the plan (vector v is the first plus v).
    pub vectors: u64,
    /// KVM memory slots taken with the plan.
    pub memory_slots: u64,
    /// A host function's BARs, planned in the BAR windows with every other host function's
    /// (its GSIs and memory slots are taken when it is attached and they are known).
    pub host_bars: Option<Vec<PhysicalBar>>,
}

/// Where a device went: the place the plan gave its [`crate::board::resources::Ask`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// A virtio-mmio window and its pin.
    VirtioMmio(MmioDevice),
    /// A function on PCI bus 0.
    Pci(PciPlace),
    /// A legacy device at its fixed ports.
    Isa(boot::acpi::IsaDevice),
}

impl Place {
    /// A function on the PCI root.
    pub fn is_pci(&self) -> bool {
        matches!(self, Self::Pci(_))
    }

    /// Where it went on the PCI root, if it is a function there.
    pub fn pci(&self) -> Option<&PciPlace> {
        match self {
            Self::Pci(p) => Some(p),
            Self::VirtioMmio(_) | Self::Isa(_) => None,
        }
    }
}

/// Where a PCI function went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PciPlace {
    /// Its slot on bus 0.
    pub slot: u8,
    /// Its own pages' addresses, in the order asked.
    pub pages: Vec<u64>,
    /// The GSI of its vector 0, when it asked for vectors with the plan.
    pub first_gsi: Option<u32>,
    /// Its first KVM memory slot, when it asked for slots with the plan.
    pub first_memory_slot: Option<u32>,
    /// A host function's parts of the 32- and 64-bit BAR windows.
    pub windows: Option<Windows>,
}

/// Where everything of one launch goes, decided before anything is built.
#[derive(Clone, Debug)]
pub struct MachinePlan {
    /// The pools, with every block below taken (a passed-through function takes more).
    pub resources: Resources,
    /// The KVM memory slot of the first RAM range (the others follow).
    pub first_ram_slot: u32,
    /// Each device's place, in the order asked.
    pub places: Vec<Place>,
    /// The 64-bit BAR window the host bridge announces, `[start, end)`: sized from the
    /// functions' BARs, within the guest's physical address width (None: no PCI, or the
    /// width does not reach [`PCI_WINDOW64_START`]).
    pub window64: Option<(u64, u64)>,
}

impl MachinePlan {
    /// Places a machine of `ram_ranges` RAM ranges and every device of `asks` (of any
    /// kind), for a guest of `phys_bits` physical address bits: the virtio-mmio windows
    /// and pins in order; then the PCI functions, each at its kind's slot of our guest ABI
    /// (docs/pci.md) or the next free one, their own pages at the bottom of the 32-bit
    /// window and their vectors and memory slots; then the host functions' BARs, planned
    /// together in what is left of the windows.
    pub fn new(ram_ranges: usize, asks: &[Ask], phys_bits: u8) -> Result<Self, ResourceError> {
        let mut r = Resources::board(&LEGACY_PORTS)?;
        let first_ram_slot = r.memory_slots.take(ram_ranges as u64, 1, "guest RAM")? as u32;
        let mut places: Vec<Option<Place>> = asks.iter().map(|_| None).collect();
        for (i, a) in asks.iter().enumerate() {
            match &a.needs {
                Needs::VirtioMmio => {
                    places[i] = Some(Place::VirtioMmio(MmioDevice {
                        base: r.virtio.take(WINDOW, WINDOW, &a.owner)?,
                        len: WINDOW,
                        gsi: r.pins.take(1, 1, &a.owner)? as u32,
                    }));
                }
                Needs::Isa(d) => {
                    r.pio
                        .reserve(u64::from(d.port), u64::from(d.len), &a.owner)?;
                    if d.irq.is_some_and(|l| u64::from(l) >= ISA_PINS) {
                        return Err(ResourceError::IsaLine {
                            owner: a.owner.clone(),
                            line: d.irq.unwrap_or_default(),
                        });
                    }
                    places[i] = Some(Place::Isa(*d));
                }
                Needs::Pci(_) => {}
            }
        }
        let pci: Vec<(usize, &Ask, &PciNeeds)> = asks
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match &a.needs {
                Needs::Pci(n) => Some((i, a, n)),
                Needs::VirtioMmio | Needs::Isa(_) => None,
            })
            .collect();
        if !pci.is_empty() {
            r.pci_slots
                .reserve(u64::from(HOST_BRIDGE_SLOT), 1, "the host bridge")?;
        }
        // The slots of our guest ABI first, so a function placed in order cannot take one.
        for (_, a, n) in &pci {
            if let Some(s) = n.slot {
                r.pci_slots.reserve(u64::from(s), 1, &a.owner)?;
            }
        }
        let mut window64 = None;
        let mut hosted: Vec<(usize, u8, &Vec<PhysicalBar>)> = Vec::new();
        for (i, a, n) in &pci {
            let slot = match n.slot {
                Some(s) => s,
                None => next_slot(&mut r.pci_slots, &a.owner)?,
            };
            // Its pages at the bottom of the window, the rest of that megabyte kept free so
            // a passed-through function's BARs start on a megabyte.
            let pages = match n.pages {
                0 => Vec::new(),
                k => {
                    let base = r.pci32.take(
                        (k * PAGE).next_multiple_of(0x10_0000),
                        0x10_0000,
                        &a.owner,
                    )?;
                    (0..k).map(|p| base + p * PAGE).collect()
                }
            };
            let first_gsi = match n.vectors {
                0 => None,
                k => Some(r.msi.take(k, 1, &a.owner)? as u32),
            };
            let first_memory_slot = match n.memory_slots {
                0 => None,
                k => Some(r.memory_slots.take(k, 1, &a.owner)? as u32),
            };
            if let Some(bars) = &n.host_bars {
                hosted.push((*i, slot, bars));
            }
            places[*i] = Some(Place::Pci(PciPlace {
                slot,
                pages,
                first_gsi,
                first_memory_slot,
                windows: None,
            }));
        }
        if !pci.is_empty() {
            let low = match hosted.is_empty() {
                true => (PCI_WINDOW_END, PCI_WINDOW_END),
                false => r
                    .pci32
                    .take_rest(0x10_0000, "the passed-through functions")?,
            };
            let bars: Vec<Vec<PhysicalBar>> = hosted.iter().map(|(_, _, b)| (*b).clone()).collect();
            let plan = devices::pci::windows::plan(
                &bars,
                &WindowLimits {
                    low,
                    high_start: PCI_WINDOW64_START,
                    high_default_end: PCI_WINDOW64_END,
                    phys_bits,
                },
            )
            .map_err(|source| {
                let f = match &source {
                    WindowError::BarSize { function, .. }
                    | WindowError::Low { function, .. }
                    | WindowError::High { function, .. } => *function,
                    WindowError::Resource { .. } => 0,
                };
                ResourceError::Bars {
                    written: hosted
                        .get(f)
                        .map(|(i, _, _)| asks[*i].written.clone())
                        .unwrap_or_default(),
                    source,
                }
            })?;
            window64 = plan.high;
            if let Some((start, end)) = plan.high {
                r.pci64 = Pool::new("64-bit PCI window", start, end);
            }
            for ((i, _, _), w) in hosted.iter().zip(plan.functions) {
                if let Some((s, e)) = w.high.filter(|(s, e)| e > s) {
                    r.pci64.reserve(s, e - s, &asks[*i].owner)?;
                }
                if let Some(Place::Pci(p)) = &mut places[*i] {
                    p.windows = Some(w);
                }
            }
        }
        Ok(Self {
            resources: r,
            first_ram_slot,
            places: places.into_iter().flatten().collect(),
            window64,
        })
    }

    /// The virtio-mmio windows, in the order asked (what the ACPI DSDT and the command
    /// line announce).
    pub fn virtio_mmio(&self) -> Vec<MmioDevice> {
        self.places
            .iter()
            .filter_map(|p| match p {
                Place::VirtioMmio(w) => Some(*w),
                Place::Pci(_) | Place::Isa(_) => None,
            })
            .collect()
    }

    /// The legacy devices the kinds placed on the ISA ports, in the order asked (what the
    /// ACPI DSDT names beside the board's own).
    pub fn isa(&self) -> Vec<boot::acpi::IsaDevice> {
        self.places
            .iter()
            .filter_map(|p| match p {
                Place::Isa(d) => Some(*d),
                Place::VirtioMmio(_) | Place::Pci(_) => None,
            })
            .collect()
    }

    /// Whether the machine has PCI functions (and so a host bridge).
    pub fn has_pci(&self) -> bool {
        self.places.iter().any(Place::is_pci)
    }
}

/// A page: the size of a function's own BARs ([`PciNeeds::pages`]).
pub const PAGE: u64 = 0x1000;

/// The first free slot from [`VFIO_SLOT`] up, reserved for `owner`.
fn next_slot(slots: &mut Pool, owner: &str) -> Result<u8, ResourceError> {
    for s in u64::from(VFIO_SLOT)..PCI_SLOTS {
        if slots.overlapping(s, 1).is_none() {
            return Ok(slots.reserve(s, 1, owner)? as u8);
        }
    }
    Err(ResourceError::Exhausted {
        what: slots.what,
        owner: owner.into(),
        len: 1,
        start: u64::from(VFIO_SLOT),
        end: PCI_SLOTS,
        taken: slots.describe(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The asks of `n` disks.
    fn disks(n: usize) -> Vec<Ask> {
        (0..n)
            .map(|i| Ask {
                owner: format!("virtio-blk{i}"),
                written: format!("/disk{i}"),
                needs: Needs::VirtioMmio,
            })
            .collect()
    }

    #[test]
    fn take_hands_out_the_lowest_free_aligned_block_and_never_twice() {
        let mut p = Pool::new("slots", 0, 16);
        assert_eq!(p.take(2, 1, "a"), Ok(0));
        assert_eq!(p.reserve(4, 2, "fixed"), Ok(4));
        assert_eq!(p.take(2, 1, "b"), Ok(2));
        assert_eq!(p.take(1, 1, "c"), Ok(6));
        assert_eq!(p.take(4, 4, "d"), Ok(8));
        assert_eq!(p.take(4, 1, "e"), Ok(12));
        assert_eq!(
            p.describe(),
            "a 0x0+0x2, b 0x2+0x2, fixed 0x4+0x2, c 0x6+0x1, d 0x8+0x4, e 0xc+0x4"
        );
        let mut seen = std::collections::BTreeSet::new();
        for (s, l, _) in p.blocks() {
            for n in s..s + l {
                assert!(seen.insert(n), "{n} handed out twice");
            }
        }
    }

    #[test]
    fn exhaustion_is_refused_naming_the_pool_and_what_holds_it() {
        let mut p = Pool::new("IOAPIC pins", 0, 8);
        p.reserve(0, 5, "the ISA lines").unwrap();
        assert_eq!(p.take(3, 1, "disk 0"), Ok(5));
        let e = p.take(1, 1, "disk 3").unwrap_err();
        assert!(matches!(e, ResourceError::Exhausted { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("disk 3") && msg.contains("IOAPIC pins") && msg.contains("disk 0 0x5+0x3"),
            "{msg}"
        );
        // A failed request changes nothing.
        assert_eq!(p.describe(), "the ISA lines 0x0+0x5, disk 0 0x5+0x3");
        assert!(matches!(
            p.take(0, 1, "empty"),
            Err(ResourceError::Exhausted { .. })
        ));
        let mut wide = Pool::new("x", 0, u64::MAX);
        wide.take(1, 1, "a").unwrap();
        assert!(matches!(
            wide.take(u64::MAX - 1, 1 << 63, "huge"),
            Err(ResourceError::Exhausted { .. })
        ));
    }

    #[test]
    fn overlaps_and_blocks_outside_the_pool_are_refused() {
        let mut p = Pool::new("I/O ports", 0, 0x1_0000);
        p.reserve(0x3f8, 8, "COM1").unwrap();
        for (at, len) in [(0x3f8, 1), (0x3f0, 9), (0x3ff, 4), (0x3f0, 0x100)] {
            let e = p.reserve(at, len, "new").unwrap_err();
            assert_eq!(
                e,
                ResourceError::Overlap {
                    what: "I/O ports",
                    owner: "new".into(),
                    at,
                    len,
                    with: "COM1".into()
                }
            );
        }
        // Touching is not overlapping.
        assert_eq!(p.reserve(0x3f0, 8, "below"), Ok(0x3f0));
        assert_eq!(p.reserve(0x400, 8, "above"), Ok(0x400));
        for (at, len) in [(0xfffc, 8), (0x10, 0), (u64::MAX, 2)] {
            assert!(
                matches!(
                    p.reserve(at, len, "out"),
                    Err(ResourceError::Outside { .. })
                ),
                "{at:#x}+{len}"
            );
        }
    }

    #[test]
    fn take_rest_is_the_free_window_above_what_is_held() {
        let mut p = Pool::new("32-bit PCI window", 0xc000_0000, 0xd000_0000);
        p.take(0x3000, 0x10_0000, "engine").unwrap();
        assert_eq!(
            p.take_rest(0x10_0000, "vfio"),
            Ok((0xc010_0000, 0xd000_0000))
        );
        // The gap left below it is a window too; then nothing is left.
        assert_eq!(p.take_rest(1, "gap"), Ok((0xc000_3000, 0xc010_0000)));
        assert!(matches!(
            p.take_rest(1, "more"),
            Err(ResourceError::Exhausted { .. })
        ));
        let mut empty = Pool::new("32-bit PCI window", 0xc000_0000, 0xd000_0000);
        assert_eq!(
            empty.take_rest(0x10_0000, "vfio"),
            Ok((0xc000_0000, 0xd000_0000))
        );
    }

    #[test]
    fn the_board_holds_its_own_pages_and_refuses_a_device_on_them() {
        let mut r = Resources::board(&[("COM1", 0x3f8, 8), ("the RTC", 0x70, 2)]).unwrap();
        assert!(
            matches!(r.mmio.reserve(PCI_ECAM_BASE + 0x1000, 0x1000, "bad"), Err(ResourceError::Overlap { with, .. }) if with == "the ECAM")
        );
        assert!(matches!(
            r.pio.reserve(0x71, 1, "bad"),
            Err(ResourceError::Overlap { .. })
        ));
        assert_eq!(r.pins.take(1, 1, "disk 0"), Ok(ISA_PINS));
        assert_eq!(r.msi.take(4, 1, "engine"), Ok(u64::from(IOAPIC_PINS)));
        // The board's own legacy ports do not collide.
        Resources::board(&LEGACY_PORTS).unwrap();
        // Two legacy devices on the same ports cannot make a board.
        assert!(Resources::board(&[("a", 0x60, 1), ("b", 0x60, 5)]).is_err());
    }

    /// An engine's ask, as `board::engine` makes it: three pages, its vectors, a slot for
    /// its doorbell page, at our ABI's slot.
    fn engine() -> Ask {
        Ask {
            owner: "the submission engine".into(),
            written: "engine".into(),
            needs: Needs::Pci(PciNeeds {
                slot: Some(ENGINE_SLOT),
                pages: 3,
                vectors: 2,
                memory_slots: 1,
                host_bars: None,
            }),
        }
    }

    /// A host function's ask, as `board::vfio` makes it.
    fn function(bdf: &str, bars: Vec<PhysicalBar>) -> Ask {
        Ask {
            owner: format!("the passed-through function {bdf}"),
            written: format!("vfio={bdf}"),
            needs: Needs::Pci(PciNeeds {
                host_bars: Some(bars),
                ..PciNeeds::default()
            }),
        }
    }

    fn pci(p: &Place) -> &PciPlace {
        match p {
            Place::Pci(p) => p,
            Place::VirtioMmio(_) | Place::Isa(_) => panic!("{p:?} is not a PCI function"),
        }
    }

    #[test]
    fn a_machine_plan_places_everything_once() {
        let bar = |index, size, is64| PhysicalBar {
            index,
            size,
            io: false,
            is64,
            prefetchable: is64,
            mmap: true,
        };
        let nvme = function("0000:00:04.0", vec![bar(0, 0x4000, false)]);
        // The function asked before the engine and the disks: each still gets its kind's
        // place, and every device its place in the order asked.
        let mut asks = vec![nvme.clone(), engine()];
        asks.extend(disks(8));
        let p = MachinePlan::new(2, &asks, 48).unwrap();
        assert_eq!(p.first_ram_slot, 0);
        assert_eq!(p.places.len(), 10);
        // Disks: 4 KiB windows from the virtio base, pins from 5 (what the ACPI DSDT and
        // the command line announce).
        assert_eq!(p.virtio_mmio().len(), 8);
        for (i, d) in p.virtio_mmio().iter().enumerate() {
            assert_eq!(p.places[2 + i], Place::VirtioMmio(*d));
            assert_eq!(
                (d.base, d.gsi),
                (VIRTIO_MMIO_BASE + i as u64 * WINDOW, 5 + i as u32)
            );
        }
        let e = pci(&p.places[1]);
        assert_eq!(
            (e.slot, e.pages.clone()),
            (
                1,
                vec![
                    PCI_WINDOW_START,
                    PCI_WINDOW_START + PAGE,
                    PCI_WINDOW_START + 2 * PAGE
                ]
            )
        );
        assert_eq!(
            (e.first_gsi, e.first_memory_slot, e.windows),
            (Some(IOAPIC_PINS), Some(2), None)
        );
        let v = pci(&p.places[0]);
        assert_eq!(
            (v.slot, v.windows.as_ref().map(|w| w.low)),
            (2, Some((PCI_WINDOW_END - 0x4000, PCI_WINDOW_END)))
        );
        assert_eq!((v.first_gsi, v.first_memory_slot), (None, None));
        assert!(p.has_pci());
        assert_eq!(p.window64, Some((PCI_WINDOW64_START, PCI_WINDOW64_END)));
        // Nothing is held twice, in any pool.
        let mut r = p.resources.clone();
        assert!(r.pins.take(1, 1, "x").is_ok_and(|g| g == 13));
        assert!(
            r.msi
                .take(1, 1, "x")
                .is_ok_and(|g| g == u64::from(IOAPIC_PINS) + 2)
        );
        // Two functions, one with a 256 GiB BAR: slots 2 and 3, the window sized to reach
        // it; too few address bits refuse it naming the function.
        let gpu = function(
            "0000:00:05.0",
            vec![bar(0, 0x100, false), bar(2, 256 << 30, true)],
        );
        let two = MachinePlan::new(1, &[nvme.clone(), gpu.clone()], 40).unwrap();
        assert_eq!(
            (pci(&two.places[0]).slot, pci(&two.places[1]).slot),
            (VFIO_SLOT, VFIO_SLOT + 1)
        );
        assert_eq!(
            pci(&two.places[1]).windows.as_ref().and_then(|w| w.high),
            Some((256 << 30, 512 << 30))
        );
        assert_eq!(two.window64, Some((PCI_WINDOW64_START, 512 << 30)));
        let e = MachinePlan::new(1, &[nvme, gpu], 38).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("--device vfio=0000:00:05.0") && msg.contains("BAR 2"),
            "{msg}"
        );
        // No function: no window the width cannot reach; no PCI at all: no host bridge.
        assert_eq!(MachinePlan::new(1, &[engine()], 36).unwrap().window64, None);
        let none = MachinePlan::new(1, &disks(1), 48).unwrap();
        assert!(!none.has_pci() && none.window64.is_none());
        assert!(none.resources.pci_slots.blocks().next().is_none());
        // More disks than pins: refused, naming the disk.
        let e = MachinePlan::new(1, &disks(20), 48).unwrap_err();
        assert!(e.to_string().contains("virtio-blk19"), "{e}");
        // Two asking for one slot of the ABI: refused, naming both.
        let e = MachinePlan::new(1, &[engine(), engine()], 48).unwrap_err();
        assert!(
            matches!(&e, ResourceError::Overlap { with, .. } if with == "the submission engine"),
            "{e}"
        );
    }

    #[test]
    fn a_legacy_device_takes_its_own_ports_and_an_isa_line_only() {
        let uart = |name: &'static str, port: u16, irq: u32| Ask {
            owner: name.into(),
            written: name.into(),
            needs: Needs::Isa(boot::acpi::IsaDevice {
                name: "COM1",
                hid: "PNP0501",
                port,
                len: 8,
                irq: Some(irq),
            }),
        };
        let plan = MachinePlan::new(1, &[uart("the console", 0x3f8, 4)], 48).unwrap();
        assert_eq!(plan.isa().len(), 1);
        assert_eq!(plan.isa()[0].port, 0x3f8);
        assert!(plan.virtio_mmio().is_empty() && !plan.has_pci());
        // Its ports are taken: a second device there is refused, naming the first.
        let e = MachinePlan::new(
            1,
            &[uart("the console", 0x3f8, 4), uart("another", 0x3fc, 3)],
            48,
        )
        .unwrap_err();
        assert!(
            matches!(&e, ResourceError::Overlap { with, .. } if with == "the console"),
            "{e}"
        );
        // On the board's own ports (the i8042's), refused too.
        assert!(MachinePlan::new(1, &[uart("u", 0x60, 4)], 48).is_err());
        // A line past the ISA lines is a devices' pin: refused.
        let e = MachinePlan::new(1, &[uart("u", 0x2f8, 9)], 48).unwrap_err();
        assert!(matches!(e, ResourceError::IsaLine { line: 9, .. }), "{e}");
    }
}
