//! `probe.assist=1`: the instructions a VMM must assist on a host whose KVM emulates guest
//! ring 0 and refuses them (the nested `kvm_pvm` development hosts), each checked for its
//! architectural effect, so an assist that gets RIP, flags or state wrong fails here:
//!
//! - `int3` in ring 0: the #BP handler must see the address right after it;
//! - `int $0x43` in ring 0: the handler must see the address right after it;
//! - `fwait` with nothing pending: a no-op;
//! - `ldmxcsr m32` in ring 0: MXCSR, read back in ring 3, must be the value loaded;
//! - `syscall` from ring 3 to an entry on a supervisor-only page (as Linux's is), and
//!   `sysretq` back: the entry must run with the kernel's CS from STAR, see the return
//!   address in RCX, and come back to the instruction after the `syscall`.
//!
//! Lines: `assist int3=ok|FAILED int_n=.. fwait=.. ldmxcsr=..` and
//! `assist syscall cs=0x.. return=ok|FAILED entries=N`. On hardware where none of this is
//! refused the same checks pass natively, which is the point: the assisted guest must not
//! be able to tell.

use core::arch::asm;

use crate::sys::{self, MSR_EFER, MSR_LSTAR, MSR_SFMASK, MSR_STAR, STAR, SUPER_ALIAS};

/// SFMASK: TF, IF, DF, NT cleared on entry.
const SFMASK: u64 = 0x4700;
/// Kernel code selector (ring0.s `SEL_KCODE`).
const SEL_KCODE: u64 = 0x08;

unsafe extern "C" {
    static assist_after_int3: u8;
    static assist_after_int_n: u8;
    static syscall_entry_probe: u8;
    static assist_rips: [u64; 2];
    static syscall_seen: [u64; 3];
}

fn verdict(ok: bool) -> &'static str {
    if ok { "ok" } else { "FAILED" }
}

fn read_mxcsr() -> u32 {
    let mut v = 0u32;
    // SAFETY: stores MXCSR into a local.
    unsafe { asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack)) };
    v
}

/// Runs the checks if `probe.assist=1`; returns whether one failed.
pub fn run(bi: &crate::bootinfo::BootInfo) -> bool {
    if bi.arg("probe.assist") != Some("1") {
        return false;
    }
    // Round to zero and every exception masked: not the reset value 0x1f80.
    let want = 0x7f80u32;
    sys::assist(&want);
    // SAFETY: written by ring 0 before sys::assist returned; plain loads of statics.
    let rips = unsafe { core::ptr::read_volatile(&raw const assist_rips) };
    let int3 = rips[0] == &raw const assist_after_int3 as u64;
    let int_n = rips[1] == &raw const assist_after_int_n as u64;
    let mxcsr = read_mxcsr();
    say!(
        "assist int3={} int_n={} fwait={} ldmxcsr={}",
        verdict(int3),
        verdict(int_n),
        // Reaching this line after an fwait with nothing pending is the check.
        verdict(true),
        verdict(mxcsr == want)
    );
    if !int3 || !int_n {
        say!("assist rips seen={:#x},{:#x}", rips[0], rips[1]);
    }
    if mxcsr != want {
        say!("assist mxcsr seen={:#x} want={:#x}", mxcsr, want);
    }

    sys::wrmsr(MSR_STAR, STAR);
    sys::wrmsr(MSR_SFMASK, SFMASK);
    sys::wrmsr(
        MSR_LSTAR,
        SUPER_ALIAS + &raw const syscall_entry_probe as u64,
    );
    sys::wrmsr(MSR_EFER, sys::rdmsr(MSR_EFER) | 1);
    let expected: u64;
    // SAFETY: the entry (ring0.s) only writes syscall_seen and returns with sysretq to
    // RCX with the flags in R11, which the asm declares clobbered.
    unsafe {
        asm!(
            "lea {e}, [rip + 2f]",
            "syscall",
            "2:",
            e = out(reg) expected,
            out("rcx") _, out("r11") _, out("rax") _,
            options(nostack),
        );
    }
    // SAFETY: written by the entry before sysretq; plain loads of a static.
    let seen = unsafe { core::ptr::read_volatile(&raw const syscall_seen) };
    let ok = seen[0] & 0xffff == SEL_KCODE && seen[1] == expected && seen[2] == 1;
    say!(
        "assist syscall cs={:#x} return={} entries={}",
        seen[0] & 0xffff,
        verdict(seen[1] == expected),
        seen[2]
    );
    !(int3 && int_n && mxcsr == want && ok)
}
