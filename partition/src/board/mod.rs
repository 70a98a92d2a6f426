//! The board a launch builds its machine on: where every device goes and how each kind is
//! wired to KVM, apart from the pipeline that decides when ([`crate::machine`]). Nothing
//! here imports the pipeline (`partition/tests/module_graph.rs` keeps that so).
//!
//! - [`resources`]: the one allocator of interrupt lines, MMIO and port ranges, PCI slots
//!   and memory slots, and the machine plan made from it before anything is opened.
//! - [`device`]: what the launch does with an attached device of any kind (its
//!   descriptors for the filters, its threads, its report entry); [`kind`]: what a kind
//!   brings (the `Kind` trait: its words, rules, host facts, place, open and attach steps).
//! - The kinds, a file each: [`disks`] (`--disk`: virtio-blk on [`virtio_mmio`] or, with
//!   `transport=pci`, on [`virtio_pci`], served by the io_uring worker), [`engine`] (`--device engine`), [`vfio`] (`--device vfio=`: a
//!   host PCI function given to the partition); the PCI ones' functions go on the root in
//!   [`pci`], which names no kind.
//! - [`console`]: the guest's serial output, capped, watched for fault lines, its first
//!   byte stamped.
//! - [`spec`]: `DeviceSpec`, the one list of the kinds, a line each (`LaunchConfig::devices`
//!   holds requests of them in the order asked), and the steps that drive every kind
//!   through a launch; `--device` arguments are handed to their kind there.

pub mod console;
pub mod device;
pub mod disks;
pub mod engine;
pub mod kind;
pub mod pci;
pub mod resources;
pub mod spec;
pub mod vfio;
pub mod virtio_mmio;
pub mod virtio_pci;
