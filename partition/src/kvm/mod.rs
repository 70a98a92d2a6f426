//! Everything that talks to KVM: the VM ([`vm`]: irqchip, memory slots, interrupt lines,
//! doorbells, vCPU creation with CPUID and LAPIC), the vCPU thread ([`vcpu`]: KVM_RUN and
//! what it needs of the vCPU's state) and KVM's binary statistics ([`stats`]). The rest of
//! the crate asks these by meaning (`Vm::irq_line`, `Vm::bind_doorbell`, `idle_caps`) and
//! never issues an ioctl itself.

pub mod stats;
pub mod vcpu;
pub mod vm;

pub use vm::{Vm, VmError, idle_caps};
