//! TSC frequency: from the hypervisor timing leaf, else kvmclock, else CPUID 0x15.

use crate::sys::{cpuid, peek, wrmsr};

const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
const KVM_FEATURE_CLOCKSOURCE2: u32 = 1 << 3;

#[repr(C, align(64))]
struct PvClock([u8; 64]);
static mut PVCLOCK: PvClock = PvClock([0; 64]);

/// TSC kHz and where it came from.
pub fn tsc_khz() -> (u64, &'static str) {
    let base = cpuid(0x4000_0000, 0);
    let kvm = base[1] == 0x4b4d_564b && base[2] == 0x564b_4d56 && base[3] == 0x4d;
    if base[0] >= 0x4000_0010 {
        let t = cpuid(0x4000_0010, 0);
        if t[0] != 0 {
            return (t[0] as u64, "cpuid-0x40000010");
        }
    }
    if kvm && cpuid(0x4000_0001, 0)[0] & KVM_FEATURE_CLOCKSOURCE2 != 0 {
        let addr = &raw mut PVCLOCK as u64;
        wrmsr(MSR_KVM_SYSTEM_TIME_NEW, addr | 1);
        // SAFETY: KVM fills the 32-byte pvclock structure at `addr` (ours, 64-aligned).
        let (mul, shift) = unsafe {
            let mut tries = 0;
            loop {
                let v1: u32 = peek(addr);
                let mul: u32 = peek(addr + 24);
                let shift: i8 = peek(addr + 28);
                let v2: u32 = peek(addr);
                if (v1 == v2 && v1 & 1 == 0 && mul != 0) || tries > 1_000_000 {
                    break (mul, shift);
                }
                tries += 1;
            }
        };
        wrmsr(MSR_KVM_SYSTEM_TIME_NEW, 0);
        if mul != 0 {
            // ns per tick = mul * 2^shift / 2^32  =>  kHz = 1e6 * 2^32 / (mul * 2^shift)
            let num: u128 = 1_000_000u128 << 32;
            let den: u128 = if shift >= 0 {
                (mul as u128) << shift
            } else {
                (mul as u128) >> (-shift)
            };
            if let Some(khz) = num.checked_div(den) {
                return (khz as u64, "kvmclock");
            }
        }
    }
    let l15 = cpuid(0x15, 0);
    if l15[0] != 0 && l15[1] != 0 && l15[2] != 0 {
        return (
            l15[2] as u64 * l15[1] as u64 / l15[0] as u64 / 1000,
            "cpuid-0x15",
        );
    }
    (0, "unknown")
}
