//! What `launch` assembles and runs: disks, PCI functions and VFIO passthrough, the
//! console, the local API, and the pipeline itself ([`launch`]) with its outcome
//! ([`outcome`]).

pub mod api;
pub mod check;
pub mod config;
pub mod confine;
pub mod console;
pub mod control;
pub mod devices;
pub mod disks;
pub mod launch;
pub mod outcome;
pub mod pci;
pub mod resources;
pub mod vcpus;
pub mod vfio;
