//! Static partitions on KVM.
//!
//! A partition is a guest on dedicated cores (one vCPU pinned per core) with memory taken
//! from a reservation. This crate is the only one that talks to KVM, and inside it only
//! [`kvm`] does; [`vcpu`] says what an exit means, [`launch`] is the pipeline from user
//! input to teardown.

pub mod api;
pub mod assist;
pub mod claim;
pub mod console;
pub mod cores;
pub mod cpuid;
pub mod cpumodel;
pub mod disks;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
pub mod idle;
pub mod isolation;
pub mod keeper;
pub mod kvm;
pub mod launch;
pub mod ledger;
pub mod memory;
pub mod outcome;
pub mod partitions;
pub mod pci;
pub mod plan;
pub mod pod;
pub mod readback;
pub mod reserve;
pub mod sandbox;
pub mod signals;
pub mod size;
pub mod statedir;
pub mod timeline;
pub mod vcpu;
pub mod vfio;

pub use launch::{
    Console, Ending, KernelSource, LaunchConfig, LaunchError, LaunchReport, MemorySource,
    PoolRequest, SandboxRequest,
};
