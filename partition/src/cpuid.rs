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

/// CPUID for vCPU `apic_id` of `count`.
pub fn for_vcpu(supported: &CpuId, apic_id: u32, count: u32, tsc_khz: Option<u32>) -> CpuId {
    let mut entries: Vec<kvm_cpuid_entry2> = supported.as_slice().to_vec();
    let shift = bits_for(count);
    for e in entries.iter_mut() {
        match e.function {
            1 => {
                e.ebx = (e.ebx & 0x0000_ffff) | (apic_id << 24) | ((count.min(255)) << 16);
                if count > 1 {
                    e.edx |= 1 << 28; // HTT: the count field is valid
                }
                e.ecx |= 1 << 31; // running under a hypervisor
            }
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
        let c = for_vcpu(&sup, 3, 4, Some(2_596_000));
        let e = |f, i| {
            *c.as_slice()
                .iter()
                .find(|e| e.function == f && e.index == i)
                .unwrap()
        };
        assert_eq!(e(1, 0).ebx >> 24, 3);
        assert_eq!((e(1, 0).ebx >> 16) & 0xff, 4);
        assert_ne!(e(1, 0).ecx & (1 << 31), 0);
        assert_eq!((e(0xb, 1).eax, e(0xb, 1).ebx, e(0xb, 1).edx), (2, 4, 3));
        assert_eq!(e(0xb, 0).flags & FLAG_INDEX, FLAG_INDEX);
        assert_eq!(e(TIMING_LEAF, 0).eax, 2_596_000);
        assert_eq!(e(0x4000_0000, 0).eax, TIMING_LEAF);
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
