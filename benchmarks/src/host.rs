//! Host helpers every harness shares: pinning a thread, a futex wait and wake, and a disk
//! image of a given size. Where a VMM's threads run is [`crate::placement`].

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::AtomicU32;

/// Writes the image and returns the probe's checksum of it.
pub fn make_image(path: &Path, bytes: u64) -> std::io::Result<u64> {
    let mut rng = XorShift(0x0b1c_0b1c_5eed_0001);
    let mut w = BufWriter::new(File::create(path)?);
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for _ in 0..bytes / 8 {
        let v = rng.next_word();
        h = (h ^ v).wrapping_mul(0x0000_0100_0000_01b3);
        w.write_all(&v.to_le_bytes())?;
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(h)
}

/// The first `name` on PATH that is a file, if any.
pub fn on_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|f| f.is_file())
}

/// Pins the calling thread to `core`.
pub fn pin(core: usize) {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sets one bit of a valid set (CPU_SET bounds-checks the index).
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: applies a valid set to the calling thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
}

pub fn futex_wait(word: &AtomicU32, val: u32) {
    // SAFETY: FUTEX_WAIT on a live u32; returns on wake, EAGAIN or EINTR.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            val,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}

pub struct XorShift(pub u64);
impl XorShift {
    pub fn next_word(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
