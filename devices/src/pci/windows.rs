//! Where a partition's passed-through functions' BARs go, decided before any device is
//! opened (docs/passthrough.md, "BAR windows"): each function's own part of the 32-bit
//! window below 4 GiB and of the 64-bit window above the guest's RAM, and how far the
//! 64-bit window reaches.
//!
//! A GPU exposes its memory through a 64-bit prefetchable BAR the size of it rounded up to
//! a power of two and aligned to that size (64 GiB for a 40 GB card, 128 GiB for an 80 GB
//! one, 256 GiB for a 141 GB one), so the 64-bit window is sized from the BARs asked for:
//! functions in order of their largest 64-bit BAR, each function's part starting on a
//! multiple of that BAR's size, its BARs largest first inside it (power-of-two sizes
//! packed that way leave no gap). The window ends on a GiB past the last BAR (at least
//! [`WindowLimits::high_default_end`], room for a guest that moves BARs) and never past
//! the guest's physical address width: a BAR that would is refused, naming it.
//!
//! The BARs come from sysfs (`resource`, one line per BAR: start, end, flags), read with
//! [`bars_from_resource`]; the VFIO attach later finds the same sizes through VFIO.

use super::config::ROM_BAR;
use super::passthrough::{BAR_ALIGN, MIN_BAR, PhysicalBar, Windows};

/// `IORESOURCE_IO` in a sysfs `resource` line's flags.
const IORESOURCE_IO: u64 = 0x100;
/// `IORESOURCE_MEM`.
const IORESOURCE_MEM: u64 = 0x200;
/// `IORESOURCE_PREFETCH`.
const IORESOURCE_PREFETCH: u64 = 0x2000;
/// `IORESOURCE_MEM_64`.
const IORESOURCE_MEM_64: u64 = 0x10_0000;
/// The 64-bit window ends on a multiple of this.
pub const HIGH_GRANULE: u64 = 1 << 30;

/// Why the BARs cannot be placed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// A sysfs `resource` file does not read as one.
    #[error("sysfs resource line {line}: {text:?} is not `START END FLAGS` in hex")]
    Resource {
        /// Line number (BAR index).
        line: usize,
        /// The line.
        text: String,
    },
    /// A memory BAR of a size no window can hold.
    #[error("BAR {bar}: size {size:#x} is not a power of two of at least 16 bytes")]
    BarSize {
        /// Index of the function in the request.
        function: usize,
        /// BAR index.
        bar: usize,
        /// Its size.
        size: u64,
    },
    /// The BARs below 4 GiB do not fit the 32-bit window.
    #[error(
        "BAR {bar} ({size:#x} bytes) does not fit the 32-bit BAR window \
         {start:#x}..{end:#x} beside the BARs placed before it"
    )]
    Low {
        /// Index of the function.
        function: usize,
        /// BAR index.
        bar: usize,
        /// Its size.
        size: u64,
        /// The window.
        start: u64,
        /// Its end.
        end: u64,
    },
    /// A 64-bit BAR would end past the guest's physical address width.
    #[error(
        "BAR {bar} ({size:#x} bytes, 64-bit) would sit at {at:#x}..{end:#x} \
         in the 64-bit BAR window from {start:#x}, past the guest's {bits}-bit physical \
         address width (CPUID 0x80000008: {limit:#x})"
    )]
    High {
        /// Index of the function.
        function: usize,
        /// BAR index.
        bar: usize,
        /// Its size.
        size: u64,
        /// Where it would start.
        at: u64,
        /// Where it would end.
        end: u64,
        /// The window's start.
        start: u64,
        /// The guest's physical address bits.
        bits: u8,
        /// `1 << bits`.
        limit: u64,
    },
}

/// Reads a sysfs `resource` file's text: the memory and I/O BARs 0-5 (lines 0-5) and the
/// expansion ROM (line 6, index [`ROM_BAR`]: a 32-bit BAR, never mapped); the bridge
/// windows after them are not BARs. A BAR whose end is 0 is absent, as `pci_resource_len`
/// says. `mmap` is set for every memory BAR 0-5: VFIO says later whether it may be mapped.
pub fn bars_from_resource(text: &str) -> Result<Vec<PhysicalBar>, WindowError> {
    let mut out = Vec::new();
    for (line, l) in text.lines().take(ROM_BAR + 1).enumerate() {
        let bad = || WindowError::Resource {
            line,
            text: l.into(),
        };
        let f: Vec<u64> = l
            .split_whitespace()
            .map(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16))
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        let [start, end, flags] = f[..] else {
            return Err(bad());
        };
        if end == 0 || end < start || flags & (IORESOURCE_IO | IORESOURCE_MEM) == 0 {
            continue;
        }
        let io = flags & IORESOURCE_IO != 0;
        let rom = line == ROM_BAR;
        out.push(PhysicalBar {
            index: line,
            size: end - start + 1,
            io,
            is64: !io && !rom && flags & IORESOURCE_MEM_64 != 0,
            prefetchable: !io && !rom && flags & IORESOURCE_PREFETCH != 0,
            mmap: !io && !rom,
        });
    }
    Ok(out)
}

/// What bounds the windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowLimits {
    /// The part of the 32-bit window the functions share, `[start, end)`.
    pub low: (u64, u64),
    /// Where the 64-bit window starts (above the most RAM a guest can have).
    pub high_start: u64,
    /// The least the 64-bit window reaches when the BARs need less.
    pub high_default_end: u64,
    /// The guest's physical address bits (CPUID 0x80000008 EAX[7:0]).
    pub phys_bits: u8,
}

/// The windows of a partition's passed-through functions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowPlan {
    /// Each function's part of the windows, in the order asked.
    pub functions: Vec<Windows>,
    /// The whole 64-bit window, `[start, end)`; None when the guest's address width does
    /// not reach past its start (64-bit BARs then go below 4 GiB, if they fit).
    pub high: Option<(u64, u64)>,
}

/// A BAR's footprint: its size, at least a page.
fn span(b: &PhysicalBar) -> u64 {
    b.size.max(BAR_ALIGN)
}

/// One function's BARs in one window: (largest span, total, the BARs largest first).
fn group<'a>(bars: &[&'a PhysicalBar]) -> (u64, u64, Vec<&'a PhysicalBar>) {
    let mut v = bars.to_vec();
    v.sort_by(|a, b| b.size.cmp(&a.size).then(a.index.cmp(&b.index)));
    let total = v.iter().map(|b| span(b)).sum();
    (v.first().map_or(0, |b| span(b)), total, v)
}

/// Plans the windows of `functions` (each one's BARs, as [`bars_from_resource`] or
/// `passthrough::physical_bars` give them) within `limits`.
pub fn plan(
    functions: &[Vec<PhysicalBar>],
    limits: &WindowLimits,
) -> Result<WindowPlan, WindowError> {
    for (function, bars) in functions.iter().enumerate() {
        for b in bars.iter().filter(|b| !b.io) {
            if b.size < MIN_BAR || !b.size.is_power_of_two() || (!b.is64 && b.size > 1 << 31) {
                return Err(WindowError::BarSize {
                    function,
                    bar: b.index,
                    size: b.size,
                });
            }
        }
    }
    let limit = 1u64
        .checked_shl(u32::from(limits.phys_bits))
        .unwrap_or(u64::MAX);
    let has_high = limit > limits.high_start;
    let goes_high = |b: &PhysicalBar| has_high && !b.io && b.is64 && b.prefetchable;
    let split: Vec<_> = functions
        .iter()
        .map(|bars| {
            let mem: Vec<&PhysicalBar> = bars.iter().filter(|b| !b.io).collect();
            let high: Vec<_> = mem.iter().copied().filter(|b| goes_high(b)).collect();
            let low: Vec<_> = mem.iter().copied().filter(|b| !goes_high(b)).collect();
            (group(&low), group(&high))
        })
        .collect();
    let mut out = vec![
        Windows {
            low: (limits.low.0, limits.low.0),
            high: None,
        };
        functions.len()
    ];
    // Below 4 GiB: functions with the largest BAR first, down from the window's end
    // (aligned, where the window's start after the engine's megabyte is not).
    let mut order: Vec<usize> = (0..functions.len()).collect();
    order.sort_by_key(|&f| std::cmp::Reverse(split[f].0.0));
    let mut next = limits.low.1;
    for &f in &order {
        let (align, total, ref bars) = split[f].0;
        if total == 0 {
            continue;
        }
        let start = next
            .checked_sub(total)
            .map(|s| s & !(align - 1))
            .filter(|&s| s >= limits.low.0);
        let Some(start) = start else {
            let b = bars[0];
            return Err(WindowError::Low {
                function: f,
                bar: b.index,
                size: b.size,
                start: limits.low.0,
                end: limits.low.1,
            });
        };
        out[f].low = (start, start + total);
        next = start;
    }
    if !has_high {
        return Ok(WindowPlan {
            functions: out,
            high: None,
        });
    }
    // Above the RAM: the same, each BAR checked against the address width.
    order.sort_by_key(|&f| std::cmp::Reverse(split[f].1.0));
    let mut next = limits.high_start;
    for &f in &order {
        let (align, total, ref bars) = split[f].1;
        let start = next.checked_next_multiple_of(align.max(1));
        let mut at = start;
        for b in bars {
            let place = at.and_then(|a| Some((a, a.checked_add(span(b))?)));
            match place {
                Some((_, e)) if e <= limit => at = Some(e),
                _ => {
                    let a = at.unwrap_or(u64::MAX);
                    return Err(WindowError::High {
                        function: f,
                        bar: b.index,
                        size: b.size,
                        at: a,
                        end: a.saturating_add(b.size),
                        start: limits.high_start,
                        bits: limits.phys_bits,
                        limit,
                    });
                }
            }
        }
        // Every BAR placed: `at` is Some and within the limit.
        let (s, e) = (start.unwrap_or(next), at.unwrap_or(next));
        out[f].high = Some((s, e));
        debug_assert_eq!(e - s, total);
        next = e;
    }
    let needed = next.next_multiple_of(HIGH_GRANULE);
    let end = needed.max(limits.high_default_end).min(limit);
    Ok(WindowPlan {
        functions: out,
        high: Some((limits.high_start, end)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::passthrough::place_bars;

    const GIB: u64 = 1 << 30;

    fn limits(bits: u8) -> WindowLimits {
        WindowLimits {
            low: (0xc010_0000, 0xd000_0000),
            high_start: 64 * GIB,
            high_default_end: 128 * GIB,
            phys_bits: bits,
        }
    }

    fn bar(index: usize, size: u64, is64: bool, prefetchable: bool) -> PhysicalBar {
        PhysicalBar {
            index,
            size,
            io: false,
            is64,
            prefetchable,
            mmap: true,
        }
    }

    /// A GPU: registers (16 MiB, 32-bit), VRAM (64-bit prefetchable), a 32 MiB 64-bit
    /// prefetchable BAR.
    fn gpu(vram: u64) -> Vec<PhysicalBar> {
        vec![
            bar(0, 16 << 20, false, false),
            bar(1, vram, true, true),
            bar(3, 32 << 20, true, true),
        ]
    }

    /// Places each function's BARs in its part and returns (function, bar, address).
    fn placed(p: &WindowPlan, fs: &[Vec<PhysicalBar>]) -> Vec<(usize, usize, u64)> {
        let mut out = Vec::new();
        for (f, (w, bars)) in p.functions.iter().zip(fs).enumerate() {
            for (i, a) in place_bars(bars, w).expect("the part holds the function's BARs") {
                out.push((f, i, a));
            }
        }
        out
    }

    #[test]
    fn gpu_sized_bars_sit_on_their_own_size_and_the_window_reaches_them() {
        for (vram, at, end) in [
            (64 * GIB, 64 * GIB, 129 * GIB),
            (128 * GIB, 128 * GIB, 257 * GIB),
            (256 * GIB, 256 * GIB, 513 * GIB),
            (512 * GIB, 512 * GIB, 1025 * GIB),
        ] {
            let fs = vec![gpu(vram)];
            let p = plan(&fs, &limits(48)).unwrap();
            let got = placed(&p, &fs);
            assert!(got.contains(&(0, 1, at)), "{vram:#x}: {got:x?}");
            // The 32 MiB BAR right after the VRAM, the registers below 4 GiB.
            assert!(got.contains(&(0, 3, at + vram)), "{got:x?}");
            assert!(got.contains(&(0, 0, 0xcf00_0000)), "{got:x?}");
            assert_eq!(p.high, Some((64 * GIB, end.next_multiple_of(GIB))));
            for &(_, i, a) in &got {
                let size = fs[0].iter().find(|b| b.index == i).unwrap().size;
                assert_eq!(a % size, 0, "BAR {i} at {a:#x} is not aligned to {size:#x}");
            }
        }
    }

    #[test]
    fn no_64_bit_bars_keep_the_default_window() {
        let fs = vec![vec![bar(0, 4096, false, false)]];
        let p = plan(&fs, &limits(48)).unwrap();
        assert_eq!(p.high, Some((64 * GIB, 128 * GIB)));
        assert_eq!(p.functions[0].low, (0xcfff_f000, 0xd000_0000));
        assert!(plan(&[], &limits(48)).unwrap().functions.is_empty());
    }

    #[test]
    fn several_functions_share_the_windows_without_overlap() {
        // Two 80 GB GPUs, an NVMe (16 KiB BAR 0), a 64 GiB GPU: the 128 GiB ones first.
        let nvme = vec![bar(0, 16 << 10, true, false)];
        let fs = vec![gpu(64 * GIB), gpu(128 * GIB), nvme, gpu(128 * GIB)];
        let p = plan(&fs, &limits(48)).unwrap();
        let got = placed(&p, &fs);
        assert!(got.contains(&(1, 1, 128 * GIB)), "{got:x?}");
        assert!(got.contains(&(3, 1, 384 * GIB)), "{got:x?}");
        assert!(got.contains(&(0, 1, 576 * GIB)), "{got:x?}");
        let mut spans: Vec<(u64, u64)> = got
            .iter()
            .map(|&(f, i, a)| {
                let s = fs[f].iter().find(|b| b.index == i).unwrap().size;
                (a, a + s.max(BAR_ALIGN))
            })
            .collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(w[0].1 <= w[1].0, "overlap: {w:x?}");
        }
        let (hs, he) = p.high.unwrap();
        assert!(
            spans
                .iter()
                .filter(|s| s.0 >= 1 << 32)
                .all(|s| hs <= s.0 && s.1 <= he)
        );
        assert!(
            spans
                .iter()
                .filter(|s| s.0 < 1 << 32)
                .all(|s| s.1 <= 0xd000_0000)
        );
    }

    #[test]
    fn a_bar_past_the_address_width_is_refused_naming_it() {
        // 39 bits reach 512 GiB: a 128 GiB GPU fits (128..256 GiB and its 32 MiB BAR);
        // a 256 GiB one's 32 MiB BAR would start at 512 GiB; a 512 GiB BAR at 512 GiB.
        assert!(plan(&[gpu(128 * GIB)], &limits(39)).is_ok());
        let e = plan(&[gpu(256 * GIB)], &limits(39)).unwrap_err();
        assert!(
            matches!(e, WindowError::High { function: 0, bar: 3, at, .. } if at == 512 * GIB),
            "{e:?}"
        );
        let e = plan(&[gpu(512 * GIB)], &limits(39)).unwrap_err();
        assert!(
            matches!(
                e,
                WindowError::High {
                    function: 0,
                    bar: 1,
                    size,
                    at,
                    bits: 39,
                    ..
                } if size == 512 * GIB && at == 512 * GIB
            ),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(text.contains("BAR 1") && text.contains("39-bit"), "{text}");
        // Two 256 GiB GPUs at 40 bits: the first at 256 GiB, the second would reach past
        // 1 TiB (768 GiB + 256 GiB + 32 MiB).
        assert!(plan(&[gpu(256 * GIB)], &limits(40)).is_ok());
        let e = plan(&[gpu(256 * GIB), gpu(256 * GIB)], &limits(40)).unwrap_err();
        assert!(
            matches!(
                e,
                WindowError::High {
                    function: 1,
                    bar: 3,
                    ..
                }
            ),
            "{e:?}"
        );
        // The window never reaches past the width, even by default.
        let p = plan(&[gpu(GIB)], &limits(37)).unwrap();
        assert_eq!(p.high, Some((64 * GIB, 128 * GIB)));
        let p = plan(&[vec![bar(0, 4096, false, false)]], &limits(36)).unwrap();
        assert_eq!(p.high, None, "36 bits do not reach 64 GiB");
    }

    #[test]
    fn without_a_64_bit_window_64_bit_bars_go_low_if_they_fit() {
        let small = vec![bar(0, 4096, false, false), bar(2, 64 << 20, true, true)];
        let p = plan(std::slice::from_ref(&small), &limits(36)).unwrap();
        let got = placed(&p, std::slice::from_ref(&small));
        assert!(got.contains(&(0, 2, 0xc800_0000)), "{got:x?}");
        let e = plan(&[gpu(16 * GIB)], &limits(36)).unwrap_err();
        assert!(
            matches!(e, WindowError::BarSize { .. } | WindowError::Low { .. }),
            "{e:?}"
        );
    }

    #[test]
    fn the_32_bit_window_is_shared_and_refuses_what_does_not_fit() {
        let f = |mib: u64| vec![bar(0, mib << 20, false, false)];
        let p = plan(&[f(64), f(128)], &limits(48)).unwrap();
        assert_eq!(p.functions[1].low, (0xc800_0000, 0xd000_0000));
        assert_eq!(p.functions[0].low, (0xc400_0000, 0xc800_0000));
        let e = plan(&[f(128), f(128)], &limits(48)).unwrap_err();
        assert!(matches!(e, WindowError::Low { bar: 0, .. }), "{e:?}");
        for size in [0, 8, 3 << 20, 4 << 30] {
            let e = plan(&[vec![bar(0, size, false, false)]], &limits(48)).unwrap_err();
            assert!(matches!(e, WindowError::BarSize { .. }), "{size:#x}: {e:?}");
        }
    }

    #[test]
    fn sysfs_resource_lines_give_the_bars() {
        // The rig's ivshmem-plain and e1000e, as their sysfs `resource` files read.
        let ivshmem = "0x00000000fea5b000 0x00000000fea5b0ff 0x0000000000040200\n\
                       0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                       0x000000a000000000 0x000000bfffffffff 0x000000000014220c\n\
                       0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                       0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                       0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                       0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
        let bars = bars_from_resource(ivshmem).unwrap();
        assert_eq!(
            bars,
            vec![bar(0, 256, false, false), bar(2, 128 * GIB, true, true)]
        );
        // e1000e: BAR 0 128 KiB, BAR 2 I/O, BAR 3 16 KiB, a 256 KiB ROM.
        let e1000e = "0x00000000fea00000 0x00000000fea1ffff 0x0000000000040200\n\
                      0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                      0x000000000000c040 0x000000000000c05f 0x0000000000040101\n\
                      0x00000000fea80000 0x00000000fea83fff 0x0000000000040200\n\
                      0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                      0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                      0x00000000feb00000 0x00000000feb3ffff 0x0000000000046200\n\
                      0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
        let bars = bars_from_resource(e1000e).unwrap();
        let rom = PhysicalBar {
            mmap: false,
            ..bar(ROM_BAR, 256 << 10, false, false)
        };
        assert_eq!(bars.len(), 4);
        assert_eq!(
            (bars[0], bars[2], bars[3]),
            (
                bar(0, 128 << 10, false, false),
                bar(3, 16 << 10, false, false),
                rom
            )
        );
        // The ROM is placed below 4 GiB with the BARs.
        let p = plan(std::slice::from_ref(&bars), &limits(48)).unwrap();
        let placed = place_bars(&bars, &p.functions[0]).unwrap();
        assert!(
            placed
                .iter()
                .any(|&(i, a)| i == ROM_BAR && a % (256 << 10) == 0 && a < 1 << 32)
        );
        let io = "0x000000000000c040 0x000000000000c05f 0x0000000000040101\n";
        let bars = bars_from_resource(io).unwrap();
        assert!(bars[0].io && !bars[0].mmap && bars[0].size == 32);
        for bad in ["0x1 0x2", "zz 0x2 0x200", "0x1 0x2 0x200 0x4"] {
            assert!(
                matches!(
                    bars_from_resource(bad),
                    Err(WindowError::Resource { line: 0, .. })
                ),
                "{bad}"
            );
        }
    }
}
