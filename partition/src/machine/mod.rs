//! What `launch` runs: the pipeline from a checked configuration to teardown
//! ([`launch`]), the vCPU threads, the confinement, the control of a running partition, and
//! its outcome ([`outcome`]). Where the devices go and how each is wired is the board's
//! ([`crate::board`]); the local API is its own room ([`crate::api`]).

pub mod check;
pub mod config;
pub mod confine;
pub mod control;
pub mod devices;
pub mod error;
pub mod facts;
pub mod launch;
pub mod open;
pub mod outcome;
pub mod vcpus;
