//! A ledger file, perhaps forged (`partition::fuzzing::ledger`, replayed over the corpus by
//! `cargo test`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| partition::fuzzing::ledger(data));
