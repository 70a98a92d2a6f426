//! The console as a device kind: the guest's COM1 (`--console`, `--console-limit`), its
//! output on the way to stdout or a file, capped (a guest that prints without end cannot
//! fill the host's disk), watched for the lines of a guest's fault, its first byte stamped
//! (the launch's "first output": both through the board's `GuestOutput`), and its entry
//! in the launch's report (what it passed on and dropped). A launch that asks for no
//! console has one on stdout ([`Kind::implied`]): every board has its COM1, which the ACPI
//! DSDT names.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use boot::acpi::IsaDevice;
use devices::serial::{COM1_IRQ, COM1_LEN, COM1_PORT, SerialPort};

use crate::board::device::{Device, DeviceError, DeviceFds, DeviceReport, FilterOf, Section};
use crate::board::kind::{Attached, Board, DeviceFacts, Kind, KindError, Placed};
use crate::board::resources::{Ask, Needs, Place};
use crate::kvm::VmError;
use crate::sys::files::FileError;
use crate::sys::timeline::Stamp;

/// Why the console could not be opened or wired.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// `--console FILE` was refused or could not be opened.
    #[error("--console {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: FileError,
    },
    /// The plan put it somewhere other than the ISA ports.
    #[error("the console was not placed on the ISA ports")]
    Place,
    /// KVM refused its interrupt line.
    #[error("the console: {0}")]
    Vm(#[from] VmError),
    /// The bus refused its ports.
    #[error("the console: {0}")]
    Bus(#[from] devices::BusError),
}

/// Where the guest's console output goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// The VMM's stdout.
    Stdout,
    /// A file (created or truncated; `/dev/null` or a terminal too).
    File(PathBuf),
}

/// The console a launch asks for (`--console FILE`, `--console-limit BYTES`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Console {
    /// Where its output goes.
    pub output: Output,
    /// Most bytes passed on (the rest is dropped and said once).
    pub limit: u64,
}

impl Default for Console {
    /// On stdout, capped at [`DEFAULT_LIMIT`].
    fn default() -> Self {
        Self {
            output: Output::Stdout,
            limit: DEFAULT_LIMIT,
        }
    }
}

/// The console's key in the launch's JSON report: one object.
pub const SECTION: Section = Section {
    key: "console",
    one: true,
    always: false,
};

/// COM1 as the ACPI DSDT names it: a 16550 at 0x3f8 on ISA line 4.
pub const COM1: IsaDevice = IsaDevice {
    name: "COM1",
    hid: "PNP0501",
    port: COM1_PORT as u16,
    len: COM1_LEN as u8,
    irq: Some(COM1_IRQ),
};

impl Kind for Console {
    const SECTION: Section = SECTION;
    type Opened = Box<dyn Write + Send>;

    /// Every board has its COM1: on stdout when the launch asks for none.
    fn implied() -> Option<Self> {
        Some(Self::default())
    }

    fn written(&self) -> String {
        match &self.output {
            Output::Stdout => "stdout".into(),
            Output::File(p) => p.display().to_string(),
        }
    }

    fn conflict(&self, earlier: &[&Self]) -> Option<String> {
        (!earlier.is_empty()).then(|| "one console per partition".into())
    }

    /// COM1's ports and line.
    fn ask(&self, _index: usize, _facts: &DeviceFacts) -> Ask {
        Ask {
            owner: "the console".into(),
            written: self.written(),
            needs: Needs::Isa(COM1),
        }
    }

    /// Its output: stdout, or the file opened without waiting ([`open_file`]).
    fn open(all: &[&Self]) -> Result<Vec<Box<dyn Write + Send>>, KindError> {
        all.iter()
            .map(|c| -> Result<Box<dyn Write + Send>, KindError> {
                match &c.output {
                    Output::Stdout => Ok(Box::new(std::io::stdout())),
                    Output::File(p) => {
                        let f = open_file(p).map_err(|e| KindError::new(e, true))?;
                        Ok(Box::new(std::io::LineWriter::new(f)))
                    }
                }
            })
            .collect()
    }

    fn attach(board: &mut Board<'_>, all: Vec<Placed<Self>>) -> Result<Attached, KindError> {
        let mut out = Attached::default();
        for p in all {
            let host = |e: ConsoleError| KindError::new(e, false);
            let Place::Isa(at) = p.place else {
                return Err(host(ConsoleError::Place));
            };
            let d = attach(board, at, p.opened, &p.request).map_err(host)?;
            out.devices.push(Box::new(d));
        }
        Ok(out)
    }
}

/// An attached console.
pub struct AttachedConsole {
    /// The UART (the vCPUs reach it through the port bus; flushed when it stops).
    serial: Arc<Mutex<SerialPort>>,
    /// What was asked.
    request: Console,
    /// What went by.
    counts: Arc<Counts>,
}

/// The console's entry in the launch's report.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConsoleEntry {
    /// Where its output went (`stdout` or the file).
    pub output: String,
    /// `--console-limit`.
    pub limit: u64,
    /// Bytes passed on.
    pub written: u64,
    /// Bytes dropped past the limit.
    pub dropped: u64,
}

/// COM1 at `at` on `board`'s port bus with its interrupt, writing to `out` at most
/// `request.limit` bytes, its first byte and fault lines told to the board's
/// `GuestOutput`.
fn attach(
    board: &mut Board<'_>,
    at: IsaDevice,
    out: Box<dyn Write + Send>,
    request: &Console,
) -> Result<AttachedConsole, ConsoleError> {
    let irq = board.vm.irq_line(at.irq.unwrap_or(COM1_IRQ))?;
    let capped = Capped::new(out, request.limit);
    let counts = capped.counts();
    let out = Box::new(FirstByte {
        inner: Box::new(FaultWatch::new(
            Box::new(capped),
            board.output.fault_lines.clone(),
        )),
        at: board.output.first_byte.clone(),
    });
    let serial = Arc::new(Mutex::new(SerialPort::new(Box::new(irq), out)));
    board.pio.insert(
        "serial",
        u64::from(at.port),
        u64::from(at.len),
        serial.clone(),
    )?;
    Ok(AttachedConsole {
        serial,
        request: request.clone(),
        counts,
    })
}

impl Device for AttachedConsole {
    fn fds(&self, _fds: &mut DeviceFds) {}

    fn start(
        &mut self,
        _filter: FilterOf<'_>,
        _worker_core: Option<usize>,
    ) -> Result<(), DeviceError> {
        Ok(())
    }

    /// Flushes what the guest wrote; what went by, and a sentence if some was dropped.
    fn stop(&mut self) -> DeviceReport {
        self.serial
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .flush();
        let entry = ConsoleEntry {
            output: self.request.written(),
            limit: self.request.limit,
            written: self.counts.written.load(Ordering::Relaxed),
            dropped: self.counts.dropped.load(Ordering::Relaxed),
        };
        let sentences = match entry.dropped {
            0 => Vec::new(),
            n => vec![format!(
                "the guest's console passed --console-limit ({} bytes): {n} bytes dropped",
                entry.limit
            )],
        };
        DeviceReport {
            section: SECTION,
            entries: vec![serde_json::to_value(&entry).unwrap_or_default()],
            sentences,
        }
    }
}

/// Opens `--console FILE` for writing without waiting (a FIFO's open would block until a
/// reader came), once, by [`crate::sys::files::open`]: a regular file (created, or
/// truncated once it is known to be one), `/dev/null` or a terminal; anything else is
/// refused.
pub fn open_file(p: &std::path::Path) -> Result<std::fs::File, ConsoleError> {
    use crate::sys::files::{self, How};
    use std::os::unix::fs::FileTypeExt;
    let refused = |source| ConsoleError::Open {
        path: p.to_path_buf(),
        source,
    };
    let not_regular = || {
        refused(FileError::Io(std::io::Error::other(
            "not a regular file, /dev/null or a terminal",
        )))
    };
    let f = files::open(p, How::CREATE_WRITE).map_err(|e| {
        match e.io().and_then(|e| e.raw_os_error()) {
            // A FIFO without a reader: O_NONBLOCK refuses it at once.
            Some(libc::ENXIO) => not_regular(),
            _ => refused(e),
        }
    })?;
    let m = f.metadata().map_err(|e| refused(e.into()))?;
    if m.is_file() {
        f.set_len(0).map_err(|e| refused(e.into()))?;
        return Ok(f);
    }
    if m.file_type().is_char_device() && (is_dev_null(&m) || std::io::IsTerminal::is_terminal(&f)) {
        return Ok(f);
    }
    Err(not_regular())
}

/// Whether `m` is the null device (character device 1:3).
fn is_dev_null(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    libc::major(m.rdev()) == 1 && libc::minor(m.rdev()) == 3
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

/// What a [`Capped`] output passed on and dropped.
#[derive(Debug, Default)]
pub struct Counts {
    /// Bytes passed on.
    pub written: AtomicU64,
    /// Bytes dropped past the limit.
    pub dropped: AtomicU64,
}

/// Passes at most `limit` bytes to `inner`; the rest is dropped (the guest's writes still
/// succeed, a serial port has no error to give), and the drop is said once.
pub struct Capped {
    inner: Box<dyn Write + Send>,
    limit: u64,
    /// What went by: what is passed on and dropped (the report's, and the cap's own
    /// count).
    counts: Arc<Counts>,
}

impl Capped {
    /// Caps `inner` at `limit` bytes.
    pub fn new(inner: Box<dyn Write + Send>, limit: u64) -> Self {
        Self {
            inner,
            limit,
            counts: Arc::default(),
        }
    }

    /// What it passed on and dropped, as it goes.
    pub fn counts(&self) -> Arc<Counts> {
        self.counts.clone()
    }
}

impl Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let written = self.counts.written.load(Ordering::Relaxed);
        let room = self.limit.saturating_sub(written);
        let take = (b.len() as u64).min(room) as usize;
        if take > 0 {
            let n = self.inner.write(&b[..take])?;
            self.counts.written.fetch_add(n as u64, Ordering::Relaxed);
            if n < take {
                return Ok(n);
            }
        }
        let drop = (b.len() - take) as u64;
        // The first drop is said, once.
        if drop > 0 && self.counts.dropped.fetch_add(drop, Ordering::Relaxed) == 0 {
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
        // What went by: 10 passed on, the rest dropped.
        let counts = c.counts();
        assert_eq!(counts.written.load(Ordering::Relaxed), 10);
        assert_eq!(counts.dropped.load(Ordering::Relaxed), 10 + 1000 * 4096);
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
