//! An MSI capability (PCI Local Bus 3.0, 6.8.1), emulated for a passed-through function
//! that has MSI and no MSI-X (QEMU's edu; many small accelerators). Pure register logic:
//! the guest programs one message (address, data) and the enable bit in configuration
//! space; [`Msi::update`] says when the route in front of the function's one interrupt
//! line must change. Nothing of it reaches the device: the host's VFIO driver programs the
//! device's own MSI with the host's message, and KVM turns that interrupt into the guest's.
//!
//! The guest sees one message only (Multiple Message Capable 0, so Multiple Message Enable
//! stays 0) and no per-vector masking, whatever the device offers: one vector is what the
//! VMM routes. The address width (32 or 64 bits) is the device's, so the capability keeps
//! the device's size and offsets.

use super::msix::{MsiMessage, RouteChange};

/// MSI's capability id.
pub const CAP_MSI: u8 = 0x05;
/// Message control: MSI enable.
pub const CONTROL_ENABLE: u16 = 1;
/// Message control: 64-bit address capable.
pub const CONTROL_64BIT: u16 = 1 << 7;

/// The emulated capability's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msi {
    is64: bool,
    /// The route installed now (None: MSI off).
    route: Option<MsiMessage>,
}

impl Msi {
    /// The capability for a device whose own message control is `control` (only its
    /// 64-bit bit is kept), MSI off.
    pub fn new(control: u16) -> Self {
        Self {
            is64: control & CONTROL_64BIT != 0,
            route: None,
        }
    }

    /// Bytes of the capability, id and next pointer included: 10 (32-bit) or 14 (64-bit).
    pub fn len(&self) -> usize {
        if self.is64 { 14 } else { 10 }
    }

    /// Always false: a capability has its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The capability body after the id and next pointer (message control, address,
    /// [address high,] data) and its write mask: the enable bit, the address (dword
    /// aligned), the data.
    pub fn capability(&self) -> (Vec<u8>, Vec<u8>) {
        let control = if self.is64 { CONTROL_64BIT } else { 0 };
        let mut body = vec![0u8; self.len() - 2];
        body[0..2].copy_from_slice(&control.to_le_bytes());
        let mut mask = vec![0u8; body.len()];
        mask[0] = CONTROL_ENABLE as u8;
        mask[2..6].copy_from_slice(&0xffff_fffc_u32.to_le_bytes());
        let data_at = if self.is64 {
            mask[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
            10
        } else {
            6
        };
        mask[data_at..data_at + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        (body, mask)
    }

    /// The message the capability's bytes `cap` (id and next pointer first, as
    /// [`Msi::len`] long) describe, if MSI is enabled. Short bytes read as MSI off.
    pub fn message(&self, cap: &[u8]) -> Option<MsiMessage> {
        if cap.len() < self.len() {
            return None;
        }
        let control = u16::from_le_bytes([cap[2], cap[3]]);
        if control & CONTROL_ENABLE == 0 {
            return None;
        }
        let lo = u32::from_le_bytes([cap[4], cap[5], cap[6], cap[7]]);
        let (hi, data_at) = if self.is64 {
            (u32::from_le_bytes([cap[8], cap[9], cap[10], cap[11]]), 12)
        } else {
            (0, 8)
        };
        Some(MsiMessage {
            address: u64::from(hi) << 32 | u64::from(lo),
            data: u32::from(u16::from_le_bytes([cap[data_at], cap[data_at + 1]])),
        })
    }

    /// The guest wrote the capability, which now holds `cap`: the route change to follow,
    /// if the message or the enable bit changed.
    pub fn update(&mut self, cap: &[u8]) -> Option<RouteChange> {
        let now = self.message(cap);
        if now == self.route {
            return None;
        }
        self.route = now;
        Some(RouteChange {
            vector: 0,
            route: now,
            fire_pending: false,
        })
    }

    /// Whether MSI is enabled.
    pub fn enabled(&self) -> bool {
        self.route.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(m: &Msi, control: u16, addr: u64, data: u16) -> Vec<u8> {
        let mut c = vec![CAP_MSI, 0];
        c.extend_from_slice(&control.to_le_bytes());
        c.extend_from_slice(&(addr as u32).to_le_bytes());
        if m.is64 {
            c.extend_from_slice(&((addr >> 32) as u32).to_le_bytes());
        }
        c.extend_from_slice(&data.to_le_bytes());
        c.resize(m.len(), 0);
        c
    }

    #[test]
    fn the_guest_sees_one_message_of_the_devices_width_and_may_write_only_its_fields() {
        // edu's control: 64-bit, 1 message capable, no per-vector masking.
        let m = Msi::new(0x0080);
        assert_eq!(m.len(), 14);
        let (body, mask) = m.capability();
        assert_eq!(body.len(), 12);
        // 64-bit kept, Multiple Message Capable 0, per-vector masking off.
        assert_eq!(u16::from_le_bytes([body[0], body[1]]), CONTROL_64BIT);
        // Writable: the enable bit only of control, the address (dword aligned), the data.
        assert_eq!(&mask[0..2], &[1, 0]);
        assert_eq!(&mask[2..6], &[0xfc, 0xff, 0xff, 0xff]);
        assert_eq!(&mask[6..10], &[0xff; 4]);
        assert_eq!(&mask[10..12], &[0xff, 0xff]);
        // A device with 32 messages and per-vector masking is shown with one and none.
        let m32 = Msi::new(0x010a);
        assert_eq!(m32.len(), 10);
        let (b, k) = m32.capability();
        assert_eq!((b[0], b[1]), (0, 0));
        assert_eq!(&k[6..8], &[0xff, 0xff]);
    }

    #[test]
    fn enabling_programs_the_route_and_disabling_takes_it_away() {
        let mut m = Msi::new(CONTROL_64BIT);
        // Address and data written with MSI still off: nothing to route.
        assert_eq!(m.update(&cap(&m, 0, 0xfee0_1000, 0x61)), None);
        assert!(!m.enabled());
        let on = m.update(&cap(&m, CONTROL_ENABLE, 0xfee0_1000, 0x61));
        let msg = MsiMessage {
            address: 0xfee0_1000,
            data: 0x61,
        };
        assert_eq!(
            on,
            Some(RouteChange {
                vector: 0,
                route: Some(msg),
                fire_pending: false
            })
        );
        // The same bytes again: no change.
        assert_eq!(m.update(&cap(&m, CONTROL_ENABLE, 0xfee0_1000, 0x61)), None);
        // A new data value while enabled: the route follows.
        let moved = m.update(&cap(&m, CONTROL_ENABLE, 0xfee0_1000, 0x62));
        assert_eq!(moved.and_then(|c| c.route).map(|r| r.data), Some(0x62));
        // The high address dword counts on a 64-bit capability.
        let high = m.update(&cap(&m, CONTROL_ENABLE, 0x1_fee0_1000, 0x62));
        assert_eq!(
            high.and_then(|c| c.route).map(|r| r.address),
            Some(0x1_fee0_1000)
        );
        let off = m.update(&cap(&m, 0, 0x1_fee0_1000, 0x62));
        assert_eq!(off.map(|c| c.route), Some(None));
        assert!(!m.enabled());
    }

    #[test]
    fn a_32_bit_capability_reads_its_data_after_the_low_address_and_short_bytes_are_off() {
        let mut m = Msi::new(0);
        let c = cap(&m, CONTROL_ENABLE, 0xfee0_0000, 0x41);
        assert_eq!(c.len(), 10);
        let r = m.update(&c).and_then(|c| c.route);
        assert_eq!(
            r,
            Some(MsiMessage {
                address: 0xfee0_0000,
                data: 0x41
            })
        );
        assert_eq!(m.message(&c[..9]), None);
    }
}
