//! The launch's timeline: where the wall time from the process's `main` to the guest's first
//! serial byte goes (issue 25). One launch per process, so the marks are process-wide: the
//! CLI marks `main` first thing, the launch marks the end of each of its phases, the first
//! vCPU thread marks its first `KVM_RUN`, and the serial device the first byte. Each phase
//! runs from the mark before it to its own, so the phases add up to the wall time exactly;
//! what is worth reading is which phase is large.
//!
//! Marking is a clock read and a push under a mutex: allowed in every confined thread
//! (`clock_gettime`, `futex`, memory), cheap beside any phase.

use std::sync::Mutex;
use std::time::Instant;

/// The marks so far: (phase that ended, when).
static MARKS: Mutex<Vec<(&'static str, Instant)>> = Mutex::new(Vec::new());

/// The phase that starts the timeline (the CLI's `main`, before argument parsing).
pub const START: &str = "main";

/// A caller that wants exec and dynamic loading counted too sets this to its
/// `CLOCK_MONOTONIC` time in nanoseconds just before it spawns `partition`; the timeline then
/// starts there, with an `exec` phase up to `main`.
pub const EXEC_ENV: &str = "PARTITION_EXEC_AT_NS";

/// `CLOCK_MONOTONIC` now, nanoseconds (the clock `Instant` reads, comparable across
/// processes).
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
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
    match spawned {
        Some(at) => {
            mark_at(START, at);
            mark_at("exec", now);
        }
        None => mark_at(START, now),
    }
}

/// Marks the end of phase `name` now. The first mark, [`START`], starts the timeline; a
/// mark before it is ignored, and so is a second mark of a phase already marked.
pub fn mark(name: &'static str) {
    mark_at(name, Instant::now());
}

/// [`mark`] at `at`.
pub fn mark_at(name: &'static str, at: Instant) {
    let mut m = MARKS.lock().unwrap_or_else(|e| e.into_inner());
    let started = !m.is_empty();
    if (name == START) == started || m.iter().any(|(n, _)| *n == name) {
        return;
    }
    m.push((name, at));
}

/// One phase of the timeline.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Phase {
    /// What ran (the mark that ended it).
    pub phase: &'static str,
    /// How long, milliseconds.
    pub ms: f64,
}

/// The phases up to `end` (the first serial byte), in time order, and the wall time from
/// [`START`] to `end` in milliseconds. Marks after `end` are left out. None before
/// [`START`] was marked.
pub fn phases(end: Instant) -> Option<(Vec<Phase>, f64)> {
    let mut m = MARKS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (_, start) = *m.first()?;
    m.sort_by_key(|(_, t)| *t);
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
    let mut out = Vec::new();
    let mut last = start;
    for &(name, t) in m.iter().skip_while(|(n, _)| *n != START).skip(1) {
        if t > end {
            break;
        }
        out.push(Phase {
            phase: name,
            ms: ms(last, t),
        });
        last = t;
    }
    out.push(Phase {
        phase: "guest_to_first_byte",
        ms: ms(last, end),
    });
    Some((out, ms(start, end)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn phases_run_mark_to_mark_and_add_up_to_the_wall_time() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        // Before `main` nothing counts.
        mark_at("check", at(1));
        mark_at(START, t0);
        mark_at("check", at(2));
        mark_at("memory", at(5));
        // A second mark of a phase, and a second start, are ignored.
        mark_at("check", at(9));
        mark_at(START, at(9));
        // A thread's mark may land out of order; a mark after the end is left out.
        mark_at("vcpu_start", at(8));
        mark_at("confine", at(7));
        mark_at("late", at(50));
        let (p, wall) = phases(at(10)).unwrap();
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
    }
}
