//! A host plan file (`partition::fuzzing::plan`, replayed over the corpus by `cargo test`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| partition::fuzzing::plan(data));
