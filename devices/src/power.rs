//! Power-off paths.
//!
//! - [`AcpiPm`]: the hardware-reduced ACPI sleep control/status registers the FADT names
//!   (ports 0x600/0x601). Linux's `poweroff` writes `SLP_TYP << 2 | SLP_EN`; type 5 (S5,
//!   from the DSDT's `\_S5_`) powers off.
//! - [`DebugExit`]: port 0xf4, compatible with QEMU's isa-debug-exit. A byte written there
//!   powers off with that byte as the guest's exit status (the probe guest's way out).

use crate::{BusDevice, VmEvent};

/// Sleep control register port (FADT SLEEP_CONTROL_REG).
pub const ACPI_PM_BASE: u64 = 0x600;
/// Control + status.
pub const ACPI_PM_LEN: u64 = 2;
/// Debug exit port.
pub const DEBUG_EXIT_PORT: u64 = 0xf4;
/// Debug exit window (QEMU's default iosize).
pub const DEBUG_EXIT_LEN: u64 = 4;
const SLP_EN: u8 = 0x20;
const SLP_TYP_S5: u8 = 5;

/// ACPI sleep control/status.
#[derive(Debug, Default)]
pub struct AcpiPm;

impl BusDevice for AcpiPm {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<VmEvent> {
        let v = *data.first()?;
        (offset == 0 && v & SLP_EN != 0 && (v >> 2) & 7 == SLP_TYP_S5)
            .then_some(VmEvent::PowerOff { status: 0 })
    }
}

/// Exit-status port.
#[derive(Debug, Default)]
pub struct DebugExit;

impl BusDevice for DebugExit {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) -> Option<VmEvent> {
        data.first().map(|&status| VmEvent::PowerOff { status })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s5_powers_off_other_states_do_not() {
        let mut pm = AcpiPm;
        assert_eq!(pm.write(0, &[0x34]), Some(VmEvent::PowerOff { status: 0 }));
        assert_eq!(pm.write(0, &[0x14]), None); // S5 without SLP_EN
        assert_eq!(pm.write(0, &[0x2c]), None); // S3
        assert_eq!(pm.write(1, &[0x34]), None); // status register
        assert_eq!(pm.write(0, &[]), None);
    }

    #[test]
    fn debug_exit_carries_status() {
        let mut d = DebugExit;
        assert_eq!(d.write(0, &[7]), Some(VmEvent::PowerOff { status: 7 }));
        assert_eq!(
            d.write(0, &[0, 0, 0, 0]),
            Some(VmEvent::PowerOff { status: 0 })
        );
        assert_eq!(d.write(0, &[]), None);
    }
}
