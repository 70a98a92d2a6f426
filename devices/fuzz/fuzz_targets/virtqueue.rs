//! The virtqueue and the virtio-blk request parser over fuzzer-made guest memory
//! (`devices::fuzzing::virtqueue`, replayed over the corpus by `cargo test`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| devices::fuzzing::virtqueue(data));
