//! VFIO passthrough on a host with an IOMMU: QEMU's NVMe, edu and ivshmem-plain functions,
//! bound to vfio-pci, passed through to the probe guest with the sandbox on; the launch and
//! the teardown end with exit 0 and the device is bound to vfio-pci as before, ready for
//! the next launch. Runs where those functions exist behind an IOMMU: the rig
//! (`scripts/rig.sh`, docs/testing.md); elsewhere each test says why it skips.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(300);
/// One passthrough at a time: each binds and unbinds host functions.
static ONE: Mutex<()> = Mutex::new(());

fn sysfs() -> &'static Path {
    Path::new("/sys/bus/pci/devices")
}

fn read_trim(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The first function `vendor:device` on this host.
fn find_function(vendor: u16, device: u16) -> Option<String> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(sysfs())
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    all.sort();
    all.into_iter().find_map(|d| {
        let v = read_trim(&d.join("vendor"));
        let id = read_trim(&d.join("device"));
        (v == format!("{vendor:#06x}") && id == format!("{device:#06x}"))
            .then(|| d.file_name().unwrap().to_string_lossy().into_owned())
    })
}

fn driver_of(bdf: &str) -> Option<String> {
    std::fs::read_link(sysfs().join(bdf).join("driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// A host function bound to vfio-pci for the test; given back to the driver it had (or
/// none) when dropped.
struct Bound {
    bdf: String,
    had: Option<String>,
}

impl Bound {
    fn new(bdf: &str) -> Self {
        let dev = sysfs().join(bdf);
        let had = driver_of(bdf);
        if had.as_deref() != Some("vfio-pci") {
            std::fs::write(dev.join("driver_override"), "vfio-pci").unwrap();
            if had.is_some() {
                std::fs::write(dev.join("driver/unbind"), bdf).unwrap();
            }
            std::fs::write("/sys/bus/pci/drivers_probe", bdf).unwrap();
        }
        assert_eq!(
            driver_of(bdf).as_deref(),
            Some("vfio-pci"),
            "{bdf} did not bind to vfio-pci"
        );
        Self {
            bdf: bdf.to_string(),
            had,
        }
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        if self.had.as_deref() == Some("vfio-pci") {
            return;
        }
        let dev = sysfs().join(&self.bdf);
        let _ = std::fs::write(dev.join("driver/unbind"), &self.bdf);
        let _ = std::fs::write(dev.join("driver_override"), "\n");
        if self.had.is_some() {
            let _ = std::fs::write("/sys/bus/pci/drivers_probe", &self.bdf);
        }
    }
}

/// The function `vendor:device` bound to vfio-pci, or why the test cannot run here.
fn passthrough_target(test: &str, vendor: u16, device: u16, what: &str) -> Option<Bound> {
    if !kvm_available(test) {
        return None;
    }
    let groups = std::fs::read_dir("/sys/kernel/iommu_groups")
        .map(|d| d.count())
        .unwrap_or(0);
    if groups == 0 {
        println!(
            "SKIPPED {test}: no IOMMU groups on this host (the rig has them: scripts/rig.sh, \
             docs/testing.md)"
        );
        return None;
    }
    if !Path::new("/sys/bus/pci/drivers/vfio-pci").exists() {
        println!("SKIPPED {test}: the vfio-pci driver is not loaded");
        return None;
    }
    let Some(bdf) = find_function(vendor, device) else {
        println!("SKIPPED {test}: no {what} ({vendor:04x}:{device:04x}) on this host");
        return None;
    };
    Some(Bound::new(&bdf))
}

/// Launches the probe with `bdf` passed through, sandbox on; checks the launch and the
/// teardown were clean; returns the report's `passthrough` section.
fn launch_with(bdf: &str) -> serde_json::Value {
    let out = run(
        &[
            "launch",
            "--cores",
            "1",
            "--memory",
            "64M",
            "--probe",
            "--device",
            &format!("vfio={bdf}"),
            "--cmdline",
            "probe.memtest=0",
            "--json",
        ],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{bdf}: {}\n{}", out.stderr, out.stdout);
    let r = report(&out.stdout);
    assert_eq!(r["outcome"]["kind"], "power_off", "{r}");
    assert_eq!(
        r["sandbox"]["user"], "partition",
        "the sandbox was not on: {r}"
    );
    assert_eq!(
        driver_of(bdf).as_deref(),
        Some("vfio-pci"),
        "{bdf} lost its driver"
    );
    let p = r["passthrough"].clone();
    println!(
        "NOTE vfio: {bdf} passed through, launch and teardown exit 0 under the sandbox (uid \
         {}): {p}",
        r["sandbox"]["uid"]
    );
    assert_eq!(p["bdf"], bdf, "{r}");
    assert_eq!(p["iommu"], "container", "{p}");
    assert!(p["dma_regions"].as_u64().unwrap() >= 1, "{p}");
    p
}

fn bar(p: &serde_json::Value, index: u64) -> &serde_json::Value {
    p["bars"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["index"] == index)
        .unwrap_or_else(|| panic!("no BAR {index}: {p}"))
}

#[test]
fn qemu_nvme_passes_through_twice_under_the_sandbox() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let name = "qemu_nvme_passes_through_twice_under_the_sandbox";
    let Some(dev) = passthrough_target(name, 0x1b36, 0x0010, "QEMU NVMe") else {
        return;
    };
    // Its capabilities chain 0x40 (MSI-X) -> 0x80 (PCIe) -> 0x60 (PM): out of order.
    for round in 0..2 {
        let p = launch_with(&dev.bdf);
        assert_eq!(p["msix_vectors"], 65, "round {round}: {p}");
        // BAR 0: 16 KiB, 64-bit, below 4 GiB; the MSI-X table and PBA pages trapped, the
        // rest (the doorbells among it) mapped.
        let b = bar(&p, 0);
        assert_eq!(
            (b["size"].as_u64(), b["is64"].as_bool()),
            (Some(16 << 10), Some(true))
        );
        assert!(b["addr"].as_u64().unwrap() < 1 << 32, "{b}");
        assert_eq!(b["mapped_bytes"], 8 << 10, "{b}");
    }
}

#[test]
fn edu_with_msi_only_passes_through_under_the_sandbox() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let name = "edu_with_msi_only_passes_through_under_the_sandbox";
    let Some(dev) = passthrough_target(name, 0x1234, 0x11e8, "QEMU edu") else {
        return;
    };
    let p = launch_with(&dev.bdf);
    assert_eq!(p["msix_vectors"], 0, "{p}");
    let b = bar(&p, 0);
    assert_eq!(b["size"], 1 << 20, "{b}");
    assert_eq!(b["mapped_bytes"], 1 << 20, "{b}");
}

#[test]
fn a_large_prefetchable_bar_goes_above_4_gib_and_is_mapped() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let name = "a_large_prefetchable_bar_goes_above_4_gib_and_is_mapped";
    let Some(dev) = passthrough_target(name, 0x1af4, 0x1110, "QEMU ivshmem-plain") else {
        return;
    };
    let p = launch_with(&dev.bdf);
    // BAR 0: 256 bytes of registers, smaller than a page: placed on a page of its own and
    // trapped.
    let regs = bar(&p, 0);
    assert_eq!(
        (regs["size"].as_u64(), regs["mapped_bytes"].as_u64()),
        (Some(256), Some(0))
    );
    assert!(regs["addr"].as_u64().unwrap() < 1 << 32, "{regs}");
    // BAR 2: the shared memory (1 GiB or more here), 64-bit prefetchable: in the window
    // above 4 GiB, all of it mapped.
    let mem = bar(&p, 2);
    let size = mem["size"].as_u64().unwrap();
    assert!(size >= 1 << 30, "{mem}");
    assert_eq!(
        (mem["is64"].as_bool(), mem["prefetchable"].as_bool()),
        (Some(true), Some(true)),
        "{mem}"
    );
    let addr = mem["addr"].as_u64().unwrap();
    assert!(addr >= 1 << 32 && addr % size == 0, "{mem}");
    assert_eq!(mem["mapped_bytes"].as_u64(), Some(size), "{mem}");
}
