//! The KVM VM: in-kernel irqchip and PIT, memory slots, interrupt lines, doorbells, vCPUs
//! with their CPUID, LAPIC and boot registers (the run loop is in [`super::vcpu`]).

use boot::regs::EntryState;
use kvm_bindings::{
    CpuId, KVM_CAP_HALT_POLL, KVM_CAP_X86_DISABLE_EXITS, KVM_CAP_X86_USER_SPACE_MSR,
    KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY, kvm_pit_config, kvm_userspace_memory_region,
};
use kvm_ioctls::{IoEventAddress, Kvm, VcpuFd, VmFd};
use vmm_sys_util::eventfd::EventFd;

use crate::cpuid::IdleCpuid;
use crate::idle::{IdleCaps, IdlePlan};
use crate::memory::GuestMemory;

/// `IA32_LSTAR`: the 64-bit SYSCALL entry.
pub const MSR_LSTAR: u32 = 0xc000_0082;
/// `IA32_STAR`: SYSCALL/SYSRET selectors.
pub const MSR_STAR: u32 = 0xc000_0081;

/// Probes what this host's KVM offers for idle policies (without creating a VM).
pub fn idle_caps() -> Result<IdleCaps, VmError> {
    let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
    let disable_exits = crate::idle::DisableExits::from_bits_truncate(
        kvm.check_extension_raw(KVM_CAP_X86_DISABLE_EXITS as _)
            .max(0) as u32,
    );
    let halt_poll = kvm.check_extension_raw(KVM_CAP_HALT_POLL as _) > 0;
    Ok(IdleCaps {
        disable_exits,
        halt_poll,
        host_mwait: crate::cpuid::host_leaf5().is_some(),
        host_halt_poll_ns: std::fs::read_to_string("/sys/module/kvm/parameters/halt_poll_ns")
            .ok()
            .and_then(|s| s.trim().parse().ok()),
    })
}

/// KVM's TSS needs three pages below 4 GiB that are not RAM (VMX only, harmless elsewhere).
const KVM_TSS_ADDR: usize = 0xfffb_d000;
/// KVM's identity-map page, right below the TSS (VMX without unrestricted guest).
const KVM_IDENTITY_MAP_ADDR: u64 = 0xfffb_c000;
/// LAPIC register offsets.
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
/// LVT delivery modes.
const APIC_MODE_EXTINT: u32 = 0x7;
const APIC_MODE_NMI: u32 = 0x4;

/// Errors setting up the VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// /dev/kvm could not be opened.
    #[error("cannot open /dev/kvm: {0} (is KVM available, and are you root or in the kvm group?)")]
    OpenKvm(#[source] kvm_ioctls::Error),
    /// A KVM ioctl failed.
    #[error("{what}: {source}")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A required capability is missing.
    #[error("KVM lacks {0}, which partitions need")]
    MissingCap(&'static str),
    /// An eventfd could not be created.
    #[error("eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    /// A RAM range of the layout has no region of its own in guest memory.
    #[error("guest RAM at {guest_addr:#x} has no host mapping of its own")]
    NoHostMapping {
        /// Guest address of the range.
        guest_addr: u64,
    },
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// A created VM.
pub struct Vm {
    kvm: Kvm,
    fd: VmFd,
    /// The guest memory behind the memory slots: a clone keeps its mappings alive for as
    /// long as the VM (and so any vCPU) can reach them. Dropped after `fd`.
    memory: Option<vm_memory::GuestMemoryMmap>,
}

impl Vm {
    /// Opens KVM and creates a VM with an in-kernel irqchip and PIT.
    pub fn new() -> Result<Self, VmError> {
        let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
        for (cap, name) in [
            (kvm_ioctls::Cap::Irqchip, "KVM_CAP_IRQCHIP"),
            (kvm_ioctls::Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
            (kvm_ioctls::Cap::Irqfd, "KVM_CAP_IRQFD"),
        ] {
            if !kvm.check_extension(cap) {
                return Err(VmError::MissingCap(name));
            }
        }
        let fd = kvm.create_vm().map_err(kvm_err("creating the VM"))?;
        fd.set_tss_address(KVM_TSS_ADDR)
            .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
        // Not every host implements it; only VMX without unrestricted guest needs it.
        if let Err(e) = fd.set_identity_map_address(KVM_IDENTITY_MAP_ADDR) {
            log::debug!("KVM_SET_IDENTITY_MAP_ADDR: {e}");
        }
        fd.create_irq_chip()
            .map_err(kvm_err("creating the in-kernel irqchip"))?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        fd.create_pit2(pit)
            .map_err(kvm_err("creating the in-kernel PIT"))?;
        Ok(Self {
            kvm,
            fd,
            memory: None,
        })
    }

    /// Applies an idle plan's VM-wide settings. Must run before any vCPU exists.
    pub fn apply_idle(&self, plan: &IdlePlan) -> Result<(), VmError> {
        if !plan.disable_exits.is_empty() {
            let mut cap = kvm_bindings::kvm_enable_cap {
                cap: KVM_CAP_X86_DISABLE_EXITS,
                ..Default::default()
            };
            cap.args[0] = plan.disable_exits.bits() as u64;
            self.fd
                .enable_cap(&cap)
                .map_err(kvm_err("KVM_ENABLE_CAP(KVM_CAP_X86_DISABLE_EXITS)"))?;
        }
        if let Some(ns) = plan.halt_poll_ns {
            let mut cap = kvm_bindings::kvm_enable_cap {
                cap: KVM_CAP_HALT_POLL,
                ..Default::default()
            };
            cap.args[0] = ns as u64;
            self.fd
                .enable_cap(&cap)
                .map_err(kvm_err("KVM_ENABLE_CAP(KVM_CAP_HALT_POLL)"))?;
        }
        Ok(())
    }

    /// Asks KVM for the instruction bytes of every emulation failure (so the VMM can assist
    /// it). Harmless where KVM never fails to emulate.
    pub fn report_emulation_failures(&self) -> Result<(), VmError> {
        let cap = kvm_bindings::KVM_CAP_EXIT_ON_EMULATION_FAILURE;
        if self.kvm.check_extension_raw(cap as _) <= 0 {
            return Ok(());
        }
        let mut c = kvm_bindings::kvm_enable_cap {
            cap,
            ..Default::default()
        };
        c.args[0] = 1;
        self.fd
            .enable_cap(&c)
            .map_err(kvm_err("KVM_ENABLE_CAP(KVM_CAP_EXIT_ON_EMULATION_FAILURE)"))
    }

    /// Makes every guest write of IA32_LSTAR exit to the VMM, which completes it and arms
    /// the SYSCALL repair (see `assist::syscall`).
    pub fn trap_lstar_writes(&self) -> Result<(), VmError> {
        if self
            .kvm
            .check_extension_raw(KVM_CAP_X86_USER_SPACE_MSR as _)
            <= 0
        {
            return Err(VmError::MissingCap("KVM_CAP_X86_USER_SPACE_MSR"));
        }
        let mut c = kvm_bindings::kvm_enable_cap {
            cap: KVM_CAP_X86_USER_SPACE_MSR,
            ..Default::default()
        };
        c.args[0] = kvm_bindings::KVM_MSR_EXIT_REASON_FILTER as u64;
        self.fd
            .enable_cap(&c)
            .map_err(kvm_err("KVM_ENABLE_CAP(KVM_CAP_X86_USER_SPACE_MSR)"))?;
        // A zero bit denies the access, which sends it to userspace.
        let deny = [0u8; 1];
        let lstar = kvm_ioctls::MsrFilterRange {
            flags: kvm_ioctls::MsrFilterRangeFlags::WRITE,
            base: MSR_LSTAR,
            msr_count: 1,
            bitmap: &deny,
        };
        self.fd
            .set_msr_filter(kvm_ioctls::MsrFilterDefaultAction::ALLOW, &[lstar])
            .map_err(kvm_err("KVM_X86_SET_MSR_FILTER"))
    }

    /// Registers every RAM range of `mem` as a memory slot.
    pub fn map_memory(&mut self, mem: &GuestMemory) -> Result<(), VmError> {
        // Kept before the first slot exists, so even a half-mapped VM cannot outlive it.
        self.memory = Some(mem.mem().clone());
        for (slot, r) in mem.layout().ram_ranges().iter().enumerate() {
            let userspace_addr = mem.host_addr(r).ok_or(VmError::NoHostMapping {
                guest_addr: r.guest_addr,
            })?;
            let region = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: r.guest_addr,
                memory_size: r.len,
                userspace_addr,
            };
            // SAFETY: the host range is a live mapping of a vm-memory region; the clone kept
            // in `self.memory` holds it mapped until after the VM fd is closed.
            unsafe { self.fd.set_user_memory_region(region) }
                .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
        }
        Ok(())
    }

    /// An edge-triggered interrupt line on `gsi`, backed by an irqfd.
    pub fn irq_line(&self, gsi: u32) -> Result<EventFd, VmError> {
        let evt = EventFd::new(libc::EFD_NONBLOCK).map_err(VmError::EventFd)?;
        self.fd
            .register_irqfd(&evt, gsi)
            .map_err(kvm_err("KVM_IRQFD"))?;
        Ok(evt)
    }

    /// A doorbell: a guest write of `datamatch` (4 bytes) to `addr` signals `evt` inside
    /// the kernel, without an exit to the VMM (KVM_IOEVENTFD).
    pub fn bind_doorbell(&self, evt: &EventFd, addr: u64, datamatch: u32) -> Result<(), VmError> {
        self.fd
            .register_ioevent(evt, &IoEventAddress::Mmio(addr), datamatch)
            .map_err(kvm_err("KVM_IOEVENTFD"))
    }

    /// KVM's statistics for the VM (KVM_GET_STATS_FD).
    pub fn stats(&self) -> Result<super::stats::Stats, super::stats::StatsError> {
        super::stats::Stats::open(&self.fd)
    }

    /// The host's supported CPUID.
    pub fn supported_cpuid(&self) -> Result<CpuId, VmError> {
        self.kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))
    }

    /// Creates vCPU `index` of `count` with its CPUID and LAPIC set up; the boot vCPU also
    /// gets `entry`. Returns the vCPU and the CPUID KVM reports back after setting it.
    pub fn create_vcpu(
        &self,
        index: usize,
        count: usize,
        supported: &CpuId,
        entry: Option<&EntryState>,
        idle: IdleCpuid,
        model: &crate::cpumodel::CpuModel,
    ) -> Result<(VcpuFd, Option<CpuId>), VmError> {
        let vcpu = self
            .fd
            .create_vcpu(index as u64)
            .map_err(kvm_err("KVM_CREATE_VCPU"))?;
        let tsc_khz = vcpu.get_tsc_khz().ok();
        let mut cpuid =
            crate::cpuid::for_vcpu(supported, index as u32, count as u32, tsc_khz, idle);
        model.apply(cpuid.as_mut_slice());
        vcpu.set_cpuid2(&cpuid).map_err(kvm_err("KVM_SET_CPUID2"))?;
        // Read back: some hosts rewrite what we set.
        let back = vcpu.get_cpuid2(KVM_MAX_CPUID_ENTRIES).ok();
        if let Some(b) = &back {
            if log::log_enabled!(log::Level::Debug) {
                crate::cpuid::log_changes(index, &cpuid, b);
            }
        }
        let mut lapic = vcpu.get_lapic().map_err(kvm_err("KVM_GET_LAPIC"))?;
        set_lvt_mode(&mut lapic.regs, APIC_LVT0, APIC_MODE_EXTINT);
        set_lvt_mode(&mut lapic.regs, APIC_LVT1, APIC_MODE_NMI);
        vcpu.set_lapic(&lapic).map_err(kvm_err("KVM_SET_LAPIC"))?;
        if let Some(e) = entry {
            vcpu.set_regs(&e.regs).map_err(kvm_err("KVM_SET_REGS"))?;
            vcpu.set_fpu(&e.fpu).map_err(kvm_err("KVM_SET_FPU"))?;
            let mut sregs = vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
            e.apply_sregs(&mut sregs);
            vcpu.set_sregs(&sregs).map_err(kvm_err("KVM_SET_SREGS"))?;
        }
        Ok((vcpu, back))
    }
}

fn set_lvt_mode(regs: &mut [std::os::raw::c_char; 1024], off: usize, mode: u32) {
    let mut b = [0u8; 4];
    for (i, x) in b.iter_mut().enumerate() {
        *x = regs[off + i] as u8;
    }
    let v = (u32::from_le_bytes(b) & !0x700) | (mode << 8);
    for (i, x) in v.to_le_bytes().iter().enumerate() {
        regs[off + i] = *x as std::os::raw::c_char;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvt_mode_bits() {
        let mut regs = [0 as std::os::raw::c_char; 1024];
        regs[APIC_LVT0 + 1] = 0x10; // mask bit (16) lives in byte 2; put junk in mode bits
        regs[APIC_LVT0 + 2] = 0x01;
        set_lvt_mode(&mut regs, APIC_LVT0, APIC_MODE_EXTINT);
        assert_eq!(regs[APIC_LVT0 + 1] as u8, 0x17);
        assert_eq!(regs[APIC_LVT0 + 2] as u8, 0x01);
    }
}
