//! The KVM VM: in-kernel irqchip and PIT, memory slots, interrupt lines, doorbells, vCPUs
//! with their CPUID, LAPIC and boot registers (the run loop is in [`super::vcpu`]).

use boot::regs::EntryState;
use kvm_bindings::{
    CpuId, KVM_CAP_HALT_POLL, KVM_CAP_X86_DISABLE_EXITS, KVM_CAP_X86_USER_SPACE_MSR,
    KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY, KvmIrqRouting,
    kvm_irq_routing_entry, kvm_pit_config, kvm_userspace_memory_region,
};
use kvm_ioctls::{IoEventAddress, Kvm, NoDatamatch, VcpuFd, VmFd};
use vmm_sys_util::eventfd::EventFd;

use crate::cpu::cpuid::IdleCpuid;
use crate::cpu::idle::{IdleCaps, IdlePlan};
use crate::kvm::apic::VmApic;
use crate::memory::GuestMemory;

/// `IA32_LSTAR`: the 64-bit SYSCALL entry.
pub const MSR_LSTAR: u32 = 0xc000_0082;
/// `IA32_STAR`: SYSCALL/SYSRET selectors.
pub const MSR_STAR: u32 = 0xc000_0081;

/// GSIs the in-kernel IOAPIC has (its pins); MSI routes take GSIs from here up.
pub const IOAPIC_PINS: u32 = 24;

/// One entry of the GSI routing table, in our words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `gsi` drives pin `pin` of an in-kernel interrupt controller.
    Irqchip {
        /// GSI.
        gsi: u32,
        /// `KVM_IRQCHIP_PIC_MASTER`, `_SLAVE` or `_IOAPIC`.
        chip: u32,
        /// Pin.
        pin: u32,
    },
    /// `gsi` sends this MSI message.
    Msi {
        /// GSI.
        gsi: u32,
        /// Message address.
        address: u64,
        /// Message data.
        data: u32,
    },
}

/// The routing table KVM installs by itself on x86 (GSIs 0-15 on the PICs and the IOAPIC,
/// 16-23 on the IOAPIC), then `msi`. Setting a table replaces the whole of it, so the
/// defaults must be in every table we set.
pub fn routing_table(msi: &[(u32, u64, u32)]) -> Vec<Route> {
    let mut t = Vec::new();
    for gsi in 0..IOAPIC_PINS {
        if gsi < 16 {
            let chip = if gsi < 8 {
                KVM_IRQCHIP_PIC_MASTER
            } else {
                KVM_IRQCHIP_PIC_SLAVE
            };
            t.push(Route::Irqchip {
                gsi,
                chip,
                pin: gsi % 8,
            });
        }
        t.push(Route::Irqchip {
            gsi,
            chip: KVM_IRQCHIP_IOAPIC,
            pin: gsi,
        });
    }
    t.extend(
        msi.iter()
            .map(|&(gsi, address, data)| Route::Msi { gsi, address, data }),
    );
    t
}

fn routing_entry(r: &Route) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry::default();
    match *r {
        Route::Irqchip { gsi, chip, pin } => {
            e.gsi = gsi;
            e.type_ = KVM_IRQ_ROUTING_IRQCHIP;
            e.u.irqchip.irqchip = chip;
            e.u.irqchip.pin = pin;
        }
        Route::Msi { gsi, address, data } => {
            e.gsi = gsi;
            e.type_ = KVM_IRQ_ROUTING_MSI;
            e.u.msi.address_lo = address as u32;
            e.u.msi.address_hi = (address >> 32) as u32;
            e.u.msi.data = data;
        }
    }
    e
}

/// Opens /dev/kvm. EPERM is the device controller's answer (file modes give EACCES): a
/// container that was given /dev/kvm as a mount, not as a device.
fn open_kvm() -> Result<Kvm, VmError> {
    Kvm::new().map_err(|e| {
        if e.errno() == libc::EPERM {
            VmError::KvmDenied(e)
        } else {
            VmError::OpenKvm(e)
        }
    })
}

impl VmError {
    /// Whether the request, as the host or container is set up, cannot work (exit 2).
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::KvmDenied(_))
    }
}

/// Probes what this host's KVM offers for idle policies (without creating a VM).
pub fn idle_caps() -> Result<IdleCaps, VmError> {
    let kvm = open_kvm()?;
    let disable_exits = crate::cpu::idle::DisableExits::from_bits_truncate(
        kvm.check_extension_raw(KVM_CAP_X86_DISABLE_EXITS as _)
            .max(0) as u32,
    );
    let halt_poll = kvm.check_extension_raw(KVM_CAP_HALT_POLL as _) > 0;
    Ok(IdleCaps {
        disable_exits,
        halt_poll,
        host_mwait: crate::cpu::cpuid::host_leaf5().is_some(),
        host_halt_poll_ns: std::fs::read_to_string("/sys/module/kvm/parameters/halt_poll_ns")
            .ok()
            .and_then(|s| s.trim().parse().ok()),
        hlt_exits_ignored: crate::cpu::cpumodel::host_is_kvm_pvm(),
    })
}

/// The guest's physical address bits: CPUID 0x80000008 EAX[7:0] as KVM offers it (the
/// guest's CPUID passes it on unchanged), 36 where KVM offers no such leaf (the
/// architecture's default without it).
pub fn guest_phys_bits() -> Result<u8, VmError> {
    let kvm = open_kvm()?;
    let cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
    Ok(cpuid
        .as_slice()
        .iter()
        .find(|e| e.function == 0x8000_0008)
        .map_or(36, |e| (e.eax & 0xff) as u8))
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
    /// /dev/kvm is there but the device controller (a container's device cgroup or eBPF
    /// filter) denies it, or the container has no /dev/kvm at all.
    #[error(
        "cannot open /dev/kvm: {0}: this process's device controller does not grant it. In a \
         container /dev/kvm must be given as a device: a device plugin's resource (KubeVirt's \
         devices.kubevirt.io/kvm, or generic-device-plugin configured for /dev/kvm; \
         docs/kubernetes.md), or a privileged container. A hostPath volume or bind mount of \
         /dev/kvm is not a device grant: the runtime denies opening it"
    )]
    KvmDenied(#[source] kvm_ioctls::Error),
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
    /// Guest RAM was mapped into this VM already (only one memory is kept alive for it).
    #[error("guest RAM is mapped into this VM already")]
    MemoryMapped,
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
    memory: std::sync::OnceLock<vm_memory::GuestMemoryMmap>,
    /// What was done so that KVM has no reason of ours to inhibit APIC virtualization
    /// (super::apic), filled in as the VM is built.
    apic: std::sync::Mutex<VmApic>,
}

impl Vm {
    /// The VM's descriptor: what a confined vCPU thread's filter ties the VM ioctls to.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// Opens KVM and creates a VM with an in-kernel irqchip and PIT (out of reinject
    /// mode).
    pub fn new() -> Result<Self, VmError> {
        let vm = Self::without_irqchip()?;
        vm.add_irqchip()?;
        vm.end_pit_reinject()?;
        Ok(vm)
    }

    /// Opens KVM and creates a VM with no irqchip yet: what must precede it (the memory
    /// slots, the MSR filter) goes in first, then [`Vm::add_irqchip`].
    ///
    /// The order matters for time, not correctness. Making the irqchip and PIT registers
    /// their port and MMIO devices, and each registration frees the old device list after
    /// a normal (not expedited) SRCU grace period of the VM; a memory slot or an MSR filter
    /// made after that waits for the one in flight first: 7.1-11.3 ms a slot on the
    /// development host's kvm_pvm (HZ=250: about two ticks), against 0.2 ms before the
    /// irqchip (docs/architecture.md, "Where a launch waits").
    pub fn without_irqchip() -> Result<Self, VmError> {
        let kvm = open_kvm()?;
        for (cap, name) in [
            (kvm_ioctls::Cap::Irqchip, "KVM_CAP_IRQCHIP"),
            (kvm_ioctls::Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
            (kvm_ioctls::Cap::Irqfd, "KVM_CAP_IRQFD"),
        ] {
            if !kvm.check_extension(cap) {
                return Err(VmError::MissingCap(name));
            }
        }
        // The launch timeline splits VM creation: opening /dev/kvm, KVM_CREATE_VM, (the
        // memory slots,) the in-kernel irqchip and PIT.
        crate::sys::timeline::mark("kvm_open");
        let fd = kvm.create_vm().map_err(kvm_err("creating the VM"))?;
        crate::sys::timeline::mark("vm_create");
        fd.set_tss_address(KVM_TSS_ADDR)
            .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
        // Not every host implements it; only VMX without unrestricted guest needs it.
        if let Err(e) = fd.set_identity_map_address(KVM_IDENTITY_MAP_ADDR) {
            log::debug!("KVM_SET_IDENTITY_MAP_ADDR: {e}");
        }
        let host = crate::kvm::apic::host_accel_here();
        let apic = VmApic {
            x2apic_shown: crate::kvm::apic::show_x2apic(&host),
            host,
            why_unknown: crate::kvm::apic::ACTIVE_UNKNOWN,
            ..Default::default()
        };
        Ok(Self {
            kvm,
            fd,
            memory: std::sync::OnceLock::new(),
            apic: std::sync::Mutex::new(apic),
        })
    }

    /// The in-kernel irqchip (PIC, IOAPIC, each vCPU's LAPIC) and PIT. Once, before any
    /// vCPU exists. The PIT starts in reinject mode (KVM's default, which inhibits AMD's
    /// AVIC for the whole VM: super::apic); [`Vm::end_pit_reinject`] ends it once the
    /// guest runs.
    pub fn add_irqchip(&self) -> Result<(), VmError> {
        self.fd
            .create_irq_chip()
            .map_err(kvm_err("creating the in-kernel irqchip"))?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        self.fd
            .create_pit2(pit)
            .map_err(kvm_err("creating the in-kernel PIT"))?;
        let control = self
            .kvm
            .check_extension_raw(kvm_bindings::KVM_CAP_REINJECT_CONTROL as _)
            > 0;
        // In reinject mode until ended; None: it cannot be ended here.
        self.apic_mut().pit_reinject = control.then_some(true);
        crate::sys::timeline::mark("irqchip");
        Ok(())
    }

    /// Takes the PIT out of reinject mode (KVM_REINJECT_CONTROL), which lifts the AVIC
    /// inhibit it holds; nothing where KVM lacks the control or it is off already.
    ///
    /// The launch calls it once the vCPUs run, not while it builds the VM: KVM unhooks
    /// the PIT's two interrupt notifiers, each behind a normal (not expedited)
    /// `synchronize_srcu` of the VM's irq SRCU (`kvm_pit_set_reinject`,
    /// arch/x86/kvm/i8254.c), and the second comes too soon after the first for SRCU to
    /// expedite it: on this host, with the launcher in a reservation's housekeeping cpuset,
    /// that held every launch 12-16 ms before its guest could start. The ioctl holds only
    /// the PIT's own lock, so a guest touching the PIT meanwhile waits on it; Linux leaves
    /// the PIT after its first milliseconds of boot (docs/architecture.md, "Where a
    /// launch waits").
    pub fn end_pit_reinject(&self) -> Result<(), VmError> {
        if self.apic_mut().pit_reinject != Some(true) {
            return Ok(());
        }
        vmm_sys_util::ioctl_io_nr!(KVM_REINJECT_CONTROL, 0xae, 0x71);
        let off = kvm_bindings::kvm_reinject_control::default();
        // SAFETY: KVM_REINJECT_CONTROL reads one `struct kvm_reinject_control`, which `off`
        // is and outlives the call; the descriptor is this VM's.
        let rc =
            unsafe { vmm_sys_util::ioctl::ioctl_with_ref(&self.fd, KVM_REINJECT_CONTROL(), &off) };
        if rc != 0 {
            return Err(VmError::Kvm {
                what: "KVM_REINJECT_CONTROL",
                source: kvm_ioctls::Error::last(),
            });
        }
        self.apic_mut().pit_reinject = Some(false);
        Ok(())
    }

    /// Sizes the VM for `count` vCPUs (IDs 0 to count - 1) and asks for 32-bit x2APIC IDs,
    /// where KVM offers each (super::apic). Must run before any vCPU exists.
    pub fn prepare_vcpus(&self, count: usize) -> Result<(), VmError> {
        use kvm_bindings::{
            KVM_CAP_MAX_VCPU_ID, KVM_CAP_X2APIC_API, KVM_X2APIC_API_DISABLE_BROADCAST_QUIRK,
            KVM_X2APIC_API_USE_32BIT_IDS,
        };
        let flags = KVM_X2APIC_API_USE_32BIT_IDS | KVM_X2APIC_API_DISABLE_BROADCAST_QUIRK;
        let offered = self.kvm.check_extension_raw(KVM_CAP_X2APIC_API as _).max(0) as u32;
        let x2apic_api = offered & flags == flags;
        if x2apic_api {
            self.enable_cap(
                KVM_CAP_X2APIC_API,
                flags as u64,
                "KVM_ENABLE_CAP(KVM_CAP_X2APIC_API)",
            )?;
        }
        // KVM_CHECK_EXTENSION(KVM_CAP_MAX_VCPU_ID) answers the largest it takes.
        let most = self
            .kvm
            .check_extension_raw(KVM_CAP_MAX_VCPU_ID as _)
            .max(0) as u64;
        let ids = count as u64;
        let max_vcpu_id = if ids > 0 && ids <= most {
            self.enable_cap(
                KVM_CAP_MAX_VCPU_ID,
                ids,
                "KVM_ENABLE_CAP(KVM_CAP_MAX_VCPU_ID)",
            )?;
            Some(ids as u32)
        } else {
            None
        };
        let mut apic = self.apic_mut();
        apic.x2apic_api = x2apic_api;
        apic.max_vcpu_id = max_vcpu_id;
        Ok(())
    }

    /// What was done for APIC virtualization, for the launch report.
    pub fn apic_report(&self) -> VmApic {
        self.apic_mut().clone()
    }

    fn apic_mut(&self) -> std::sync::MutexGuard<'_, VmApic> {
        self.apic.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// KVM_ENABLE_CAP on this VM with one argument (every capability we enable takes one).
    fn enable_cap(&self, cap: u32, arg: u64, what: &'static str) -> Result<(), VmError> {
        let mut c = kvm_bindings::kvm_enable_cap {
            cap,
            ..Default::default()
        };
        c.args[0] = arg;
        self.fd.enable_cap(&c).map_err(kvm_err(what))
    }

    /// Applies an idle plan's VM-wide settings. Must run before any vCPU exists.
    pub fn apply_idle(&self, plan: &IdlePlan) -> Result<(), VmError> {
        if !plan.disable_exits.is_empty() {
            self.enable_cap(
                KVM_CAP_X86_DISABLE_EXITS,
                plan.disable_exits.bits() as u64,
                "KVM_ENABLE_CAP(KVM_CAP_X86_DISABLE_EXITS)",
            )?;
        }
        if let Some(ns) = plan.halt_poll_ns {
            self.enable_cap(
                KVM_CAP_HALT_POLL,
                ns as u64,
                "KVM_ENABLE_CAP(KVM_CAP_HALT_POLL)",
            )?;
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
        self.enable_cap(cap, 1, "KVM_ENABLE_CAP(KVM_CAP_EXIT_ON_EMULATION_FAILURE)")
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
        self.enable_cap(
            KVM_CAP_X86_USER_SPACE_MSR,
            kvm_bindings::KVM_MSR_EXIT_REASON_FILTER as u64,
            "KVM_ENABLE_CAP(KVM_CAP_X86_USER_SPACE_MSR)",
        )?;
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

    /// Registers every RAM range of `mem` as a memory slot, from `first_slot` on. Once per
    /// VM: the VM keeps the one memory its slots point into.
    pub fn map_memory(&self, mem: &GuestMemory, first_slot: u32) -> Result<(), VmError> {
        // Kept before the first slot exists, so even a half-mapped VM cannot outlive it; a
        // second memory is refused, never registered without being kept.
        self.memory
            .set(mem.mem().clone())
            .map_err(|_| VmError::MemoryMapped)?;
        for (slot, r) in (first_slot..).zip(mem.layout().ram_ranges().iter()) {
            let userspace_addr = mem.host_addr(r).ok_or(VmError::NoHostMapping {
                guest_addr: r.guest_addr,
            })?;
            let region = kvm_userspace_memory_region {
                slot,
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

    /// A doorbell that fires on any 4-byte write to `addr` (KVM_IOEVENTFD without
    /// datamatch), for a BAR whose writes carry no meaning but "look".
    pub fn bind_knock(&self, evt: &EventFd, addr: u64) -> Result<(), VmError> {
        self.fd
            .register_ioevent(evt, &IoEventAddress::Mmio(addr), NoDatamatch)
            .map_err(kvm_err("KVM_IOEVENTFD"))
    }

    /// Takes a [`Vm::bind_knock`] doorbell away (a BAR that moved).
    pub fn unbind_knock(&self, evt: &EventFd, addr: u64) -> Result<(), VmError> {
        self.fd
            .unregister_ioevent(evt, &IoEventAddress::Mmio(addr), NoDatamatch)
            .map_err(kvm_err("KVM_IOEVENTFD (deassign)"))
    }

    /// The KVM VFIO pseudo-device (KVM_CREATE_DEVICE, type VFIO): VFIO groups are added to
    /// it so KVM knows the guest has assigned devices (coherent DMA, no-snoop handling).
    pub fn vfio_device(&self) -> Result<kvm_ioctls::DeviceFd, VmError> {
        let mut dev = kvm_bindings::kvm_create_device {
            type_: kvm_bindings::kvm_device_type_KVM_DEV_TYPE_VFIO,
            fd: 0,
            flags: 0,
        };
        self.fd
            .create_device(&mut dev)
            .map_err(kvm_err("KVM_CREATE_DEVICE (VFIO)"))
    }

    /// Installs `routes` as the whole GSI routing table (KVM_SET_GSI_ROUTING).
    pub fn set_routes(&self, routes: &[Route]) -> Result<(), VmError> {
        let mut table = KvmIrqRouting::new(routes.len()).map_err(|_| VmError::Kvm {
            what: "KVM_SET_GSI_ROUTING: too many routes",
            source: kvm_ioctls::Error::new(libc::E2BIG),
        })?;
        for (dst, r) in table.as_mut_slice().iter_mut().zip(routes) {
            *dst = routing_entry(r);
        }
        self.fd
            .set_gsi_routing(&table)
            .map_err(kvm_err("KVM_SET_GSI_ROUTING"))
    }

    /// Maps `len` bytes of host memory at `host_addr` into the guest at `guest_addr` as
    /// KVM memory slot `slot` (`crate::board::resources` hands them out): guest loads and
    /// stores there never exit.
    /// `len` 0 takes the slot away.
    ///
    /// # Safety
    ///
    /// The host range must stay mapped for as long as the slot exists or the VM does
    /// (whichever ends first); the caller keeps its owner alive that long.
    pub unsafe fn map_device_memory(
        &self,
        slot: u32,
        guest_addr: u64,
        host_addr: u64,
        len: u64,
    ) -> Result<(), VmError> {
        let region = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: guest_addr,
            memory_size: len,
            userspace_addr: host_addr,
        };
        // SAFETY: the caller promises the host range outlives the slot (above).
        unsafe { self.fd.set_user_memory_region(region) }
            .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION (device memory)"))
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
        model: &crate::cpu::cpumodel::CpuModel,
    ) -> Result<(VcpuFd, Option<CpuId>), VmError> {
        let vcpu = self
            .fd
            .create_vcpu(index as u64)
            .map_err(kvm_err("KVM_CREATE_VCPU"))?;
        let tsc_khz = vcpu.get_tsc_khz().ok();
        let deadline = self.kvm.check_extension(kvm_ioctls::Cap::TscDeadlineTimer);
        let mut cpuid = crate::cpu::cpuid::for_vcpu(
            supported,
            index as u32,
            count as u32,
            tsc_khz,
            idle,
            deadline,
        );
        model.apply(cpuid.as_mut_slice());
        if !self.apic_mut().x2apic_shown {
            for e in cpuid.as_mut_slice().iter_mut().filter(|e| e.function == 1) {
                e.ecx &= !crate::kvm::apic::LEAF1_ECX_X2APIC;
            }
        }
        vcpu.set_cpuid2(&cpuid).map_err(kvm_err("KVM_SET_CPUID2"))?;
        // Read back: some hosts rewrite what we set.
        let back = vcpu.get_cpuid2(KVM_MAX_CPUID_ENTRIES).ok();
        if let Some(b) = &back {
            if log::log_enabled!(log::Level::Debug) {
                crate::cpu::cpuid::log_changes(index, &cpuid, b);
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

    /// A VM, or None (printing why) where /dev/kvm cannot be opened.
    fn vm_or_skip(test: &str) -> Option<Vm> {
        match Vm::new() {
            Ok(vm) => Some(vm),
            Err(e) => {
                skip::skip(&format!("partition::kvm::vm::{test}"), &e.to_string());
                None
            }
        }
    }

    #[test]
    fn guest_ram_is_mapped_once() {
        let Some(vm) = vm_or_skip("guest_ram_is_mapped_once") else {
            return;
        };
        let layout = boot::layout::MemoryLayout::new(8 << 20).unwrap();
        let ram = pool::RamSource::Anonymous(pool::Backing::Anonymous);
        let a = GuestMemory::new(&ram, layout).unwrap();
        let b = GuestMemory::new(&ram, layout).unwrap();
        vm.map_memory(&a, 0).unwrap();
        // A second memory would be registered without the VM keeping it alive: refused.
        assert!(matches!(vm.map_memory(&b, 4), Err(VmError::MemoryMapped)));
    }

    #[test]
    fn device_routes_knocks_and_memory_reach_kvm() {
        let Some(vm) = vm_or_skip("device_routes_knocks_and_memory_reach_kvm") else {
            return;
        };
        // An MSI route on the first GSI past the IOAPIC, an irqfd on it, and back again.
        vm.set_routes(&routing_table(&[(IOAPIC_PINS, 0xfee0_0000, 0x31)]))
            .unwrap();
        let line = vm.irq_line(IOAPIC_PINS).unwrap();
        line.write(1).unwrap();
        vm.set_routes(&routing_table(&[])).unwrap();
        // A knock registered twice is refused by KVM; unbound, it can be bound again.
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        vm.bind_knock(&evt, 0xc000_2000).unwrap();
        assert!(vm.bind_knock(&evt, 0xc000_2000).is_err());
        vm.unbind_knock(&evt, 0xc000_2000).unwrap();
        vm.bind_knock(&evt, 0xc000_3000).unwrap();
        // A page of device memory in a slot, moved, and taken away.
        let page = vm_memory::MmapRegion::<()>::new(4096).unwrap();
        let host = page.as_ptr() as u64;
        for (at, len) in [
            (0xc000_4000, 4096),
            (0xc000_4000, 0),
            (0xc000_5000, 4096),
            (0xc000_5000, 0),
        ] {
            // SAFETY: `page` outlives the slot: the last step takes it away, before `page`
            // drops.
            unsafe { vm.map_device_memory(0, at, host, len) }.unwrap();
        }
    }

    #[test]
    fn the_routing_table_keeps_the_defaults_and_adds_msi() {
        let t = routing_table(&[(24, 0xfee0_0000, 0x41), (25, 0xfee0_1000, 0x42)]);
        // 16 GSIs on a PIC and the IOAPIC, 8 more on the IOAPIC, then two MSIs.
        assert_eq!(t.len(), 16 * 2 + 8 + 2);
        assert!(t.contains(&Route::Irqchip {
            gsi: 9,
            chip: KVM_IRQCHIP_PIC_SLAVE,
            pin: 1
        }));
        assert!(t.contains(&Route::Irqchip {
            gsi: 9,
            chip: KVM_IRQCHIP_IOAPIC,
            pin: 9
        }));
        assert!(t.contains(&Route::Irqchip {
            gsi: 23,
            chip: KVM_IRQCHIP_IOAPIC,
            pin: 23
        }));
        assert!(!t.iter().any(
            |r| matches!(r, Route::Irqchip { gsi: 16.., chip, .. } if *chip != KVM_IRQCHIP_IOAPIC)
        ));
        let e = routing_entry(&t[t.len() - 1]);
        assert_eq!((e.gsi, e.type_), (25, KVM_IRQ_ROUTING_MSI));
        // SAFETY: reading the union member routing_entry wrote.
        let msi = unsafe { e.u.msi };
        assert_eq!(
            (msi.address_lo, msi.address_hi, msi.data),
            (0xfee0_1000, 0, 0x42)
        );
        let e = routing_entry(&Route::Irqchip {
            gsi: 3,
            chip: KVM_IRQCHIP_PIC_MASTER,
            pin: 3,
        });
        // SAFETY: as above.
        let chip = unsafe { e.u.irqchip };
        assert_eq!(
            (e.type_, chip.irqchip, chip.pin),
            (KVM_IRQ_ROUTING_IRQCHIP, 0, 3)
        );
    }

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
