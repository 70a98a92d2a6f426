//! The console: the guest's COM1 and its output on the way to stdout or `--console FILE`,
//! capped (a guest that prints without end cannot fill the host's disk), watched for the
//! lines of a guest's fault, its first byte stamped (the launch's "first output").

use std::io::Write;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

use devices::Bus;
use devices::serial::{COM1_IRQ, COM1_LEN, COM1_PORT, SerialPort};

use crate::kvm::{Vm, VmError};
use crate::sys::timeline::Stamp;

/// Why the console could not be wired.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// KVM refused its interrupt line.
    #[error("{0}")]
    Vm(#[from] VmError),
    /// The bus refused its ports.
    #[error("{0}")]
    Bus(#[from] devices::BusError),
}

/// The console's parts the launch keeps.
pub struct AttachedConsole {
    /// COM1 (the vCPUs reach it through the port bus; the launch flushes it at the end).
    pub serial: Arc<Mutex<SerialPort>>,
    /// When the guest's first byte went by.
    pub first_byte: Arc<OnceLock<Stamp>>,
    /// Lines of the guest's console that report a fatal signal or an Oops
    /// ([`FAULT_LINES`]).
    pub guest_faults: Arc<AtomicU64>,
}

/// COM1 on `pio` with its interrupt, writing to `out` at most `limit` bytes.
pub fn attach(
    vm: &Vm,
    pio: &mut Bus,
    out: Box<dyn Write + Send>,
    limit: u64,
) -> Result<AttachedConsole, ConsoleError> {
    let irq = vm.irq_line(COM1_IRQ)?;
    let first_byte = Arc::new(OnceLock::new());
    let guest_faults = Arc::new(AtomicU64::new(0));
    let out = Box::new(FirstByte {
        inner: Box::new(FaultWatch::new(
            Box::new(Capped::new(out, limit)),
            guest_faults.clone(),
        )),
        at: first_byte.clone(),
    });
    let serial = Arc::new(Mutex::new(SerialPort::new(Box::new(irq), out)));
    pio.insert("serial", COM1_PORT, COM1_LEN, serial.clone())?;
    Ok(AttachedConsole {
        serial,
        first_byte,
        guest_faults,
    })
}

/// Passes output through and notes when the first byte went by.
struct FirstByte {
    inner: Box<dyn Write + Send>,
    at: Arc<OnceLock<Stamp>>,
}

impl Write for FirstByte {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        // One stamp (a CPU clock read is a system call), at the first byte.
        if !b.is_empty() && self.at.get().is_none() {
            let _ = self.at.set(Stamp::now());
        }
        self.inner.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

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

/// What a Linux guest's console says when one of its processes dies of a fatal signal
/// (with `print-fatal-signals=1` for the second) or its kernel trips.
pub const FAULT_LINES: [&str; 4] = [
    "segfault at",
    "potentially unexpected fatal signal",
    "general protection fault",
    "Oops:",
];

/// Passes everything to `inner` and counts the lines that contain one of [`FAULT_LINES`]
/// (the vCPUs dump their SYSCALL repair's recent debug exits when it is not 0).
pub struct FaultWatch {
    inner: Box<dyn Write + Send>,
    line: Vec<u8>,
    seen: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl FaultWatch {
    /// Longest line kept for matching; longer ones are matched on their first bytes.
    const LINE: usize = 512;

    /// Watches what goes to `inner`, counting into `seen`.
    pub fn new(
        inner: Box<dyn Write + Send>,
        seen: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        Self {
            inner,
            line: Vec::with_capacity(Self::LINE),
            seen,
        }
    }
}

impl Write for FaultWatch {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        for &c in b {
            if c == b'\n' {
                let line = String::from_utf8_lossy(&self.line);
                if FAULT_LINES.iter().any(|f| line.contains(f)) {
                    self.seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                self.line.clear();
            } else if self.line.len() < Self::LINE {
                self.line.push(c);
            }
        }
        self.inner.write(b)
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

    #[test]
    fn fault_lines_are_counted_across_writes() {
        let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut w = FaultWatch::new(Box::new(std::io::sink()), seen.clone());
        w.write_all(b"[  1.0] dd[77]: segf").unwrap();
        w.write_all(b"ault at 0 ip 0 sp 0 error 4\n[  1.1] ok\n")
            .unwrap();
        w.write_all(b"potentially unexpected fatal signal 11.\r\n")
            .unwrap();
        assert_eq!(seen.load(std::sync::atomic::Ordering::Relaxed), 2);
        // A line longer than the buffer still counts by its start.
        let mut long = b"Oops: ".to_vec();
        long.extend(vec![b'x'; 4000]);
        long.push(b'\n');
        w.write_all(&long).unwrap();
        assert_eq!(seen.load(std::sync::atomic::Ordering::Relaxed), 3);
    }
}
