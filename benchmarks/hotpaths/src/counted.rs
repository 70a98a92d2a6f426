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
//!
//! Where the process can read `/proc/interrupts` (a Linux guest), it also reads the
//! guest's own count of rescheduling (`RES`) and function-call (`CAL`) IPIs, summed over
//! its CPUs, just outside each mark (before a run's first, after its last), and after the
//! loop prints `hotpaths-ipis op=NAME part=K res=A,B,C,D cal=A,B,C,D`: the same difference
//! gives the IPIs one iteration sent, the guest's own word beside the host's exit count.
//! The reads themselves fall outside the marked runs, so they add no exit to them.

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
        drain_stdout();
        self.part.set(self.part.get() + 1);
        f((self.n1 / 10).max(1));
        let a = ipis();
        self.mark(m);
        f(self.n1);
        self.mark(m + 1);
        // One read serves as B and C: marks m+1 and m+2 have nothing but it between them.
        let b = ipis();
        let c = b;
        self.mark(m + 2);
        f(self.n2);
        self.mark(m + 3);
        let d = ipis();
        if let (Some(a), Some(b), Some(c), Some(d)) = (a, b, c, d) {
            println!(
                "{}",
                ipis_line(&self.op.borrow(), self.part.get() - 1, [a, b, c, d])
            );
            drain_stdout();
        }
    }
}

/// Flushes stdout and, where it is a terminal (a guest's serial console), waits until the
/// line has left it: a console still draining a line into the UART makes port-write exits
/// inside the next loop's marked runs (seen in the rig: 3.6 `io` exits an iteration of
/// `write`, 2026-12-07, while the lines before it drained).
fn drain_stdout() {
    let _ = std::io::stdout().flush();
    // SAFETY: tcdrain on descriptor 1 touches no memory of ours; on a descriptor that is
    // not a terminal it fails with ENOTTY, which is ignored.
    unsafe {
        libc::tcdrain(1);
    }
}

/// The guest's rescheduling and function-call IPIs so far, each summed over its CPUs
/// (None where `/proc/interrupts` is not there or has no such rows).
fn ipis() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/interrupts").ok()?;
    ipis_of(&text)
}

/// `RES` and `CAL` of an `/proc/interrupts` text, summed over the CPU columns.
pub fn ipis_of(text: &str) -> Option<(u64, u64)> {
    let sum = |name: &str| {
        let row = text.lines().find(|l| l.trim_start().starts_with(name))?;
        let cols = row.trim_start()[name.len()..].split_whitespace();
        Some(cols.map_while(|w| w.parse::<u64>().ok()).sum::<u64>())
    };
    Some((sum("RES:")?, sum("CAL:")?))
}

/// The line that gives a counted loop's IPI counts at its four marks.
pub fn ipis_line(op: &str, part: u32, at: [(u64, u64); 4]) -> String {
    let join = |f: fn(&(u64, u64)) -> u64| {
        at.iter()
            .map(|p| f(p).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "hotpaths-ipis op={op} part={part} res={} cal={}",
        join(|p| p.0),
        join(|p| p.1)
    )
}

/// The line that names a counted loop.
pub fn line(op: &str, part: u32, mark: u32, n1: u64, n2: u64) -> String {
    format!("hotpaths-count op={op} part={part} mark={mark} n1={n1} n2={n2}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipis_are_summed_over_the_cpus_and_named_per_loop() {
        let text = "           CPU0       CPU1\n  0:         36          0   IO-APIC   2-edge      timer\n\
                    RES:         17         25   Rescheduling interrupts\n\
                    CAL:       4000        991   Function call interrupts\n";
        assert_eq!(ipis_of(text), Some((42, 4991)));
        assert_eq!(ipis_of("  0: 36 IO-APIC timer\n"), None);
        assert_eq!(
            ipis_line("pipe_2cores", 0, [(1, 2), (3, 4), (5, 6), (7, 8)]),
            "hotpaths-ipis op=pipe_2cores part=0 res=1,3,5,7 cal=2,4,6,8"
        );
    }
}
