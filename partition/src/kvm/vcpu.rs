//! The vCPU thread: pin, run KVM_RUN, turn KVM's exit into our [`Exit`], act on the
//! [`Action`] [`handle_exit`] returns; instruction assists and the SYSCALL repair carried
//! out through the vCPU's registers, events and debug state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use devices::Bus;
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::assist::{self, Assist, Effect, GuestVirt, SegLoad};
use crate::kvm::vm::{MSR_LSTAR, MSR_STAR};
use crate::memory::GuestMemory;
use crate::vcpu::{Action, Exit, ExitCounters, StopReason, handle_exit};

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
    /// The reserved cores' cpuset the thread joins before pinning, if any.
    pub cpuset: Option<Arc<crate::isolation::GuestsCpuset>>,
    /// The seccomp filter the thread installs before its first KVM_RUN (none with
    /// `--no-sandbox`).
    pub filter: Option<Arc<seccompiler::BpfProgram>>,
    /// The SYSCALL repair's state (armed when the guest writes IA32_LSTAR).
    pub syscall: SyscallRepair,
    /// Fatal-signal and Oops lines the guest's console showed: when not 0 at the end, the
    /// SYSCALL repair's recent debug exits are dumped.
    pub guest_faults: Arc<std::sync::atomic::AtomicU64>,
    /// Paused by the local API.
    pub pause: Arc<PauseControl>,
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

/// The vCPU thread: pin, run until something stops it, report why.
pub fn run(mut ctx: VcpuContext) -> StopReason {
    // Joined, the cpuset's `tasks` file is let go: the last vCPU thread to join closes it,
    // so the running VMM holds no writable cgroup file.
    if let Some(c) = ctx.cpuset.take() {
        if let Err(e) = c.join() {
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
    if let Some(f) = &ctx.filter {
        if let Err(e) = crate::sandbox::apply(crate::sandbox::Role::Vcpu, f) {
            return StopReason::RunError(format!("vcpu{}: {e}", ctx.index));
        }
    }
    // The first vCPU to get here ends the timeline's thread start-up phase.
    crate::timeline::mark("vcpu_start");
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

/// Guest-virtual reads through this vCPU's page tables (KVM_TRANSLATE, page by page).
struct VcpuVirt<'a> {
    fd: &'a VcpuFd,
    mem: &'a GuestMemoryMmap,
}

impl GuestVirt for VcpuVirt<'_> {
    fn read(&self, gva: u64, buf: &mut [u8]) -> Result<(), assist::Unmapped> {
        let mut done = 0usize;
        while done < buf.len() {
            let a = gva.checked_add(done as u64).ok_or(assist::Unmapped)?;
            let t = self.fd.translate_gva(a).map_err(|_| assist::Unmapped)?;
            if t.valid == 0 {
                return Err(assist::Unmapped);
            }
            let n = ((0x1000 - (a & 0xfff)) as usize).min(buf.len() - done);
            self.mem
                .read_slice(&mut buf[done..done + n], GuestAddress(t.physical_address))
                .map_err(|_| assist::Unmapped)?;
            done += n;
        }
        Ok(())
    }
}

fn read_msr(fd: &VcpuFd, index: u32) -> Result<u64, kvm_ioctls::Error> {
    let mut m = kvm_bindings::Msrs::from_entries(&[kvm_bindings::kvm_msr_entry {
        index,
        ..Default::default()
    }])
    .map_err(|_| kvm_ioctls::Error::new(libc::ENOMEM))?;
    fd.get_msrs(&mut m)?;
    Ok(m.as_slice()[0].data)
}

/// EFER.LMA.
const EFER_LMA: u64 = 1 << 10;
/// u32 index of FCW (low half) and FSW (high half) in the XSAVE legacy region.
const XSAVE_FCW_FSW: usize = 0;
/// u32 index of MXCSR in the XSAVE legacy region (byte 24).
const XSAVE_MXCSR: usize = 6;
/// u32 index of the low half of XSTATE_BV in the XSAVE header (byte 512).
const XSAVE_XSTATE_BV: usize = 128;
/// XSTATE_BV's SSE component bit (XMM registers and MXCSR).
const XFEATURE_MASK_SSE: u32 = 1 << 1;

/// The assist's view of the vCPU, with the registers it came from.
fn cpu_state(fd: &VcpuFd) -> Result<(assist::Cpu, kvm_regs, kvm_sregs), kvm_ioctls::Error> {
    let r = fd.get_regs()?;
    let s = fd.get_sregs()?;
    // The XSAVE image, not KVM_GET_FPU: the nested kvm_pvm host returns MXCSR 0 there and
    // ignores MXCSR set through KVM_SET_FPU.
    let xsave = fd.get_xsave()?;
    let cpu = assist::Cpu {
        rip: r.rip,
        gprs: [
            r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11,
            r.r12, r.r13, r.r14, r.r15,
        ],
        rflags: r.rflags,
        cpl: s.cs.dpl,
        long_mode: s.efer & EFER_LMA != 0 && s.cs.l != 0,
        cr0: s.cr0,
        cr4: s.cr4,
        efer: s.efer,
        fs_base: s.fs.base,
        gs_base: s.gs.base,
        fsw: (xsave.region[XSAVE_FCW_FSW] >> 16) as u16,
        star: read_msr(fd, MSR_STAR)?,
    };
    Ok((cpu, r, s))
}

fn segment(l: &SegLoad) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: l.selector,
        // Execute/read or read/write, accessed.
        type_: if l.code { 11 } else { 3 },
        present: 1,
        dpl: l.dpl,
        db: u8::from(!l.long),
        s: 1,
        l: u8::from(l.long),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Carries out an assist's effects on the vCPU.
fn apply(
    fd: &VcpuFd,
    mut regs: kvm_regs,
    mut sregs: kvm_sregs,
    a: &Assist,
) -> Result<(), kvm_ioctls::Error> {
    let mut events = None;
    let mut mxcsr = None;
    let mut sregs_dirty = false;
    for e in &a.effects {
        match *e {
            Effect::Rip(v) => regs.rip = v,
            Effect::Rflags(v) => regs.rflags = v,
            Effect::Rsp(v) => regs.rsp = v,
            Effect::Mxcsr(v) => mxcsr = Some(v),
            Effect::Segments { cs, ss } => {
                sregs.cs = segment(&cs);
                sregs.ss = segment(&ss);
                sregs_dirty = true;
            }
            Effect::Exception { vector, error_code } => {
                let mut ev = fd.get_vcpu_events()?;
                ev.exception.injected = 1;
                ev.exception.nr = vector;
                ev.exception.has_error_code = u8::from(error_code.is_some());
                ev.exception.error_code = error_code.unwrap_or(0);
                events = Some(ev);
            }
            Effect::Interrupt(vector) => {
                let mut ev = fd.get_vcpu_events()?;
                ev.interrupt.injected = 1;
                ev.interrupt.nr = vector;
                ev.interrupt.soft = 0;
                events = Some(ev);
            }
        }
    }
    if sregs_dirty {
        fd.set_sregs(&sregs)?;
    }
    fd.set_regs(&regs)?;
    if let Some(v) = mxcsr {
        let mut x = fd.get_xsave()?;
        x.region[XSAVE_MXCSR] = v;
        // MXCSR is part of the SSE component: with the SSE bit of XSTATE_BV clear (the
        // guest has not touched SSE state yet) KVM_SET_XSAVE ignores it. The XMM registers
        // in the image are then the init state, zeros, which setting the bit keeps.
        x.region[XSAVE_XSTATE_BV] |= XFEATURE_MASK_SSE;
        // SAFETY: `x` is the kvm_xsave KVM_GET_XSAVE just filled, of the size KVM_SET_XSAVE
        // reads; only MXCSR changed.
        unsafe { fd.set_xsave(&x)? };
        if log::log_enabled!(log::Level::Debug) {
            let back = fd.get_xsave().map(|b| b.region[XSAVE_MXCSR]);
            log::debug!("ldmxcsr assist: MXCSR {v:#x} set, KVM_GET_XSAVE reads back {back:?}");
        }
    }
    if let Some(ev) = events {
        fd.set_vcpu_events(&ev)?;
    }
    Ok(())
}

/// Decodes and carries out the instruction KVM could not emulate, or says why not.
fn assist_instruction(ctx: &mut VcpuContext, bytes: &[u8]) -> Result<(), String> {
    let insn = assist::decode(bytes).map_err(|e| e.to_string())?;
    let (cpu, regs, sregs) = cpu_state(&ctx.fd).map_err(|e| format!("reading the vCPU: {e}"))?;
    let virt = VcpuVirt {
        fd: &ctx.fd,
        mem: ctx.memory.mem(),
    };
    let a = assist::execute(&insn, &cpu, &virt).map_err(|e| e.to_string())?;
    apply(&ctx.fd, regs, sregs, &a).map_err(|e| format!("applying it: {e}"))?;
    ctx.counters.assisted(a.kind);
    Ok(())
}

/// DR7: local enable of breakpoint 0 (execute, one byte), and the reserved bit 10.
const DR7_L0: u64 = 1 | (1 << 10);
/// The #PF vector.
const VEC_PF: u64 = 14;
/// The #DB vector.
const VEC_DB: u8 = 1;

/// DR6.BS: the debug exception came from a single step.
const DR6_BS: u64 = 1 << 14;
/// DR6.B0..B3: which breakpoint matched.
const DR6_B0_B3: u64 = 0xf;
/// IA32_FMASK (SFMASK): the RFLAGS bits SYSCALL clears.
const MSR_SFMASK: u32 = 0xc000_0084;
/// How many debug exits each vCPU remembers (`SyscallRepair::recent`).
const RECENT: usize = 64;

/// One debug exit as the SYSCALL repair saw it (the diagnostic ring).
#[derive(Clone, Copy, Debug, Default)]
struct DebugEvent {
    /// RIP at the exit.
    pc: u64,
    /// DR6 at the exit.
    dr6: u64,
    /// The #PF frame's RIP, CS, RFLAGS and CR2 (zero when not at the #PF handler).
    rip: u64,
    cs: u64,
    rflags: u64,
    cr2: u64,
    /// What was done: `repair`, `unmatched`, `ordinary` (skipped or stepped over),
    /// `stepped`, `step-failed`, `guest-db`.
    what: &'static str,
}

/// The SYSCALL repair of one vCPU (see [`assist::syscall`]): a hardware breakpoint on the
/// guest's #PF handler, armed when the guest writes IA32_LSTAR.
#[derive(Debug, Default)]
pub struct SyscallRepair {
    /// Whether this launch repairs SYSCALL (the CPU model says so).
    pub enabled: bool,
    lstar: u64,
    handler: u64,
    /// A single step over the handler's first instruction is under way.
    pub(crate) stepping: bool,
    /// The last [`RECENT`] debug exits, oldest first.
    events: std::collections::VecDeque<DebugEvent>,
}

impl SyscallRepair {
    /// A repair that is on or off.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            ..Default::default()
        }
    }

    /// The breakpoint on the #PF handler; with `step`, instead a single step of the next
    /// instruction with interrupts blocked (KVM_GUESTDBG_BLOCKIRQ), so the step ends on
    /// the instruction after it and not in an interrupt handler. The breakpoint is off
    /// for that one instruction: kvm_pvm does not honour RFLAGS.RF for a guest-debug
    /// breakpoint (armed, the step exits at the same breakpoint again: DR6 0xffff0ff1 at
    /// the handler, seen with the probe's canary), and with interrupts blocked nothing but
    /// that instruction runs.
    fn breakpoint(&self, fd: &VcpuFd, step: bool) -> Result<(), kvm_ioctls::Error> {
        let control = if step {
            kvm_bindings::KVM_GUESTDBG_ENABLE
                | kvm_bindings::KVM_GUESTDBG_SINGLESTEP
                | kvm_bindings::KVM_GUESTDBG_BLOCKIRQ
        } else {
            kvm_bindings::KVM_GUESTDBG_ENABLE | kvm_bindings::KVM_GUESTDBG_USE_HW_BP
        };
        let mut d = kvm_bindings::kvm_guest_debug {
            control,
            ..Default::default()
        };
        d.arch.debugreg[0] = self.handler;
        d.arch.debugreg[7] = DR7_L0;
        fd.set_guest_debug(&d)
    }

    fn note(&mut self, e: DebugEvent) {
        if self.events.len() == RECENT {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }

    /// The remembered debug exits, oldest first, one per line-ish entry.
    pub fn recent(&self) -> String {
        let v: Vec<String> = self
            .events
            .iter()
            .map(|e| {
                format!(
                    "[{} pc {:#x} dr6 {:#x} rip {:#x} cs {:#x} rflags {:#x} cr2 {:#x}]",
                    e.what, e.pc, e.dr6, e.rip, e.cs, e.rflags, e.cr2
                )
            })
            .collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(" ")
        }
    }

    /// Completes the guest's WRMSR (only IA32_LSTAR is filtered) and arms the breakpoint
    /// on the #PF handler its IDT names now. False: the write is refused (#GP), as KVM
    /// would have refused it.
    fn write_msr(&mut self, fd: &VcpuFd, mem: &GuestMemoryMmap, index: u32, data: u64) -> bool {
        let m = kvm_bindings::Msrs::from_entries(&[kvm_bindings::kvm_msr_entry {
            index,
            data,
            ..Default::default()
        }]);
        if !matches!(m.map(|m| fd.set_msrs(&m)), Ok(Ok(1))) {
            return false;
        }
        if index != MSR_LSTAR || !self.enabled {
            return true;
        }
        self.lstar = data;
        let virt = VcpuVirt { fd, mem };
        let gate = fd.get_sregs().ok().and_then(|s| {
            let mut g = [0u8; 16];
            (s.idt.limit as u64 >= VEC_PF * 16 + 15)
                .then_some(())
                .and_then(|_| virt.read(s.idt.base + VEC_PF * 16, &mut g).ok())
                .map(|_| g)
        });
        let Some(g) = gate.filter(|g| g[5] & 0x80 != 0) else {
            log::warn!("SYSCALL repair not armed: no present #PF gate in the guest's IDT yet");
            return true;
        };
        let lo = u64::from_le_bytes(g[0..8].try_into().unwrap_or_default());
        let hi = u64::from_le_bytes(g[8..16].try_into().unwrap_or_default());
        self.handler = (lo & 0xffff) | ((lo >> 48) << 16) | ((hi & 0xffff_ffff) << 32);
        self.stepping = false;
        if let Err(e) = self.breakpoint(fd, false) {
            log::warn!("SYSCALL repair not armed: KVM_SET_GUEST_DEBUG: {e}");
            self.handler = 0;
        }
        log::debug!(
            "SYSCALL repair armed: LSTAR {data:#x}, #PF handler {:#x}",
            self.handler
        );
        true
    }

    /// A debug exit (`dr6`, `pc` as KVM reported them): our breakpoint (repair the
    /// SYSCALL, or step over it), the end of our single step (which must be one: DR6.BS),
    /// or the guest's own #DB (given back with its DR6).
    fn debug_exit(
        &mut self,
        fd: &VcpuFd,
        mem: &GuestMemoryMmap,
        counters: &ExitCounters,
        (dr6, pc): (u64, u64),
    ) -> Result<(), String> {
        let e = |what: &'static str| move |err: kvm_ioctls::Error| format!("{what}: {err}");
        let mut ev = DebugEvent {
            pc,
            dr6,
            ..Default::default()
        };
        if self.stepping {
            self.stepping = false;
            if dr6 & DR6_BS == 0 || pc == self.handler {
                ev.what = "step-failed";
                self.note(ev);
                return Err(format!(
                    "the single step over the #PF handler's first instruction ended with DR6 \
                     {dr6:#x} at {pc:#x}, not one instruction on"
                ));
            }
            ev.what = "stepped";
            self.note(ev);
            return self.breakpoint(fd, false).map_err(e("re-arming"));
        }
        let mut regs = fd.get_regs().map_err(e("KVM_GET_REGS"))?;
        if self.handler == 0 || regs.rip != self.handler || dr6 & DR6_B0_B3 & !1 != 0 {
            // The guest's own #DB: it sees the DR6 the exception set.
            ev.what = "guest-db";
            self.note(ev);
            let mut dregs = fd.get_debug_regs().map_err(e("KVM_GET_DEBUGREGS"))?;
            dregs.dr6 = dr6;
            fd.set_debug_regs(&dregs).map_err(e("KVM_SET_DEBUGREGS"))?;
            let mut vev = fd.get_vcpu_events().map_err(e("KVM_GET_VCPU_EVENTS"))?;
            vev.exception.injected = 1;
            vev.exception.nr = VEC_DB;
            vev.exception.has_error_code = 0;
            return fd.set_vcpu_events(&vev).map_err(e("injecting #DB"));
        }
        let sregs = fd.get_sregs().map_err(e("KVM_GET_SREGS"))?;
        let virt = VcpuVirt { fd, mem };
        let mut raw = [0u8; 40];
        virt.read(regs.rsp, &mut raw)
            .map_err(|_| format!("exception frame at {:#x} not mapped", regs.rsp))?;
        let mut w = [0u64; 5];
        for (i, x) in w.iter_mut().enumerate() {
            *x = u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        }
        let frame = assist::syscall::PfFrame::from_words(w);
        (ev.rip, ev.cs, ev.rflags, ev.cr2) = (frame.rip, frame.cs, frame.rflags, sregs.cr2);
        let star = read_msr(fd, MSR_STAR).map_err(e("reading STAR"))?;
        let sfmask = read_msr(fd, MSR_SFMASK).map_err(e("reading SFMASK"))?;
        match assist::syscall::classify(&frame, sregs.cr2, self.lstar, star, regs.r11, sfmask) {
            assist::syscall::Verdict::Repair(a) => {
                ev.what = "repair";
                self.note(ev);
                apply(fd, regs, sregs, &a).map_err(e("applying"))?;
                counters.assisted(a.kind);
                return Ok(());
            }
            assist::syscall::Verdict::Unmatched => {
                ev.what = "unmatched";
                self.note(ev);
                counters
                    .syscall_unmatched
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                log::warn!(
                    "SYSCALL repair: a user-mode fault at LSTAR {:#x} not of a broken \
                     SYSCALL's shape (error code {:#x}, RIP {:#x}, CR2 {:#x}) goes to the \
                     guest; the last debug exits: {}",
                    self.lstar,
                    frame.error_code,
                    frame.rip,
                    sregs.cr2,
                    self.recent()
                );
            }
            assist::syscall::Verdict::Ordinary => {
                ev.what = "ordinary";
                self.note(ev);
            }
        }
        // Not ours to finish: let the handler run past the breakpoint. Its first
        // instruction is read each time (the kernel patches it at run time): a no-op is
        // stepped over by skipping it, anything else by a single step with interrupts
        // blocked (the breakpoint re-armed when the step reports back).
        let mut first = [0u8; 15];
        if let Some(n) = virt
            .read(self.handler, &mut first)
            .ok()
            .and_then(|_| assist::nop_len(&first))
        {
            regs.rip += n as u64;
            return fd
                .set_regs(&regs)
                .map_err(e("stepping over the breakpoint"));
        }
        self.stepping = true;
        self.breakpoint(fd, true).map_err(e("single-stepping"))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_loads_become_flat_segments() {
        let cs = segment(&SegLoad {
            selector: 0x33,
            dpl: 3,
            code: true,
            long: true,
        });
        assert_eq!(
            (cs.selector, cs.dpl, cs.l, cs.db, cs.type_),
            (0x33, 3, 1, 0, 11)
        );
        assert_eq!(
            (cs.base, cs.limit, cs.present, cs.s, cs.g),
            (0, 0xffff_ffff, 1, 1, 1)
        );
        let ss = segment(&SegLoad {
            selector: 0x18,
            dpl: 0,
            code: false,
            long: false,
        });
        assert_eq!(
            (ss.selector, ss.dpl, ss.l, ss.db, ss.type_),
            (0x18, 0, 0, 1, 3)
        );
    }
}
