//! Memory latency by working-set size [lat_mem_rd] and bandwidth [bw_mem rd, wr, bcopy].

use std::hint::black_box;

use crate::chase;
use crate::timing::{Enough, per_iteration};

/// Anonymous memory for the chase, 2 MiB aligned, unmapped on drop.
struct Region {
    base: *mut u8,
    len: usize,
    aligned: *mut u8,
}

impl Region {
    /// `bytes` of zeroed memory; with `thp`, transparent huge pages are asked for
    /// (madvise), as a guest's memory from the pool is 2 MiB pages.
    fn new(bytes: usize, thp: bool) -> Option<Self> {
        const HUGE: usize = 2 << 20;
        let len = bytes.next_multiple_of(HUGE) + HUGE;
        // SAFETY: a fresh private anonymous mapping; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let base = base as *mut u8;
        let aligned = base.wrapping_add(base.align_offset(HUGE));
        if thp {
            // SAFETY: advice on our own mapping; a refusal only means 4 KiB pages.
            unsafe { libc::madvise(aligned.cast(), len - HUGE, libc::MADV_HUGEPAGE) };
        }
        Some(Self { base, len, aligned })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Nanoseconds per dependent load for each working-set size up to `max` bytes.
pub fn latency(enough: Enough, max: usize, thp: bool) -> Vec<(usize, f64)> {
    let sizes: Vec<usize> = chase::SIZES.iter().copied().filter(|&s| s <= max).collect();
    let Some(&largest) = sizes.last() else {
        return Vec::new();
    };
    let Some(buf) = Region::new(largest, thp) else {
        return Vec::new();
    };
    let mut order = vec![0u32; largest / chase::LINE];
    let mut out = Vec::new();
    for s in sizes {
        // SAFETY: the region holds at least `largest` >= s bytes, 2 MiB aligned, ours.
        let start = unsafe { chase::build(buf.aligned, s, &mut order) };
        let mut p = start;
        let mut f = |n: u64| {
            // SAFETY: the chain was just built in buf, which outlives the walk.
            p = unsafe { chase::walk(p, n) };
            black_box(p);
        };
        let us = per_iteration(&mut f, enough, 0.0);
        out.push((s, us * 1000.0 / chase::UNROLL as f64));
    }
    out
}

/// MB/s (10^6 bytes per second) reading, writing and copying `bytes` bytes.
pub fn bandwidth(enough: Enough, bytes: usize) -> Vec<(&'static str, f64)> {
    let words = bytes / 8;
    let mut src: Vec<u64> = (0..words as u64).collect();
    let mut dst = vec![0u64; words];
    let mb = |us: f64| bytes as f64 / us;
    let mut out = Vec::new();
    // Read: sum every word, eight independent accumulators.
    let mut rd = |n: u64| {
        for _ in 0..n {
            let mut acc = [0u64; 8];
            for c in black_box(&src).chunks_exact(8) {
                for i in 0..8 {
                    acc[i] = acc[i].wrapping_add(c[i]);
                }
            }
            black_box(acc);
        }
    };
    out.push(("rd", mb(per_iteration(&mut rd, enough, 0.0))));
    // Write: store every word.
    let mut wr = |n: u64| {
        for k in 0..n {
            let v = black_box(k);
            for w in black_box(&mut src).iter_mut() {
                *w = v;
            }
        }
    };
    out.push(("wr", mb(per_iteration(&mut wr, enough, 0.0))));
    // Copy: memcpy, bytes counted once.
    let mut cp = |n: u64| {
        for _ in 0..n {
            black_box(&mut dst).copy_from_slice(black_box(&src));
        }
    };
    out.push(("bcopy", mb(per_iteration(&mut cp, enough, 0.0))));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_visits_every_line_once_per_cycle() {
        let bytes = 64 << 10;
        let mut buf = vec![0u64; bytes / 8];
        let mut order = vec![0u32; bytes / chase::LINE];
        let base = buf.as_mut_ptr() as usize;
        // SAFETY: our buffer.
        let start = unsafe { chase::build(buf.as_mut_ptr().cast(), bytes, &mut order) };
        let mut seen = vec![false; bytes / chase::LINE];
        let mut p = start;
        for _ in 0..seen.len() {
            let line = (p as usize - base) / chase::LINE;
            assert!(!seen[line], "line {line} visited twice");
            seen[line] = true;
            // SAFETY: a chain element.
            p = unsafe { *p as *const usize };
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(p, start, "the chain is a cycle");
        // Not the sequential order a prefetcher would follow.
        // SAFETY: a chain element.
        let second = unsafe { *start };
        assert_ne!(second, base + chase::LINE);
    }

    #[test]
    fn staircase_and_bandwidth_report_every_point() {
        let l = latency(Enough(100), 64 << 10, true);
        assert_eq!(latency(Enough(100), 4096, false).len(), 4);
        assert_eq!(l.len(), 8); // 512 B .. 64 KiB
        assert!(l.iter().all(|&(_, ns)| ns > 0.0));
        let b = bandwidth(Enough(100), 1 << 20);
        assert_eq!(
            b.iter().map(|x| x.0).collect::<Vec<_>>(),
            ["rd", "wr", "bcopy"]
        );
        assert!(b.iter().all(|&(_, v)| v > 0.0 && v.is_finite()));
    }
}
