//! The devices of a partition and the bus that routes guest accesses to them.
//!
//! Devices see offsets, never absolute addresses, and know nothing of KVM: register logic
//! takes (offset, bytes) and raises interrupts through [`Interrupt`], so it is unit-tested
//! without a VM. The vCPU loop turns [`VmEvent`]s into teardown.

pub mod bus;
#[doc(hidden)]
pub mod fuzzing;
pub mod i8042;
pub mod pci;
pub mod power;
pub mod ratelimit;
pub mod rtc;
pub mod serial;
pub mod virtio;

pub use bus::{Bus, BusDevice, BusError};

/// Something a device asks of the VM as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmEvent {
    /// The guest powered off; `status` is what it reported (0 for a plain ACPI power-off).
    PowerOff {
        /// Exit status byte.
        status: u8,
    },
    /// The guest asked for a reset.
    Reset,
}

/// An interrupt line a device can raise.
pub trait Interrupt: Send {
    /// Raises the line (edge).
    fn trigger(&self) -> std::io::Result<()>;
}

impl Interrupt for vmm_sys_util::eventfd::EventFd {
    fn trigger(&self) -> std::io::Result<()> {
        self.write(1)
    }
}
