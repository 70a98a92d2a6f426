//! The submission engine as a PCI function: the [`engine`](super::engine) protocol behind
//! a type-0 header with three BARs and an MSI-X capability.
//!
//! | BAR | size | what | how the guest reaches it |
//! |---|---|---|---|
//! | 0 | 4 KiB | the engine's registers | traps to the VMM |
//! | 2 | 4 KiB | MSI-X table (offset 0) and PBA (offset 0x800) | traps to the VMM |
//! | 4 | 4 KiB | the doorbell page | per [`DoorbellMode`] |
//!
//! The three doorbell modes differ only in how the engine thread learns there is work:
//! [`DoorbellMode::Trap`], a write to BAR 4 exits to the VMM, which kicks the thread;
//! [`DoorbellMode::Ioeventfd`], KVM turns the write into an eventfd signal without leaving
//! the kernel; [`DoorbellMode::Mapped`], BAR 4 is host memory mapped into the guest (a KVM
//! memory slot: no exit at all) and the engine thread polls its first word. The register
//! doorbell (BAR 0 `DOORBELL`) always traps. Completion is a fence in guest memory the
//! driver may poll, and MSI-X vector 0 when a command asks for it.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vm_memory::{GuestMemoryMmap, MmapRegion};
use vmm_sys_util::eventfd::EventFd;

use super::config::{Bar, BarKind, CAP_MSIX, ConfigError, ConfigSpace};
use super::engine::{Effect, Engine};
use super::msix::{Delivery, Msix, MsixError, MsixLayout, RouteChange};
use super::{ConfigEffects, PciFunction};
use crate::{Interrupt, VmEvent};

/// PCI vendor id the engine answers with (the id QEMU's own test devices use; not ours to
/// register, and only ever seen by our own probe guest).
pub const VENDOR: u16 = 0x1234;
/// PCI device id of the engine.
pub const DEVICE: u16 = 0x5e01;
/// Class: processing accelerator (0x12), subclass 0, interface 0.
pub const CLASS: u32 = 0x12_0000;
/// BAR index of the registers.
pub const BAR_REGS: usize = 0;
/// BAR index of the MSI-X table and PBA.
pub const BAR_MSIX: usize = 2;
/// BAR index of the doorbell page.
pub const BAR_DOORBELL: usize = 4;
/// Size of each BAR.
pub const BAR_SIZE: u64 = 4096;
/// Offset of the PBA in [`BAR_MSIX`].
pub const PBA_OFFSET: u32 = 0x800;
/// MSI-X vectors: 0 is completion.
pub const VECTORS: usize = 2;

/// How the doorbell page reaches the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DoorbellMode {
    /// Every doorbell write exits to the VMM.
    Trap,
    /// KVM signals an eventfd; no exit to userspace.
    Ioeventfd,
    /// Host memory in the guest; the engine thread polls it; no exit at all.
    Mapped,
}

impl DoorbellMode {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Trap => "trap",
            Self::Ioeventfd => "ioeventfd",
            Self::Mapped => "mapped",
        }
    }
}

impl std::str::FromStr for DoorbellMode {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Self::Trap, Self::Ioeventfd, Self::Mapped]
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or("use trap, ioeventfd or mapped")
    }
}

/// What the engine thread and the function share.
pub struct Shared {
    /// The protocol state.
    pub engine: Mutex<Engine>,
    /// The MSI-X state (the thread asks it how to deliver).
    pub msix: Mutex<Msix>,
    /// Vector `i`'s line (an irqfd the VMM routes to the vector's message).
    pub vectors: Vec<Box<dyn Interrupt + Sync>>,
    /// Guest memory.
    pub mem: GuestMemoryMmap,
    /// Doorbell writes that reached the VMM (BAR 4 in trap mode, or the `DOORBELL`
    /// register): each one a VM exit. Mapped and ioeventfd doorbells never count here.
    pub trapped_doorbells: AtomicU64,
    /// Interrupts sent (vector 0 messages that left the device, pending ones when sent).
    pub interrupts_sent: AtomicU64,
    /// The engine thread's CPU time and wall time, ns, stored when it ends: how much of
    /// its core it kept busy (a polled doorbell spins; the others sleep between work).
    pub thread_cpu_ns: AtomicU64,
    /// See `thread_cpu_ns`.
    pub thread_wall_ns: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Raises vector `v` as MSI-X says: sent now, left pending, or dropped.
    pub fn raise(&self, v: usize) -> Delivery {
        let d = lock(&self.msix).signal(v);
        if let (Delivery::Send(_), Some(line)) = (d, self.vectors.get(v)) {
            let _ = line.trigger();
            self.interrupts_sent.fetch_add(1, Ordering::Relaxed);
        }
        d
    }

    /// The engine state.
    pub fn engine(&self) -> MutexGuard<'_, Engine> {
        lock(&self.engine)
    }
}

/// The engine's PCI function.
pub struct SubmitFunction {
    config: ConfigSpace,
    msix_cap: usize,
    shared: Arc<Shared>,
    mode: DoorbellMode,
    kick: Box<dyn Interrupt>,
}

/// Errors building the function (the VMM's own mistakes).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The configuration space refused a BAR or capability.
    #[error("submission engine: {0}")]
    Config(#[from] ConfigError),
    /// The MSI-X capability was refused.
    #[error("submission engine: {0}")]
    Msix(#[from] MsixError),
    /// A BAR base that is not 4 KiB aligned.
    #[error("submission engine: BAR base {0:#x} is not 4 KiB aligned")]
    Base(u64),
}

impl SubmitFunction {
    /// The function with its BARs at `bases` (registers, MSI-X, doorbell), guest memory
    /// `mem`, one line per MSI-X vector, and `kick` to wake the engine thread (trap mode's
    /// doorbell, enable and reset).
    pub fn new(
        bases: [u64; 3],
        mode: DoorbellMode,
        mem: GuestMemoryMmap,
        vectors: Vec<Box<dyn Interrupt + Sync>>,
        kick: Box<dyn Interrupt>,
    ) -> Result<(Self, Arc<Shared>), SubmitError> {
        if let Some(b) = bases.iter().find(|b| **b % BAR_SIZE != 0) {
            return Err(SubmitError::Base(*b));
        }
        let mut config = ConfigSpace::new(VENDOR, DEVICE, CLASS, 1, 0);
        let bar = Bar {
            size: BAR_SIZE,
            kind: BarKind::Mem32,
            prefetchable: false,
        };
        for (index, base) in [BAR_REGS, BAR_MSIX, BAR_DOORBELL].into_iter().zip(bases) {
            config.set_bar(index, bar, base)?;
        }
        let msix = Msix::new(
            VECTORS,
            MsixLayout {
                table: (BAR_MSIX as u8, 0),
                pba: (BAR_MSIX as u8, PBA_OFFSET),
            },
        )?;
        let (body, mask) = msix.capability();
        let msix_cap = config.add_capability(CAP_MSIX, &body, &mask)?;
        let shared = Arc::new(Shared {
            engine: Mutex::new(Engine::new()),
            msix: Mutex::new(msix),
            vectors,
            mem,
            trapped_doorbells: AtomicU64::new(0),
            interrupts_sent: AtomicU64::new(0),
            thread_cpu_ns: AtomicU64::new(0),
            thread_wall_ns: AtomicU64::new(0),
        });
        Ok((
            Self {
                config,
                msix_cap,
                shared: shared.clone(),
                mode,
                kick,
            },
            shared,
        ))
    }

    /// How the doorbell reaches the engine.
    pub fn mode(&self) -> DoorbellMode {
        self.mode
    }

    fn kick(&self) {
        let _ = self.kick.trigger();
    }
}

impl PciFunction for SubmitFunction {
    fn config(&self) -> &ConfigSpace {
        &self.config
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) -> ConfigEffects {
        let bars = self.config.write(offset, data);
        let msix = lock(&self.shared.msix).follow_config_write(
            &self.config,
            self.msix_cap,
            offset,
            data.len(),
        );
        ConfigEffects { bars, msix }
    }

    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        match bar {
            BAR_REGS => self.shared.engine().read(offset, data),
            BAR_MSIX => {
                let m = lock(&self.shared.msix);
                if offset < u64::from(PBA_OFFSET) {
                    m.read_table(offset, data);
                } else {
                    m.read_pba(offset - u64::from(PBA_OFFSET), data);
                }
            }
            _ => data.fill(0),
        }
    }

    fn write_bar(
        &mut self,
        bar: usize,
        offset: u64,
        data: &[u8],
    ) -> (Vec<RouteChange>, Option<VmEvent>) {
        match bar {
            BAR_REGS => {
                if offset == super::engine::reg::DOORBELL {
                    self.shared
                        .trapped_doorbells
                        .fetch_add(1, Ordering::Relaxed);
                }
                let effect = {
                    let mut e = self.shared.engine();
                    e.write(&self.shared.mem, offset, data)
                };
                if effect != Effect::None {
                    self.kick();
                }
                (Vec::new(), None)
            }
            BAR_MSIX if offset < u64::from(PBA_OFFSET) => {
                // A vector unmasked while pending is the host's to send, once it has
                // installed the route (`RouteChange::fire_pending`).
                let change = lock(&self.shared.msix).write_table(offset, data);
                (change.into_iter().collect(), None)
            }
            // The doorbell page reached the VMM: trap mode (or a mapped page not mapped
            // yet). Any write is a doorbell.
            BAR_DOORBELL => {
                self.shared
                    .trapped_doorbells
                    .fetch_add(1, Ordering::Relaxed);
                self.kick();
                (Vec::new(), None)
            }
            _ => (Vec::new(), None),
        }
    }
}

/// The doorbell page of [`DoorbellMode::Mapped`]: a page of host memory the VMM maps into
/// the guest at BAR 4 (a KVM memory slot) and the engine thread polls.
#[derive(Clone)]
pub struct DoorbellPage(Arc<MmapRegion>);

impl DoorbellPage {
    /// A fresh zeroed page.
    pub fn new() -> std::io::Result<Self> {
        MmapRegion::new(BAR_SIZE as usize)
            .map(|r| Self(Arc::new(r)))
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// Host address and length, for the memory slot.
    pub fn host_range(&self) -> (u64, u64) {
        (self.0.as_ptr() as u64, BAR_SIZE)
    }

    /// The doorbell word (offset 0).
    fn word(&self) -> &AtomicU32 {
        // SAFETY: the mapping is BAR_SIZE bytes, page aligned and lives as long as `self`
        // (the Arc); an AtomicU32 has the size and alignment of the u32 at its start, and
        // every access to it (ours, and the guest's through the slot) is a plain 4-byte
        // load or store, which an atomic load observes whole.
        unsafe { &*(self.0.as_ptr() as *const AtomicU32) }
    }

    /// What the guest last wrote to the doorbell word.
    pub fn read(&self) -> u32 {
        self.word().load(Ordering::Acquire)
    }

    /// Stores `v` in the doorbell word, as a guest's store through the memory slot does
    /// (for the bare-host twin of the mapped doorbell, and tests).
    pub fn ring(&self, v: u32) {
        self.word().store(v, Ordering::Release);
    }

    /// Sets the doorbell word back to zero.
    pub fn clear(&self) {
        self.word().store(0, Ordering::Release);
    }
}

/// How the engine thread waits for work.
pub enum Wake {
    /// Blocks on the kick eventfd: trap mode (the VMM writes it on a doorbell exit) and
    /// ioeventfd mode (KVM writes it on the doorbell write).
    Block,
    /// Polls the doorbell page, and the kick eventfd without blocking (enable, reset and
    /// the register doorbell still trap).
    Poll(DoorbellPage),
}

/// A running engine thread.
pub struct EngineThread {
    stop: Arc<AtomicBool>,
    kick: Arc<EventFd>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl EngineThread {
    /// Starts the thread: `hook` runs first (the sandbox installs its filter there), then
    /// it executes whatever is already submitted, and from then on waits as `wake` says and
    /// executes what the driver submitted, raising vector 0 for the commands that ask.
    /// `kick` should be non-blocking (`EFD_NONBLOCK`): the thread waits for it with
    /// `poll(2)` in [`Wake::Block`] and only peeks at it in [`Wake::Poll`]. With `core`, the
    /// thread pins itself there before the hook (a polling engine must not share a vCPU's
    /// core); a refused pin is logged and the thread runs where the scheduler puts it.
    pub fn spawn(
        shared: Arc<Shared>,
        kick: Arc<EventFd>,
        wake: Wake,
        core: Option<usize>,
        hook: super::super::virtio::ThreadHook,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (st, k) = (stop.clone(), kick.clone());
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                if let Some(c) = core
                    && !crate::virtio::block::worker::pin(c)
                {
                    log::warn!("engine thread: could not pin to core {c}");
                }
                if let Err(e) = hook("engine") {
                    log::error!("engine thread: {e}");
                    return 0;
                }
                let (wall, cpu) = (Instant::now(), thread_cpu_ns());
                let rounds = engine_loop(&shared, &k, &wake, &st);
                shared
                    .thread_cpu_ns
                    .store(thread_cpu_ns().saturating_sub(cpu), Ordering::Release);
                shared
                    .thread_wall_ns
                    .store(wall.elapsed().as_nanos() as u64, Ordering::Release);
                rounds
            })?;
        Ok(Self {
            stop,
            kick,
            thread: Some(thread),
        })
    }

    /// Stops and joins it; returns how many times it executed up to the tail.
    pub fn stop(mut self) -> u64 {
        self.halt()
    }

    fn halt(&mut self) -> u64 {
        self.stop.store(true, Ordering::Release);
        let _ = self.kick.write(1);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        self.halt();
    }
}

/// CPU time of the calling thread, ns.
fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec we own; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// Spends `ns` nanoseconds of the engine's own time (a command's busy work).
fn busy(ns: u64) {
    let until = Instant::now() + Duration::from_nanos(ns.min(1_000_000_000));
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

fn run_once(shared: &Shared) -> bool {
    let p = shared.engine().execute(&shared.mem, busy);
    if p.interrupts > 0 {
        shared.raise(0);
    }
    p.executed > 0
}

fn wait_readable(fd: &EventFd) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call. EINTR or an error just means
    // look again: the caller reads the fd without blocking and checks its stop flag.
    unsafe { libc::poll(&mut p, 1, -1) };
}

/// In [`Wake::Poll`], how many turns of the loop go by between looks at the kick eventfd
/// (enable, reset, the register doorbell and stop). Those are rare and not latency-bound:
/// the vCPU thread updates the engine's registers itself.
const KICK_EVERY: u32 = 256;

fn engine_loop(shared: &Shared, kick: &EventFd, wake: &Wake, stop: &AtomicBool) -> u64 {
    let mut rounds = 0u64;
    // Whatever was submitted before the thread ran; a doorbell seen from now on runs again.
    let mut seen = match wake {
        Wake::Poll(page) => page.read(),
        Wake::Block => 0,
    };
    run_once(shared);
    let mut spins = 0u32;
    loop {
        let run = match wake {
            Wake::Block => {
                wait_readable(kick);
                kick.read().is_ok()
            }
            Wake::Poll(page) => {
                // The page every turn; the kick eventfd (a system call) one turn in
                // KICK_EVERY, so the doorbell is seen within a few loads, not a syscall.
                spins = spins.wrapping_add(1);
                if spins % KICK_EVERY == 0 && kick.read().is_ok() {
                    // Enable, reset or the register doorbell: clear the page and run.
                    // A doorbell written before the clear is covered by this run (its
                    // tail is already in memory); one written after it changes the word.
                    // Without the clear, a driver that resets and submits again rings
                    // with the same tail as before and would not be seen.
                    page.clear();
                    seen = 0;
                    true
                } else {
                    let rung = page.read();
                    let changed = rung != seen;
                    seen = rung;
                    changed
                }
            }
        };
        if stop.load(Ordering::Acquire) {
            return rounds;
        }
        if run {
            rounds += 1;
            run_once(shared);
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::engine::{Command, FLAG_INTERRUPT, OP_FENCE, RING_HEADER, reg};
    use super::super::msix::CONTROL_ENABLE;
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    #[derive(Clone, Default)]
    struct Count(Arc<AtomicU32>);
    impl Interrupt for Count {
        fn trigger(&self) -> std::io::Result<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }
    impl Count {
        fn get(&self) -> u32 {
            self.0.load(Ordering::SeqCst)
        }
    }

    const BASES: [u64; 3] = [0xc000_0000, 0xc000_1000, 0xc000_2000];

    fn function() -> (SubmitFunction, Arc<Shared>, Count, Count) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let (v0, kick) = (Count::default(), Count::default());
        let vectors: Vec<Box<dyn Interrupt + Sync>> =
            vec![Box::new(v0.clone()), Box::new(Count::default())];
        let (f, s) = SubmitFunction::new(
            BASES,
            DoorbellMode::Trap,
            mem,
            vectors,
            Box::new(kick.clone()),
        )
        .unwrap();
        (f, s, v0, kick)
    }

    fn w32(f: &mut SubmitFunction, bar: usize, off: u64, v: u32) {
        f.write_bar(bar, off, &v.to_le_bytes());
    }

    /// Submits one fence command on the ring at 0x1000 (4 entries) as the driver would.
    fn submit(s: &Shared, tail: &mut u32, value: u64, flags: u32) {
        let c = Command {
            opcode: OP_FENCE,
            flags,
            fence_addr: 0x8000,
            fence_value: value,
            work_ns: 1000,
        };
        let at = 0x1000 + RING_HEADER + u64::from(*tail % 4) * 32;
        s.mem.write_slice(&c.to_bytes(), GuestAddress(at)).unwrap();
        *tail += 1;
        s.mem.write_obj(*tail, GuestAddress(0x1000)).unwrap();
    }

    fn wait_fence(s: &Shared, value: u64) {
        let t = Instant::now();
        while s.mem.read_obj::<u64>(GuestAddress(0x8000)).unwrap() != value {
            if t.elapsed() > Duration::from_secs(20) {
                let e = s.engine();
                panic!(
                    "fence {value} never came: {:?}, {} executed, running {}",
                    e.error(),
                    e.executed(),
                    e.running()
                );
            }
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_engine_thread_serves_kicks_and_a_polled_page() {
        for poll in [false, true] {
            let (mut f, s, v0, _) = function();
            f.write_config(0x42, &CONTROL_ENABLE.to_le_bytes());
            f.write_bar(BAR_MSIX, 0, &0xfee0_0000u64.to_le_bytes());
            w32(&mut f, BAR_MSIX, 12, 0);
            w32(&mut f, BAR_REGS, reg::RING_LO, 0x1000);
            w32(&mut f, BAR_REGS, reg::RING_SIZE, 4);
            w32(&mut f, BAR_REGS, reg::CONTROL, 1);
            let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
            let page = DoorbellPage::new().unwrap();
            let wake = if poll {
                Wake::Poll(page.clone())
            } else {
                Wake::Block
            };
            let hook: crate::virtio::ThreadHook = Arc::new(|_| Ok(()));
            let t = EngineThread::spawn(s.clone(), kick.clone(), wake, None, hook).unwrap();
            let mut tail = 0;
            for i in 1..=6u64 {
                submit(&s, &mut tail, i, FLAG_INTERRUPT);
                if poll {
                    // The guest's store to the mapped page.
                    page.word().store(tail, Ordering::Release);
                } else {
                    kick.write(1).unwrap();
                }
                wait_fence(&s, i);
            }
            let rounds = t.stop();
            assert!(rounds >= 1, "poll={poll}");
            let (cpu, wall) = (
                s.thread_cpu_ns.load(Ordering::Acquire),
                s.thread_wall_ns.load(Ordering::Acquire),
            );
            assert!(
                wall > 0 && cpu <= wall + 10_000_000,
                "poll={poll}: {cpu} of {wall}"
            );
            assert_eq!(s.engine().executed(), 6, "poll={poll}");
            // One interrupt per round that completed a command.
            assert!((1..=6).contains(&v0.get()), "poll={poll}: {}", v0.get());
        }
    }

    #[test]
    fn a_polled_page_sees_the_same_tail_again_after_a_reset() {
        let (mut f, s, _, _) = function();
        w32(&mut f, BAR_REGS, reg::RING_LO, 0x1000);
        w32(&mut f, BAR_REGS, reg::RING_SIZE, 4);
        w32(&mut f, BAR_REGS, reg::CONTROL, 1);
        let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        let page = DoorbellPage::new().unwrap();
        let hook: crate::virtio::ThreadHook = Arc::new(|_| Ok(()));
        let t = EngineThread::spawn(
            s.clone(),
            kick.clone(),
            Wake::Poll(page.clone()),
            None,
            hook,
        )
        .unwrap();
        let mut tail = 0;
        submit(&s, &mut tail, 1, 0);
        page.word().store(tail, Ordering::Release);
        wait_fence(&s, 1);
        // The driver resets and enables (both trap: the VMM kicks the thread), starts its
        // ring over and rings with tail 1 again, after the thread has taken the kicks.
        w32(&mut f, BAR_REGS, reg::CONTROL, 0);
        tail = 0;
        s.mem.write_obj(0u32, GuestAddress(0x1000)).unwrap();
        w32(&mut f, BAR_REGS, reg::CONTROL, 1);
        kick.write(1).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        submit(&s, &mut tail, 2, 0);
        page.word().store(tail, Ordering::Release);
        wait_fence(&s, 2);
        t.stop();
        assert_eq!(s.engine().lifetime(), 2);
    }

    #[test]
    fn the_header_describes_the_engine() {
        let (f, _, _, _) = function();
        let c = f.config();
        let mut id = [0u8; 4];
        c.read(0, &mut id);
        assert_eq!(
            u32::from_le_bytes(id),
            u32::from(DEVICE) << 16 | u32::from(VENDOR)
        );
        for (i, b) in [BAR_REGS, BAR_MSIX, BAR_DOORBELL].into_iter().zip(BASES) {
            assert_eq!(c.bar_addr(i), Some(b));
        }
        // The MSI-X capability: the first one, table size 2, table and PBA in BAR 2.
        assert_eq!(c.bytes(0x34, 1), &[0x40]);
        assert_eq!(c.bytes(0x40, 1), &[CAP_MSIX]);
        assert_eq!(c.bytes(0x42, 2), &[1, 0]);
        assert_eq!(c.bytes(0x44, 4), &2u32.to_le_bytes());
        assert_eq!(c.bytes(0x48, 4), &(PBA_OFFSET | 2).to_le_bytes());
        let bad = SubmitFunction::new(
            [0xc000_0800, 0, 0],
            DoorbellMode::Mapped,
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap(),
            Vec::new(),
            Box::new(Count::default()),
        );
        assert!(matches!(bad, Err(SubmitError::Base(0xc000_0800))));
    }

    #[test]
    fn a_submission_through_the_trapping_doorbell_completes_by_fence_and_msix() {
        let (mut f, s, v0, kick) = function();
        // MSI-X on, vector 0 programmed and unmasked: the route is reported to the host.
        let eff = f.write_config(0x42, &CONTROL_ENABLE.to_le_bytes());
        assert!(eff.msix.is_empty(), "all vectors are masked at reset");
        f.write_bar(BAR_MSIX, 0, &0xfee0_0000u64.to_le_bytes());
        w32(&mut f, BAR_MSIX, 8, 0x41);
        let (routes, _) = f.write_bar(BAR_MSIX, 12, &0u32.to_le_bytes());
        assert_eq!(routes.len(), 1);
        assert_eq!(routes[0].route.map(|m| m.data), Some(0x41));
        // The ring at 0x1000, four entries; enabling kicks the engine thread.
        w32(&mut f, BAR_REGS, reg::RING_LO, 0x1000);
        w32(&mut f, BAR_REGS, reg::RING_SIZE, 4);
        w32(&mut f, BAR_REGS, reg::CONTROL, 1);
        assert_eq!(kick.get(), 1);
        let c = Command {
            opcode: OP_FENCE,
            flags: FLAG_INTERRUPT,
            fence_addr: 0x8000,
            fence_value: 77,
            work_ns: 0,
        };
        s.mem
            .write_slice(&c.to_bytes(), GuestAddress(0x1000 + RING_HEADER))
            .unwrap();
        s.mem.write_obj(1u32, GuestAddress(0x1000)).unwrap();
        // The doorbell page traps here: it kicks.
        w32(&mut f, BAR_DOORBELL, 0, 1);
        assert_eq!(kick.get(), 2);
        // What the engine thread does when kicked.
        let p = s.engine().execute(&s.mem, |_| {});
        assert_eq!((p.executed, p.interrupts), (1, 1));
        assert_eq!(s.raise(0), Delivery::Send(routes[0].route.unwrap()));
        assert_eq!(v0.get(), 1);
        assert_eq!(s.mem.read_obj::<u64>(GuestAddress(0x8000)).unwrap(), 77);
        let mut head = [0u8; 4];
        f.read_bar(BAR_REGS, reg::HEAD, &mut head);
        assert_eq!(u32::from_le_bytes(head), 1);
    }

    #[test]
    fn a_masked_completion_waits_in_the_pba_and_fires_on_unmask() {
        let (mut f, s, v0, _) = function();
        f.write_config(0x42, &CONTROL_ENABLE.to_le_bytes());
        f.write_bar(BAR_MSIX, 0, &0xfee0_0000u64.to_le_bytes());
        assert_eq!(s.raise(0), Delivery::Pending);
        assert_eq!(v0.get(), 0);
        let mut pba = [0u8; 8];
        f.read_bar(BAR_MSIX, u64::from(PBA_OFFSET), &mut pba);
        assert_eq!(u64::from_le_bytes(pba), 1);
        // Unmasking asks the host to send it once, after it installs the route.
        let (routes, _) = f.write_bar(BAR_MSIX, 12, &0u32.to_le_bytes());
        assert_eq!(routes.len(), 1);
        assert!(routes[0].fire_pending && routes[0].route.is_some());
        assert_eq!(v0.get(), 0);
        f.read_bar(BAR_MSIX, u64::from(PBA_OFFSET), &mut pba);
        assert_eq!(u64::from_le_bytes(pba), 0);
        // The PBA is read-only, the doorbell page reads zero.
        f.write_bar(BAR_MSIX, u64::from(PBA_OFFSET), &[0xff; 8]);
        let mut d = [0xffu8; 4];
        f.read_bar(BAR_DOORBELL, 0, &mut d);
        assert_eq!(d, [0; 4]);
    }
}
