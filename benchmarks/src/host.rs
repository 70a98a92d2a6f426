//! Host helpers every harness shares: pinning a thread, a futex wait and wake, a disk
//! image of a given size, and starting a QEMU peer pinned beside the partition.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

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

/// QEMU was started paused (`-S`): pin its vCPU thread to `vcpu_core` and every other
/// thread to `other_core`, then let it run through QMP.
pub fn pin_and_start_qemu(
    pid: u32,
    qmp: &Path,
    vcpu_core: usize,
    other_core: usize,
) -> Result<(), String> {
    use std::os::unix::net::UnixStream;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match UnixStream::connect(qmp) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("QMP socket {}: {e}", qmp.display())),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    // Reads until a line answers the command (events such as RESUME may come first).
    let reply = |s: &mut UnixStream, what: &str, key: &str| -> Result<String, String> {
        let mut acc = Vec::new();
        let mut b = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&acc).into_owned();
            if let Some(l) = text
                .lines()
                .find(|l| l.contains(key) || l.contains("\"error\""))
                .filter(|_| text.ends_with('\n'))
            {
                return Ok(l.to_string());
            }
            // A signal meanwhile (a child of another harness thread ending) is not an end.
            let n = match s.read(&mut b) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => r.map_err(|e| format!("QMP {what}: {e}"))?,
            };
            if n == 0 {
                return Err(format!("QMP {what}: closed"));
            }
            acc.extend_from_slice(&b[..n]);
        }
    };
    reply(&mut s, "greeting", "\"QMP\"")?;
    s.write_all(b"{\"execute\":\"qmp_capabilities\"}\n")
        .map_err(|e| e.to_string())?;
    reply(&mut s, "capabilities", "\"return\"")?;
    let is_vcpu = |comm: &str| comm.starts_with("CPU ") && comm.contains("/KVM");
    if !pin_threads(pid, is_vcpu, vcpu_core, other_core)? {
        return Err("no QEMU vCPU thread (\"CPU 0/KVM\") found".into());
    }
    s.write_all(b"{\"execute\":\"cont\"}\n")
        .map_err(|e| e.to_string())?;
    let r = reply(&mut s, "cont", "\"return\"")?;
    if !r.contains("\"return\"") {
        return Err(format!("QMP cont: {}", r.trim()));
    }
    Ok(())
}

/// Pins each thread of process `pid`: those whose name `is_vcpu` says is a vCPU's to
/// `vcpu_core`, the others to `other_core`. Whether a vCPU thread was among them.
fn pin_threads(
    pid: u32,
    is_vcpu: impl Fn(&str) -> bool,
    vcpu_core: usize,
    other_core: usize,
) -> Result<bool, String> {
    let mut vcpu = false;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| e.to_string())?;
    for t in tasks.flatten() {
        let Ok(tid) = t.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let v = is_vcpu(comm.trim());
        vcpu |= v;
        if !set_affinity(tid, if v { vcpu_core } else { other_core }) {
            return Err(format!("pinning thread {tid} of {pid}"));
        }
    }
    Ok(vcpu)
}

/// Pins a running Firecracker as QEMU is pinned: its vCPU thread (`fc_vcpu 0`) to
/// `vcpu_core`, every other thread to `other_core`, as soon as the vCPU thread exists.
/// Firecracker cannot start paused without its API, so the guest's first instructions
/// (its boot, before any measurement) may run before the pinning.
pub fn pin_firecracker(pid: u32, vcpu_core: usize, other_core: usize) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if pin_threads(pid, |c| c.starts_with("fc_vcpu"), vcpu_core, other_core)? {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("no Firecracker vCPU thread (\"fc_vcpu 0\") within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
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

fn set_affinity(tid: i32, core: usize) -> bool {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sets one bit of a valid set (CPU_SET bounds-checks the index).
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: applies a valid set to a thread id; a stale id only fails.
    unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}
