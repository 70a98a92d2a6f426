//! The part of an i8042 keyboard controller a guest needs: its reset line.
//!
//! Writing 0xfe to the command port (0x64) pulses the CPU reset line; Linux uses it for
//! `reboot=k`, and our ACPI FADT names it as the reset register. Status reads say "no data,
//! input buffer empty" so drivers probing the controller move on.

use crate::{BusDevice, VmEvent};

/// Data port.
pub const I8042_DATA: u64 = 0x60;
/// Base of the window (data port through command port).
pub const I8042_BASE: u64 = 0x60;
/// Window length (0x60..=0x64).
pub const I8042_LEN: u64 = 5;
const CMD_OFFSET: u64 = 4;
const CMD_RESET: u8 = 0xfe;

/// The controller.
#[derive(Debug, Default)]
pub struct I8042;

impl BusDevice for I8042 {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<VmEvent> {
        (offset == CMD_OFFSET && data.first() == Some(&CMD_RESET)).then_some(VmEvent::Reset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_line() {
        let mut k = I8042;
        assert_eq!(k.write(4, &[0xfe]), Some(VmEvent::Reset));
        assert_eq!(k.write(4, &[0xad]), None);
        assert_eq!(k.write(0, &[0xfe]), None);
        let mut s = [0xffu8];
        k.read(4, &mut s);
        assert_eq!(s, [0]);
    }
}
