//! The CMOS real-time clock at ports 0x70/0x71 (MC146818-compatible), as every PC has.
//!
//! Port 0x70 selects a register (bit 7 is the NMI mask, kept and ignored); port 0x71 reads
//! or writes it. The time registers show the host's clock (UTC) plus an offset the guest
//! sets by writing them; register A never shows an update in progress, register D always
//! says the time is valid, and the other 114 bytes are plain CMOS RAM. No interrupts (IRQ
//! 8): periodic, alarm and update-ended interrupts are not raised.
//!
//! Why it matters: a kernel reading the clock polls register A until the update-in-progress
//! bit clears; unclaimed ports read all ones, which says "updating" forever.

use crate::{BusDevice, VmEvent};

/// First port (index register).
pub const RTC_PORT: u64 = 0x70;
/// Index + data.
pub const RTC_LEN: u64 = 2;
/// The century register, as the FADT's CENTURY field names it.
pub const CENTURY_REG: u8 = 0x32;

const SECONDS: u8 = 0x00;
const MINUTES: u8 = 0x02;
const HOURS: u8 = 0x04;
const WEEKDAY: u8 = 0x06;
const DAY: u8 = 0x07;
const MONTH: u8 = 0x08;
const YEAR: u8 = 0x09;
const REG_A: u8 = 0x0a;
const REG_B: u8 = 0x0b;
const REG_C: u8 = 0x0c;
const REG_D: u8 = 0x0d;
/// Register A: 32.768 kHz time base, 1024 Hz rate; bit 7 (UIP) always clear.
const REG_A_VALUE: u8 = 0x26;
/// Register B: binary (else BCD).
const B_BINARY: u8 = 1 << 2;
/// Register B: 24-hour (else 12-hour, bit 7 of the hour = PM).
const B_24H: u8 = 1 << 1;
/// Register D: valid RAM and time.
const REG_D_VRT: u8 = 0x80;

/// Where the RTC gets the time: seconds since the Unix epoch.
pub type Clock = fn() -> i64;

/// The host's clock.
pub fn system_clock() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A civil date and time (UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DateTime {
    year: i64,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
    /// 1 = Sunday.
    weekday: u8,
}

/// Days since 1970-01-01 to a (year, month, day) (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u8, u8) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// (year, month, day) to days since 1970-01-01.
fn days_from_civil(y: i64, m: u8, d: u8) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

impl DateTime {
    fn from_unix(t: i64) -> Self {
        let days = t.div_euclid(86_400);
        let secs = t.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        Self {
            year,
            month,
            day,
            hour: (secs / 3600) as u8,
            minute: (secs / 60 % 60) as u8,
            second: (secs % 60) as u8,
            // 1970-01-01 was a Thursday (5 when Sunday is 1).
            weekday: ((days + 4).rem_euclid(7) + 1) as u8,
        }
    }

    fn to_unix(self) -> i64 {
        days_from_civil(self.year, self.month, self.day) * 86_400
            + self.hour as i64 * 3600
            + self.minute as i64 * 60
            + self.second as i64
    }
}

fn to_bcd(v: u8) -> u8 {
    ((v / 10) << 4) | (v % 10)
}

fn from_bcd(v: u8) -> u8 {
    (v >> 4) * 10 + (v & 0xf)
}

/// The CMOS RTC.
pub struct Rtc {
    index: u8,
    /// Guest time minus host time, in seconds.
    offset: i64,
    reg_b: u8,
    ram: [u8; 128],
    clock: Clock,
}

impl Rtc {
    /// An RTC showing `clock`'s time.
    pub fn new(clock: Clock) -> Self {
        Self {
            index: 0,
            offset: 0,
            reg_b: B_24H,
            ram: [0; 128],
            clock,
        }
    }

    fn now(&self) -> DateTime {
        DateTime::from_unix((self.clock)().saturating_add(self.offset))
    }

    fn encode(&self, v: u8) -> u8 {
        if self.reg_b & B_BINARY != 0 {
            v
        } else {
            to_bcd(v)
        }
    }

    fn decode(&self, v: u8) -> u8 {
        if self.reg_b & B_BINARY != 0 {
            v
        } else {
            from_bcd(v)
        }
    }

    fn read_reg(&mut self, reg: u8) -> u8 {
        let t = self.now();
        match reg {
            SECONDS => self.encode(t.second),
            MINUTES => self.encode(t.minute),
            HOURS if self.reg_b & B_24H != 0 => self.encode(t.hour),
            HOURS => {
                let h12 = match t.hour % 12 {
                    0 => 12,
                    h => h,
                };
                self.encode(h12) | if t.hour >= 12 { 0x80 } else { 0 }
            }
            WEEKDAY => self.encode(t.weekday),
            DAY => self.encode(t.day),
            MONTH => self.encode(t.month),
            YEAR => self.encode(t.year.rem_euclid(100) as u8),
            CENTURY_REG => self.encode(t.year.div_euclid(100).clamp(0, 99) as u8),
            REG_A => REG_A_VALUE,
            REG_B => self.reg_b,
            REG_C => 0,
            REG_D => REG_D_VRT,
            r => self.ram[r as usize & 0x7f],
        }
    }

    /// Sets one field of the current time; the rest of the time keeps running.
    fn write_time(&mut self, reg: u8, raw: u8) {
        let mut t = self.now();
        let v = self.decode(raw & if reg == HOURS { 0x7f } else { 0xff });
        match reg {
            SECONDS if v < 60 => t.second = v,
            MINUTES if v < 60 => t.minute = v,
            HOURS if self.reg_b & B_24H != 0 && v < 24 => t.hour = v,
            HOURS if (1..=12).contains(&v) => {
                t.hour = v % 12 + if raw & 0x80 != 0 { 12 } else { 0 }
            }
            DAY if (1..=31).contains(&v) => t.day = v,
            MONTH if (1..=12).contains(&v) => t.month = v,
            YEAR if v < 100 => t.year = t.year.div_euclid(100) * 100 + v as i64,
            CENTURY_REG if v < 100 => t.year = v as i64 * 100 + t.year.rem_euclid(100),
            // Out-of-range values and the weekday (derived from the date) change nothing.
            _ => return,
        }
        self.offset = t.to_unix() - (self.clock)();
    }
}

impl BusDevice for Rtc {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let v = match offset {
            0 => self.index,
            _ => self.read_reg(self.index),
        };
        data.fill(v);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<VmEvent> {
        let &v = data.first()?;
        match offset {
            0 => self.index = v & 0x7f,
            _ => match self.index {
                SECONDS | MINUTES | HOURS | DAY | MONTH | YEAR | CENTURY_REG => {
                    self.write_time(self.index, v)
                }
                REG_B => self.reg_b = v,
                WEEKDAY | REG_A | REG_C | REG_D => {}
                r => self.ram[r as usize] = v,
            },
        }
        // The guest may hold SET (register B bit 7) while it writes the time field by
        // field; each write already moved the offset, so releasing it changes nothing.
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-01 09:25:49 UTC, a Tuesday.
    const T0: i64 = 1_796_117_149;

    fn fixed() -> i64 {
        T0
    }

    fn reg(rtc: &mut Rtc, r: u8) -> u8 {
        rtc.write(0, &[r]);
        let mut b = [0u8];
        rtc.read(1, &mut b);
        b[0]
    }

    fn set(rtc: &mut Rtc, r: u8, v: u8) {
        rtc.write(0, &[r]);
        rtc.write(1, &[v]);
    }

    #[test]
    fn reads_the_host_time_in_bcd() {
        let mut rtc = Rtc::new(fixed);
        assert_eq!(reg(&mut rtc, SECONDS), 0x49);
        assert_eq!(reg(&mut rtc, MINUTES), 0x25);
        assert_eq!(reg(&mut rtc, HOURS), 0x09);
        assert_eq!(reg(&mut rtc, DAY), 0x01);
        assert_eq!(reg(&mut rtc, MONTH), 0x12);
        assert_eq!(reg(&mut rtc, YEAR), 0x26);
        assert_eq!(reg(&mut rtc, CENTURY_REG), 0x20);
        assert_eq!(
            reg(&mut rtc, WEEKDAY),
            3,
            "Tuesday is day 3 when Sunday is 1"
        );
        // Never updating, always valid: the two bits a kernel waits on.
        assert_eq!(reg(&mut rtc, REG_A) & 0x80, 0);
        assert_eq!(reg(&mut rtc, REG_D), REG_D_VRT);
    }

    #[test]
    fn binary_and_12_hour_modes() {
        let mut rtc = Rtc::new(fixed);
        set(&mut rtc, REG_B, B_BINARY | B_24H);
        assert_eq!(reg(&mut rtc, SECONDS), 49);
        assert_eq!(reg(&mut rtc, YEAR), 26);
        set(&mut rtc, REG_B, 0);
        assert_eq!(reg(&mut rtc, HOURS), 0x09, "9 AM: no PM bit");
        set(&mut rtc, REG_B, B_24H);
        set(&mut rtc, HOURS, 0x21);
        set(&mut rtc, REG_B, 0);
        assert_eq!(reg(&mut rtc, HOURS), 0x89, "21:xx is 9 PM");
    }

    #[test]
    fn writing_the_time_moves_the_clock_and_keeps_it_running() {
        let mut rtc = Rtc::new(fixed);
        set(&mut rtc, YEAR, 0x30);
        set(&mut rtc, MONTH, 0x02);
        set(&mut rtc, DAY, 0x29); // 2030 is not a leap year: Feb 29 rolls into March 1
        assert_eq!(rtc.offset % 86_400, 0, "only the date moved");
        assert_eq!(reg(&mut rtc, YEAR), 0x30);
        assert_eq!(reg(&mut rtc, MONTH), 0x03);
        assert_eq!(reg(&mut rtc, DAY), 0x01);
        assert_eq!(reg(&mut rtc, SECONDS), 0x49);
        // Nonsense is ignored.
        let before = rtc.offset;
        set(&mut rtc, MINUTES, 0x99);
        set(&mut rtc, MONTH, 0x13);
        set(&mut rtc, WEEKDAY, 0x01);
        assert_eq!(rtc.offset, before);
    }

    #[test]
    fn cmos_ram_and_the_index_register() {
        let mut rtc = Rtc::new(fixed);
        set(&mut rtc, 0x40, 0xab);
        // Bit 7 of the index is the NMI mask, not part of the register number.
        set(&mut rtc, 0x80 | 0x41, 0xcd);
        assert_eq!(reg(&mut rtc, 0x40), 0xab);
        assert_eq!(reg(&mut rtc, 0x41), 0xcd);
        let mut b = [0u8];
        rtc.read(0, &mut b);
        assert_eq!(b[0], 0x41);
        // Empty and wide accesses do not panic.
        assert_eq!(rtc.write(1, &[]), None);
        let mut wide = [0u8; 4];
        rtc.read(1, &mut wide);
        assert_eq!(wide, [0xcd; 4]);
    }

    #[test]
    fn calendar_round_trips() {
        for t in [
            0i64,
            951_782_400, /* 2000-02-29 */
            T0,
            4_102_444_800,
            -86_400,
        ] {
            assert_eq!(DateTime::from_unix(t).to_unix(), t, "{t}");
        }
        let leap = DateTime::from_unix(951_782_400);
        assert_eq!((leap.year, leap.month, leap.day), (2000, 2, 29));
        assert_eq!(
            DateTime::from_unix(0).weekday,
            5,
            "1970-01-01 was a Thursday"
        );
    }
}
