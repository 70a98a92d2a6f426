//! The guest's serial output on its way to stdout or `--console FILE`: capped, so a guest
//! that prints without end cannot fill the host's disk.

use std::io::Write;

/// Default cap on what a guest may write to its console (`--console-limit`).
pub const DEFAULT_LIMIT: u64 = 64 << 20;

/// Passes at most `limit` bytes to `inner`; the rest is dropped (the guest's writes still
/// succeed, a serial port has no error to give), and the drop is said once.
pub struct Capped {
    inner: Box<dyn Write + Send>,
    limit: u64,
    written: u64,
    said: bool,
}

impl Capped {
    /// Caps `inner` at `limit` bytes.
    pub fn new(inner: Box<dyn Write + Send>, limit: u64) -> Self {
        Self {
            inner,
            limit,
            written: 0,
            said: false,
        }
    }
}

impl Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let room = self.limit.saturating_sub(self.written);
        let take = (b.len() as u64).min(room) as usize;
        if take > 0 {
            let n = self.inner.write(&b[..take])?;
            self.written += n as u64;
            if n < take {
                return Ok(n);
            }
        }
        if take < b.len() && !self.said {
            self.said = true;
            log::warn!(
                "the guest's console output passed {} bytes (--console-limit); the rest is dropped",
                self.limit
            );
            let _ = self.inner.flush();
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn passes_the_limit_and_not_a_byte_more() {
        let sink = Sink::default();
        let mut c = Capped::new(Box::new(sink.clone()), 10);
        assert_eq!(c.write(b"hello ").unwrap(), 6);
        // Across the limit: the whole write "succeeds", only its first 4 bytes pass.
        assert_eq!(c.write(b"world and more").unwrap(), 14);
        for _ in 0..1000 {
            assert_eq!(c.write(&[b'x'; 4096]).unwrap(), 4096);
        }
        assert_eq!(sink.0.lock().unwrap().as_slice(), b"hello worl");
        assert!(c.said);
    }
}
