//! The gap detector of the `noise` benchmark, one file for both sides: the probe guest runs
//! it in ring 3 (`probe.bench=noise`) and the bare-host twin in a pinned thread
//! (benchmarks/src/noise.rs includes this file), so the two loops are the same code.
//!
//! A loop reads the TSC back to back; any gap between two reads longer than the loop's own
//! step is time the core spent elsewhere (an interrupt, a tick, an exit, another task), as
//! osnoise, sysjitter and hwlatdetect measure it. Every gap goes into a histogram with 8
//! buckets per power of two (12.5 % wide), gaps over 1 us are summed as the noise, and
//! those over 1, 10 and 100 us are counted. `core` only.

/// Buckets per power of two.
const SUB: usize = 8;
/// Histogram buckets: 64 powers of two.
pub const BUCKETS: usize = 64 * SUB;

/// What a run of the detector saw, in TSC ticks.
pub struct Gaps {
    /// Reads of the TSC.
    pub samples: u64,
    /// Sum of the gaps over 1 us.
    pub lost: u64,
    /// The largest gap.
    pub max: u64,
    /// Gaps over 1, 10 and 100 us.
    pub over: [u64; 3],
    /// Every gap, by [`bucket`].
    pub hist: [u32; BUCKETS],
    /// 1, 10 and 100 us in ticks.
    limits: [u64; 3],
}

/// The bucket of a gap of `g` ticks: exact below 8, then 8 per power of two.
pub fn bucket(g: u64) -> usize {
    if g < SUB as u64 {
        return g as usize;
    }
    let p = 63 - g.leading_zeros() as usize; // 2^p <= g
    let frac = ((g >> (p - 3)) & (SUB as u64 - 1)) as usize;
    (p - 2) * SUB + frac
}

/// The largest gap that falls in bucket `i` (a bucket's upper bound).
pub fn bucket_top(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let p = i / SUB + 2;
    let frac = (i % SUB) as u64;
    let low = (1u64 << p) + (frac << (p - 3));
    low + (1u64 << (p - 3)) - 1
}

impl Gaps {
    /// An empty record for a TSC of `tsc_khz`.
    pub fn new(tsc_khz: u64) -> Self {
        let us = (tsc_khz / 1000).max(1);
        Self {
            samples: 0,
            lost: 0,
            max: 0,
            over: [0; 3],
            hist: [0; BUCKETS],
            limits: [us, 10 * us, 100 * us],
        }
    }

    /// Records one gap.
    #[inline(always)]
    pub fn add(&mut self, g: u64) {
        self.samples += 1;
        let b = bucket(g);
        self.hist[b] = self.hist[b].saturating_add(1);
        if g > self.max {
            self.max = g;
        }
        if g > self.limits[0] {
            self.lost += g;
            self.over[0] += 1;
            if g > self.limits[1] {
                self.over[1] += 1;
                if g > self.limits[2] {
                    self.over[2] += 1;
                }
            }
        }
    }

    /// The gap below which `num/den` of all gaps fall (the upper bound of its bucket).
    pub fn quantile(&self, num: u64, den: u64) -> u64 {
        let want = (self.samples * num).div_ceil(den.max(1));
        let mut seen = 0u64;
        for (i, &n) in self.hist.iter().enumerate() {
            seen += n as u64;
            if seen >= want && n > 0 {
                return bucket_top(i);
            }
        }
        self.max
    }
}

/// Reads `read` (the TSC) back to back for `ticks` ticks, recording every gap.
#[inline(always)]
pub fn run(read: impl Fn() -> u64, ticks: u64, g: &mut Gaps) {
    let start = read();
    let end = start.wrapping_add(ticks);
    let mut last = start;
    loop {
        let t = read();
        g.add(t.wrapping_sub(last));
        last = t;
        if t >= end {
            break;
        }
    }
}
