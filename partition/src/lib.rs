//! Static partitions on KVM.
//!
//! A partition is a guest on dedicated cores (one vCPU pinned per core) with memory taken
//! from a reservation. The crate is laid out in rooms that follow docs/architecture.md,
//! each depending only on the rooms listed before it (`partition/tests/module_graph.rs`
//! keeps that order):
//!
//! - [`config`]: what a user writes, parsed and typed (core lists, sizes, key=value lists).
//! - [`sys`]: the OS seams (bounded file reads, the state directory, signals, the sandbox,
//!   the launch timeline).
//! - [`cpu`]: the CPU the guest sees and what its exits mean (CPU model, CPUID, idle
//!   policies, the pure exit handler, instruction assists, the SYSCALL repair).
//! - [`memory`]: the guest's RAM.
//! - [`kvm`]: the only door to KVM (VM, vCPU ioctls, statistics).
//! - [`host`]: what `reserve` takes from the host and the ledger that records who owns it.
//! - [`board`]: where every device goes and how each kind is wired to KVM (the resource
//!   allocator, virtio-blk disks, PCI functions, VFIO passthrough, the console).
//! - [`api`]: a running partition's local API (HTTP on a Unix socket), its routes and the
//!   OpenAPI description of them.
//! - [`machine`]: the pipeline from user input to teardown ([`machine::launch`]): the check,
//!   the vCPU threads, the confinement, the control of a running partition, its outcome.

pub mod api;
pub mod board;
pub mod config;
pub mod cpu;
#[doc(hidden)]
pub mod fuzzing;
pub mod host;
pub mod kvm;
pub mod machine;
pub mod memory;
pub mod sys;

pub use board::console::Console;
pub use machine::config::{KernelSource, LaunchConfig, MemorySource, PoolRequest, SandboxRequest};
pub use machine::error::LaunchError;
pub use machine::outcome::{Ending, LaunchReport};
