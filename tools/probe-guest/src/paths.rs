//! `probe.bench=paths`: the VMM's own paths, timed from ring 3 with the TSC, and the
//! memory-latency staircase with the same chase `hotpaths` runs on the host.
//!
//! Each path is timed as lmbench times a call: a fixed count per repetition, one warm-up
//! repetition discarded, the median of `TRIES` repetitions per call. Lines:
//! `paths test=NAME n=N median_ns=M min_ns=A max_ns=B` (over the repetitions) and
//! `paths mem_lat size=BYTES ns=X`.
//!
//! - `cpuid`: CPUID leaf 0 in ring 3: a VM exit the hypervisor answers in the kernel;
//! - `service`: the probe's own trap into ring 0 and back (`ud2`), the floor under the
//!   ring-0 paths below (on the nested development host ring 0 is emulated);
//! - `pio_in`: `in` from COM1's line status register, executed in ring 3 (IOPL 3): an exit
//!   to the VMM's userspace serial device and back. A hypervisor that refuses ring-3 port
//!   I/O (the nested development host does: #GP) gets `pio_in_service` instead: the same
//!   `in` through the ring-0 service, whose cost without it is `service`;
//! - `mmio_read`: a ring-3 read of the first virtio-mmio device's MagicValue: an exit to
//!   the VMM's userspace transport and back;
//! - `mmio_doorbell`: a ring-3 write of 0 to that device's QueueNotify: with an ioeventfd
//!   the kernel answers it without leaving for userspace (`--no-ioeventfd` shows the
//!   difference).
//!
//! Options: `probe.paths_n=N` calls per repetition (default 2000), `probe.paths_max_mem=B`
//! the largest working set (default 256 MiB; 0 skips the staircase).

#[path = "../../../benchmarks/hotpaths/src/chase.rs"]
mod chase;

use crate::bootinfo::BootInfo;
use crate::sys::poke;
use crate::sys::{self, rdtsc};

const TRIES: usize = 11;

fn ns(cycles: u64, tsc_khz: u64) -> u64 {
    cycles.saturating_mul(1_000_000) / tsc_khz.max(1)
}

/// Cycles per call: one warm-up repetition, then TRIES of `n` calls; (median, min, max).
fn time(n: u64, mut f: impl FnMut()) -> (u64, u64, u64) {
    let mut reps = [0u64; TRIES + 1];
    for r in reps.iter_mut() {
        let t0 = rdtsc();
        for _ in 0..n {
            f();
        }
        *r = (rdtsc() - t0) / n;
    }
    let s = &mut reps[1..];
    s.sort_unstable();
    (s[TRIES / 2], s[0], s[TRIES - 1])
}

fn report(name: &str, n: u64, (m, lo, hi): (u64, u64, u64), tsc_khz: u64) {
    say!(
        "paths test={} n={} median_ns={} min_ns={} max_ns={}",
        name,
        n,
        ns(m, tsc_khz),
        ns(lo, tsc_khz),
        ns(hi, tsc_khz)
    );
}

fn cpuid0() {
    let r = core::arch::x86_64::__cpuid_count(0, 0);
    core::hint::black_box(r);
}

unsafe extern "C" {
    /// ring0.s: `in` from `port` in ring 3; the byte, or -1 if the hypervisor refuses
    /// ring-3 port I/O.
    fn pio_try_inb(port: u32) -> i32;
}

fn inb(port: u16) -> i32 {
    // SAFETY: ring 3 runs with IOPL 3 (ring0.s); a refusal (#GP) is caught and returns -1;
    // reading COM1's line status has no effect.
    unsafe { pio_try_inb(port as u32) }
}

/// The first `virtio_mmio.device=SIZE@ADDR:IRQ` base on the command line.
fn first_virtio(bi: &BootInfo) -> Option<u64> {
    bi.cmdline().split_ascii_whitespace().find_map(|w| {
        let v = w.strip_prefix("virtio_mmio.device=")?;
        let a = v.split_once('@')?.1.split_once(':')?.0;
        u64::from_str_radix(a.trim_start_matches("0x"), 16).ok()
    })
}

/// Runs the paths benchmark.
pub fn run(bi: &BootInfo, tsc_khz: u64, ram: Option<(u64, u64)>) {
    let n: u64 = bi
        .arg("probe.paths_n")
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
        .clamp(10, 1_000_000);
    say!("paths start n={} tries={}", n, TRIES);
    report("cpuid", n, time(n, cpuid0), tsc_khz);
    report(
        "service",
        n,
        time(n, || {
            core::hint::black_box(sys::null());
        }),
        tsc_khz,
    );
    if inb(0x3fd) >= 0 {
        report(
            "pio_in",
            n,
            time(n, || {
                core::hint::black_box(inb(0x3fd));
            }),
            tsc_khz,
        );
    } else {
        // This hypervisor refuses ring-3 port I/O: through ring 0 (subtract `service`).
        say!("paths pio: ring 3 may not use port I/O here (IOPL 3 refused); via the service");
        report(
            "pio_in_service",
            n,
            time(n, || {
                core::hint::black_box(sys::inb(0x3fd));
            }),
            tsc_khz,
        );
    }
    match first_virtio(bi) {
        Some(base) => {
            report(
                "mmio_read",
                n,
                time(n, || {
                    // SAFETY: the device window is mapped and user-accessible; MagicValue
                    // reads have no effect.
                    core::hint::black_box(unsafe { sys::peek::<u32>(base) });
                }),
                tsc_khz,
            );
            report(
                "mmio_doorbell",
                n,
                time(n, || {
                    // SAFETY: QueueNotify of a device no driver set up: the doorbell rings
                    // (an eventfd counts it) and nothing else happens.
                    unsafe { poke::<u32>(base + 0x50, 0) };
                }),
                tsc_khz,
            );
        }
        None => say!("paths mmio skipped: no virtio_mmio.device= on the command line"),
    }
    let max = bi
        .arg("probe.paths_max_mem")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(256 << 20);
    if max == 0 {
        say!("paths end (mem_lat skipped: probe.paths_max_mem=0)");
        return;
    }
    let Some((lo, hi)) = ram else {
        say!("paths mem_lat skipped: no free RAM range");
        return;
    };
    // The chain at `lo`, its scratch order after the largest working set that fits.
    let room = (hi - lo) as usize;
    let Some(&largest) = chase::SIZES
        .iter()
        .rfind(|&&s| s <= max && s + s / chase::LINE * 4 <= room)
    else {
        say!(
            "paths mem_lat skipped: {} bytes of free RAM is too little",
            room
        );
        return;
    };
    let lines = largest / chase::LINE;
    // SAFETY: [lo, hi) is usable RAM the probe owns (not its image, not page 0); the order
    // scratch lies right after the chain, inside the same range.
    let order =
        unsafe { core::slice::from_raw_parts_mut((lo as usize + largest) as *mut u32, lines) };
    for &s in chase::SIZES.iter().filter(|&&s| s <= largest) {
        // SAFETY: lo..lo+s is ours (above), 8-aligned.
        let start = unsafe { chase::build(lo as *mut u8, s, order) };
        let mut p = start;
        // Loads per repetition: tsc_khz / 100 (2.4 ms at 100 ns a load on a 2.4 GHz TSC).
        let iters = ((tsc_khz / 100) / chase::UNROLL).max(256);
        let mut reps = [0u64; TRIES + 1];
        for r in reps.iter_mut() {
            let t0 = rdtsc();
            // SAFETY: the chain was just built in RAM we own.
            p = unsafe { chase::walk(p, iters) };
            *r = rdtsc() - t0;
        }
        core::hint::black_box(p);
        let reps = &mut reps[1..];
        reps.sort_unstable();
        let cycles_per_load_x1000 = reps[TRIES / 2] * 1000 / (iters * chase::UNROLL);
        // ns per load, three decimals: cycles * 1e6 / tsc_khz.
        let ps = cycles_per_load_x1000.saturating_mul(1_000_000) / tsc_khz.max(1);
        say!("paths mem_lat size={} ns={}.{:03}", s, ps / 1000, ps % 1000);
    }
    say!("paths end");
}
