//! Line-buffered output on COM1, one `rep outsb` per line.

use core::fmt;

const COM1: u16 = 0x3f8;

/// A console writer with a line buffer.
pub struct Console {
    buf: [u8; 256],
    len: usize,
}

impl Console {
    /// An empty console.
    pub const fn new() -> Self {
        Self {
            buf: [0; 256],
            len: 0,
        }
    }

    /// Sends what is buffered.
    pub fn flush(&mut self) {
        crate::sys::outsb(COM1, &self.buf[..self.len]);
        self.len = 0;
    }
}

impl fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for &b in s.as_bytes() {
            if self.len == self.buf.len() {
                self.flush();
            }
            self.buf[self.len] = b;
            self.len += 1;
            if b == b'\n' {
                self.flush();
            }
        }
        Ok(())
    }
}

/// Prints a line prefixed with `probe: `.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use core::fmt::Write as _;
        let mut c = $crate::console::Console::new();
        let _ = c.write_str("probe: ");
        let _ = c.write_fmt(format_args!($($arg)*));
        let _ = c.write_str("\n");
        c.flush();
    }};
}
