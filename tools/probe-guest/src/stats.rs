//! Summaries of timed samples, as every probe test prints them.

/// Sorts `s` (TSC cycles) and prints `PREFIX test=TEST MODE_KEY=MODE n= median_ns= p99_ns=
/// min_ns= max_ns=`.
pub fn summarise(
    prefix: &str,
    test: &str,
    mode_key: &str,
    mode: &str,
    s: &mut [u64],
    tsc_khz: u64,
) {
    s.sort_unstable();
    let n = s.len();
    if n == 0 {
        return;
    }
    let ns = |c: u64| c.saturating_mul(1_000_000) / tsc_khz.max(1);
    let p99 = s[((n * 99).div_ceil(100)).clamp(1, n) - 1];
    say!(
        "{} test={} {}={} n={} median_ns={} p99_ns={} min_ns={} max_ns={}",
        prefix,
        test,
        mode_key,
        mode,
        n,
        ns(s[n / 2]),
        ns(p99),
        ns(s[0]),
        ns(s[n - 1])
    );
}
