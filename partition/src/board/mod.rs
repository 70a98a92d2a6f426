//! The board a launch builds its machine on: where every device goes and how each kind is
//! wired to KVM, apart from the pipeline that decides when ([`crate::machine`]). Nothing
//! here imports the pipeline (`partition/tests/module_graph.rs` keeps that so).
//!
//! - [`resources`]: the one allocator of interrupt lines, MMIO and port ranges, PCI slots
//!   and memory slots, and the machine plan made from it before anything is opened.
//! - [`device`]: what the launch does with an attached device of any kind (its
//!   descriptors for the filters, its threads, its report entry).
//! - The kinds, a file each: [`disks`] (`--disk`: virtio-blk on [`virtio_mmio`], served by
//!   the io_uring worker), [`engine`] (`--device engine`), [`vfio`] (`--device vfio=`: a
//!   host PCI function given to the partition); the PCI ones on the root in [`pci`].
//! - [`console`]: the guest's serial output, capped, watched for fault lines, its first
//!   byte stamped.
//! - [`spec`]: `DeviceSpec`, the one list of the kinds a launch request can ask for, each
//!   kind's request a variant (`LaunchConfig::devices` holds them in the order asked);
//!   [`kinds`]: the `--device` kinds and their parsers, one table.

pub mod console;
pub mod device;
pub mod disks;
pub mod engine;
pub mod kinds;
pub mod pci;
pub mod resources;
pub mod spec;
pub mod vfio;
pub mod virtio_mmio;
