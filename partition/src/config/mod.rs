//! What a user writes, parsed strictly and typed at the edge: core lists, byte sizes, and
//! `key=value` lists with the value types `--disk`, `--device`, `--cores`, the host plan
//! file and the local API share ([`keyvalue`]).

pub mod cores;
pub mod keyvalue;
pub mod size;
