//! Register traffic on a virtio-mmio window with a real virtio-blk behind it
//! (`devices::fuzzing::mmio`, replayed over the corpus by `cargo test`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| devices::fuzzing::mmio(data));
