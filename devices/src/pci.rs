//! "There is no PCI bus": the PCI configuration mechanism #1 ports (0xcf8-0xcff) answer
//! all ones, the way an empty bus does, so Linux's normal probing is not reported as a
//! guest poking at unknown ports.

use crate::{BusDevice, VmEvent};

/// CONFIG_ADDRESS port.
pub const PCI_CONFIG_BASE: u64 = 0xcf8;
/// CONFIG_ADDRESS + CONFIG_DATA.
pub const PCI_CONFIG_LEN: u64 = 8;

/// An absent PCI host bridge.
#[derive(Debug, Default)]
pub struct NoPci;

impl BusDevice for NoPci {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    fn write(&mut self, _offset: u64, _data: &[u8]) -> Option<VmEvent> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_as_empty_bus() {
        let mut p = NoPci;
        assert_eq!(p.write(0, &[0, 0, 0, 0x80]), None);
        let mut id = [0u8; 4];
        p.read(4, &mut id);
        assert_eq!(u32::from_le_bytes(id), 0xffff_ffff);
    }
}
