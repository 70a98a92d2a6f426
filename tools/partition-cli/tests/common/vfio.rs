//! Host PCI functions for passthrough tests: found by vendor and device in sysfs, bound to
//! vfio-pci for a test and given back after it (tests/vfio.rs, tests/linux_kernel.rs).

use std::path::{Path, PathBuf};

use super::{kvm_available, skip};

/// Where the host's PCI functions are.
pub fn sysfs() -> &'static Path {
    Path::new("/sys/bus/pci/devices")
}

/// A sysfs attribute, trimmed (empty when unreadable).
pub fn read_trim(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The first function `vendor:device` on this host.
pub fn find_function(vendor: u16, device: u16) -> Option<String> {
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

/// The driver `bdf` is bound to.
pub fn driver_of(bdf: &str) -> Option<String> {
    std::fs::read_link(sysfs().join(bdf).join("driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// A host function bound to vfio-pci for the test; given back to the driver it had (or
/// none) when dropped.
pub struct Bound {
    pub bdf: String,
    had: Option<String>,
}

impl Bound {
    pub fn new(bdf: &str) -> Self {
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
pub fn passthrough_target(test: &str, vendor: u16, device: u16, what: &str) -> Option<Bound> {
    if !kvm_available(test) {
        return None;
    }
    let groups = std::fs::read_dir("/sys/kernel/iommu_groups")
        .map(|d| d.count())
        .unwrap_or(0);
    if groups == 0 {
        skip(
            test,
            "no IOMMU groups on this host (the rig has them: scripts/rig.sh, \
             docs/testing.md)",
        );
        return None;
    }
    if !Path::new("/sys/bus/pci/drivers/vfio-pci").exists() {
        skip(test, "the vfio-pci driver is not loaded");
        return None;
    }
    let Some(bdf) = find_function(vendor, device) else {
        skip(
            test,
            &format!("no {what} ({vendor:04x}:{device:04x}) on this host"),
        );
        return None;
    };
    Some(Bound::new(&bdf))
}
