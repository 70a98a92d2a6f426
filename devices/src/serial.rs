//! COM1: a 16550A-compatible UART (vm-superio's register model) on port 0x3f8, IRQ 4.
//! Output goes to the VMM's stdout or a console file; input is not wired.

use std::io::Write;

use vm_superio::{Serial, Trigger};

use crate::ratelimit::RateLimiter;
use crate::{BusDevice, Interrupt, VmEvent, warn_ratelimited};

/// COM1 base port.
pub const COM1_PORT: u64 = 0x3f8;
/// COM1 register window.
pub const COM1_LEN: u64 = 8;
/// COM1 interrupt (ISA IRQ 4).
pub const COM1_IRQ: u32 = 4;

/// Adapts an [`Interrupt`] to vm-superio's trigger.
pub struct IrqLine(Box<dyn Interrupt>);

impl Trigger for IrqLine {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.trigger()
    }
}

/// The UART with its output sink.
pub struct SerialPort {
    uart: Serial<IrqLine, vm_superio::serial::NoEvents, Box<dyn Write + Send>>,
    errors: RateLimiter,
}

impl SerialPort {
    /// A UART raising `irq` and writing to `out`.
    pub fn new(irq: Box<dyn Interrupt>, out: Box<dyn Write + Send>) -> Self {
        Self {
            uart: Serial::new(IrqLine(irq), out),
            errors: RateLimiter::new(1, std::time::Duration::from_secs(10)),
        }
    }

    /// Flushes the output sink.
    pub fn flush(&mut self) {
        let _ = self.uart.writer_mut().flush();
    }
}

impl BusDevice for SerialPort {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        // Registers are bytes; wider accesses read the first register, the rest is ones.
        data.fill(0xff);
        if let Some(b) = data.first_mut() {
            *b = self.uart.read(offset as u8);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<VmEvent> {
        // String I/O (`rep outsb`) arrives as several bytes for one port.
        for &b in data {
            if let Err(e) = self.uart.write(offset as u8, b) {
                warn_ratelimited!(self.errors, "serial: output failed: {e}");
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
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
    struct Counter(Arc<AtomicU32>);
    impl Interrupt for Counter {
        fn trigger(&self) -> std::io::Result<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn transmits_bytes_and_string_io() {
        let sink = Sink::default();
        let irqs = Arc::new(AtomicU32::new(0));
        let mut s = SerialPort::new(Box::new(Counter(irqs.clone())), Box::new(sink.clone()));
        s.write(0, b"h");
        s.write(0, b"ello\n");
        assert_eq!(sink.0.lock().unwrap().as_slice(), b"hello\n");
        // Line status: transmitter empty.
        let mut lsr = [0u8];
        s.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0);
        // No interrupt until the guest enables one; then THR-empty raises it.
        assert_eq!(irqs.load(Ordering::SeqCst), 0);
        s.write(1, &[0x02]);
        s.write(0, b"x");
        assert!(irqs.load(Ordering::SeqCst) > 0);
    }
}
