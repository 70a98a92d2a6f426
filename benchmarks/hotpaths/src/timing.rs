//! lmbench's timing discipline: find an iteration count whose run lasts at least `enough`,
//! discard a warm-up repetition, time `TRIES` repetitions and keep their median; subtract
//! the cost of the empty loop.

use std::hint::black_box;
use std::time::Instant;

/// Repetitions per measurement (lmbench's TRIES).
pub const TRIES: usize = 11;

/// How long one repetition must last, in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Enough(pub u64);

/// Median of `v` (sorted in place); NaN when empty.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn time_us(f: &mut dyn FnMut(u64), n: u64) -> f64 {
    let t = Instant::now();
    f(n);
    t.elapsed().as_secs_f64() * 1e6
}

/// Iterations for which `f` runs at least `enough` (doubling, then scaling up).
pub fn calibrate(f: &mut dyn FnMut(u64), enough: Enough) -> u64 {
    let target = enough.0 as f64;
    let mut n = 1u64;
    loop {
        let t = time_us(f, n);
        if t >= target {
            return n;
        }
        if t >= target / 8.0 {
            return ((n as f64 * target * 1.1 / t.max(1e-3)) as u64).max(n + 1);
        }
        n = n.saturating_mul(2);
        if n >= 1 << 40 {
            return n;
        }
    }
}

/// Microseconds per iteration of `f(n)` (which runs `n` iterations): the median of TRIES
/// repetitions after one discarded, minus `overhead_us` per iteration.
pub fn per_iteration(f: &mut dyn FnMut(u64), enough: Enough, overhead_us: f64) -> f64 {
    let n = calibrate(f, enough);
    let _ = time_us(f, n); // warm-up, discarded
    let mut v: Vec<f64> = (0..TRIES).map(|_| time_us(f, n) / n as f64).collect();
    (median(&mut v) - overhead_us).max(0.0)
}

/// The empty loop's cost per iteration (lmbench's l_overhead).
pub fn loop_overhead(enough: Enough) -> f64 {
    let mut f = |n: u64| {
        for i in 0..n {
            black_box(i);
        }
    };
    per_iteration(&mut f, enough, 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn calibration_reaches_enough() {
        let mut f = |n: u64| {
            let t = Instant::now();
            // 1 us per iteration, give or take.
            while t.elapsed().as_nanos() < n as u128 * 1000 {
                std::hint::spin_loop();
            }
        };
        // Each iteration spins at least 1 us, so whatever the machine's load: a count whose
        // run lasts 2 ms is at most 2200 (the 10% margin), and a repetition's per-iteration time is >= 1 us.
        let n = calibrate(&mut f, Enough(2000));
        assert!((1..=2200).contains(&n), "{n}");
        let us = per_iteration(&mut f, Enough(2000), 0.0);
        assert!(us >= 1.0, "{us}");
    }
}
