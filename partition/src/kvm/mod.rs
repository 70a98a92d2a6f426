//! Everything that talks to KVM: the VM ([`vm`]: irqchip, memory slots, interrupt lines,
//! doorbells, vCPU creation with CPUID and LAPIC), the vCPU thread ([`vcpu`]: KVM_RUN and
//! what it needs of the vCPU's state) and KVM's binary statistics ([`stats`]). The rest of
//! the crate asks these by meaning (`Vm::irq_line`, `Vm::bind_doorbell`, `idle_caps`) and
//! never issues an ioctl itself.

pub mod apic;
pub mod regs;
pub mod stats;
pub mod syscall;
pub mod vcpu;
pub mod vm;

pub use vm::{IOAPIC_PINS, Route, Vm, VmError, idle_caps, routing_table};

/// The VM ioctls a vCPU thread issues when the guest reprograms a PCI function: the GSI
/// routing table (MSI-X), ioeventfds and memory slots (a moved doorbell BAR).
pub fn vm_device_ioctls() -> Vec<(&'static str, u64)> {
    use kvm_bindings::{kvm_ioeventfd, kvm_irq_routing, kvm_userspace_memory_region};
    const KVMIO: u32 = 0xae;
    vmm_sys_util::ioctl_iow_nr!(
        KVM_SET_USER_MEMORY_REGION,
        KVMIO,
        0x46,
        kvm_userspace_memory_region
    );
    vmm_sys_util::ioctl_iow_nr!(KVM_SET_GSI_ROUTING, KVMIO, 0x6a, kvm_irq_routing);
    vmm_sys_util::ioctl_iow_nr!(KVM_IOEVENTFD, KVMIO, 0x79, kvm_ioeventfd);
    vec![
        ("KVM_SET_USER_MEMORY_REGION", KVM_SET_USER_MEMORY_REGION()),
        ("KVM_SET_GSI_ROUTING", KVM_SET_GSI_ROUTING()),
        ("KVM_IOEVENTFD", KVM_IOEVENTFD()),
    ]
}

/// The KVM ioctl request numbers a vCPU thread issues once it runs: `KVM_RUN`, and the
/// register, event, MSR, XSAVE, translation and debug calls the instruction assists, the
/// SYSCALL repair and the crash report make. Its seccomp filter allows these and no other
/// ioctl (docs/security.md).
pub fn vcpu_thread_ioctls() -> Vec<(&'static str, u64)> {
    use kvm_bindings::{
        kvm_guest_debug, kvm_msrs, kvm_regs, kvm_sregs, kvm_translation, kvm_vcpu_events, kvm_xsave,
    };
    const KVMIO: u32 = 0xae;
    vmm_sys_util::ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
    vmm_sys_util::ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
    vmm_sys_util::ioctl_iow_nr!(KVM_SET_REGS, KVMIO, 0x82, kvm_regs);
    vmm_sys_util::ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_sregs);
    vmm_sys_util::ioctl_iow_nr!(KVM_SET_SREGS, KVMIO, 0x84, kvm_sregs);
    vmm_sys_util::ioctl_iowr_nr!(KVM_TRANSLATE, KVMIO, 0x85, kvm_translation);
    vmm_sys_util::ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_msrs);
    vmm_sys_util::ioctl_iow_nr!(KVM_SET_MSRS, KVMIO, 0x89, kvm_msrs);
    vmm_sys_util::ioctl_iow_nr!(KVM_SET_GUEST_DEBUG, KVMIO, 0x9b, kvm_guest_debug);
    vmm_sys_util::ioctl_ior_nr!(KVM_GET_VCPU_EVENTS, KVMIO, 0x9f, kvm_vcpu_events);
    vmm_sys_util::ioctl_iow_nr!(KVM_SET_VCPU_EVENTS, KVMIO, 0xa0, kvm_vcpu_events);
    vmm_sys_util::ioctl_ior_nr!(KVM_GET_XSAVE, KVMIO, 0xa4, kvm_xsave);
    vmm_sys_util::ioctl_iow_nr!(KVM_SET_XSAVE, KVMIO, 0xa5, kvm_xsave);
    [
        ("KVM_RUN", KVM_RUN()),
        ("KVM_GET_REGS", KVM_GET_REGS()),
        ("KVM_SET_REGS", KVM_SET_REGS()),
        ("KVM_GET_SREGS", KVM_GET_SREGS()),
        ("KVM_SET_SREGS", KVM_SET_SREGS()),
        ("KVM_TRANSLATE", KVM_TRANSLATE()),
        ("KVM_GET_MSRS", KVM_GET_MSRS()),
        ("KVM_SET_MSRS", KVM_SET_MSRS()),
        ("KVM_SET_GUEST_DEBUG", KVM_SET_GUEST_DEBUG()),
        ("KVM_GET_VCPU_EVENTS", KVM_GET_VCPU_EVENTS()),
        ("KVM_SET_VCPU_EVENTS", KVM_SET_VCPU_EVENTS()),
        ("KVM_GET_XSAVE", KVM_GET_XSAVE()),
        ("KVM_SET_XSAVE", KVM_SET_XSAVE()),
    ]
    .to_vec()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_vcpu_ioctl_numbers_are_the_kernels() {
        // From <linux/kvm.h> as the kernel computes them on x86-64.
        let n: Vec<u64> = super::vcpu_thread_ioctls()
            .iter()
            .map(|&(_, n)| n)
            .collect();
        for want in [
            0xae80u64,   // KVM_RUN
            0x8090_ae81, // KVM_GET_REGS (144 bytes)
            0x4090_ae82, // KVM_SET_REGS
            0x8138_ae83, // KVM_GET_SREGS (312 bytes)
            0xc018_ae85, // KVM_TRANSLATE
            0xc008_ae88, // KVM_GET_MSRS
            0x4048_ae9b, // KVM_SET_GUEST_DEBUG (72 bytes)
            0x8040_ae9f, // KVM_GET_VCPU_EVENTS
            0x9000_aea4, // KVM_GET_XSAVE (4096 bytes)
            0x5000_aea5, // KVM_SET_XSAVE
        ] {
            assert!(n.contains(&want), "{want:#x} missing from {n:x?}");
        }
        assert_eq!(n.len(), 13);
    }
}
