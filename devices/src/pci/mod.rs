//! PCI for partitions: a root bus (bus 0, function 0 of each slot) reached through the
//! configuration mechanism #1 ports (0xcf8-0xcff) and through ECAM, and the window of guest
//! addresses its functions' BARs decode in.
//!
//! The [`Bus`](crate::Bus) is frozen before the guest runs, so the root claims three fixed
//! ranges there ([`PciRoot::port_device`], [`PciRoot::ecam_device`],
//! [`PciRoot::window_device`]) and routes inside them itself: a guest that moves a BAR
//! moves it inside the window, and the root follows. What needs KVM when a BAR moves (a
//! mapped BAR's memory slot, a doorbell's ioeventfd) or when an MSI-X vector is programmed
//! (a GSI route in front of the vector's irqfd) goes to the [`PciHost`] the VMM supplies.
//!
//! With no functions the root is "no PCI bus": every read, CONFIG_ADDRESS included,
//! answers all ones, the way a machine without mechanism #1 does, so Linux's probing finds
//! nothing and is not reported as unknown port pokes.

pub mod config;
pub mod engine;
pub mod msi;
pub mod msix;
pub mod passthrough;
pub mod submit;
pub mod windows;

use std::sync::{Arc, Mutex, MutexGuard};

use crate::{BusDevice, VmEvent};
use config::{BarChange, ConfigSpace};
use msix::RouteChange;

/// CONFIG_ADDRESS port.
pub const PCI_CONFIG_BASE: u64 = 0xcf8;
/// CONFIG_ADDRESS + CONFIG_DATA.
pub const PCI_CONFIG_LEN: u64 = 8;
/// Bytes of ECAM per bus (32 devices × 8 functions × 4 KiB).
pub const ECAM_BUS_SIZE: u64 = 1 << 20;
/// Slots on the root bus.
pub const SLOTS: usize = 32;

/// What a function's configuration write changed that the VMM must follow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigEffects {
    /// BARs that moved or started or stopped decoding.
    pub bars: Vec<BarChange>,
    /// MSI-X vectors (or the one MSI message, vector 0) whose route changed.
    pub msix: Vec<RouteChange>,
}

/// A function on the root bus.
pub trait PciFunction: Send {
    /// Its configuration space.
    fn config(&self) -> &ConfigSpace;
    /// A guest configuration write (the function applies it to its space and reacts).
    fn write_config(&mut self, offset: u64, data: &[u8]) -> ConfigEffects;
    /// A guest read of BAR `bar` at `offset` that reached the VMM (a trapping BAR).
    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]);
    /// A guest write to BAR `bar` at `offset` that reached the VMM. Returns route changes
    /// (an MSI-X table in this BAR) and anything the VM as a whole must do.
    fn write_bar(
        &mut self,
        bar: usize,
        offset: u64,
        data: &[u8],
    ) -> (Vec<RouteChange>, Option<VmEvent>);
}

/// The host bridge at 00.0 (class 06/00, no BARs): what a guest's PCI probing expects to
/// find first (Linux's mechanism-#1 sanity check looks for a host bridge or VGA device).
pub struct HostBridge(ConfigSpace);

/// Vendor and device id of our host bridge (QEMU's test vendor, as the engine's).
pub const HOST_BRIDGE_ID: (u16, u16) = (0x1234, 0x5e00);

impl HostBridge {
    /// The bridge.
    pub fn new() -> Self {
        Self(ConfigSpace::new(
            HOST_BRIDGE_ID.0,
            HOST_BRIDGE_ID.1,
            0x06_0000,
            0,
            0,
        ))
    }
}

impl Default for HostBridge {
    fn default() -> Self {
        Self::new()
    }
}

impl PciFunction for HostBridge {
    fn config(&self) -> &ConfigSpace {
        &self.0
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) -> ConfigEffects {
        ConfigEffects {
            bars: self.0.write(offset, data),
            msix: Vec::new(),
        }
    }
    fn read_bar(&mut self, _bar: usize, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    fn write_bar(
        &mut self,
        _bar: usize,
        _offset: u64,
        _data: &[u8],
    ) -> (Vec<RouteChange>, Option<VmEvent>) {
        (Vec::new(), None)
    }
}

/// What the VMM does when the guest reprograms a function (the KVM side of PCI).
pub trait PciHost: Send {
    /// Slot `slot`'s BAR moved (or started or stopped decoding).
    fn bar_changed(&mut self, slot: u8, change: &BarChange);
    /// Slot `slot`'s MSI-X vector changed route. When `change.fire_pending`, the host sends
    /// the vector once after installing the new route (the device left that to it, so
    /// the message cannot overtake its route).
    fn msix_changed(&mut self, slot: u8, change: &RouteChange);
}

/// A host that ignores everything (tests; a bus with no functions).
#[derive(Debug, Default)]
pub struct NoHost;

impl PciHost for NoHost {
    fn bar_changed(&mut self, _slot: u8, _change: &BarChange) {}
    fn msix_changed(&mut self, _slot: u8, _change: &RouteChange) {}
}

/// Errors building the root.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PciError {
    /// Slot out of range or taken.
    #[error("PCI slot {0} does not exist or is taken")]
    Slot(usize),
    /// A BAR that does not fit inside the window.
    #[error(
        "slot {slot} BAR {bar} at {addr:#x}+{size:#x} is outside the PCI window {start:#x}..{end:#x}"
    )]
    OutsideWindow {
        /// Slot.
        slot: usize,
        /// BAR index.
        bar: usize,
        /// Address.
        addr: u64,
        /// Size.
        size: u64,
        /// Window start.
        start: u64,
        /// Window end.
        end: u64,
    },
    /// Two BARs that overlap.
    #[error("slot {0} BAR {1} overlaps slot {2} BAR {3}")]
    Overlap(usize, usize, usize, usize),
}

/// The root bus.
pub struct PciRoot {
    slots: Vec<Option<Box<dyn PciFunction>>>,
    address: u32,
    /// The BAR windows, `[start, end)`: the 32-bit one first.
    windows: Vec<(u64, u64)>,
    host: Box<dyn PciHost>,
}

impl std::fmt::Debug for PciRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PciRoot")
            .field("functions", &self.slots.iter().flatten().count())
            .field("windows", &self.windows)
            .finish()
    }
}

impl PciRoot {
    /// An empty root whose BARs decode in `[window_start, window_end)`.
    pub fn new(window_start: u64, window_end: u64, host: Box<dyn PciHost>) -> Self {
        Self {
            slots: (0..SLOTS).map(|_| None).collect(),
            address: 0,
            windows: vec![(window_start, window_end)],
            host,
        }
    }

    /// Adds a second BAR window (the 64-bit one above 4 GiB).
    pub fn add_window(&mut self, start: u64, end: u64) {
        self.windows.push((start, end));
    }

    /// Puts `function` in `slot`, its BARs where its configuration space says, checked to
    /// lie inside a window and not overlap another's.
    pub fn add(&mut self, slot: usize, function: Box<dyn PciFunction>) -> Result<(), PciError> {
        if slot >= SLOTS || self.slots[slot].is_some() {
            return Err(PciError::Slot(slot));
        }
        let (start, end) = self.windows[0];
        let bars = Self::bars_of(function.config());
        for &(bar, addr, size) in &bars {
            let inside = self
                .windows
                .iter()
                .any(|&(s, e)| addr >= s && addr.checked_add(size).is_some_and(|end| end <= e));
            if !inside {
                return Err(PciError::OutsideWindow {
                    slot,
                    bar,
                    addr,
                    size,
                    start,
                    end,
                });
            }
            for (other, f) in self.slots.iter().enumerate() {
                let Some(f) = f else { continue };
                for (obar, oaddr, osize) in Self::bars_of(f.config()) {
                    if addr < oaddr + osize && oaddr < addr + size {
                        return Err(PciError::Overlap(slot, bar, other, obar));
                    }
                }
            }
        }
        self.slots[slot] = Some(function);
        Ok(())
    }

    fn bars_of(c: &ConfigSpace) -> Vec<(usize, u64, u64)> {
        (0..=config::ROM_BAR)
            .filter_map(|i| Some((i, c.bar_addr(i)?, c.bar(i)?.size)))
            .collect()
    }

    /// The function in `slot`, if any.
    pub fn function(&self, slot: usize) -> Option<&dyn PciFunction> {
        self.slots.get(slot)?.as_deref()
    }

    /// Occupied slots.
    pub fn occupied(&self) -> Vec<usize> {
        (0..SLOTS).filter(|s| self.slots[*s].is_some()).collect()
    }

    /// Decodes a (bus, device, function, register) and reads it; absent functions read all
    /// ones.
    fn config_read(&self, bus: u8, dev: u8, func: u8, reg: u64, data: &mut [u8]) {
        match self.target(bus, dev, func) {
            Some(f) => f.config().read(reg, data),
            None => data.fill(0xff),
        }
    }

    fn config_write(&mut self, bus: u8, dev: u8, func: u8, reg: u64, data: &[u8]) {
        if self.target(bus, dev, func).is_none() {
            return;
        }
        let Some(f) = self.slots[usize::from(dev)].as_mut() else {
            return;
        };
        let effects = f.write_config(reg, data);
        for b in &effects.bars {
            self.host.bar_changed(dev, b);
        }
        for m in &effects.msix {
            self.host.msix_changed(dev, m);
        }
    }

    fn target(&self, bus: u8, dev: u8, func: u8) -> Option<&dyn PciFunction> {
        (bus == 0 && func == 0)
            .then(|| self.slots.get(usize::from(dev))?.as_deref())
            .flatten()
    }

    /// The slot and BAR decoding `addr..addr+len` (inside one BAR), with the offset in it.
    fn decode(&self, addr: u64, len: usize) -> Option<(usize, usize, u64)> {
        self.slots.iter().enumerate().find_map(|(slot, f)| {
            let c = f.as_ref()?.config();
            if !c.memory_enabled() {
                return None;
            }
            (0..=config::ROM_BAR).find_map(|bar| {
                let base = c.bar_addr(bar)?;
                let size = c.bar(bar)?.size;
                let off = addr.checked_sub(base)?;
                (off.checked_add(len as u64)? <= size).then_some((slot, bar, off))
            })
        })
    }

    fn window_read(&mut self, addr: u64, data: &mut [u8]) {
        match self.decode(addr, data.len()) {
            Some((slot, bar, off)) => match self.slots[slot].as_mut() {
                Some(f) => f.read_bar(bar, off, data),
                None => data.fill(0xff),
            },
            None => data.fill(0xff),
        }
    }

    fn window_write(&mut self, addr: u64, data: &[u8]) -> Option<VmEvent> {
        let (slot, bar, off) = self.decode(addr, data.len())?;
        let f = self.slots[slot].as_mut()?;
        let (routes, event) = f.write_bar(bar, off, data);
        for r in &routes {
            self.host.msix_changed(slot as u8, r);
        }
        event
    }

    /// The bus device for ports 0xcf8-0xcff.
    pub fn port_device(root: &Arc<Mutex<Self>>) -> Arc<Mutex<dyn BusDevice>> {
        Arc::new(Mutex::new(PortAccess(root.clone())))
    }

    /// The bus device for the ECAM window of bus 0 ([`ECAM_BUS_SIZE`] bytes).
    pub fn ecam_device(root: &Arc<Mutex<Self>>) -> Arc<Mutex<dyn BusDevice>> {
        Arc::new(Mutex::new(EcamAccess(root.clone())))
    }

    /// The bus device for the 32-bit BAR window (inserted at the window's start, its
    /// length).
    pub fn window_device(root: &Arc<Mutex<Self>>) -> Arc<Mutex<dyn BusDevice>> {
        let base = lock(root).windows[0].0;
        Self::window_device_at(root, base)
    }

    /// The bus device for a BAR window inserted at `base`.
    pub fn window_device_at(root: &Arc<Mutex<Self>>, base: u64) -> Arc<Mutex<dyn BusDevice>> {
        Arc::new(Mutex::new(WindowAccess(root.clone(), base)))
    }
}

fn lock(root: &Mutex<PciRoot>) -> MutexGuard<'_, PciRoot> {
    root.lock().unwrap_or_else(|p| p.into_inner())
}

/// Configuration mechanism #1: CONFIG_ADDRESS at 0xcf8 (dword only), CONFIG_DATA at
/// 0xcfc-0xcff (byte, word or dword).
struct PortAccess(Arc<Mutex<PciRoot>>);

/// (bus, device, function, register) that CONFIG_DATA at `port_off` (4..8) reaches, if
/// CONFIG_ADDRESS is enabled.
fn cf8_target(address: u32, port_off: u64) -> Option<(u8, u8, u8, u64)> {
    if address & 0x8000_0000 == 0 {
        return None;
    }
    let bus = (address >> 16) as u8;
    let dev = ((address >> 11) & 0x1f) as u8;
    let func = ((address >> 8) & 0x7) as u8;
    let reg = u64::from(address & 0xfc) + (port_off - 4);
    Some((bus, dev, func, reg))
}

impl BusDevice for PortAccess {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let root = lock(&self.0);
        match offset {
            // An empty bus answers all ones even here, so a guest's mechanism-#1 probe
            // (write 0x8000_0000, read it back) finds no PCI at all, as before PCI existed.
            0 if data.len() == 4 && root.slots.iter().any(Option::is_some) => {
                data.copy_from_slice(&root.address.to_le_bytes())
            }
            4..8 => match cf8_target(root.address, offset) {
                Some((b, d, f, reg)) => root.config_read(b, d, f, reg, data),
                None => data.fill(0xff),
            },
            _ => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<VmEvent> {
        let mut root = lock(&self.0);
        match offset {
            0 if data.len() == 4 => {
                root.address =
                    u32::from_le_bytes([data[0], data[1], data[2], data[3]]) & 0x80ff_fffc;
            }
            4..8 => {
                if let Some((b, d, f, reg)) = cf8_target(root.address, offset) {
                    root.config_write(b, d, f, reg, data);
                }
            }
            _ => {}
        }
        None
    }
}

/// ECAM: bus 0's 1 MiB, 4 KiB per function.
struct EcamAccess(Arc<Mutex<PciRoot>>);

fn ecam_target(offset: u64) -> (u8, u8, u8, u64) {
    let bus = (offset >> 20) as u8;
    let dev = ((offset >> 15) & 0x1f) as u8;
    let func = ((offset >> 12) & 0x7) as u8;
    (bus, dev, func, offset & 0xfff)
}

impl BusDevice for EcamAccess {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let (b, d, f, reg) = ecam_target(offset);
        lock(&self.0).config_read(b, d, f, reg, data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<VmEvent> {
        let (b, d, f, reg) = ecam_target(offset);
        lock(&self.0).config_write(b, d, f, reg, data);
        None
    }
}

/// A BAR window inserted on the bus at its base: routes to whichever BAR decodes the
/// address now.
struct WindowAccess(Arc<Mutex<PciRoot>>, u64);

impl BusDevice for WindowAccess {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let addr = self.1.saturating_add(offset);
        lock(&self.0).window_read(addr, data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<VmEvent> {
        let addr = self.1.saturating_add(offset);
        lock(&self.0).window_write(addr, data)
    }
}

#[cfg(test)]
mod tests {
    use super::config::{Bar, BarKind, COMMAND_MEMORY};
    use super::*;

    /// A function with one 4 KiB trapping BAR that records what it sees.
    struct Scratch {
        config: ConfigSpace,
        regs: [u8; 16],
    }

    impl Scratch {
        fn at(addr: u64) -> Self {
            let mut config = ConfigSpace::new(0x1af4, 0x10ff, 0x0b_4000, 0, 0);
            let bar = Bar {
                size: 0x1000,
                kind: BarKind::Mem32,
                prefetchable: false,
            };
            config.set_bar(0, bar, addr).unwrap();
            Self {
                config,
                regs: [0; 16],
            }
        }
    }

    impl PciFunction for Scratch {
        fn config(&self) -> &ConfigSpace {
            &self.config
        }
        fn write_config(&mut self, offset: u64, data: &[u8]) -> ConfigEffects {
            ConfigEffects {
                bars: self.config.write(offset, data),
                msix: Vec::new(),
            }
        }
        fn read_bar(&mut self, _bar: usize, offset: u64, data: &mut [u8]) {
            let at = offset as usize % 16;
            let n = data.len().min(16 - at);
            data[..n].copy_from_slice(&self.regs[at..at + n]);
        }
        fn write_bar(
            &mut self,
            _bar: usize,
            offset: u64,
            data: &[u8],
        ) -> (Vec<RouteChange>, Option<VmEvent>) {
            let at = offset as usize % 16;
            let n = data.len().min(16 - at);
            self.regs[at..at + n].copy_from_slice(&data[..n]);
            (Vec::new(), None)
        }
    }

    type Seen = Arc<Mutex<Vec<(u8, BarChange)>>>;

    #[derive(Default)]
    struct Recorder(Seen);

    impl PciHost for Recorder {
        fn bar_changed(&mut self, slot: u8, change: &BarChange) {
            self.0.lock().unwrap().push((slot, *change));
        }
        fn msix_changed(&mut self, _slot: u8, _change: &RouteChange) {}
    }

    const WIN: (u64, u64) = (0xc000_0000, 0xd000_0000);

    fn root() -> (Arc<Mutex<PciRoot>>, Seen) {
        let rec = Recorder::default();
        let seen = rec.0.clone();
        let mut r = PciRoot::new(WIN.0, WIN.1, Box::new(rec));
        r.add(3, Box::new(Scratch::at(0xc000_1000))).unwrap();
        (Arc::new(Mutex::new(r)), seen)
    }

    fn cf8(port: &Arc<Mutex<dyn BusDevice>>, dev: u32, reg: u32) {
        let a = 0x8000_0000 | dev << 11 | reg;
        port.lock().unwrap().write(0, &a.to_le_bytes());
    }

    fn cfc_read32(port: &Arc<Mutex<dyn BusDevice>>) -> u32 {
        let mut b = [0u8; 4];
        port.lock().unwrap().read(4, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn an_empty_bus_reads_all_ones() {
        let root = Arc::new(Mutex::new(PciRoot::new(WIN.0, WIN.1, Box::new(NoHost))));
        let port = PciRoot::port_device(&root);
        cf8(&port, 0, 0);
        assert_eq!(cfc_read32(&port), 0xffff_ffff);
        assert_eq!(port.lock().unwrap().write(4, &[0; 4]), None);
        let mut a = [0u8; 4];
        port.lock().unwrap().read(0, &mut a);
        assert_eq!(
            a, [0xff; 4],
            "CONFIG_ADDRESS does not read back on an empty bus"
        );
    }

    #[test]
    fn port_and_ecam_reach_the_same_function() {
        let (root, _) = root();
        let port = PciRoot::port_device(&root);
        let ecam = PciRoot::ecam_device(&root);
        cf8(&port, 3, 0);
        assert_eq!(cfc_read32(&port), 0x10ff_1af4);
        // CONFIG_ADDRESS reads back; its reserved low bits are dropped.
        port.lock().unwrap().write(0, &0x8000_1803u32.to_le_bytes());
        let mut a = [0u8; 4];
        port.lock().unwrap().read(0, &mut a);
        assert_eq!(u32::from_le_bytes(a), 0x8000_1800);
        // Byte and word reads of CONFIG_DATA pick the register's bytes.
        let mut w = [0u8; 2];
        port.lock().unwrap().read(6, &mut w);
        assert_eq!(u16::from_le_bytes(w), 0x10ff);
        let mut b = [0u8; 4];
        ecam.lock().unwrap().read(3 << 15, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0x10ff_1af4);
        // Other slots, functions and buses are absent.
        ecam.lock().unwrap().read(4 << 15, &mut b);
        assert_eq!(b, [0xff; 4]);
        ecam.lock().unwrap().read(3 << 15 | 1 << 12, &mut b);
        assert_eq!(b, [0xff; 4]);
        cf8(&port, 3, 0);
        port.lock()
            .unwrap()
            .write(0, &(0x8001_1800u32).to_le_bytes());
        assert_eq!(cfc_read32(&port), 0xffff_ffff);
        // Disabled CONFIG_ADDRESS reaches nothing.
        port.lock()
            .unwrap()
            .write(0, &(0x0000_1800u32).to_le_bytes());
        assert_eq!(cfc_read32(&port), 0xffff_ffff);
    }

    #[test]
    fn the_window_follows_a_moved_bar_and_the_host_hears_of_it() {
        let (root, seen) = root();
        let ecam = PciRoot::ecam_device(&root);
        let win = PciRoot::window_device(&root);
        win.lock().unwrap().write(0x1004, &[0xaa]);
        let mut b = [0u8; 1];
        win.lock().unwrap().read(0x1004, &mut b);
        assert_eq!(b, [0xaa]);
        // Move BAR 0 to 0xc000_8000 with decoding off, then turn it on.
        let base = 3u64 << 15;
        ecam.lock().unwrap().write(base + 4, &[0, 0]);
        win.lock().unwrap().read(0x1004, &mut b);
        assert_eq!(b, [0xff], "decoding is off");
        ecam.lock()
            .unwrap()
            .write(base + 0x10, &0xc000_8000u32.to_le_bytes());
        ecam.lock()
            .unwrap()
            .write(base + 4, &COMMAND_MEMORY.to_le_bytes());
        win.lock().unwrap().read(0x8004, &mut b);
        assert_eq!(b, [0xaa]);
        win.lock().unwrap().read(0x1004, &mut b);
        assert_eq!(b, [0xff]);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[0].1.new, None);
        assert_eq!(seen[1].1.new, Some(0xc000_8000));
        // An access straddling the BAR's end reaches nothing.
        drop(seen);
        let mut q = [0u8; 4];
        win.lock().unwrap().read(0x8ffe, &mut q);
        assert_eq!(q, [0xff; 4]);
    }

    #[test]
    fn functions_are_checked_against_the_window_and_each_other() {
        let (root, _) = root();
        let mut r = root.lock().unwrap();
        assert_eq!(
            r.add(3, Box::new(Scratch::at(0xc000_2000))),
            Err(PciError::Slot(3))
        );
        assert_eq!(
            r.add(32, Box::new(Scratch::at(0xc000_2000))),
            Err(PciError::Slot(32))
        );
        assert!(matches!(
            r.add(4, Box::new(Scratch::at(0xd000_0000))),
            Err(PciError::OutsideWindow { slot: 4, .. })
        ));
        assert_eq!(
            r.add(4, Box::new(Scratch::at(0xc000_1000))),
            Err(PciError::Overlap(4, 0, 3, 0))
        );
        r.add(4, Box::new(Scratch::at(0xc000_2000))).unwrap();
        assert_eq!(r.occupied(), vec![3, 4]);
    }
}
