//! A vCPU's run loop: KVM_RUN, KVM's exit turned into our [`Exit`], the [`Action`]
//! [`handle_exit`] returns carried out (instruction assists through [`super::regs`], the
//! SYSCALL repair through [`super::syscall`]), and the kick and pause that pull a vCPU out
//! of the guest. Where the thread runs (core, cpuset, seccomp) is decided above, in
//! `crate::machine::vcpus`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use devices::Bus;
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress};

use super::regs::{VcpuVirt, apply, cpu_state};
use super::syscall::SyscallRepair;
use crate::cpu::assist::{self};
use crate::cpu::exits::{Action, Exit, ExitCounters, StopReason, handle_exit};
use crate::memory::GuestMemory;

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
            VcpuExit::Debug(d) => Exit::Debug {
                dr6: d.dr6,
                pc: d.pc,
            },
            VcpuExit::IrqWindowOpen => Exit::Other("irq window open"),
            VcpuExit::Nmi => Exit::Other("nmi exit"),
            VcpuExit::IoapicEoi(_) => Exit::Other("ioapic eoi"),
            VcpuExit::X86Rdmsr(_) => Exit::Other("rdmsr exit"),
            VcpuExit::X86Wrmsr(w) => Exit::WriteMsr {
                index: w.index,
                data: w.data,
            },
            VcpuExit::MemoryFault { .. } => Exit::Other("memory fault"),
            _ => Exit::Other("unsupported exit"),
        }
    }
}

/// Lets another thread pull a vCPU out of KVM_RUN: sets `immediate_exit` (so a vCPU about
/// to enter the guest returns at once) and signals the thread (so one inside returns).
///
/// Not vmm-sys-util's `Killable` nor kvm-ioctls' `set_kvm_immediate_exit`: those need the
/// thread's `JoinHandle` and the `VcpuFd`, which the launcher and the vCPU thread own,
/// while kicks come from teardown, the API thread and signal handling. The vCPU thread
/// registers its own `pthread_t` and `kvm_run` address here and clears both under the same
/// locks before it exits, so a kick never reaches a thread or a mapping that is gone.
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
    pub(crate) fn new() -> Self {
        Self {
            immediate_exit: Mutex::new(0),
            thread: Mutex::new(None),
            stop: AtomicBool::new(false),
        }
    }

    /// Asks the vCPU to stop and kicks it out of the guest.
    pub fn kick(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.nudge();
    }

    /// Pulls the vCPU out of the guest without asking it to stop (it looks at its stop
    /// and pause state, then carries on or ends).
    pub fn nudge(&self) {
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

/// Whether the partition's vCPUs may run: the local API pauses and resumes them
/// (`crate::api`). A paused vCPU waits outside `KVM_RUN` until resumed or stopped.
#[derive(Debug, Default)]
pub struct PauseControl {
    paused: AtomicBool,
    lock: Mutex<()>,
    cv: std::sync::Condvar,
}

impl PauseControl {
    /// Whether the vCPUs are paused.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Pauses every vCPU (each leaves the guest at once).
    pub fn pause(&self, kickers: &[Arc<Kicker>]) {
        self.paused.store(true, Ordering::SeqCst);
        for k in kickers {
            k.nudge();
        }
    }

    /// Lets them run again.
    pub fn resume(&self) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.paused.store(false, Ordering::SeqCst);
        self.cv.notify_all();
    }

    /// Waits while paused, looking at `stopping` every 50 ms.
    fn wait(&self, stopping: impl Fn() -> bool) {
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        while self.is_paused() && !stopping() {
            g = self
                .cv
                .wait_timeout(g, std::time::Duration::from_millis(50))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
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
    /// The SYSCALL repair's state (armed when the guest writes IA32_LSTAR).
    pub syscall: SyscallRepair,
    /// Fatal-signal and Oops lines the guest's console showed: when not 0 at the end, the
    /// SYSCALL repair's recent debug exits are dumped.
    pub guest_faults: Arc<std::sync::atomic::AtomicU64>,
    /// Paused by the local API.
    pub pause: Arc<PauseControl>,
    /// KVM's statistics for this vCPU (read at the guest's marks), if the host offers them.
    pub stats: Option<Arc<super::stats::Stats>>,
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
    pub stats: Option<Arc<super::stats::Stats>>,
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

/// Runs the vCPU on the calling thread until something stops it, and says why. The thread
/// is already where it must be (its core, its cpuset, its seccomp filter): that policy is
/// the caller's (`crate::machine::vcpus`).
pub fn run(mut ctx: VcpuContext) -> StopReason {
    // The first vCPU to get here ends the timeline's thread start-up phase.
    crate::sys::timeline::mark("vcpu_start");
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
    let faults = ctx.guest_faults.load(std::sync::atomic::Ordering::Relaxed);
    if faults > 0 && ctx.syscall.enabled {
        log::warn!(
            "vcpu{}: the guest's console reported {faults} fatal signal or Oops line(s); this \
             vCPU's last SYSCALL-repair debug exits: {}",
            ctx.index,
            ctx.syscall.recent()
        );
    }
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
        if ctx.pause.is_paused() {
            let k = ctx.kicker.clone();
            ctx.pause.wait(|| k.stopping());
        }
        if ctx.kicker.stopping() {
            return StopReason::Kicked;
        }
        let action = match ctx.fd.run() {
            Ok(exit) => {
                let mut e = Exit::from(exit);
                if let Exit::InternalError { .. } = e {
                    e = internal_error(&mut ctx.fd);
                }
                ctx.counters.count(&e);
                // A single step over the #PF handler's first instruction ends in a debug
                // exit and nothing else (a signal's EINTR below is not an exit).
                if ctx.syscall.stepping && !matches!(e, Exit::Debug { .. }) {
                    return StopReason::RunError(format!(
                        "SYSCALL repair: a single step over the #PF handler's first \
                         instruction ended in {e:?}, not a debug exit; the last debug exits: {}",
                        ctx.syscall.recent()
                    ));
                }
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
            Action::Assist(bytes) => {
                if let Err(why) = assist_instruction(ctx, &bytes) {
                    return StopReason::InternalError(format!(
                        "suberror 1 (emulation failure), not assisted: {why}; {}",
                        fault_site(ctx)
                    ));
                }
            }
            Action::WriteMsr { index, data } => {
                let ok = ctx
                    .syscall
                    .write_msr(&ctx.fd, ctx.memory.mem(), index, data);
                if !ok {
                    set_msr_error(&mut ctx.fd);
                }
            }
            Action::Mark(id) => {
                let kvm = ctx.stats.as_ref().map(|s| s.read()).unwrap_or_default();
                ctx.counters.mark(id, kvm);
            }
            Action::Debug { dr6, pc } => {
                if let Err(why) =
                    ctx.syscall
                        .debug_exit(&ctx.fd, ctx.memory.mem(), &ctx.counters, (dr6, pc))
                {
                    return StopReason::RunError(format!(
                        "SYSCALL repair: {why}; the last debug exits: {}",
                        ctx.syscall.recent()
                    ));
                }
            }
            Action::Stop(StopReason::InternalError(what)) => {
                return StopReason::InternalError(format!("{what}; {}", fault_site(ctx)));
            }
            Action::Stop(StopReason::TripleFault(_)) => {
                return StopReason::TripleFault(shutdown_site(ctx));
            }
            Action::Stop(r @ StopReason::FailEntry(_)) => {
                log::error!("vcpu{}: {:?}; {}", ctx.index, r, fault_site(ctx));
                return r;
            }
            Action::Stop(r) => return r,
        }
    }
}

/// What an internal-error exit says: an emulation failure with its instruction bytes, or
/// the bare sub-code.
fn internal_error(fd: &mut VcpuFd) -> Exit<'static> {
    let run = fd.get_kvm_run();
    // SAFETY: the exit reason is KVM_EXIT_INTERNAL_ERROR; `emulation_failure` is the layout
    // of its `internal` member (suberror and ndata first, at the same offsets), and for
    // KVM_INTERNAL_ERROR_EMULATION its flags say whether the instruction bytes are valid.
    let ef = unsafe { run.__bindgen_anon_1.emulation_failure };
    let (suberror, ndata) = (ef.suberror, ef.ndata);
    let has_bytes = suberror == kvm_bindings::KVM_INTERNAL_ERROR_EMULATION
        && ndata >= 2
        && ef.flags & kvm_bindings::KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES as u64 != 0;
    if !has_bytes {
        return Exit::InternalError { suberror };
    }
    // SAFETY: the flag above says the instruction bytes are valid.
    let insn = unsafe { ef.__bindgen_anon_1.__bindgen_anon_1 };
    let n = (insn.insn_size as usize).min(insn.insn_bytes.len());
    Exit::EmulationFailure {
        bytes: heapless::Vec::from_slice(&insn.insn_bytes[..n]).unwrap_or_default(),
    }
}

/// Makes the pending WRMSR fail (KVM injects #GP).
fn set_msr_error(fd: &mut VcpuFd) {
    let run = fd.get_kvm_run();
    // The last exit was KVM_EXIT_X86_WRMSR, so `msr` is the live member (writing a union
    // field is safe; KVM reads it on the next KVM_RUN).
    run.__bindgen_anon_1.msr.error = 1;
}

/// Why an instruction was not assisted (the launch stops with an internal error).
#[derive(Debug, thiserror::Error)]
pub enum AssistError {
    /// Not one we assist, or it would fault.
    #[error("{0}")]
    Refused(#[from] assist::Refusal),
    /// KVM refused to show or change the vCPU.
    #[error("{what}: {source}")]
    Kvm {
        /// What was being done.
        what: &'static str,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
}

/// Decodes and carries out the instruction KVM could not emulate, or says why not.
fn assist_instruction(ctx: &mut VcpuContext, bytes: &[u8]) -> Result<(), AssistError> {
    let kvm = |what| move |source| AssistError::Kvm { what, source };
    let insn = assist::decode(bytes)?;
    let (cpu, regs, sregs) = cpu_state(&ctx.fd).map_err(kvm("reading the vCPU"))?;
    let virt = VcpuVirt {
        fd: &ctx.fd,
        mem: ctx.memory.mem(),
    };
    let a = assist::execute(&insn, &cpu, &virt)?;
    apply(&ctx.fd, regs, sregs, &a).map_err(kvm("applying it"))?;
    ctx.counters.assisted(a.kind);
    Ok(())
}

/// Where a shutdown (triple fault) happened. KVM on AMD SVM re-initialises the vCPU when it
/// takes the shutdown, so its registers then show the reset vector (CS 0xf000, RIP 0xfff0)
/// and the faulting site is lost: said so instead of naming the reset vector.
fn shutdown_site(ctx: &VcpuContext) -> String {
    let site = fault_site(ctx);
    let reset = matches!(
        (ctx.fd.get_regs(), ctx.fd.get_sregs()),
        (Ok(r), Ok(s)) if r.rip == 0xfff0 && s.cs.selector == 0xf000
    );
    if reset {
        format!(
            "site unknown: the host's KVM reset the vCPU when it took the shutdown (AMD SVM \
             does), so the faulting RIP is lost; now {site}"
        )
    } else {
        site
    }
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
