//! The CPUID a vCPU sees: the host's supported set, with topology that matches the vCPU
//! count and the vCPU's own APIC ID, the hypervisor bit, and the TSC frequency leaf.

use kvm_bindings::{CpuId, kvm_cpuid_entry2};

/// KVM_CPUID_FLAG_SIGNIFCANT_INDEX: the entry depends on the sub-leaf.
const FLAG_INDEX: u32 = 1;
/// Hypervisor timing leaf (TSC and APIC-bus kHz), VMware-compatible.
const TIMING_LEAF: u32 = 0x4000_0010;

fn bits_for(count: u32) -> u32 {
    if count <= 1 {
        0
    } else {
        32 - (count - 1).leading_zeros()
    }
}

/// CPUID leaf 1 ECX: MONITOR/MWAIT.
pub const LEAF1_ECX_MONITOR: u32 = 1 << 3;
/// CPUID 0x40000001 EDX: KVM_HINTS_REALTIME.
pub const KVM_HINTS_REALTIME: u32 = 1 << 0;
const KVM_FEATURES_LEAF: u32 = 0x4000_0001;

/// What the idle policy shows the guest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdleCpuid {
    /// MONITOR/MWAIT bit and the host's leaf 5 (C-state sub-states).
    pub mwait: bool,
    /// KVM_HINTS_REALTIME: vCPUs never preempted (dedicated cores).
    pub hints_realtime: bool,
}

/// The host CPU's raw leaf 5 (MONITOR/MWAIT sub-states), if it has MONITOR.
pub fn host_leaf5() -> Option<[u32; 4]> {
    let l1 = core::arch::x86_64::__cpuid(1);
    if l1.ecx & LEAF1_ECX_MONITOR == 0 {
        return None;
    }
    let l5 = core::arch::x86_64::__cpuid(5);
    Some([l5.eax, l5.ebx, l5.ecx, l5.edx])
}

/// The leaf 5 a guest of this host is shown under `mwait`, from the host's.
pub fn guest_leaf5_here(host: [u32; 4]) -> [u32; 4] {
    use crate::cpu::guest_idle::{guest_leaf5, host_mwait_waits};
    if host_mwait_waits() {
        guest_leaf5(host)
    } else {
        host
    }
}

/// CPUID leaf 1 ECX: the local APIC's TSC-deadline mode.
pub const LEAF1_ECX_TSC_DEADLINE: u32 = 1 << 24;

/// CPUID for vCPU `apic_id` of `count`. `tsc_deadline`: KVM emulates the local APIC's
/// TSC-deadline mode (KVM_CAP_TSC_DEADLINE_TIMER), which KVM_GET_SUPPORTED_CPUID never
/// shows (the VMM must), so the guest may use it.
pub fn for_vcpu(
    supported: &CpuId,
    apic_id: u32,
    count: u32,
    tsc_khz: Option<u32>,
    idle: IdleCpuid,
    tsc_deadline: bool,
) -> CpuId {
    let mut entries: Vec<kvm_cpuid_entry2> = supported.as_slice().to_vec();
    // MONITOR/MWAIT only when MWAIT exits are disabled; leaf 5 goes with it, counting a
    // C1 sub-state so that a stock Linux guest idles in MWAIT, where the host's MWAIT
    // waits (guest_idle.rs).
    entries.retain(|e| e.function != 5);
    if idle.mwait {
        if let Some([a, b, c, d]) = host_leaf5().map(guest_leaf5_here) {
            entries.push(kvm_cpuid_entry2 {
                function: 5,
                eax: a,
                ebx: b,
                ecx: c,
                edx: d,
                ..Default::default()
            });
        }
    }
    let shift = bits_for(count);
    for e in entries.iter_mut() {
        match e.function {
            1 => {
                e.ebx = (e.ebx & 0x0000_ffff) | (apic_id << 24) | ((count.min(255)) << 16);
                if count > 1 {
                    e.edx |= 1 << 28; // HTT: the count field is valid
                }
                e.ecx |= crate::cpu::guest_idle::LEAF1_ECX_HYPERVISOR;
                if tsc_deadline {
                    e.ecx |= LEAF1_ECX_TSC_DEADLINE;
                }
                if idle.mwait {
                    e.ecx |= LEAF1_ECX_MONITOR;
                } else {
                    e.ecx &= !LEAF1_ECX_MONITOR;
                }
            }
            KVM_FEATURES_LEAF if idle.hints_realtime => e.edx |= KVM_HINTS_REALTIME,
            0xb | 0x1f => {
                // Sub-leaf 0: SMT level, one thread per core; sub-leaf 1: core level.
                e.edx = apic_id;
                match e.index {
                    0 => {
                        e.eax = 0;
                        e.ebx = 1;
                        e.ecx = 1 << 8;
                    }
                    1 => {
                        e.eax = shift;
                        e.ebx = count;
                        e.ecx = 1 | (2 << 8);
                    }
                    n => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = n;
                    }
                }
            }
            0x8000_0008 => {
                e.ecx = (e.ecx & !0xf0ff) | (count - 1) | (shift << 12);
            }
            0x8000_001e => {
                e.eax = apic_id;
                e.ebx &= !0xff00; // one thread per core
                e.ebx = (e.ebx & !0xff) | apic_id;
            }
            _ => {}
        }
    }
    if let Some(khz) = tsc_khz {
        let max_hv = entries
            .iter_mut()
            .find(|e| e.function == 0x4000_0000)
            .map(|e| {
                e.eax = e.eax.max(TIMING_LEAF);
                e.eax
            });
        if max_hv.is_some() && !entries.iter().any(|e| e.function == TIMING_LEAF) {
            entries.push(kvm_cpuid_entry2 {
                function: TIMING_LEAF,
                index: 0,
                flags: 0,
                eax: khz,
                // LAPIC bus frequency: KVM's virtual APIC timer runs at 1 GHz.
                ebx: 1_000_000,
                ..Default::default()
            });
        }
    }
    // Sub-leaf sensitive leaves must be flagged as such.
    for e in entries.iter_mut() {
        if matches!(e.function, 0xb | 0x1f | 4 | 7 | 0xd | 0x8000_001d) {
            e.flags |= FLAG_INDEX;
        }
    }
    CpuId::from_entries(&entries).unwrap_or_else(|_| supported.clone())
}

/// Logs (at debug level) what the host changed of the CPUID we set.
pub fn log_changes(index: usize, set: &CpuId, back: &CpuId) {
    for s in set.as_slice() {
        let b = back
            .as_slice()
            .iter()
            .find(|b| b.function == s.function && b.index == s.index);
        match b {
            None => log::debug!(
                "vcpu{index}: CPUID {:#x}.{} dropped by the host",
                s.function,
                s.index
            ),
            Some(b) if (b.eax, b.ebx, b.ecx, b.edx) != (s.eax, s.ebx, s.ecx, s.edx) => {
                log::debug!(
                    "vcpu{index}: CPUID {:#x}.{} set {:08x} {:08x} {:08x} {:08x}, host has {:08x} {:08x} {:08x} {:08x}",
                    s.function,
                    s.index,
                    s.eax,
                    s.ebx,
                    s.ecx,
                    s.edx,
                    b.eax,
                    b.ebx,
                    b.ecx,
                    b.edx
                )
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            ebx: 0x0012_3456,
            ..Default::default()
        }
    }

    #[test]
    fn topology_and_ids() {
        let sup = CpuId::from_entries(&[
            entry(1, 0),
            entry(0xb, 0),
            entry(0xb, 1),
            entry(0x4000_0000, 0),
        ])
        .unwrap();
        let c = for_vcpu(&sup, 3, 4, Some(2_596_000), IdleCpuid::default(), true);
        let e = |f, i| {
            *c.as_slice()
                .iter()
                .find(|e| e.function == f && e.index == i)
                .unwrap()
        };
        assert_eq!(e(1, 0).ebx >> 24, 3);
        assert_eq!((e(1, 0).ebx >> 16) & 0xff, 4);
        assert_ne!(e(1, 0).ecx & (1 << 31), 0);
        assert_ne!(e(1, 0).ecx & LEAF1_ECX_TSC_DEADLINE, 0);
        let without = for_vcpu(&sup, 3, 4, None, IdleCpuid::default(), false);
        let l1 = without.as_slice().iter().find(|e| e.function == 1).unwrap();
        assert_eq!(
            l1.ecx & LEAF1_ECX_TSC_DEADLINE,
            0,
            "only where KVM emulates it"
        );
        assert_eq!((e(0xb, 1).eax, e(0xb, 1).ebx, e(0xb, 1).edx), (2, 4, 3));
        assert_eq!(e(0xb, 0).flags & FLAG_INDEX, FLAG_INDEX);
        assert_eq!(e(TIMING_LEAF, 0).eax, 2_596_000);
        assert_eq!(e(0x4000_0000, 0).eax, TIMING_LEAF);
    }

    #[test]
    fn idle_bits() {
        let mut l1 = entry(1, 0);
        l1.ecx = LEAF1_ECX_MONITOR;
        let sup = CpuId::from_entries(&[l1, entry(5, 0), entry(KVM_FEATURES_LEAF, 0)]).unwrap();
        let hidden = for_vcpu(&sup, 0, 1, None, IdleCpuid::default(), false);
        let get = |c: &CpuId, f| c.as_slice().iter().find(|e| e.function == f).copied();
        assert_eq!(get(&hidden, 1).unwrap().ecx & LEAF1_ECX_MONITOR, 0);
        assert!(get(&hidden, 5).is_none());
        assert_eq!(
            get(&hidden, KVM_FEATURES_LEAF).unwrap().edx & KVM_HINTS_REALTIME,
            0
        );
        let shown = for_vcpu(
            &sup,
            0,
            1,
            None,
            IdleCpuid {
                mwait: true,
                hints_realtime: true,
            },
            false,
        );
        assert_ne!(get(&shown, 1).unwrap().ecx & LEAF1_ECX_MONITOR, 0);
        assert_eq!(get(&shown, 5).is_some(), host_leaf5().is_some());
        // The leaf shown is the guest's version of the host's: a C1 sub-state wherever
        // the host's leaf enumerates sub-states.
        if let (Some(e), Some(host)) = (get(&shown, 5), host_leaf5()) {
            let want = guest_leaf5_here(host);
            assert_eq!([e.eax, e.ebx, e.ecx, e.edx], want);
        }
        assert_ne!(
            get(&shown, KVM_FEATURES_LEAF).unwrap().edx & KVM_HINTS_REALTIME,
            0
        );
    }

    #[test]
    fn bits() {
        assert_eq!(bits_for(1), 0);
        assert_eq!(bits_for(2), 1);
        assert_eq!(bits_for(3), 2);
        assert_eq!(bits_for(4), 2);
        assert_eq!(bits_for(5), 3);
    }
}
