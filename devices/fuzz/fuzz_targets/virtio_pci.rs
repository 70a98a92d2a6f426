//! Configuration-space and BAR traffic on a virtio-pci function with a real virtio-blk
//! behind it (`devices::fuzzing::virtio_pci`, replayed over the corpus by `cargo test`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| devices::fuzzing::virtio_pci(data));
