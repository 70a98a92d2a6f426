//! What a user writes, parsed strictly and typed at the edge: core lists and byte sizes.

pub mod cores;
pub mod size;
