//! `probe.canary=N`: N system calls from ring 3 through SYSCALL, each one checked for
//! everything a correct SYSCALL/SYSRET pair leaves alone, so a VMM that finishes SYSCALLs
//! for its host (the nested `kvm_pvm` hosts: partition/src/kvm/vcpu.rs, the SYSCALL repair)
//! and gets one wrong is caught in seconds instead of as a rare SIGSEGV in a Linux guest.
//!
//! Before each call ring 3 fills RBX, RBP, R12-R15, XMM0-15, MXCSR, the x87 control word
//! and the 128-byte red zone below RSP with a fresh pattern and sets DF; after it, every one
//! must be as it was, RSP unchanged and DF still set (SYSRET restores RFLAGS from R11).
//! The entry (ring0.s `canary_entry`, on a supervisor-only page as Linux's is) records the
//! RFLAGS and CS it runs with: CS must be the kernel's and IF, TF, DF and AC clear (SFMASK
//! is Linux's), since until an entry has its own stack an interrupt there would write
//! below the user's RSP. With `probe.canary_timer=US` a periodic local APIC timer fires
//! every US microseconds (0: off; default 50) with interrupts on in ring 3, so interrupts
//! land all around the calls.
//!
//! With `probe.canary_on=ap` it runs on the first AP while the BSP goes on with the rest
//! (the virtio-blk tests, `probe.blk=...`), so a busy disk queue and its interrupts are
//! beside it.
//!
//! Between the calls ring 3 takes 16 ordinary page faults (a read of a supervisor-only
//! page, which the #PF handler turns into a return): a VMM that repairs SYSCALL at the
//! handler's entry must pass those to the guest, stepping over the handler's first
//! instruction (not a no-op here).
//!
//! Line: `canary calls=N entries=E mismatches=M bad_entries=B timer_irqs=T page_faults=F`
//! and, for the
//! first few mismatches, `canary mismatch call=I what=... want=... got=...`.

use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use crate::sys::{self, MSR_EFER, MSR_LSTAR, MSR_SFMASK, MSR_STAR, STAR, SUPER_ALIAS};

/// Linux's SFMASK: TF, DF, IF, IOPL, AC, NT.
const SFMASK: u64 = 0x4_7700;
const RFLAGS_TF: u64 = 1 << 8;
const RFLAGS_IF: u64 = 1 << 9;
const RFLAGS_DF: u64 = 1 << 10;
const RFLAGS_AC: u64 = 1 << 18;
const SEL_KCODE: u64 = 0x08;
/// The timer's vector (ring0.s counts it in irq_counts and sends the EOI).
const VEC_CANARY_TIMER: usize = 0x44;

/// What ring 3 loads before the call and reads back after it (layout shared with the
/// assembly below: offsets in the comments).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
struct State {
    /// RBX, RBP, R12, R13, R14, R15 (0).
    gpr: [u64; 6],
    /// XMM0-15 (48).
    xmm: [[u64; 2]; 16],
    /// MXCSR (304), x87 control word (308).
    mxcsr: u32,
    fcw: u32,
    /// The red zone, lowest address first (312).
    red: [u64; 16],
    /// RFLAGS after the call (440), RSP before and after (448, 456).
    rflags: u64,
    rsp_before: u64,
    rsp_after: u64,
}

const ZERO: State = State {
    gpr: [0; 6],
    xmm: [[0; 2]; 16],
    mxcsr: 0,
    fcw: 0,
    red: [0; 16],
    rflags: 0,
    rsp_before: 0,
    rsp_after: 0,
};

#[unsafe(no_mangle)]
static mut canary_in: State = ZERO;
#[unsafe(no_mangle)]
static mut canary_out: State = ZERO;

unsafe extern "C" {
    /// The call (below): loads canary_in, SYSCALL, stores canary_out.
    fn canary_call();
    static canary_entry: u8;
    /// Written by the entry: RFLAGS and CS it ran with, and how many times it ran.
    static canary_seen: [u64; 3];
    /// Reads a u64, or returns -1 when the read faults (ring0.s).
    fn pf_try_read(addr: u64) -> u64;
    /// Page faults at pf_try_read, recovered.
    static pf_seen: u64;
}

/// Ordinary page faults taken between the calls: ring 3 reads the supervisor-only alias
/// (a protection fault that is not a SYSCALL's), which the handler turns into a return.
/// Where the VMM repairs SYSCALL it must let each through to the guest's handler past its
/// breakpoint, stepping over the handler's first instruction (here not a no-op).
const PAGE_FAULTS: u64 = 16;

core::arch::global_asm!(
    r#"
    .section .text, "ax"
    .global canary_call
canary_call:
    push %rbx
    push %rbp
    push %r12
    push %r13
    push %r14
    push %r15
    lea canary_in(%rip), %rdi
    ldmxcsr 304(%rdi)
    fldcw 308(%rdi)
    movdqu 48(%rdi), %xmm0
    movdqu 64(%rdi), %xmm1
    movdqu 80(%rdi), %xmm2
    movdqu 96(%rdi), %xmm3
    movdqu 112(%rdi), %xmm4
    movdqu 128(%rdi), %xmm5
    movdqu 144(%rdi), %xmm6
    movdqu 160(%rdi), %xmm7
    movdqu 176(%rdi), %xmm8
    movdqu 192(%rdi), %xmm9
    movdqu 208(%rdi), %xmm10
    movdqu 224(%rdi), %xmm11
    movdqu 240(%rdi), %xmm12
    movdqu 256(%rdi), %xmm13
    movdqu 272(%rdi), %xmm14
    movdqu 288(%rdi), %xmm15
    xor %ecx, %ecx
1:
    mov 312(%rdi,%rcx,8), %rax
    mov %rax, -128(%rsp,%rcx,8)
    inc %ecx
    cmp $16, %ecx
    jb 1b
    lea canary_out(%rip), %rax
    mov %rsp, 448(%rax)
    mov 0(%rdi), %rbx
    mov 8(%rdi), %rbp
    mov 16(%rdi), %r12
    mov 24(%rdi), %r13
    mov 32(%rdi), %r14
    mov 40(%rdi), %r15
    std
    mov $39, %eax
    syscall
    lea canary_out(%rip), %rdi
    mov %rsp, 456(%rdi)
    mov %rbx, 0(%rdi)
    mov %rbp, 8(%rdi)
    mov %r12, 16(%rdi)
    mov %r13, 24(%rdi)
    mov %r14, 32(%rdi)
    mov %r15, 40(%rdi)
    movdqu %xmm0, 48(%rdi)
    movdqu %xmm1, 64(%rdi)
    movdqu %xmm2, 80(%rdi)
    movdqu %xmm3, 96(%rdi)
    movdqu %xmm4, 112(%rdi)
    movdqu %xmm5, 128(%rdi)
    movdqu %xmm6, 144(%rdi)
    movdqu %xmm7, 160(%rdi)
    movdqu %xmm8, 176(%rdi)
    movdqu %xmm9, 192(%rdi)
    movdqu %xmm10, 208(%rdi)
    movdqu %xmm11, 224(%rdi)
    movdqu %xmm12, 240(%rdi)
    movdqu %xmm13, 256(%rdi)
    movdqu %xmm14, 272(%rdi)
    movdqu %xmm15, 288(%rdi)
    stmxcsr 304(%rdi)
    fnstcw 308(%rdi)
    xor %ecx, %ecx
2:
    mov -128(%rsp,%rcx,8), %rax
    mov %rax, 312(%rdi,%rcx,8)
    inc %ecx
    cmp $16, %ecx
    jb 2b
    pushfq
    popq 440(%rdi)
    cld
    movl $0x1f80, -8(%rsp)
    ldmxcsr -8(%rsp)
    movw $0x37f, -8(%rsp)
    fldcw -8(%rsp)
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %rbp
    pop %rbx
    ret
"#,
    options(att_syntax, raw)
);

/// A small xorshift, so every call gets its own pattern.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn fresh(x: &mut u64) -> State {
    let mut s = ZERO;
    for g in &mut s.gpr {
        *g = next(x);
    }
    for v in &mut s.xmm {
        *v = [next(x), next(x)];
    }
    // Round toward zero, every exception masked; precision control 64-bit, round down.
    s.mxcsr = 0x7f80 | (next(x) as u32 & 0x3f);
    s.fcw = 0x077f;
    for r in &mut s.red {
        *r = next(x);
    }
    s
}

fn say_mismatch(n: &mut u32, call: u64, what: &str, want: u64, got: u64) {
    if *n < 8 {
        say!(
            "canary mismatch call={} what={} want={:#x} got={:#x}",
            call,
            what,
            want,
            got
        );
    }
    *n += 1;
}

/// What one CPU's canary found.
#[derive(Clone, Copy, Default)]
pub struct Outcome {
    calls: u64,
    entries: u64,
    mismatches: u32,
    bad_entries: u64,
    irqs: u64,
    page_faults: u64,
}

/// The canary's result from the AP (`probe.canary_on=ap`), written before it says done.
static mut AP_OUTCOME: Outcome = Outcome {
    calls: 0,
    entries: 0,
    mismatches: 0,
    bad_entries: 0,
    irqs: 0,
    page_faults: 0,
};

/// Where the canary runs and what it is waiting for.
pub enum Pending {
    /// Not asked for.
    Off,
    /// Ran on this CPU already.
    Done(Outcome),
    /// Posted to the AP (`wake::post_canary`): its mailbox sequence number.
    OnAp(u64),
}

/// Starts the canary if `probe.canary=N`: on this CPU at once, or with
/// `probe.canary_on=ap` on the first AP (`ap`), so the BSP can drive the disk meanwhile
/// (main.rs runs the blk tests between `start` and `finish`).
pub fn start(bi: &crate::bootinfo::BootInfo, ap: Option<u32>) -> Pending {
    let Some(calls) = bi.arg("probe.canary").and_then(|v| v.parse::<u64>().ok()) else {
        return Pending::Off;
    };
    let timer_us = bi
        .arg("probe.canary_timer")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(50);
    match (bi.arg("probe.canary_on"), ap) {
        (Some("ap"), Some(ap)) => {
            say!("canary on the AP (apic {}) while the BSP goes on", ap);
            Pending::OnAp(crate::wake::post_call(ap, on_ap, calls, timer_us))
        }
        (Some("ap"), None) => {
            say!("canary FAILED: probe.canary_on=ap but there is no AP");
            Pending::Done(Outcome {
                mismatches: 1,
                ..Outcome::default()
            })
        }
        _ => Pending::Done(check(calls, timer_us)),
    }
}

/// The AP's side of `probe.canary_on=ap` (called from its mailbox loop).
pub fn on_ap(calls: u64, timer_us: u64) {
    let o = check(calls, timer_us);
    // SAFETY: only the AP writes it, before it marks the command done; the BSP reads it
    // after seeing that.
    unsafe { write_volatile(addr_of_mut!(AP_OUTCOME), o) };
}

/// Waits for the canary (if it runs on the AP), says what it found; whether it failed.
pub fn finish(p: Pending) -> bool {
    let o = match p {
        Pending::Off => return false,
        Pending::Done(o) => o,
        Pending::OnAp(seq) => {
            crate::wake::wait_posted(seq);
            // SAFETY: the AP wrote it before marking the command done.
            unsafe { read_volatile(addr_of!(AP_OUTCOME)) }
        }
    };
    say!(
        "canary calls={} entries={} mismatches={} bad_entries={} timer_irqs={} page_faults={}",
        o.calls,
        o.entries,
        o.mismatches,
        o.bad_entries,
        o.irqs,
        o.page_faults
    );
    let want_faults = o.calls.div_ceil((o.calls / PAGE_FAULTS).max(1));
    o.mismatches != 0 || o.bad_entries != 0 || o.entries != o.calls || o.page_faults != want_faults
}

/// `calls` system calls on this CPU, each checked; a periodic local APIC timer every
/// `timer_us` (0: none) with interrupts on in ring 3 meanwhile.
fn check(calls: u64, timer_us: u64) -> Outcome {
    sys::wrmsr(MSR_STAR, STAR);
    sys::wrmsr(MSR_SFMASK, SFMASK);
    sys::wrmsr(MSR_EFER, sys::rdmsr(MSR_EFER) | 1);
    // LSTAR last: writing it is what arms a VMM's SYSCALL repair.
    sys::wrmsr(MSR_LSTAR, SUPER_ALIAS + &raw const canary_entry as u64);
    let irqs_before = crate::wake::irq_count(VEC_CANARY_TIMER);
    if timer_us > 0 {
        crate::smp::set_lvt_timer_periodic(VEC_CANARY_TIMER as u8, timer_us);
        sys::set_interrupts(true);
    }
    let mut x = 0x5359_5343_414c_4c21u64 ^ calls;
    let mut bad = 0u32;
    let mut bad_entries = 0u64;
    // SAFETY: a plain load of a static ring 0 writes.
    let pf_before = unsafe { read_volatile(addr_of!(pf_seen)) };
    let pf_every = (calls / PAGE_FAULTS).max(1);
    // SAFETY: a plain load of a static the entry writes.
    let entries_before = unsafe { read_volatile(addr_of!(canary_seen))[2] };
    for call in 0..calls {
        if call % pf_every == 0 {
            // SAFETY: the read faults (a supervisor page) and returns -1 from the fixup.
            let v = unsafe { pf_try_read(SUPER_ALIAS) };
            if v != u64::MAX {
                say_mismatch(&mut bad, call, "page_fault_read", u64::MAX, v);
            }
        }
        let want = fresh(&mut x);
        // SAFETY: the statics are only touched here and by canary_call, on this CPU (one
        // CPU runs the canary).
        let got = unsafe {
            write_volatile(addr_of_mut!(canary_in), want);
            canary_call();
            read_volatile(addr_of!(canary_out))
        };
        // SAFETY: written by the entry before sysretq; a plain load of a static.
        let seen = unsafe { read_volatile(addr_of!(canary_seen)) };
        let names = ["rbx", "rbp", "r12", "r13", "r14", "r15"];
        for (i, n) in names.iter().enumerate() {
            if got.gpr[i] != want.gpr[i] {
                say_mismatch(&mut bad, call, n, want.gpr[i], got.gpr[i]);
            }
        }
        for i in 0..16 {
            if got.xmm[i] != want.xmm[i] {
                say_mismatch(&mut bad, call, "xmm", i as u64, got.xmm[i][0]);
            }
        }
        if got.mxcsr != want.mxcsr {
            say_mismatch(&mut bad, call, "mxcsr", want.mxcsr.into(), got.mxcsr.into());
        }
        if got.fcw & 0xffff != want.fcw {
            say_mismatch(&mut bad, call, "fcw", want.fcw.into(), got.fcw.into());
        }
        for i in 0..16 {
            if got.red[i] != want.red[i] {
                say_mismatch(&mut bad, call, "red_zone", i as u64, got.red[i]);
            }
        }
        if got.rsp_after != got.rsp_before {
            say_mismatch(&mut bad, call, "rsp", got.rsp_before, got.rsp_after);
        }
        if got.rflags & RFLAGS_DF == 0 {
            say_mismatch(&mut bad, call, "user_df", RFLAGS_DF, got.rflags);
        }
        let entry_flags = seen[0] & (RFLAGS_IF | RFLAGS_TF | RFLAGS_DF | RFLAGS_AC);
        if entry_flags != 0 || seen[1] & 0xffff != SEL_KCODE {
            if bad_entries < 4 {
                say!(
                    "canary bad entry call={} rflags={:#x} cs={:#x}",
                    call,
                    seen[0],
                    seen[1]
                );
            }
            bad_entries += 1;
        }
    }
    if timer_us > 0 {
        sys::set_interrupts(false);
        crate::smp::stop_lvt_timer();
    }
    // SAFETY: as above.
    let entries = unsafe { read_volatile(addr_of!(canary_seen))[2] } - entries_before;
    // SAFETY: as above.
    let faults = unsafe { read_volatile(addr_of!(pf_seen)) } - pf_before;
    Outcome {
        calls,
        entries,
        mismatches: bad,
        bad_entries,
        irqs: crate::wake::irq_count(VEC_CANARY_TIMER) - irqs_before,
        page_faults: faults,
    }
}
