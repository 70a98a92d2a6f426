//! The board a launch builds its machine on: where every device goes and how each kind is
//! wired to KVM, apart from the pipeline that decides when ([`crate::machine`]). Nothing
//! here imports the pipeline (`partition/tests/module_graph.rs` keeps that so).
//!
//! - [`resources`]: the one allocator of interrupt lines, MMIO and port ranges, PCI slots
//!   and memory slots, and the machine plan made from it before anything is opened.
//! - [`disks`]: `--disk`, virtio-blk on virtio-mmio with ioeventfd doorbells and irqfd
//!   interrupts, served by the io_uring worker.
//! - [`pci`]: the PCI functions (host bridge, the submission engine, passed-through
//!   functions) and their KVM side (MSI-X routes, doorbell and BAR memory slots).
//! - [`vfio`]: a host PCI function given to the partition through VFIO.
//! - [`console`]: the guest's serial output, capped.

pub mod console;
pub mod disks;
pub mod pci;
pub mod resources;
pub mod vfio;
