//! The memory-latency pointer chase, shared word for word by `hotpaths` (on a host or in a
//! Linux guest) and the probe guest (ring 3, no OS): the same chain and the same loop, so
//! a guest/host ratio compares the memory system and nothing else.
//!
//! The chain links every `LINE`-byte line of the working set in a random cyclic order
//! (a shuffle from a fixed seed), one pointer at the start of each line; the loop follows
//! it, 16 dependent loads per iteration. Random order defeats the stride prefetchers that
//! make a sequential walk look like cache hits; the cost at large sizes includes the TLB
//! misses a random walk takes, as lmbench's `lat_mem_rd -t` does.
//!
//! Only `core` is used: the probe guest is `no_std`.

/// Bytes per chain element (a cache line).
pub const LINE: usize = 64;
/// Dependent loads per loop iteration.
pub const UNROLL: u64 = 16;
/// Working-set sizes measured: 512 B to 256 MiB, doubling.
pub const SIZES: [usize; 20] = {
    let mut s = [0usize; 20];
    let mut i = 0;
    while i < 20 {
        s[i] = 512 << i;
        i += 1;
    }
    s
};

/// xorshift64: the shuffle's random numbers (a fixed seed, so every run builds one chain).
pub struct XorShift(pub u64);

impl XorShift {
    /// Next value.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Builds the chain over `bytes` bytes at `base` (a multiple of `LINE`, at least one line):
/// every line's first word points to the next line in a random cycle. `order` is scratch of
/// at least `bytes / LINE` entries. Returns the start of the chain.
///
/// # Safety
/// `base..base + bytes` must be writable memory this function may overwrite, aligned to 8.
pub unsafe fn build(base: *mut u8, bytes: usize, order: &mut [u32]) -> *const usize {
    let lines = (bytes / LINE).min(order.len());
    for (i, o) in order.iter_mut().take(lines).enumerate() {
        *o = i as u32;
    }
    // Fisher-Yates over lines 1.., line 0 stays first.
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut i = lines;
    while i > 2 {
        i -= 1;
        let j = 1 + (rng.next() % i as u64) as usize;
        order.swap(i, j);
    }
    for k in 0..lines {
        let here = order[k] as usize * LINE;
        let next = order[(k + 1) % lines] as usize * LINE;
        // SAFETY: both offsets are inside the caller's buffer (lines * LINE <= bytes).
        unsafe { (base.add(here) as *mut usize).write(base.add(next) as usize) };
    }
    base as *const usize
}

/// Follows the chain `iterations * UNROLL` times from `p`; returns where it stopped (feed
/// it back in so the walk continues, and so the loads cannot be optimised away).
///
/// # Safety
/// `p` must be a chain built by [`build`] whose memory is still live.
#[inline(never)]
pub unsafe fn walk(mut p: *const usize, iterations: u64) -> *const usize {
    for _ in 0..iterations {
        // SAFETY: every element holds the address of another element of the chain.
        unsafe {
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
            p = *p as *const usize;
        }
    }
    p
}
