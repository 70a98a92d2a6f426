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
use devices::pci::submit::{BAR_SIZE, VECTORS};
use devices::pci::windows::{WindowError, WindowLimits};
use devices::pci::{PCI_CONFIG_BASE, PCI_CONFIG_LEN};
use devices::power::{ACPI_PM_BASE, ACPI_PM_LEN, DEBUG_EXIT_LEN, DEBUG_EXIT_PORT};
use devices::rtc::{RTC_LEN, RTC_PORT};
use devices::serial::{COM1_LEN, COM1_PORT};
use devices::virtio::mmio::WINDOW;

use crate::kvm::IOAPIC_PINS;

/// The ports the board's legacy devices answer: (name, base, length).
pub const LEGACY_PORTS: [(&str, u16, u16); 6] = [
    ("serial", COM1_PORT as u16, COM1_LEN as u16),
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
    /// A passed-through function's BARs do not fit the windows.
    #[error("--device vfio={bdf}: {source}")]
    Bars {
        /// The function.
        bdf: String,
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

/// Where the submission engine goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnginePlace {
    /// Its slot on bus 0.
    pub slot: u8,
    /// Its three BARs (registers, MSI-X, doorbell), one page each.
    pub bars: [u64; 3],
    /// The GSI of its MSI-X vector 0 (vector v is `first_gsi + v`).
    pub first_gsi: u32,
    /// The KVM memory slot of its mapped doorbell page.
    pub doorbell_slot: u32,
}

/// Where a passed-through function goes; its GSIs and memory slots are taken when its
/// vector count and BARs are known (`crate::board::vfio::attach`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VfioPlace {
    /// The host function, `DDDD:BB:DD.F`.
    pub bdf: String,
    /// Its slot on bus 0.
    pub slot: u8,
    /// Its parts of the 32- and 64-bit BAR windows (`devices::pci::windows`).
    pub windows: Windows,
}

/// A function to pass through, as the plan needs it: its address and its BARs (from
/// sysfs, `devices::pci::windows::bars_from_resource`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassthroughAsk {
    /// The host function.
    pub bdf: String,
    /// Its BARs.
    pub bars: Vec<PhysicalBar>,
}

/// Where everything of one launch goes, decided before anything is built.
#[derive(Clone, Debug)]
pub struct MachinePlan {
    /// The pools, with every block below taken (a passed-through function takes more).
    pub resources: Resources,
    /// The KVM memory slot of the first RAM range (the others follow).
    pub first_ram_slot: u32,
    /// Each virtio-mmio device's window and pin, in the order asked (the disks, in
    /// `--disk` order).
    pub virtio_mmio: Vec<MmioDevice>,
    /// The engine's place, with `--device engine`.
    pub engine: Option<EnginePlace>,
    /// Each passed-through function's place, in `--device vfio=` order.
    pub vfio: Vec<VfioPlace>,
    /// The 64-bit BAR window the host bridge announces, `[start, end)`: sized from the
    /// functions' BARs, within the guest's physical address width (None: no PCI, or the
    /// width does not reach [`PCI_WINDOW64_START`]).
    pub window64: Option<(u64, u64)>,
}

impl MachinePlan {
    /// Places a machine of `ram_ranges` RAM ranges, a virtio-mmio device for each of
    /// `virtio_mmio` (its name) and the PCI functions asked for, for a guest of `phys_bits`
    /// physical address bits. The PCI slots are our
    /// guest ABI (docs/pci.md), reserved at fixed numbers; everything else is taken in
    /// order.
    pub fn new(
        ram_ranges: usize,
        virtio_mmio: &[String],
        engine: bool,
        vfio: &[PassthroughAsk],
        phys_bits: u8,
    ) -> Result<Self, ResourceError> {
        let mut r = Resources::board(&LEGACY_PORTS)?;
        let first_ram_slot = r.memory_slots.take(ram_ranges as u64, 1, "guest RAM")? as u32;
        let virtio_mmio = virtio_mmio
            .iter()
            .map(|owner| {
                Ok(MmioDevice {
                    base: r.virtio.take(WINDOW, WINDOW, owner)?,
                    len: WINDOW,
                    gsi: r.pins.take(1, 1, owner)? as u32,
                })
            })
            .collect::<Result<Vec<_>, ResourceError>>()?;
        let pci = engine || !vfio.is_empty();
        if pci {
            r.pci_slots
                .reserve(u64::from(HOST_BRIDGE_SLOT), 1, "the host bridge")?;
        }
        let engine = match engine {
            false => None,
            true => {
                let owner = "the submission engine";
                r.pci_slots.reserve(u64::from(ENGINE_SLOT), 1, owner)?;
                // Its pages at the bottom of the window, the rest of that megabyte kept
                // free so a passed-through function's BARs start on a megabyte.
                let base = r.pci32.take(0x10_0000, 0x10_0000, owner)?;
                Some(EnginePlace {
                    slot: ENGINE_SLOT,
                    bars: [base, base + BAR_SIZE, base + 2 * BAR_SIZE],
                    first_gsi: r.msi.take(VECTORS as u64, 1, owner)? as u32,
                    doorbell_slot: r.memory_slots.take(1, 1, "the engine's doorbell page")? as u32,
                })
            }
        };
        let mut places = Vec::new();
        let mut window64 = None;
        if pci {
            let low = match vfio.is_empty() {
                true => (PCI_WINDOW_END, PCI_WINDOW_END),
                false => r
                    .pci32
                    .take_rest(0x10_0000, "the passed-through functions")?,
            };
            let bars: Vec<Vec<PhysicalBar>> = vfio.iter().map(|a| a.bars.clone()).collect();
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
                    bdf: vfio.get(f).map(|a| a.bdf.clone()).unwrap_or_default(),
                    source,
                }
            })?;
            window64 = plan.high;
            if let Some((start, end)) = plan.high {
                r.pci64 = Pool::new("64-bit PCI window", start, end);
            }
            for (i, (ask, w)) in vfio.iter().zip(plan.functions).enumerate() {
                let owner = format!("the passed-through function {}", ask.bdf);
                let slot = u64::from(VFIO_SLOT) + i as u64;
                r.pci_slots.reserve(slot, 1, &owner)?;
                if let Some((s, e)) = w.high.filter(|(s, e)| e > s) {
                    r.pci64.reserve(s, e - s, &owner)?;
                }
                places.push(VfioPlace {
                    bdf: ask.bdf.clone(),
                    slot: slot as u8,
                    windows: w,
                });
            }
        }
        Ok(Self {
            resources: r,
            first_ram_slot,
            virtio_mmio,
            engine,
            vfio: places,
            window64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of `n` disks.
    fn disks(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("virtio-blk{i}")).collect()
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
        let nvme = PassthroughAsk {
            bdf: "0000:00:04.0".into(),
            bars: vec![bar(0, 0x4000, false)],
        };
        let p = MachinePlan::new(2, &disks(8), true, std::slice::from_ref(&nvme), 48).unwrap();
        assert_eq!(p.first_ram_slot, 0);
        // Disks: 4 KiB windows from the virtio base, pins from 5 (what the ACPI DSDT and
        // the command line announce).
        for (i, d) in p.virtio_mmio.iter().enumerate() {
            assert_eq!(
                (d.base, d.gsi),
                (VIRTIO_MMIO_BASE + i as u64 * WINDOW, 5 + i as u32)
            );
        }
        let e = p.engine.unwrap();
        assert_eq!(
            (e.slot, e.bars[0], e.bars[2]),
            (1, PCI_WINDOW_START, PCI_WINDOW_START + 2 * BAR_SIZE)
        );
        assert_eq!((e.first_gsi, e.doorbell_slot), (IOAPIC_PINS, 2));
        let v = &p.vfio[0];
        assert_eq!(
            (v.slot, v.windows.low),
            (2, (PCI_WINDOW_END - 0x4000, PCI_WINDOW_END))
        );
        assert_eq!(p.window64, Some((PCI_WINDOW64_START, PCI_WINDOW64_END)));
        // Nothing is held twice, in any pool.
        let mut r = p.resources.clone();
        assert!(r.pins.take(1, 1, "x").is_ok_and(|g| g == 13));
        assert!(
            r.msi
                .take(1, 1, "x")
                .is_ok_and(|g| g == u64::from(IOAPIC_PINS) + VECTORS as u64)
        );
        // Two functions, one with a 256 GiB BAR: slots 2 and 3, the window sized to reach
        // it; too few address bits refuse it naming the function.
        let gpu = PassthroughAsk {
            bdf: "0000:00:05.0".into(),
            bars: vec![bar(0, 0x100, false), bar(2, 256 << 30, true)],
        };
        let two = MachinePlan::new(1, &[], false, &[nvme.clone(), gpu.clone()], 40).unwrap();
        assert_eq!(
            (two.vfio[0].slot, two.vfio[1].slot),
            (VFIO_SLOT, VFIO_SLOT + 1)
        );
        assert_eq!(two.vfio[1].windows.high, Some((256 << 30, 512 << 30)));
        assert_eq!(two.window64, Some((PCI_WINDOW64_START, 512 << 30)));
        let e = MachinePlan::new(1, &[], false, &[nvme, gpu], 38).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("vfio=0000:00:05.0") && msg.contains("BAR 2"),
            "{msg}"
        );
        // No function: no window the width cannot reach.
        assert_eq!(
            MachinePlan::new(1, &[], true, &[], 36).unwrap().window64,
            None
        );
        // More disks than pins: refused, naming the disk.
        let e = MachinePlan::new(1, &disks(20), false, &[], 48).unwrap_err();
        assert!(e.to_string().contains("virtio-blk19"), "{e}");
    }
}
