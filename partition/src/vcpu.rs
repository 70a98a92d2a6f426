//! vCPU threads: pin, run, dispatch exits, stop.
//!
//! [`handle_exit`] is a free function over our own [`Exit`] type, so unit tests feed it
//! synthetic exits; the thread loop only converts KVM's exit, counts it, and acts on the
//! [`Action`] it gets back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use devices::{Bus, VmEvent};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress};

use crate::memory::GuestMemory;

/// KVM_SYSTEM_EVENT_SHUTDOWN.
const SYSTEM_EVENT_SHUTDOWN: u32 = 1;
/// KVM_SYSTEM_EVENT_RESET.
const SYSTEM_EVENT_RESET: u32 = 2;
/// KVM_SYSTEM_EVENT_CRASH.
const SYSTEM_EVENT_CRASH: u32 = 3;

/// A VM exit, in our own terms.
#[derive(Debug)]
pub enum Exit<'a> {
    /// `in` from a port; fill `data`.
    IoIn {
        /// Port.
        port: u16,
        /// Bytes to fill (size × count for string I/O).
        data: &'a mut [u8],
    },
    /// `out` to a port.
    IoOut {
        /// Port.
        port: u16,
        /// Bytes written (size × count for string I/O).
        data: &'a [u8],
    },
    /// MMIO read; fill `data`.
    MmioRead {
        /// Guest physical address.
        addr: u64,
        /// Bytes to fill.
        data: &'a mut [u8],
    },
    /// MMIO write.
    MmioWrite {
        /// Guest physical address.
        addr: u64,
        /// Bytes written.
        data: &'a [u8],
    },
    /// HLT reached userspace (only without an in-kernel LAPIC).
    Hlt,
    /// Triple fault.
    Shutdown,
    /// KVM could not handle something (emulation failure and friends).
    InternalError {
        /// KVM_INTERNAL_ERROR_* sub-code.
        suberror: u32,
    },
    /// VM entry failed.
    FailEntry {
        /// Hardware reason.
        reason: u64,
    },
    /// A system event (PSCI-style shutdown/reset/crash).
    SystemEvent {
        /// KVM_SYSTEM_EVENT_* type.
        kind: u32,
    },
    /// KVM_RUN returned because of a signal or `immediate_exit`.
    Interrupted,
    /// Anything else.
    Other(&'static str),
}

/// Why a vCPU (and with it the partition) stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The guest powered off with this status.
    PowerOff(u8),
    /// The guest asked for a reset (treated as a stop: partitions do not reboot in place).
    Reset,
    /// Triple fault.
    TripleFault,
    /// KVM internal error, with what we could find out.
    InternalError(String),
    /// VM entry failure.
    FailEntry(u64),
    /// The guest reported a crash through a system event.
    Crash,
    /// An exit we do not handle.
    Unhandled(String),
    /// The VMM asked the vCPU to stop (signal, another vCPU stopped, error elsewhere).
    Kicked,
    /// KVM_RUN failed.
    RunError(String),
}

/// What the loop should do after an exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Re-enter the guest.
    Continue,
    /// Stop the partition.
    Stop(StopReason),
}

/// Exit counts by reason, cheap enough for every exit.
#[derive(Debug, Default)]
pub struct ExitCounters {
    /// Port reads.
    pub io_in: AtomicU64,
    /// Port writes.
    pub io_out: AtomicU64,
    /// MMIO reads.
    pub mmio_read: AtomicU64,
    /// MMIO writes.
    pub mmio_write: AtomicU64,
    /// HLT exits.
    pub hlt: AtomicU64,
    /// Returns from KVM_RUN because of a signal.
    pub interrupted: AtomicU64,
    /// Everything else.
    pub other: AtomicU64,
}

impl ExitCounters {
    fn count(&self, e: &Exit<'_>) {
        let c = match e {
            Exit::IoIn { .. } => &self.io_in,
            Exit::IoOut { .. } => &self.io_out,
            Exit::MmioRead { .. } => &self.mmio_read,
            Exit::MmioWrite { .. } => &self.mmio_write,
            Exit::Hlt => &self.hlt,
            Exit::Interrupted => &self.interrupted,
            _ => &self.other,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// (name, count) pairs.
    pub fn snapshot(&self) -> [(&'static str, u64); 7] {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("io_in", l(&self.io_in)),
            ("io_out", l(&self.io_out)),
            ("mmio_read", l(&self.mmio_read)),
            ("mmio_write", l(&self.mmio_write)),
            ("hlt", l(&self.hlt)),
            ("interrupted", l(&self.interrupted)),
            ("other", l(&self.other)),
        ]
    }
}

fn event_action(ev: Option<VmEvent>) -> Action {
    match ev {
        None => Action::Continue,
        Some(VmEvent::PowerOff { status }) => Action::Stop(StopReason::PowerOff(status)),
        Some(VmEvent::Reset) => Action::Stop(StopReason::Reset),
    }
}

/// Decides what an exit means. Device accesses go to the buses; nothing a guest does here
/// can panic the VMM.
pub fn handle_exit(exit: Exit<'_>, pio: &Bus, mmio: &Bus) -> Action {
    match exit {
        Exit::IoIn { port, data } => {
            pio.read(port as u64, data);
            Action::Continue
        }
        Exit::IoOut { port, data } => event_action(pio.write(port as u64, data)),
        Exit::MmioRead { addr, data } => {
            mmio.read(addr, data);
            Action::Continue
        }
        Exit::MmioWrite { addr, data } => event_action(mmio.write(addr, data)),
        Exit::Hlt | Exit::Interrupted => Action::Continue,
        Exit::Shutdown => Action::Stop(StopReason::TripleFault),
        Exit::InternalError { suberror } => Action::Stop(StopReason::InternalError(format!(
            "suberror {suberror} ({})",
            internal_error_name(suberror)
        ))),
        Exit::FailEntry { reason } => Action::Stop(StopReason::FailEntry(reason)),
        Exit::SystemEvent { kind } => match kind {
            SYSTEM_EVENT_SHUTDOWN => Action::Stop(StopReason::PowerOff(0)),
            SYSTEM_EVENT_RESET => Action::Stop(StopReason::Reset),
            SYSTEM_EVENT_CRASH => Action::Stop(StopReason::Crash),
            k => Action::Stop(StopReason::Unhandled(format!("system event {k}"))),
        },
        Exit::Other(what) => Action::Stop(StopReason::Unhandled(what.to_string())),
    }
}

fn internal_error_name(sub: u32) -> &'static str {
    match sub {
        1 => "emulation failure",
        2 => "simultaneous exceptions",
        3 => "unexpected delivery event",
        4 => "unexpected exit reason",
        _ => "unknown",
    }
}

impl<'a> From<VcpuExit<'a>> for Exit<'a> {
    fn from(e: VcpuExit<'a>) -> Self {
        match e {
            VcpuExit::IoIn(port, data) => Exit::IoIn { port, data },
            VcpuExit::IoOut(port, data) => Exit::IoOut { port, data },
            VcpuExit::MmioRead(addr, data) => Exit::MmioRead { addr, data },
            VcpuExit::MmioWrite(addr, data) => Exit::MmioWrite { addr, data },
            VcpuExit::Hlt => Exit::Hlt,
            VcpuExit::Shutdown => Exit::Shutdown,
            VcpuExit::InternalError => Exit::InternalError { suberror: 0 },
            VcpuExit::FailEntry(reason, _) => Exit::FailEntry { reason },
            VcpuExit::SystemEvent(kind, _) => Exit::SystemEvent { kind },
            VcpuExit::Intr => Exit::Interrupted,
            VcpuExit::Unknown => Exit::Other("unknown exit"),
            VcpuExit::Exception => Exit::Other("exception exit"),
            VcpuExit::Debug(_) => Exit::Other("debug exit"),
            VcpuExit::IrqWindowOpen => Exit::Other("irq window open"),
            VcpuExit::Nmi => Exit::Other("nmi exit"),
            VcpuExit::IoapicEoi(_) => Exit::Other("ioapic eoi"),
            VcpuExit::X86Rdmsr(_) => Exit::Other("rdmsr exit"),
            VcpuExit::X86Wrmsr(_) => Exit::Other("wrmsr exit"),
            VcpuExit::MemoryFault { .. } => Exit::Other("memory fault"),
            _ => Exit::Other("unsupported exit"),
        }
    }
}

/// Lets another thread pull a vCPU out of KVM_RUN: sets `immediate_exit` (so a vCPU about
/// to enter the guest returns at once) and signals the thread (so one inside returns).
pub struct Kicker {
    /// Address of this vCPU's `kvm_run.immediate_exit`, 0 once the vCPU is gone.
    immediate_exit: Mutex<usize>,
    thread: Mutex<Option<libc::pthread_t>>,
    stop: AtomicBool,
}

/// Signal used to kick vCPU threads out of KVM_RUN.
pub fn kick_signal() -> i32 {
    libc::SIGRTMIN()
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the (empty) kick handler, without SA_RESTART so KVM_RUN returns EINTR.
pub fn install_kick_handler() -> std::io::Result<()> {
    vmm_sys_util::signal::register_signal_handler(kick_signal(), kick_handler)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
}

impl Kicker {
    fn new() -> Self {
        Self {
            immediate_exit: Mutex::new(0),
            thread: Mutex::new(None),
            stop: AtomicBool::new(false),
        }
    }

    /// Asks the vCPU to stop and kicks it out of the guest.
    pub fn kick(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let p = self
            .immediate_exit
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *p != 0 {
            // SAFETY: the pointer is into the vCPU's kvm_run mapping, which stays mapped
            // while it is non-zero: the vCPU thread zeroes it under this lock before the
            // VcpuFd is dropped.
            unsafe { std::ptr::write_volatile(*p as *mut u8, 1) };
        }
        if let Some(t) = *self.thread.lock().unwrap_or_else(|e| e.into_inner()) {
            // SAFETY: pthread_kill on a thread that registered itself and unregisters
            // (under the same lock) before exiting; the handler is a no-op.
            unsafe { libc::pthread_kill(t, kick_signal()) };
        }
        drop(p);
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Everything one vCPU thread needs.
pub struct VcpuContext {
    /// vCPU index (= APIC ID).
    pub index: usize,
    /// Host core to pin to.
    pub core: usize,
    /// The vCPU.
    pub fd: VcpuFd,
    /// Port I/O bus.
    pub pio: Arc<Bus>,
    /// MMIO bus.
    pub mmio: Arc<Bus>,
    /// Guest memory (to report the bytes behind an internal error).
    pub memory: Arc<GuestMemory>,
    /// Counters, shared with the launcher.
    pub counters: Arc<ExitCounters>,
    /// Stop control, shared with the launcher.
    pub kicker: Arc<Kicker>,
    /// Where the thread must go before pinning to a reserved core.
    pub isolation: Option<crate::ledger::Isolation>,
}

/// A vCPU's handles, kept by the launcher.
pub struct VcpuHandle {
    /// vCPU index.
    pub index: usize,
    /// Host core.
    pub core: usize,
    /// Exit counters.
    pub counters: Arc<ExitCounters>,
    /// Stop control.
    pub kicker: Arc<Kicker>,
    /// KVM's statistics for the vCPU, if the host offers them.
    pub stats: Option<crate::kvmstats::Stats>,
}

/// Creates the shared parts of a vCPU.
pub fn handles(index: usize, core: usize) -> (Arc<ExitCounters>, Arc<Kicker>, VcpuHandle) {
    let counters = Arc::new(ExitCounters::default());
    let kicker = Arc::new(Kicker::new());
    let h = VcpuHandle {
        index,
        core,
        counters: counters.clone(),
        kicker: kicker.clone(),
        stats: None,
    };
    (counters, kicker, h)
}

/// The vCPU thread: pin, run until something stops it, report why.
pub fn run(mut ctx: VcpuContext) -> StopReason {
    if let Some(iso) = &ctx.isolation {
        if let Err(e) = crate::isolation::join_guests(iso) {
            return StopReason::RunError(format!(
                "vcpu{}: joining the reserved cores' cpuset: {e}",
                ctx.index
            ));
        }
    }
    if !core_affinity::set_for_current(core_affinity::CoreId { id: ctx.core }) {
        return StopReason::RunError(format!(
            "vcpu{}: pinning to core {} failed",
            ctx.index, ctx.core
        ));
    }
    {
        let run = ctx.fd.get_kvm_run();
        *ctx.kicker
            .immediate_exit
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = &raw mut run.immediate_exit as usize;
        // SAFETY: pthread_self has no preconditions.
        *ctx.kicker.thread.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(unsafe { libc::pthread_self() });
    }
    let reason = run_loop(&mut ctx);
    // Unregister before the VcpuFd (and its kvm_run mapping) goes away.
    *ctx.kicker
        .immediate_exit
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = 0;
    *ctx.kicker.thread.lock().unwrap_or_else(|e| e.into_inner()) = None;
    reason
}

fn run_loop(ctx: &mut VcpuContext) -> StopReason {
    loop {
        if ctx.kicker.stopping() {
            return StopReason::Kicked;
        }
        let action = match ctx.fd.run() {
            Ok(exit) => {
                let mut e = Exit::from(exit);
                if let Exit::InternalError { .. } = e {
                    e = Exit::InternalError {
                        suberror: internal_suberror(&mut ctx.fd),
                    };
                }
                ctx.counters.count(&e);
                handle_exit(e, &ctx.pio, &ctx.mmio)
            }
            Err(err) if err.errno() == libc::EINTR || err.errno() == libc::EAGAIN => {
                ctx.counters.count(&Exit::Interrupted);
                ctx.fd.set_kvm_immediate_exit(0);
                Action::Continue
            }
            Err(err) => return StopReason::RunError(format!("KVM_RUN: {err}")),
        };
        match action {
            Action::Continue => {}
            Action::Stop(StopReason::InternalError(what)) => {
                return StopReason::InternalError(format!("{what}; {}", fault_site(ctx)));
            }
            Action::Stop(r @ (StopReason::TripleFault | StopReason::FailEntry(_))) => {
                log::error!("vcpu{}: {:?}; {}", ctx.index, r, fault_site(ctx));
                return r;
            }
            Action::Stop(r) => return r,
        }
    }
}

fn internal_suberror(fd: &mut VcpuFd) -> u32 {
    let run = fd.get_kvm_run();
    // SAFETY: the exit reason is KVM_EXIT_INTERNAL_ERROR, so `internal` is the live member.
    unsafe { run.__bindgen_anon_1.internal.suberror }
}

/// "RIP 0x… (gpa 0x…): bytes 0f 01 …" for the instruction a vCPU stopped at.
fn fault_site(ctx: &VcpuContext) -> String {
    let regs = match ctx.fd.get_regs() {
        Ok(r) => r,
        Err(e) => return format!("registers unavailable: {e}"),
    };
    let sregs = ctx.fd.get_sregs().ok();
    let gva = match sregs {
        // Real or 16-bit protected mode: CS base + IP.
        Some(s) if s.cr0 & 1 == 0 => s.cs.base.wrapping_add(regs.rip & 0xffff),
        _ => regs.rip,
    };
    let gpa = match ctx.fd.translate_gva(gva) {
        Ok(t) if t.valid != 0 => t.physical_address,
        _ if sregs.map(|s| s.cr0 & 0x8000_0000 == 0).unwrap_or(false) => gva,
        _ => return format!("RIP {:#x} (not mapped)", regs.rip),
    };
    let mut bytes = [0u8; 16];
    let n = (0..bytes.len())
        .take_while(|&i| {
            ctx.memory
                .mem()
                .read_obj::<u8>(GuestAddress(gpa + i as u64))
                .map(|b| bytes[i] = b)
                .is_ok()
        })
        .count();
    let hex: Vec<String> = bytes[..n].iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "RIP {:#x} (gpa {:#x}) CS {:#x} CR0 {:#x}: bytes {}",
        regs.rip,
        gpa,
        sregs.map(|s| s.cs.selector).unwrap_or(0),
        sregs.map(|s| s.cr0).unwrap_or(0),
        if hex.is_empty() {
            "unreadable".to_string()
        } else {
            hex.join(" ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::BusDevice;
    use std::sync::Mutex as StdMutex;

    struct Echo;
    impl BusDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(0x40 + offset as u8);
        }
        fn write(&mut self, _offset: u64, data: &[u8]) -> Option<VmEvent> {
            match data.first() {
                Some(0xfe) => Some(VmEvent::Reset),
                Some(&s) if s >= 0x80 => Some(VmEvent::PowerOff { status: s - 0x80 }),
                _ => None,
            }
        }
    }

    fn buses() -> (Bus, Bus) {
        let mut pio = Bus::new("pio");
        pio.insert("echo", 0x10, 4, Arc::new(StdMutex::new(Echo)))
            .unwrap();
        let mut mmio = Bus::new("mmio");
        mmio.insert("echo", 0xd000_0000, 0x1000, Arc::new(StdMutex::new(Echo)))
            .unwrap();
        (pio, mmio)
    }

    #[test]
    fn device_exits() {
        let (pio, mmio) = buses();
        let mut d = [0u8; 1];
        assert_eq!(
            handle_exit(
                Exit::IoIn {
                    port: 0x11,
                    data: &mut d
                },
                &pio,
                &mmio
            ),
            Action::Continue
        );
        assert_eq!(d, [0x41]);
        let mut d = [0u8; 4];
        handle_exit(
            Exit::MmioRead {
                addr: 0xd000_0002,
                data: &mut d,
            },
            &pio,
            &mmio,
        );
        assert_eq!(d, [0x42; 4]);
        assert_eq!(
            handle_exit(
                Exit::IoOut {
                    port: 0x10,
                    data: &[0x83]
                },
                &pio,
                &mmio
            ),
            Action::Stop(StopReason::PowerOff(3))
        );
        assert_eq!(
            handle_exit(
                Exit::MmioWrite {
                    addr: 0xd000_0000,
                    data: &[0xfe]
                },
                &pio,
                &mmio
            ),
            Action::Stop(StopReason::Reset)
        );
    }

    #[test]
    fn hostile_accesses_do_not_stop_the_vm() {
        let (pio, mmio) = buses();
        let mut d = [0u8; 8];
        for port in [0u16, 0x13, 0xffff] {
            assert_eq!(
                handle_exit(Exit::IoIn { port, data: &mut d }, &pio, &mmio),
                Action::Continue
            );
        }
        // 0x13 + 8 bytes runs past the device: all ones, not the device.
        assert_eq!(d, [0xff; 8]);
        assert_eq!(
            handle_exit(
                Exit::MmioWrite {
                    addr: u64::MAX,
                    data: &[1, 2, 3, 4, 5, 6, 7, 8]
                },
                &pio,
                &mmio
            ),
            Action::Continue
        );
        assert_eq!(
            handle_exit(
                Exit::IoOut {
                    port: 0x10,
                    data: &[]
                },
                &pio,
                &mmio
            ),
            Action::Continue
        );
    }

    #[test]
    fn fatal_exits() {
        let (pio, mmio) = buses();
        assert_eq!(
            handle_exit(Exit::Shutdown, &pio, &mmio),
            Action::Stop(StopReason::TripleFault)
        );
        assert!(matches!(
            handle_exit(Exit::InternalError { suberror: 1 }, &pio, &mmio),
            Action::Stop(StopReason::InternalError(s)) if s.contains("emulation failure")
        ));
        assert_eq!(
            handle_exit(Exit::FailEntry { reason: 7 }, &pio, &mmio),
            Action::Stop(StopReason::FailEntry(7))
        );
        assert_eq!(
            handle_exit(Exit::SystemEvent { kind: 1 }, &pio, &mmio),
            Action::Stop(StopReason::PowerOff(0))
        );
        assert_eq!(
            handle_exit(Exit::SystemEvent { kind: 2 }, &pio, &mmio),
            Action::Stop(StopReason::Reset)
        );
        assert_eq!(
            handle_exit(Exit::Interrupted, &pio, &mmio),
            Action::Continue
        );
        assert!(matches!(
            handle_exit(Exit::Other("x"), &pio, &mmio),
            Action::Stop(StopReason::Unhandled(_))
        ));
    }

    #[test]
    fn counters_count_by_reason() {
        let c = ExitCounters::default();
        c.count(&Exit::IoOut { port: 1, data: &[] });
        c.count(&Exit::IoOut { port: 1, data: &[] });
        c.count(&Exit::Shutdown);
        let s = c.snapshot();
        assert_eq!(s[1], ("io_out", 2));
        assert_eq!(s[6], ("other", 1));
    }
}
