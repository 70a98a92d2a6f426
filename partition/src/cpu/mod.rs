//! The CPU a guest sees and what its exits mean: the CPU model and CPUID, the idle
//! policies and what KVM reports back about them, the pure exit handler ([`exits`]), the
//! instruction assists and the SYSCALL repair. Nothing here issues an ioctl: [`crate::kvm`]
//! carries out what these decide.

pub mod assist;
pub mod cpuid;
pub mod cpumodel;
pub mod exits;
pub mod guest_idle;
pub mod idle;
pub mod readback;
pub mod syscall;
