//! Ring-3 side of the ring-0 services (`ud2`, see ring0.s), and raw physical memory access.
//!
//! All memory is identity-mapped and user-accessible, so a physical address is a pointer.

use core::arch::asm;

/// IA32_EFER, IA32_STAR, IA32_LSTAR, IA32_FMASK (SFMASK): SYSCALL's MSRs.
pub const MSR_EFER: u32 = 0xc000_0080;
pub const MSR_STAR: u32 = 0xc000_0081;
pub const MSR_LSTAR: u32 = 0xc000_0082;
pub const MSR_SFMASK: u32 = 0xc000_0084;
/// Supervisor-only alias of the first GiB (ring0.s `SUPER_ALIAS`): where SYSCALL entries
/// are reached, on a page ring 3 may not fetch from, as Linux's entry is.
pub const SUPER_ALIAS: u64 = 0x100_0000_0000;
/// STAR: SYSCALL loads CS 0x08 (SS 0x10); SYSRET loads CS 0x2b (SS 0x23).
pub const STAR: u64 = (0x1b << 48) | (0x08 << 32);

const SYS_OUTB: u64 = 0;
#[allow(dead_code)]
const SYS_INB: u64 = 1;
const SYS_OUTSB: u64 = 2;
const SYS_HALT: u64 = 3;
const SYS_WRMSR: u64 = 4;
const SYS_RDMSR: u64 = 5;
const SYS_CPUID: u64 = 6;
const SYS_SETIF: u64 = 7;
const SYS_STOP: u64 = 8;
const SYS_OUTL: u64 = 9;
const SYS_WAIT: u64 = 13;
const SYS_PINGPONG: u64 = 14;
const SYS_TIMER_WAIT: u64 = 15;
const SYS_NULL: u64 = 16;
const SYS_ASSIST: u64 = 17;
const SYS_WAIT2: u64 = 18;
const SYS_XSETBV: u64 = 19;

/// Calls ring-0 service `op`.
#[inline(always)]
fn call(op: u64, a: u64, b: u64, c: u64) -> u64 {
    let ret: u64;
    // SAFETY: `ud2` enters the ring-0 dispatcher in ring0.s, which only touches the
    // registers declared clobbered here (RBX is saved and restored) and, for SYS_CPUID, the
    // 16 bytes at RDX that the caller passes as a valid pointer.
    unsafe {
        asm!(
            "ud2",
            inlateout("rax") op => ret,
            inlateout("rdi") a => _,
            inlateout("rsi") b => _,
            inlateout("rdx") c => _,
            out("rcx") _, out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            options(nostack),
        );
    }
    ret
}

/// The service dispatch and nothing else: a trap into ring 0 and back.
pub fn null() -> u64 {
    call(SYS_NULL, 0, 0, 0)
}

/// The VMM's mark port (partition's `cpu::exits::MARK_PORT`).
const MARK_PORT: u16 = 0x520;

/// Marks this moment for the VMM: it notes its exit counts and KVM's statistics for this
/// vCPU, so a loop between two marks is measured by KVM itself (one port write: an exit,
/// the second mark's own, which the reader takes off).
pub fn mark(id: u32) {
    call(SYS_OUTL, MARK_PORT as u64, id as u64, 0);
}

/// `out` a byte.
pub fn outb(port: u16, v: u8) {
    call(SYS_OUTB, port as u64, v as u64, 0);
}

/// `in` a byte.
#[allow(dead_code)]
pub fn inb(port: u16) -> u8 {
    call(SYS_INB, port as u64, 0, 0) as u8
}

/// `rep outsb` of `buf` to `port`.
pub fn outsb(port: u16, buf: &[u8]) {
    if !buf.is_empty() {
        call(
            SYS_OUTSB,
            buf.as_ptr() as u64,
            buf.len() as u64,
            port as u64,
        );
    }
}

/// Waits in `sti; hlt` until an interrupt has been handled.
pub fn halt() {
    call(SYS_HALT, 0, 0, 0);
}

/// Writes an MSR.
pub fn wrmsr(msr: u32, v: u64) {
    call(SYS_WRMSR, msr as u64, v, 0);
}

/// Runs the ring-0 instructions the nested host's emulator refuses (int3, int n, fwait,
/// ldmxcsr of `*mxcsr`; see ring0.s `sys_assist`).
pub fn assist(mxcsr: &u32) {
    call(SYS_ASSIST, mxcsr as *const u32 as u64, 0, 0);
}

/// Reads an MSR.
pub fn rdmsr(msr: u32) -> u64 {
    call(SYS_RDMSR, msr as u64, 0, 0)
}

/// CPUID as ring 0 sees it (ring 3 on the nested host sees the raw host CPUID).
pub fn cpuid(leaf: u32, sub: u32) -> [u32; 4] {
    let mut out = [0u32; 4];
    call(SYS_CPUID, leaf as u64, sub as u64, out.as_mut_ptr() as u64);
    out
}

/// Sets CR4.OSXSAVE and XCR0 to `xcr0` (XSETBV); returns XCR0 as XGETBV reads it back.
/// Only where ring 0 runs natively (the nested host's emulator refuses both).
pub fn xsetbv(xcr0: u64) -> u64 {
    call(SYS_XSETBV, xcr0, 0, 0)
}

/// Turns interrupt delivery in ring 3 on or off.
pub fn set_interrupts(on: bool) {
    call(SYS_SETIF, on as u64, 0, 0);
}

/// Stops this CPU for good.
pub fn stop() -> ! {
    call(SYS_STOP, 0, 0, 0);
    loop {
        core::hint::spin_loop();
    }
}

/// Waits in ring 0 (hlt, or monitor/mwait when `mwait`) until the u64 at `addr` is no
/// longer `old`; returns the TSC at wake-up.
pub fn wait(addr: *const u64, old: u64, mwait: bool) -> u64 {
    call(SYS_WAIT, addr as u64, old, mwait as u64)
}

/// Waits in ring 0 (hlt, or monitor/mwait on `a` when `mwait`) until the u64 at `a` is no
/// longer `old_a` or the u64 at `b` (8-byte aligned) moves from what it is when the call
/// starts; returns the TSC at wake-up.
pub fn wait_either(a: *const u64, old_a: u64, b: *const u64, mwait: bool) -> u64 {
    call(SYS_WAIT2, a as u64, old_a, b as u64 | mwait as u64)
}

/// Ring-0 IPI ping-pong (see ring0.s): `n` rounds with the CPU whose APIC ID is
/// `peer_apic`; as initiator, round trips land in `wake_samples`.
pub fn pingpong(n: u64, peer_apic: u32, mwait: bool, initiator: bool) {
    call(
        SYS_PINGPONG,
        n,
        (peer_apic as u64) << 24,
        mwait as u64 | (initiator as u64) << 1,
    );
}

/// Arms the TSC-deadline timer for `deadline` (0: the caller armed the timer already, see
/// `smp::Alarm`) and waits in ring 0; returns the TSC at wake-up.
pub fn timer_wait(deadline: u64, mwait: bool) -> u64 {
    call(SYS_TIMER_WAIT, deadline, mwait as u64, 0)
}

/// Time stamp counter (ring 3, native).
#[inline(always)]
pub fn rdtsc() -> u64 {
    let lo: u32;
    let hi: u32;
    // SAFETY: RDTSC reads a counter; CR4.TSD is clear so it is allowed in ring 3.
    unsafe { asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack)) };
    ((hi as u64) << 32) | lo as u64
}

/// Reads a `T` at physical address `addr`.
///
/// # Safety
/// `addr..addr + size_of::<T>()` must be mapped (guest RAM or a device window).
#[inline(always)]
pub unsafe fn peek<T: Copy>(addr: u64) -> T {
    // SAFETY: the caller guarantees the range is mapped; unaligned reads are fine on x86.
    unsafe { core::ptr::read_volatile(addr as *const T) }
}

/// Writes a `T` at physical address `addr`.
///
/// # Safety
/// As [`peek`], and nothing else may own that memory.
#[inline(always)]
pub unsafe fn poke<T: Copy>(addr: u64, v: T) {
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(addr as *mut T, v) }
}

/// Length of a sample buffer.
pub const SAMPLES: usize = 4096;
static mut SCRATCH: [[u64; SAMPLES]; 2] = [[0; SAMPLES]; 2];

/// Sample buffer `i` (0 or 1) for the BSP's timing loops: 32 KiB each, too big for a
/// 16 KiB ring-3 stack.
///
/// # Safety
/// Only the BSP calls this, and it never holds two borrows of the same buffer.
pub unsafe fn scratch(i: usize) -> &'static mut [u64; SAMPLES] {
    // SAFETY: i < 2 is checked by `add`'s caller contract below; the caller guarantees
    // exclusive use of buffer i.
    unsafe { &mut *(&raw mut SCRATCH).cast::<[u64; SAMPLES]>().add(i.min(1)) }
}
