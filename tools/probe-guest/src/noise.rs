//! `probe.bench=noise`: the gap detector (gaps.rs) in ring 3 for `probe.noise_ms`
//! milliseconds (default 1000), with every interrupt source of the guest masked, so each gap
//! is time the host took from the vCPU (its ticks, interrupts, exits, other tasks).
//!
//! Line: `noise ms=M tsc_khz=K samples=S lost_ns=L max_ns=X over1us=A over10us=B
//! over100us=C p9999_ns=P` (the last: the upper bound of the histogram bucket holding the
//! 99.99th percentile gap).

use crate::bootinfo::BootInfo;
use crate::gaps::{self, Gaps};
use crate::sys::rdtsc;

/// The histogram lives here, not on the small ring-3 stack.
static mut GAPS: Option<Gaps> = None;

/// Runs the detector and prints its line.
pub fn run(bi: &BootInfo, tsc_khz: u64) {
    let ms = bi
        .arg("probe.noise_ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000u64);
    let slot = &raw mut GAPS;
    // SAFETY: only the BSP runs this, once; nothing else touches GAPS.
    let g = unsafe { (*slot).insert(Gaps::new(tsc_khz)) };
    gaps::run(rdtsc, ms * tsc_khz, g);
    let ns = |ticks: u64| ticks * 1_000_000 / tsc_khz.max(1);
    say!(
        "noise ms={} tsc_khz={} samples={} lost_ns={} max_ns={} over1us={} over10us={} over100us={} p9999_ns={}",
        ms,
        tsc_khz,
        g.samples,
        ns(g.lost),
        ns(g.max),
        g.over[0],
        g.over[1],
        g.over[2],
        ns(g.quantile(9999, 10000))
    );
}
