//! The pool's extent allocator: which byte ranges of the pool are free.
//!
//! Pure logic, no `std`: a sorted list of free extents in a fixed-capacity `heapless::Vec`.
//! First fit or an explicit offset; freeing merges with both neighbours. Every extent is a
//! multiple of the allocation unit (the hugepage size) and aligned to it.

use heapless::Vec;

/// Most free extents tracked (fragments); far more than a host's partitions can create.
pub const MAX_FREE: usize = 256;

/// A byte range `[offset, offset + len)` of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Extent {
    /// Start.
    pub offset: u64,
    /// Length.
    pub len: u64,
}

impl Extent {
    /// One past the end.
    pub const fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// Whether the two overlap.
    pub const fn overlaps(&self, o: &Extent) -> bool {
        self.offset < o.end() && o.offset < self.end()
    }
}

/// Why an allocation or free failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentError {
    /// Zero length, or not a multiple of the unit.
    BadLength {
        /// Requested length.
        len: u64,
        /// Allocation unit.
        unit: u64,
    },
    /// Offset not aligned to the unit.
    Misaligned {
        /// Requested offset.
        offset: u64,
        /// Allocation unit.
        unit: u64,
    },
    /// Beyond the end of the pool.
    OutOfRange {
        /// Requested extent.
        extent: Extent,
        /// Pool size.
        size: u64,
    },
    /// (Part of) the range is in use.
    InUse {
        /// Requested extent.
        extent: Extent,
    },
    /// No free extent is large enough.
    NoSpace {
        /// Requested length.
        len: u64,
        /// Largest free extent.
        largest: u64,
    },
    /// Freeing something that is (partly) free already.
    DoubleFree {
        /// The extent.
        extent: Extent,
    },
    /// Too many fragments to track.
    TooFragmented,
}

impl core::error::Error for ExtentError {}

impl core::fmt::Display for ExtentError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::BadLength { len, unit } => {
                write!(f, "length {len} is zero or not a multiple of {unit} bytes")
            }
            Self::Misaligned { offset, unit } => {
                write!(f, "offset {offset:#x} is not a multiple of {unit} bytes")
            }
            Self::OutOfRange { extent, size } => write!(
                f,
                "extent {:#x}+{:#x} runs past the end of the {size:#x}-byte pool",
                extent.offset, extent.len
            ),
            Self::InUse { extent } => write!(
                f,
                "extent {:#x}+{:#x} is (partly) in use",
                extent.offset, extent.len
            ),
            Self::NoSpace { len, largest } => write!(
                f,
                "no free extent of {len} bytes (largest free: {largest} bytes)"
            ),
            Self::DoubleFree { extent } => write!(
                f,
                "extent {:#x}+{:#x} is already (partly) free",
                extent.offset, extent.len
            ),
            Self::TooFragmented => write!(f, "the pool has too many free fragments"),
        }
    }
}

/// Free space of a pool of `size` bytes, in units of `unit` bytes.
#[derive(Clone, Debug)]
pub struct ExtentAllocator {
    size: u64,
    unit: u64,
    free: Vec<Extent, MAX_FREE>,
}

impl ExtentAllocator {
    /// An allocator with the whole pool free. `unit` must be a power of two and `size` a
    /// multiple of it.
    pub fn new(size: u64, unit: u64) -> Result<Self, ExtentError> {
        if unit == 0 || !unit.is_power_of_two() || size == 0 || size % unit != 0 {
            return Err(ExtentError::BadLength { len: size, unit });
        }
        let mut free = Vec::new();
        // Cannot fail: the vector is empty.
        let _ = free.push(Extent {
            offset: 0,
            len: size,
        });
        Ok(Self { size, unit, free })
    }

    /// Pool size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Allocation unit.
    pub fn unit(&self) -> u64 {
        self.unit
    }

    /// Free extents in address order.
    pub fn free_extents(&self) -> &[Extent] {
        &self.free
    }

    /// Total free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|e| e.len).sum()
    }

    fn check(&self, e: Extent) -> Result<(), ExtentError> {
        if e.len == 0 || e.len % self.unit != 0 {
            return Err(ExtentError::BadLength {
                len: e.len,
                unit: self.unit,
            });
        }
        if e.offset % self.unit != 0 {
            return Err(ExtentError::Misaligned {
                offset: e.offset,
                unit: self.unit,
            });
        }
        match e.offset.checked_add(e.len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ExtentError::OutOfRange {
                extent: e,
                size: self.size,
            }),
        }
    }

    /// Takes the first free extent of `len` bytes.
    pub fn alloc(&mut self, len: u64) -> Result<Extent, ExtentError> {
        self.check(Extent { offset: 0, len }).map_err(|e| match e {
            ExtentError::OutOfRange { .. } => ExtentError::NoSpace {
                len,
                largest: self.largest(),
            },
            other => other,
        })?;
        let i = self
            .free
            .iter()
            .position(|f| f.len >= len)
            .ok_or(ExtentError::NoSpace {
                len,
                largest: self.largest(),
            })?;
        let got = Extent {
            offset: self.free[i].offset,
            len,
        };
        self.take(i, got)?;
        Ok(got)
    }

    /// Takes exactly `e`.
    pub fn alloc_at(&mut self, e: Extent) -> Result<Extent, ExtentError> {
        self.check(e)?;
        let i = self
            .free
            .iter()
            .position(|f| f.offset <= e.offset && e.end() <= f.end())
            .ok_or(ExtentError::InUse { extent: e })?;
        self.take(i, e)?;
        Ok(e)
    }

    fn largest(&self) -> u64 {
        self.free.iter().map(|f| f.len).max().unwrap_or(0)
    }

    /// Removes `e` from free extent `i`, which contains it.
    fn take(&mut self, i: usize, e: Extent) -> Result<(), ExtentError> {
        let f = self.free[i];
        let before = Extent {
            offset: f.offset,
            len: e.offset - f.offset,
        };
        let after = Extent {
            offset: e.end(),
            len: f.end() - e.end(),
        };
        match (before.len > 0, after.len > 0) {
            (false, false) => {
                self.free.remove(i);
            }
            (true, false) => self.free[i] = before,
            (false, true) => self.free[i] = after,
            (true, true) => {
                if self.free.is_full() {
                    return Err(ExtentError::TooFragmented);
                }
                self.free[i] = before;
                self.free
                    .insert(i + 1, after)
                    .map_err(|_| ExtentError::TooFragmented)?;
            }
        }
        Ok(())
    }

    /// Returns `e` to the free list, merging with its neighbours.
    pub fn free(&mut self, e: Extent) -> Result<(), ExtentError> {
        self.check(e)?;
        if self.free.iter().any(|f| f.overlaps(&e)) {
            return Err(ExtentError::DoubleFree { extent: e });
        }
        let i = self
            .free
            .iter()
            .position(|f| f.offset > e.offset)
            .unwrap_or(self.free.len());
        let merge_prev = i > 0 && self.free[i - 1].end() == e.offset;
        let merge_next = i < self.free.len() && self.free[i].offset == e.end();
        match (merge_prev, merge_next) {
            (true, true) => {
                let next = self.free.remove(i);
                self.free[i - 1].len += e.len + next.len;
            }
            (true, false) => self.free[i - 1].len += e.len,
            (false, true) => {
                self.free[i].offset = e.offset;
                self.free[i].len += e.len;
            }
            (false, false) => self
                .free
                .insert(i, e)
                .map_err(|_| ExtentError::TooFragmented)?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB2: u64 = 2 << 20;

    fn ext(offset: u64, len: u64) -> Extent {
        Extent { offset, len }
    }

    #[test]
    fn first_fit_and_merge() {
        let mut a = ExtentAllocator::new(8 * MB2, MB2).unwrap();
        let x = a.alloc(2 * MB2).unwrap();
        let y = a.alloc(MB2).unwrap();
        let z = a.alloc(2 * MB2).unwrap();
        assert_eq!((x.offset, y.offset, z.offset), (0, 2 * MB2, 3 * MB2));
        a.free(y).unwrap();
        // First fit takes the hole left by y.
        assert_eq!(a.alloc(MB2).unwrap().offset, 2 * MB2);
        a.free(ext(2 * MB2, MB2)).unwrap();
        a.free(x).unwrap();
        a.free(z).unwrap();
        assert_eq!(a.free_extents(), &[ext(0, 8 * MB2)]);
    }

    #[test]
    fn explicit_offsets() {
        let mut a = ExtentAllocator::new(8 * MB2, MB2).unwrap();
        a.alloc_at(ext(4 * MB2, 2 * MB2)).unwrap();
        assert_eq!(a.free_extents(), &[ext(0, 4 * MB2), ext(6 * MB2, 2 * MB2)]);
        assert_eq!(
            a.alloc_at(ext(5 * MB2, MB2)),
            Err(ExtentError::InUse {
                extent: ext(5 * MB2, MB2)
            })
        );
        assert_eq!(
            a.alloc_at(ext(3 * MB2, 2 * MB2)),
            Err(ExtentError::InUse {
                extent: ext(3 * MB2, 2 * MB2)
            })
        );
        assert!(matches!(
            a.alloc_at(ext(7 * MB2, 2 * MB2)),
            Err(ExtentError::OutOfRange { .. })
        ));
        assert!(matches!(
            a.alloc_at(ext(MB2 / 2, MB2)),
            Err(ExtentError::Misaligned { .. })
        ));
        assert!(matches!(
            a.alloc_at(ext(u64::MAX - MB2 + 1, MB2)),
            Err(ExtentError::OutOfRange { .. }) | Err(ExtentError::Misaligned { .. })
        ));
        // A too-big request reports the largest hole.
        assert_eq!(
            a.alloc(5 * MB2),
            Err(ExtentError::NoSpace {
                len: 5 * MB2,
                largest: 4 * MB2
            })
        );
    }

    #[test]
    fn bad_requests() {
        assert!(ExtentAllocator::new(3 * MB2 + 1, MB2).is_err());
        assert!(ExtentAllocator::new(4 * MB2, 3).is_err());
        let mut a = ExtentAllocator::new(4 * MB2, MB2).unwrap();
        assert!(matches!(a.alloc(0), Err(ExtentError::BadLength { .. })));
        assert!(matches!(
            a.alloc(MB2 + 1),
            Err(ExtentError::BadLength { .. })
        ));
        assert!(matches!(a.alloc(8 * MB2), Err(ExtentError::NoSpace { .. })));
        assert!(matches!(
            a.free(ext(0, MB2)),
            Err(ExtentError::DoubleFree { .. })
        ));
    }

    /// A tiny deterministic generator, so the property test needs no std.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
    }

    /// Property: after any sequence of allocations and frees, the free list is sorted,
    /// disjoint, fully merged, and free + allocated = the pool, with no overlap.
    #[test]
    fn random_operations_keep_the_invariants() {
        for seed in 0..200u64 {
            let units = 64u64;
            let mut a = ExtentAllocator::new(units * MB2, MB2).unwrap();
            let mut held: heapless::Vec<Extent, 128> = heapless::Vec::new();
            let mut rng = Lcg(seed);
            for _ in 0..300 {
                match rng.next() % 3 {
                    0 | 1 if !held.is_full() => {
                        let len = (1 + rng.next() % 8) * MB2;
                        let r = if rng.next() % 2 == 0 {
                            a.alloc(len)
                        } else {
                            a.alloc_at(ext((rng.next() % units) * MB2, len))
                        };
                        if let Ok(e) = r {
                            assert!(held.iter().all(|h| !h.overlaps(&e)), "seed {seed}: overlap");
                            held.push(e).unwrap();
                        }
                    }
                    _ if !held.is_empty() => {
                        let i = (rng.next() % held.len() as u64) as usize;
                        let e = held.swap_remove(i);
                        a.free(e).unwrap();
                        // Freeing twice is refused.
                        assert!(a.free(e).is_err());
                    }
                    _ => {}
                }
                let f = a.free_extents();
                for w in f.windows(2) {
                    assert!(
                        w[0].end() < w[1].offset,
                        "seed {seed}: unsorted or unmerged"
                    );
                }
                let used: u64 = held.iter().map(|e| e.len).sum();
                assert_eq!(a.free_bytes() + used, units * MB2, "seed {seed}: leak");
                for h in &held {
                    assert!(
                        f.iter().all(|x| !x.overlaps(h)),
                        "seed {seed}: held is free"
                    );
                }
            }
        }
    }
}
