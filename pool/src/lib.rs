//! Where a guest's memory comes from.
//!
//! [`extent`] is the pool's allocator: pure logic that builds without `std`. The rest
//! (sysfs hugepages, hugetlbfs, the pool file, anonymous memory) needs `std`.
//!
//! [`GuestRam`] is the one thing the VMM needs from a memory source: a flat, host-mapped
//! range that outlives the guest. [`AnonRam`] provides it from anonymous memory (optionally
//! `MAP_HUGETLB`); the reserved hugepage pool provides it from an extent of the pool file.

#![cfg_attr(not(feature = "std"), no_std)]

pub mod extent;

#[cfg(feature = "std")]
pub mod anon;
#[cfg(feature = "std")]
pub mod hugepages;
#[cfg(feature = "std")]
pub mod hugetlbfs;
#[cfg(feature = "std")]
pub mod poolfile;

#[cfg(feature = "std")]
pub use anon::{AnonRam, Backing};
pub use extent::{Extent, ExtentAllocator, ExtentError};

#[cfg(feature = "std")]
/// A flat host mapping that backs a guest's RAM.
///
/// # Safety
/// Implementors guarantee that `as_ptr()..as_ptr() + len()` is mapped read-write for as
/// long as the value lives, and that nothing else unmaps it.
pub unsafe trait GuestRam: Send + Sync {
    /// Start of the mapping.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the mapping is empty (never, for a real guest).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Short description for logs and status ("anonymous", "hugetlb 2M", "pool extent ...").
    fn describe(&self) -> String;
}
