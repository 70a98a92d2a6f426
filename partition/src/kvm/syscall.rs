//! The SYSCALL repair on a vCPU (what it repairs and why: [`crate::cpu::syscall`]): a
//! hardware breakpoint on the guest's #PF handler, armed when the guest writes IA32_LSTAR,
//! and what each debug exit then calls for. The decision is the pure
//! [`crate::cpu::syscall::classify`]; this file reads and writes the vCPU for it.

use kvm_ioctls::VcpuFd;
use vm_memory::GuestMemoryMmap;

use super::regs::{VcpuVirt, apply, read_msr};
use crate::cpu::assist::{self, GuestVirt};
use crate::cpu::exits::ExitCounters;
use crate::kvm::vm::{MSR_LSTAR, MSR_STAR};

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

/// Why the SYSCALL repair could not go on (the launch stops with it).
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// KVM refused a read or write of the vCPU.
    #[error("{what}: {source}")]
    Kvm {
        /// What was being done.
        what: &'static str,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// The single step over the handler's first instruction did not end one instruction on.
    #[error(
        "the single step over the #PF handler's first instruction ended with DR6 {dr6:#x} at \
         {pc:#x}, not one instruction on"
    )]
    StepFailed {
        /// DR6 at the exit.
        dr6: u64,
        /// Where it stopped.
        pc: u64,
    },
    /// The #PF handler's stack is not in guest memory.
    #[error("exception frame at {0:#x} not mapped")]
    FrameUnmapped(u64),
}

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
    pub(super) fn write_msr(
        &mut self,
        fd: &VcpuFd,
        mem: &GuestMemoryMmap,
        index: u32,
        data: u64,
    ) -> bool {
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
    pub(super) fn debug_exit(
        &mut self,
        fd: &VcpuFd,
        mem: &GuestMemoryMmap,
        counters: &ExitCounters,
        (dr6, pc): (u64, u64),
    ) -> Result<(), RepairError> {
        let e =
            |what: &'static str| move |source: kvm_ioctls::Error| RepairError::Kvm { what, source };
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
                return Err(RepairError::StepFailed { dr6, pc });
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
            .map_err(|_| RepairError::FrameUnmapped(regs.rsp))?;
        let mut w = [0u64; 5];
        for (i, x) in w.iter_mut().enumerate() {
            *x = u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        }
        let frame = crate::cpu::syscall::PfFrame::from_words(w);
        (ev.rip, ev.cs, ev.rflags, ev.cr2) = (frame.rip, frame.cs, frame.rflags, sregs.cr2);
        let star = read_msr(fd, MSR_STAR).map_err(e("reading STAR"))?;
        let sfmask = read_msr(fd, MSR_SFMASK).map_err(e("reading SFMASK"))?;
        match crate::cpu::syscall::classify(&frame, sregs.cr2, self.lstar, star, regs.r11, sfmask) {
            crate::cpu::syscall::Verdict::Repair(a) => {
                ev.what = "repair";
                self.note(ev);
                apply(fd, regs, sregs, &a).map_err(e("applying"))?;
                counters.assisted(a.kind);
                return Ok(());
            }
            crate::cpu::syscall::Verdict::Unmatched => {
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
            crate::cpu::syscall::Verdict::Ordinary => {
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
