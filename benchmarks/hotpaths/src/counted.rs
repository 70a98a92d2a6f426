//! Counted mode (`--count N1,N2`): each benchmark's loop runs exactly N1 and then N2
//! iterations, each run between two marks the host can see, so whatever counts events on
//! the host (KVM's exits by reason, traced) takes the difference between the runs: what
//! one iteration costs, with the start and end of a run cancelled out (the `exits`
//! section of `partition bench`, docs/measurement.md).
//!
//! A mark is a 32-bit `out` to `--mark-port` (the VMM's mark port, 0x520), which a
//! virtual machine's monitor sees as a port-write exit with the mark's number; the process
//! needs the port (`ioperm`, root). Before each loop, one line on stdout names it:
//! `hotpaths-count op=NAME part=K mark=M n1=N1 n2=N2` — marks M, M+1 bracket the N1 run,
//! M+2, M+3 the N2 run (part: the loop's order within the benchmark, as a benchmark that
//! subtracts a baseline runs two). A warm-up of N1/10 iterations (at least one) comes
//! first, unmarked.

use std::cell::{Cell, RefCell};
use std::io::Write;

/// The first mark's number (clear of the probe guest's own marks).
const FIRST_MARK: u32 = 0x1000;

/// Counted mode's state.
pub struct Counted {
    /// Iterations of the first run.
    pub n1: u64,
    /// Iterations of the second.
    pub n2: u64,
    port: u16,
    next: Cell<u32>,
    op: RefCell<String>,
    part: Cell<u32>,
}

impl Counted {
    /// Counted mode with marks on `port` (asks for the port).
    pub fn new(n1: u64, n2: u64, port: u16) -> Result<Self, String> {
        // SAFETY: asks for four ports from `port`; no memory is involved.
        if unsafe { libc::ioperm(u64::from(port), 4, 1) } != 0 {
            return Err(format!(
                "ioperm({port:#x}): {} (counted mode writes its marks to that port: run as root)",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Self {
            n1,
            n2,
            port,
            next: Cell::new(FIRST_MARK),
            op: RefCell::new(String::new()),
            part: Cell::new(0),
        })
    }

    /// The benchmark whose loops run next.
    pub fn begin(&self, op: &str) {
        *self.op.borrow_mut() = op.to_string();
        self.part.set(0);
    }

    fn mark(&self, id: u32) {
        // SAFETY: a port write to a port ioperm granted; no memory is touched.
        unsafe {
            std::arch::asm!("out dx, eax", in("dx") self.port, in("eax") id, options(nomem, nostack))
        };
    }

    /// Runs `f` counted: the line, the warm-up, then N1 and N2 iterations between marks.
    pub fn run(&self, f: &mut dyn FnMut(u64)) {
        let m = self.next.get();
        self.next.set(m + 4);
        println!(
            "{}",
            line(&self.op.borrow(), self.part.get(), m, self.n1, self.n2)
        );
        let _ = std::io::stdout().flush();
        self.part.set(self.part.get() + 1);
        f((self.n1 / 10).max(1));
        self.mark(m);
        f(self.n1);
        self.mark(m + 1);
        self.mark(m + 2);
        f(self.n2);
        self.mark(m + 3);
    }
}

/// The line that names a counted loop.
pub fn line(op: &str, part: u32, mark: u32, n1: u64, n2: u64) -> String {
    format!("hotpaths-count op={op} part={part} mark={mark} n1={n1} n2={n2}")
}
