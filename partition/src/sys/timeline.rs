//! The launch's timeline: where the wall time from the process's `main` to the guest's first
//! serial byte goes (issue 25). One launch per process, so the marks are process-wide: the
//! CLI marks `main` first thing, the launch marks the end of each of its phases, the first
//! vCPU thread marks its first `KVM_RUN`, and the serial device the first byte. Each phase
//! runs from the mark before it to its own, so the phases add up to the wall time exactly;
//! what is worth reading is which phase is large.
//!
//! Each mark also reads the process's CPU clock (`CLOCK_PROCESS_CPUTIME_ID`: every thread of
//! the VMM, a vCPU's time in `KVM_RUN` included), so each phase says how much of its wall
//! time was our CPU and how much was waiting.
//!
//! Marking is two clock reads and a push under a mutex: allowed in every confined thread
//! (`clock_gettime`, `futex`, memory), cheap beside any phase.

use std::sync::Mutex;
use std::time::Instant;

/// The marks so far: (phase that ended, when, the process's CPU time then in ns).
static MARKS: Mutex<Vec<(&'static str, Instant, u64)>> = Mutex::new(Vec::new());

/// The phase that starts the timeline (the CLI's `main`, before argument parsing).
pub const START: &str = "main";

/// A caller that wants exec and dynamic loading counted too sets this to its
/// `CLOCK_MONOTONIC` time in nanoseconds just before it spawns `partition`; the timeline then
/// starts there, with an `exec` phase up to `main`.
pub const EXEC_ENV: &str = "PARTITION_EXEC_AT_NS";

/// `CLOCK_MONOTONIC` now, nanoseconds (the clock `Instant` reads, comparable across
/// processes).
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The CPU time every thread of this process has used so far, nanoseconds (since the fork
/// that made it: exec and dynamic loading count).
pub fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into a local timespec.
    unsafe { libc::clock_gettime(clock, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A moment of the launch: the wall clock and the process's CPU time then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// When.
    pub at: Instant,
    /// [`process_cpu_ns`] then.
    pub cpu_ns: u64,
}

impl Stamp {
    /// Now.
    pub fn now() -> Self {
        Self {
            at: Instant::now(),
            cpu_ns: process_cpu_ns(),
        }
    }
}

/// Marks [`START`] (the CLI calls it first thing in `main`); with [`EXEC_ENV`] set to a
/// time at most a minute back, the timeline starts at that time instead, its first phase
/// `exec` (fork, exec, dynamic loading, the runtime's start).
pub fn mark_main() {
    let (now, now_ns) = (Instant::now(), monotonic_ns());
    let spawned = std::env::var(EXEC_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&at| at <= now_ns && now_ns - at < 60_000_000_000)
        .and_then(|at| now.checked_sub(std::time::Duration::from_nanos(now_ns - at)));
    let cpu = process_cpu_ns();
    match spawned {
        Some(at) => {
            // The CPU before `main` (the fork's child side, exec, loading) is exec's.
            push(START, at, 0);
            push("exec", now, cpu);
        }
        None => push(START, now, cpu),
    }
}

/// Marks the end of phase `name` now. The first mark, [`START`], starts the timeline; a
/// mark before it is ignored, and so is a second mark of a phase already marked.
pub fn mark(name: &'static str) {
    mark_at(name, Instant::now());
}

/// [`mark`] at `at` (a moment just past; the CPU clock is read now).
pub fn mark_at(name: &'static str, at: Instant) {
    push(name, at, process_cpu_ns());
}

fn push(name: &'static str, at: Instant, cpu_ns: u64) {
    let mut m = MARKS.lock().unwrap_or_else(|e| e.into_inner());
    let started = !m.is_empty();
    if (name == START) == started || m.iter().any(|(n, _, _)| *n == name) {
        return;
    }
    m.push((name, at, cpu_ns));
}

/// One phase of the timeline.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Phase {
    /// What ran (the mark that ended it).
    pub phase: &'static str,
    /// How long, milliseconds.
    pub ms: f64,
    /// How much of it was this process's CPU time (all its threads), milliseconds.
    pub cpu_ms: f64,
}

/// The timeline up to the first serial byte.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    /// The phases, in time order; they add up to `wall_ms` and `cpu_ms`.
    pub phases: Vec<Phase>,
    /// Wall time from [`START`] to the end, ms.
    pub wall_ms: f64,
    /// The process's CPU time over the same span, ms.
    pub cpu_ms: f64,
}

/// The phases up to `end` (the first serial byte), in time order. Marks after `end` are
/// left out. None before [`START`] was marked.
pub fn phases(end: Stamp) -> Option<Timeline> {
    let mut m = MARKS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (_, start, start_cpu) = *m.first()?;
    m.sort_by_key(|(_, t, _)| *t);
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
    // Marks from two threads may read the CPU clock in the other order than the wall
    // clock: such a phase shows no CPU rather than a negative figure, and the next one
    // takes it up, so the sum still holds.
    let cpu = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e6;
    let mut out = Vec::new();
    let (mut last, mut last_cpu) = (start, start_cpu);
    for &(name, t, c) in m.iter().skip_while(|(n, _, _)| *n != START).skip(1) {
        if t > end.at {
            break;
        }
        out.push(Phase {
            phase: name,
            ms: ms(last, t),
            cpu_ms: cpu(last_cpu, c),
        });
        last = t;
        last_cpu = last_cpu.max(c);
    }
    out.push(Phase {
        phase: "guest_to_first_byte",
        ms: ms(last, end.at),
        cpu_ms: cpu(last_cpu, end.cpu_ns),
    });
    Some(Timeline {
        phases: out,
        wall_ms: ms(start, end.at),
        cpu_ms: cpu(start_cpu, end.cpu_ns),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn phases_run_mark_to_mark_and_add_up_to_the_wall_time() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        // CPU time in ns: 100 us per wall ms, except where said.
        let cpu = |ms: u64| ms * 100_000;
        // Before `main` nothing counts.
        push("check", at(1), cpu(1));
        push(START, t0, cpu(0));
        push("check", at(2), cpu(2));
        push("memory", at(5), cpu(5));
        // A second mark of a phase, and a second start, are ignored.
        push("check", at(9), cpu(9));
        push(START, at(9), cpu(9));
        // A thread's mark may land out of order, and read the CPU clock before the mark
        // before it did (confine's CPU reading is later than vcpu_start's); a mark after
        // the end is left out.
        push("vcpu_start", at(8), cpu(6));
        push("confine", at(7), cpu(7));
        push("late", at(50), cpu(50));
        let t = phases(Stamp {
            at: at(10),
            cpu_ns: cpu(10),
        })
        .unwrap();
        let (p, wall) = (&t.phases, t.wall_ms);
        let names: Vec<&str> = p.iter().map(|p| p.phase).collect();
        assert_eq!(
            names,
            [
                "check",
                "memory",
                "confine",
                "vcpu_start",
                "guest_to_first_byte"
            ]
        );
        let ms: Vec<u64> = p.iter().map(|p| p.ms.round() as u64).collect();
        assert_eq!(ms, [2, 3, 2, 1, 2]);
        assert!((wall - 10.0).abs() < 1e-6);
        assert!((p.iter().map(|p| p.ms).sum::<f64>() - wall).abs() < 1e-6);
        // CPU, us: confine 5->7, vcpu_start read 6 (shows none), then 7->10.
        let us: Vec<u64> = p.iter().map(|p| (p.cpu_ms * 1e3).round() as u64).collect();
        assert_eq!(us, [200, 300, 200, 0, 300]);
        assert!((t.cpu_ms - 1.0).abs() < 1e-9);
        assert!((p.iter().map(|p| p.cpu_ms).sum::<f64>() - t.cpu_ms).abs() < 1e-9);
    }

    #[test]
    fn the_process_cpu_clock_counts_this_threads_work() {
        let before = process_cpu_ns();
        let mut x = 0u64;
        while process_cpu_ns() - before < 2_000_000 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(x > 0);
        assert!(Stamp::now().cpu_ns >= before + 2_000_000);
    }
}
