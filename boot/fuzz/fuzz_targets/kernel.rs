//! A kernel image from the user: ELF, bzImage, PVH note, bzImage payload, loading and boot
//! structures (`boot::fuzzing::kernel`, replayed over the corpus by `cargo test`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| boot::fuzzing::kernel(data));
