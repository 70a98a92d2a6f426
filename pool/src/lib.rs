//! Where a guest's memory comes from.
//!
//! [`extent`] is the pool's allocator: pure logic that builds without `std`. The rest
//! (sysfs hugepages, hugetlbfs, the pool file, anonymous memory) needs `std`.
//!
//! [`RamSource`] says what a guest's RAM is mapped from: anonymous memory (optionally
//! `MAP_HUGETLB`) or an extent of the reserved pool's file. The VMM's guest memory
//! (vm-memory) makes and owns the mapping; the pool maps an extent itself only to scrub it.

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
pub mod source;

#[cfg(feature = "std")]
pub use anon::Backing;
pub use extent::{Extent, ExtentAllocator, ExtentError};
#[cfg(feature = "std")]
pub use source::RamSource;
