//! A real kernel nobody here wrote: Debian's cloud kernel, fetched with `apt-get download`.
//!
//! - Its ELF vmlinux, extracted by `partition extract-vmlinux`, boots with a busybox
//!   initramfs; its own log must show "Linux version", our exact command line and an e820
//!   map equal to the partition's memory. On a host with real KVM it must then reach
//!   userspace and power off through ACPI; on the nested kvm_pvm development hosts it dies
//!   in early boot (an emulation failure), so the test stops after the early lines and says
//!   what it could not check.
//! - Its bzImage is loaded and the zero page checked field by field; then it boots through
//!   its own decompressor (minutes in the nested host's emulator) to the same early lines.
//!
//! Assets are cached under target/tmp/assets (inside the repository, git-ignored).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;

static ASSETS: Mutex<()> = Mutex::new(());

fn assets_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("assets");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sh(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Downloads Debian package `pkg` (resolving a metapackage to what it depends on) and
/// unpacks it under `dir/<name>`; returns the unpack directory.
fn debian_package(pkg: &str, name: &str) -> PathBuf {
    let dir = assets_dir();
    let unpacked = dir.join(name);
    if unpacked.join(".done").exists() {
        return unpacked;
    }
    // linux-image-cloud-amd64 is a metapackage: find the versioned image it pulls in.
    let deps = sh(
        Command::new("apt-cache").args(["depends", pkg]),
        "apt-cache depends (run `apt-get update` first if the package is unknown)",
    );
    let real = deps
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .filter(|d| d.starts_with("linux-image-"))
        .unwrap_or(pkg)
        .to_string();
    let dl = dir.join(format!("{name}-deb"));
    let _ = std::fs::remove_dir_all(&dl);
    std::fs::create_dir_all(&dl).unwrap();
    let mut ok = false;
    for _ in 0..3 {
        let st = Command::new("apt-get")
            .args(["download", "-q", &real])
            .current_dir(&dl)
            .status()
            .expect("apt-get");
        if st.success() {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    assert!(
        ok,
        "apt-get download {real} failed three times (is Debian's mirror reachable?)"
    );
    let deb = std::fs::read_dir(&dl)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .expect("downloaded .deb");
    let _ = std::fs::remove_dir_all(&unpacked);
    sh(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked),
        "dpkg-deb -x",
    );
    std::fs::write(unpacked.join(".done"), real).unwrap();
    let _ = std::fs::remove_dir_all(&dl);
    unpacked
}

fn debian_bzimage() -> PathBuf {
    let d = debian_package("linux-image-cloud-amd64", "linux-image").join("boot");
    std::fs::read_dir(&d)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .expect("vmlinuz in the kernel package")
}

/// The vmlinux inside the bzImage, extracted by the CLI under test.
fn debian_vmlinux(bz: &Path) -> PathBuf {
    let out = assets_dir().join("vmlinux");
    if !out.exists() {
        let tmp = assets_dir().join("vmlinux.tmp");
        let r = run(
            &[
                "extract-vmlinux",
                bz.to_str().unwrap(),
                "-o",
                tmp.to_str().unwrap(),
            ],
            Duration::from_secs(120),
        );
        assert_eq!(r.code(), 0, "extract-vmlinux: {}", r.stderr);
        std::fs::rename(&tmp, &out).unwrap();
    }
    out
}

/// Appends one newc cpio entry.
fn cpio_entry(buf: &mut Vec<u8>, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) {
    let ino = buf.len() as u32 + 1;
    let header = format!(
        "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
        ino,
        mode,
        0,
        0,
        1,
        0,
        data.len(),
        0,
        0,
        rdev.0,
        rdev.1,
        name.len() + 1,
        0
    );
    buf.extend_from_slice(header.as_bytes());
    buf.extend_from_slice(name.as_bytes());
    buf.push(0);
    while buf.len() % 4 != 0 {
        buf.push(0);
    }
    buf.extend_from_slice(data);
    while buf.len() % 4 != 0 {
        buf.push(0);
    }
}

/// A busybox initramfs whose init prints a marker and powers off.
fn busybox_initramfs() -> PathBuf {
    let out = assets_dir().join("initramfs.cpio");
    if out.exists() {
        return out;
    }
    let bb = std::fs::read(debian_package("busybox-static", "busybox").join("bin/busybox"))
        .expect("bin/busybox in busybox-static");
    let init =
        b"#!/bin/busybox sh\n/bin/busybox echo PARTITION-USERSPACE-OK\n/bin/busybox poweroff -f\n";
    let mut c = Vec::new();
    cpio_entry(&mut c, "bin", 0o040755, &[], (0, 0));
    cpio_entry(&mut c, "dev", 0o040755, &[], (0, 0));
    cpio_entry(&mut c, "dev/console", 0o020600, &[], (5, 1));
    cpio_entry(&mut c, "bin/busybox", 0o100755, &bb, (0, 0));
    cpio_entry(&mut c, "init", 0o100755, init, (0, 0));
    cpio_entry(&mut c, "TRAILER!!!", 0, &[], (0, 0));
    let tmp = assets_dir().join("initramfs.tmp");
    std::fs::File::create(&tmp).unwrap().write_all(&c).unwrap();
    std::fs::rename(&tmp, &out).unwrap();
    out
}

/// The kernel's "BIOS-e820" lines for our map of `size` bytes.
fn expected_kernel_e820(size: u64) -> Vec<String> {
    expected_e820(size)
        .iter()
        .map(|e| {
            format!(
                "BIOS-e820: [mem {:#018x}-{:#018x}] {}",
                e.start,
                e.end - 1,
                if e.kind == 1 { "usable" } else { "reserved" }
            )
        })
        .collect()
}

/// What the kernel's early log shows, once it has shown all of it.
struct EarlyLog {
    banner: String,
    cmdline: String,
    e820: Vec<String>,
}

fn early_log(log: &str) -> Option<EarlyLog> {
    let body = |l: &str| l.split_once("] ").map(|(_, b)| b.to_string());
    // Only whole lines: the console file is read while the guest is still writing it, and
    // a half-written "BIOS-e8" would look like the line that ends the map.
    let lines: Vec<&str> = log[..=log.rfind('\n')?].lines().collect();
    let banner = lines.iter().find(|l| l.contains("Linux version "))?;
    let cmdline = lines.iter().find(|l| l.contains("Command line: "))?;
    let start = lines
        .iter()
        .position(|l| l.contains("BIOS-provided physical RAM map"))?;
    let mut e820 = Vec::new();
    for l in &lines[start + 1..] {
        match body(l) {
            Some(b) if b.starts_with("BIOS-e820:") => e820.push(b),
            // The map is complete once a different line follows it.
            Some(_) => {
                return Some(EarlyLog {
                    banner: body(banner)?,
                    cmdline: body(cmdline)?,
                    e820,
                });
            }
            None => return None,
        }
    }
    None
}

/// Boots `kernel`, waits for its early log (and, on real KVM, userspace), checks it.
fn boot_and_check(name: &str, kernel: &Path, initrd: Option<&Path>, limit: Duration) {
    let dir = Scratch::new(name);
    let console = dir.path("console.log");
    let size: u64 = 256 << 20;
    let cmdline = "earlyprintk=serial console=ttyS0 panic=-1 rdinit=/init partition.test=1";
    let mut cmd = partition();
    cmd.args(["launch", "--cores", "0", "--memory", "256M", "--kernel"])
        .arg(kernel)
        .args(["--cmdline", cmdline, "--console"])
        .arg(&console)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(rd) = initrd {
        cmd.arg("--initrd").arg(rd);
    }
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    let early = loop {
        let log = std::fs::read_to_string(&console).unwrap_or_default();
        if let Some(e) = early_log(&log) {
            break e;
        }
        if let Some(st) = child.try_wait().unwrap() {
            let out = wait_output(child, limit, name);
            panic!(
                "{name}: VMM exited ({st}) before the early log was complete\nstderr: {}\nconsole:\n{log}",
                out.stderr
            );
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name}: no complete early log after {limit:?}\nconsole:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("{name}: kernel says {}", early.banner);
    assert!(early.banner.starts_with("Linux version "));
    assert_eq!(
        early.cmdline,
        format!("Command line: {}{cmdline}", cpu_model_words())
    );
    assert_eq!(early.e820, expected_kernel_e820(size));

    if nested_pvm() {
        eprintln!(
            "NOTE {name}: userspace not checked on this host: /dev/kvm is the nested kvm_pvm \
             module, where a stock kernel dies in early boot (KVM emulation failure). \
             Checked here: banner, exact command line, e820 = partition memory."
        );
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = wait_output(child, Duration::from_secs(60), name);
        assert!(
            out.code() == 128 + libc::SIGTERM || out.code() == 3,
            "{name}: VMM did not stop cleanly ({}): {}",
            out.code(),
            out.stderr
        );
        return;
    }
    if initrd.is_none() {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        wait_output(child, Duration::from_secs(60), name);
        return;
    }
    // Real KVM: the initramfs must run and power off through ACPI.
    let out = wait_output(child, limit, name);
    let log = std::fs::read_to_string(&console).unwrap_or_default();
    assert!(
        log.contains("PARTITION-USERSPACE-OK"),
        "{name}: userspace marker missing\nconsole:\n{log}"
    );
    assert_eq!(out.code(), 0, "{name}: {}", out.stderr);
    assert!(out.stderr.contains("guest powered off (status 0)"));
}

#[test]
fn debian_vmlinux_boots_with_our_cmdline_and_e820() {
    if !kvm_available("debian_vmlinux_boots_with_our_cmdline_and_e820") {
        return;
    }
    let (vmlinux, initrd) = {
        let _g = ASSETS.lock().unwrap_or_else(|e| e.into_inner());
        let bz = debian_bzimage();
        (debian_vmlinux(&bz), busybox_initramfs())
    };
    boot_and_check(
        "debian-vmlinux",
        &vmlinux,
        Some(&initrd),
        Duration::from_secs(300),
    );
}

#[test]
fn debian_bzimage_loads_with_a_correct_zero_page() {
    use boot::kernel::{KernelImage, KernelKind};
    use boot::layout::{CMDLINE_ADDR, MemoryLayout, ZERO_PAGE_ADDR};
    use boot::regs::BootProtocol;
    use linux_loader::bootparam::boot_params;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    let bz = {
        let _g = ASSETS.lock().unwrap_or_else(|e| e.into_inner());
        debian_bzimage()
    };
    let bytes = std::fs::read(&bz).unwrap();
    let img = KernelImage::from_bytes(bytes.clone()).unwrap();
    let KernelKind::BzImage {
        version,
        load_addr,
        init_size,
        xloadflags,
        cmdline_size,
        ..
    } = img.kind().clone()
    else {
        panic!("Debian's vmlinuz is not recognised as a bzImage");
    };
    assert!(version >= 0x020c, "boot protocol {version:#x}");
    assert_ne!(xloadflags & 1, 0, "no XLF_KERNEL_64");
    let layout = MemoryLayout::new(256 << 20).unwrap();
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 256 << 20)]).unwrap();
    let cmdline = "console=ttyS0 a=b";
    let info = boot::setup(
        &mem,
        &layout,
        &boot::BootConfig {
            kernel: &img,
            initrd: Some(&[0x5a; 4096]),
            cmdline,
            cpus: 1,
            protocol: BootProtocol::Linux64,
            virtio_mmio: &[],
        },
    )
    .unwrap();
    assert_eq!(info.entry_addr, load_addr + 0x200);
    assert_eq!(info.kernel.end, load_addr + init_size);
    // The protected-mode kernel is the file after the setup sectors, at load_addr.
    let setup = (bytes[0x1f1] as usize + 1) * 512;
    let mut head = vec![0u8; 4096];
    mem.read_slice(&mut head, GuestAddress(load_addr)).unwrap();
    assert_eq!(head, bytes[setup..setup + 4096]);
    let bp: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
    let hdr = bp.hdr;
    let (v, x, c32, loader) = (
        hdr.version,
        hdr.xloadflags,
        hdr.code32_start,
        hdr.type_of_loader,
    );
    assert_eq!((v, x), (version, xloadflags));
    assert_eq!(c32 as u64, load_addr);
    assert_eq!(loader, 0xff);
    let (ptr, size) = (hdr.cmd_line_ptr, hdr.cmdline_size);
    assert_eq!(ptr as u64, CMDLINE_ADDR);
    assert!(size as usize <= cmdline_size as usize + 1);
    let (rd, rd_size) = (hdr.ramdisk_image, hdr.ramdisk_size);
    assert_eq!(Some((rd as u64, rd_size as u64)), info.initrd);
    assert_eq!(bp.e820_entries as usize, 3);
    let boot_flag = hdr.boot_flag;
    assert_eq!(boot_flag, 0xaa55);
}

#[test]
fn debian_bzimage_decompresses_itself_and_boots() {
    if !kvm_available("debian_bzimage_decompresses_itself_and_boots") {
        return;
    }
    let bz = {
        let _g = ASSETS.lock().unwrap_or_else(|e| e.into_inner());
        debian_bzimage()
    };
    // The decompressor runs in guest ring 0: minutes in the nested host's emulator.
    boot_and_check("debian-bzimage", &bz, None, Duration::from_secs(600));
}

#[test]
fn the_early_log_is_complete_only_when_the_e820_map_is() {
    let head = "[    0.000000] Linux version 6.1\n[    0.000000] Command line: a=1\n\
                [    0.000000] BIOS-provided physical RAM map:\n\
                [    0.000000] BIOS-e820: [mem 0x0-0x9fbff] usable\n";
    // Still being written: a half line must not end the map.
    assert!(early_log(&format!("{head}[    0.000000] BIOS-e8")).is_none());
    assert!(
        early_log(&format!(
            "{head}[    0.000000] BIOS-e820: [mem 0x100000-0x1ff"
        ))
        .is_none()
    );
    let done = format!(
        "{head}[    0.000000] BIOS-e820: [mem 0x100000-0xfffffff] usable\n[    0.000000] NX\n"
    );
    let e = early_log(&done).unwrap();
    assert_eq!(e.banner, "Linux version 6.1");
    assert_eq!(e.cmdline, "Command line: a=1");
    assert_eq!(
        e.e820,
        [
            "BIOS-e820: [mem 0x0-0x9fbff] usable",
            "BIOS-e820: [mem 0x100000-0xfffffff] usable"
        ]
    );
}
