//! Local APIC access and bringing up application processors with INIT/SIPI, one at a time,
//! exactly as on real hardware.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::firmware::MAX_CPUS;
use crate::sys::{peek, poke, rdtsc};

/// xAPIC MMIO base.
pub const LAPIC: u64 = 0xfee0_0000;
const REG_ID: u64 = 0x20;
const REG_EOI: u64 = 0xb0;
const REG_SVR: u64 = 0xf0;
const REG_ICR_LO: u64 = 0x300;
const REG_ICR_HI: u64 = 0x310;
/// Where the AP trampoline goes (SIPI vector 1).
const TRAMP: u64 = 0x1000;
const TP_GDTR: u64 = TRAMP + 0xf00;
const TP_CR3: u64 = TRAMP + 0xf10;
const TP_ENTRY: u64 = TRAMP + 0xf18;
const TP_CPU: u64 = TRAMP + 0xf20;

/// Set by each AP once it runs in ring 3.
pub static AP_UP: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(0) }; MAX_CPUS];

unsafe extern "C" {
    static tramp_start: u8;
    static tramp_end: u8;
    static gdtr64: u8;
    static pml4: u8;
    static ap_entry64: u8;
}

fn reg_read(off: u64) -> u32 {
    // SAFETY: the LAPIC window is mapped (uncached) in the identity map.
    unsafe { peek(LAPIC + off) }
}

fn reg_write(off: u64, v: u32) {
    // SAFETY: as above; writes go to the (in-kernel) local APIC.
    unsafe { poke(LAPIC + off, v) }
}

/// This CPU's APIC ID.
pub fn apic_id() -> u32 {
    reg_read(REG_ID) >> 24
}

/// Software-enables this CPU's local APIC, spurious vector 0xff.
pub fn enable_lapic() {
    reg_write(REG_SVR, 0x1ff);
}

/// The local APIC timer as a one-shot alarm at a TSC value: in TSC-deadline mode when CPUID
/// offers it (armed by writing IA32_TSC_DEADLINE), else in one-shot mode counting KVM's
/// 1 GHz APIC bus (a CPU without TSC-deadline: QEMU TCG's, so the rig's guests).
#[derive(Clone, Copy)]
pub struct Alarm {
    deadline: bool,
    tsc_khz: u64,
}

impl Alarm {
    /// Sets the timer up on `vector`.
    pub fn new(vector: u8, tsc_khz: u64) -> Self {
        let deadline = crate::sys::cpuid(1, 0)[2] & (1 << 24) != 0;
        let mode = if deadline { 0b10 << 17 } else { 0 };
        reg_write(0x320, vector as u32 | mode);
        if !deadline {
            reg_write(0x3e0, 0b1011);
            say!("timer mode=one-shot (no TSC-deadline timer in CPUID)");
        }
        Self { deadline, tsc_khz }
    }

    /// Arms the alarm for TSC `at`. Returns the value to write to IA32_TSC_DEADLINE (the
    /// caller writes it, in ring 3 or in `sys::timer_wait`), or 0 when it is armed already.
    pub fn arm(&self, at: u64) -> u64 {
        if self.deadline {
            return at;
        }
        let ns = at.saturating_sub(crate::sys::rdtsc()) * 1_000_000 / self.tsc_khz.max(1);
        reg_write(0x380, ns.clamp(1, u32::MAX as u64) as u32);
        0
    }
}

/// Puts the local APIC timer in periodic mode on `vector`, every `us` microseconds (KVM's
/// local APIC timer counts a 1 GHz bus, divided by 1 here).
pub fn set_lvt_timer_periodic(vector: u8, us: u64) {
    reg_write(0x3e0, 0b1011);
    reg_write(0x320, vector as u32 | (0b01 << 17));
    reg_write(0x380, (us * 1000).min(u32::MAX as u64) as u32);
}

/// Stops the local APIC timer (masked, count 0).
pub fn stop_lvt_timer() {
    reg_write(0x380, 0);
    reg_write(0x320, 1 << 16);
}

/// End of interrupt.
#[allow(dead_code)]
pub fn eoi() {
    reg_write(REG_EOI, 0);
}

fn wait_icr_idle() {
    for _ in 0..1_000_000 {
        if reg_read(REG_ICR_LO) & (1 << 12) == 0 {
            return;
        }
        core::hint::spin_loop();
    }
}

/// Sends an IPI with ICR low word `lo` to `apic_id`.
pub fn send_ipi(apic_id: u32, lo: u32) {
    reg_write(REG_ICR_HI, apic_id << 24);
    reg_write(REG_ICR_LO, lo);
    wait_icr_idle();
}

fn wait_up(index: usize, cycles: u64) -> bool {
    let start = rdtsc();
    while rdtsc().wrapping_sub(start) < cycles {
        if AP_UP[index].load(Ordering::Acquire) != 0 {
            return true;
        }
        core::hint::spin_loop();
    }
    false
}

/// Copies the trampoline to low memory. Call once before [`start_ap`].
pub fn install_trampoline() {
    // SAFETY: the trampoline symbols delimit code in the image; TRAMP is a free page of
    // low RAM (below the VMM's boot structures) that nothing else uses while APs start.
    unsafe {
        let start = &raw const tramp_start as u64;
        let end = &raw const tramp_end as u64;
        for i in 0..(end - start) {
            poke::<u8>(TRAMP + i, peek(start + i));
        }
        let gdtr = &raw const gdtr64 as u64;
        poke::<u16>(TP_GDTR, peek(gdtr));
        poke::<u32>(TP_GDTR + 2, peek::<u64>(gdtr + 2) as u32);
        poke::<u32>(TP_CR3, &raw const pml4 as u64 as u32);
        poke::<u64>(TP_ENTRY, &raw const ap_entry64 as u64);
    }
}

/// Starts the AP with `apic_id` as CPU `index` and waits for it. `tsc_khz` bounds the wait.
pub fn start_ap(apic_id: u32, index: usize, tsc_khz: u64) -> bool {
    if index >= MAX_CPUS {
        return false;
    }
    // SAFETY: the parameter block is in the trampoline page installed above.
    unsafe { poke::<u64>(TP_CPU, index as u64) };
    let ms = tsc_khz.max(100_000);
    send_ipi(apic_id, 0x0000_4500); // INIT, assert
    // One SIPI, and a second if the first went unanswered (the MP spec sends two).
    for _ in 0..2 {
        send_ipi(apic_id, 0x0000_4600 | (TRAMP >> 12) as u32); // STARTUP
        if wait_up(index, 1000 * ms) {
            return true;
        }
    }
    false
}
