//! Launching a partition: one straight pipeline, [`launch`], read top to bottom.
//!
//! 1. [`HostFacts::read`]: what the host is (cores online, memory, KVM's capabilities, a
//!    reservation's cores, passed-through functions' BARs), read and nothing more.
//! 2. [`check`]: every piece of user input validated and the launch planned from the
//!    configuration and those facts alone; nothing is opened.
//! 3. [`open`]: the kernel, initrd, disks, console and API directory the plan names, opened
//!    and read, before anything is allocated or a VM is made.
//! 4. [`acquire`]: guest memory, [`Acquired`]: anonymous memory, or a pool extent whose
//!    claim ([`crate::host::claim::ExtentClaim`]) scrubs and frees it when it ends.
//! 5. [`run`]: create the VM, write the boot structures, attach the devices, start one
//!    pinned thread per vCPU, wait for the guest, a fault or a signal, tear down, report.

use std::sync::Arc;
use std::time::Instant;

use boot::{BootConfig, BootInfo};
use devices::power::ACPI_PM_BASE;
use pool::RamSource;

use super::check::check;
use super::config::{LaunchConfig, MemorySource, ValidConfig};
use super::confine::{Descriptors, confine, raw};
use super::control::{Control, start_api};
use super::devices::{LEGACY_DEVICES, attach_devices};
use super::error::LaunchError;
use super::facts::HostFacts;
use super::open::{Checked, open};
use super::outcome::{LaunchReport, MemoryReport, Observer, PoolOutcome, Timings, VcpuReport};
use super::vcpus::{Seats, create_vcpus, reports, run_vcpus};
use crate::cpu::readback::Readback;
use crate::host::claim::{ClaimRequest, ExtentClaim};
use crate::host::isolation::GuestsCpuset;
use crate::host::keeper::{Keeper, KeeperMode};
use crate::kvm::Vm;
use crate::memory::GuestMemory;
use crate::sys::sandbox::Sandbox;
use crate::sys::signals::SignalGuard;

/// A launch's guest memory, and what must happen to it afterwards.
pub enum Acquired {
    /// Memory no claim holds (anonymous, or a pod's volume file), gone with the mapping.
    Unclaimed(RamSource),
    /// A pool extent: the claim scrubs and frees it when it ends.
    Extent {
        /// The claim in the ledger (boxed: it holds the ledger as loaded).
        claim: Box<ExtentClaim>,
        /// The extent of the pool file, to be mapped as the guest's RAM.
        ram: RamSource,
    },
}

/// Takes the memory a checked launch asks for.
pub fn acquire(checked: &Checked) -> Result<Acquired, LaunchError> {
    let plan = &checked.plan;
    match &plan.source {
        MemorySource::Anonymous(backing) => Ok(Acquired::Unclaimed(RamSource::Anonymous(*backing))),
        MemorySource::Volume(dir) => {
            let volume = plan
                .volume
                .as_ref()
                .ok_or_else(|| crate::host::pod::PodError::NotHugetlbfs(dir.clone()))?;
            Ok(Acquired::Unclaimed(RamSource::Extent(
                volume.memory(plan.memory())?,
            )))
        }
        MemorySource::Pool(req) => {
            let claim = ExtentClaim::take(&ClaimRequest {
                state_dir: &plan.state_dir,
                name: &req.name,
                offset: req.offset,
                size: plan.memory(),
                cores: &plan.cores,
                idle: plan.idle.policy.name(),
                kernel: &checked.kernel_name,
                api_socket: plan.api_socket.as_deref(),
            })?;
            match claim.extent_file() {
                Ok(ram) => Ok(Acquired::Extent {
                    claim: Box::new(claim),
                    ram: RamSource::Extent(ram),
                }),
                Err(e) => {
                    // Nothing touched the extent: it is still clean.
                    claim.forget_unused();
                    Err(e.into())
                }
            }
        }
    }
}

/// Passes progress on, and tells the partition's keeper (which records it in the ledger).
pub(super) struct KeeperObserver<'a> {
    pub(super) inner: &'a dyn Observer,
    pub(super) keeper: &'a std::cell::RefCell<Keeper>,
}

impl Observer for KeeperObserver<'_> {
    fn booting(&self, c: &Checked, b: &BootInfo, m: &str) {
        self.inner.booting(c, b, m);
    }
    fn running(&self) {
        self.keeper.borrow_mut().running();
        crate::host::claim::crash_point("running");
        self.inner.running();
    }
    fn tick(&self, vcpus: &[VcpuReport]) {
        let stats: Vec<_> = vcpus.iter().map(|v| v.counters.clone()).collect();
        self.keeper.borrow_mut().record(&stats);
        self.inner.tick(vcpus);
    }
}

/// Runs a checked launch to its end on `ram`. `started` is when the caller began getting
/// the memory (so memory setup counts towards the timings); `cpuset` is where vCPU threads
/// go before they pin (they do it first, while the VM is built). The steps, in order: memory, VM, boot structures, devices, vCPUs,
/// confinement, run and wait, stop, report.
pub fn run(
    mut checked: Checked,
    ram: RamSource,
    started: Instant,
    cpuset: Option<GuestsCpuset>,
    observer: &dyn Observer,
) -> Result<LaunchReport, LaunchError> {
    // Confined, the VMM gets a mount namespace of its own while it is one thread (the
    // keeper, forked before, stays in the host's), so that every thread it starts shares
    // the empty root it moves to before giving up root (`confine`).
    if let Sandbox::On(_) = checked.plan.sandbox {
        if let crate::sys::sandbox::PrivateRoot::NotMade(why) =
            crate::sys::sandbox::private_mounts()?
        {
            log::warn!("no private root for the VMM: {why}");
        }
        crate::sys::timeline::mark("mounts");
    }
    // The vCPU threads first: they take their cores while the VM is built. Every other
    // thread, this one first, keeps off those cores.
    let seats = Seats::start(&checked.plan.cores, cpuset)?;
    super::vcpus::keep_off(&checked.plan.cores);
    let memory = Arc::new(GuestMemory::new(&ram, checked.plan.layout)?);
    let memory_report = MemoryReport::of(&ram, &checked.plan.source, checked.plan.layout.size());
    // Mapped, the pool file is let go: the VMM keeps its own extent's mapping and no
    // descriptor through which another partition's extent could be mapped.
    ram.release_file().map_err(|e| LaunchError::Os {
        what: "letting the pool file go after mapping its extent",
        source: e,
    })?;
    drop(ram);
    let t_mem = Instant::now();
    crate::sys::timeline::mark_at("memory", t_mem);
    let vm = build_vm(&checked, &memory)?;
    let t_vm = Instant::now();
    crate::sys::timeline::mark_at("vm", t_vm);
    let boot = write_boot(&checked, &memory)?;
    let t_boot = Instant::now();
    crate::sys::timeline::mark_at("boot", t_boot);
    let mut devices = attach_devices(&mut checked, &vm, &memory)?;
    crate::sys::timeline::mark("devices");
    let mut vcpus = create_vcpus(&checked, &vm, &boot, &devices, &memory)?;
    let t_vcpus = Instant::now();
    crate::sys::timeline::mark_at("vcpus", t_vcpus);
    observer.booting(&checked, &boot, &memory.describe());

    // Stop signals wait on a signalfd until teardown is over.
    let signals = SignalGuard::new().map_err(|source| LaunchError::Os {
        what: "blocking the stop signals",
        source,
    })?;
    // The API socket is bound while root, for the sandbox's user.
    let api_socket = match checked.api_place.take() {
        Some(p) => Some(crate::api::ApiSocket::bind(
            p,
            match &checked.plan.sandbox {
                Sandbox::On(who) => Some((who.uid, who.gid)),
                Sandbox::Off => None,
            },
        )?),
        None => None,
    };
    // Everything that needs root exists: give it up, then start the threads (and hand the
    // vCPU threads, already waiting on their cores, their vCPUs), each under its own
    // filter, tied to the descriptors it may name.
    let fds = Descriptors {
        vm: vm.raw_fd(),
        vcpus: vcpus.threads.iter().map(|t| raw(&t.ctx.fd)).collect(),
        stats: vcpus
            .handles
            .iter()
            .filter_map(|h| h.stats.as_ref().map(|s| s.raw_fd()))
            .collect(),
        vcpu_stats: vcpus
            .handles
            .iter()
            .map(|h| h.stats.as_ref().map(|s| s.raw_fd()))
            .collect(),
        devices: crate::board::device::fds_of(&devices.list),
    };
    let filters = confine(&checked.plan.sandbox, &fds)?;
    let control = Control::new()?;
    for (i, t) in vcpus.threads.iter_mut().enumerate() {
        t.policy.filter = filters.as_ref().map(|f| f.vcpu[i].clone());
        t.policy.uid = match &checked.plan.sandbox {
            Sandbox::On(who) => Some(who.uid),
            Sandbox::Off => None,
        };
        t.ctx.pause = control.pause.clone();
    }
    devices.start(filters.as_ref())?;
    let api = match api_socket {
        Some(sock) => Some(start_api(
            sock,
            &checked,
            &vcpus.handles,
            vcpus.cpuid_back.as_ref(),
            &memory_report,
            &control,
            filters.as_ref().map(|f| f.api.clone()),
        )?),
        None => None,
    };
    crate::sys::timeline::mark("confine");
    let ran = run_vcpus(
        seats,
        vcpus.threads,
        &vcpus.handles,
        &signals,
        observer,
        super::vcpus::MainThread {
            filter: filters.as_ref().map(|f| &f.main),
            vm: &vm,
        },
        &control,
    );
    if let Some(a) = api {
        // Unconfined, the socket goes with the VMM; confined, it stays (stale) for the next
        // launch on the path to replace.
        a.stop(filters.is_none());
    }
    // Every vCPU has stopped: each device's step before any is stopped (a passed-through
    // function's interrupt count is read and it is quieted, its DMA ended before the
    // partition's memory is scrubbed).
    devices.guest_stopped();
    let (ending, ran_for) = ran?;
    // Workers write into guest memory: stop them before it goes away.
    let device_reports = devices.shut_down();
    drop(signals);

    let first_output = devices
        .output
        .first_byte
        .get()
        .map(|t| t.at.duration_since(started));
    let timeline = devices
        .output
        .first_byte
        .get()
        .and_then(|t| crate::sys::timeline::phases(*t));
    let vcpu_reports = reports(&vcpus.handles);
    let idle_readback = Readback::new(
        &checked.plan.idle,
        vcpus.cpuid_back.as_ref().map(|c| c.as_slice()),
        crate::cpu::cpuid::host_leaf5(),
        &checked.plan.cmdline,
        vcpu_reports
            .iter()
            .map(|v| (v.counters.vcpu, &v.counters.kvm)),
    );
    let cpu_model_shown_anyway = vcpus
        .cpuid_back
        .as_ref()
        .map(|c| checked.plan.cpu_model.shown_anyway(c.as_slice()))
        .unwrap_or_default();
    Ok(LaunchReport {
        apic: vm.apic_report(),
        idle: checked.plan.idle.clone(),
        idle_readback,
        cpu_model: checked.plan.cpu_model.clone(),
        cpu_model_shown_anyway,
        ending,
        boot,
        cmdline: checked.plan.cmdline.clone(),
        memory: memory_report,
        ran_for,
        vcpus: vcpu_reports,
        timings: Timings {
            memory: t_mem.duration_since(started),
            vm: t_vm.duration_since(t_mem),
            boot: t_boot.duration_since(t_vm),
            vcpus: t_vcpus.duration_since(t_boot),
            first_output,
            wall_to_first_byte_ms: timeline.as_ref().map(|t| t.wall_ms),
            cpu_to_first_byte_ms: timeline.as_ref().map(|t| t.cpu_ms),
            phases: timeline.map(|t| t.phases).unwrap_or_default(),
        },
        pool: None,
        devices: device_reports,
        pci_window64: checked.plan.machine.window64,
        guest_fault_lines: devices
            .output
            .fault_lines
            .load(std::sync::atomic::Ordering::Relaxed),
        sandbox: match &checked.plan.sandbox {
            Sandbox::On(who) => Some(who.clone()),
            Sandbox::Off => None,
        },
    })
}

/// The VM: created, its memory slots and (for the SYSCALL repair) the MSR filter put in
/// before the irqchip and PIT (see [`Vm::without_irqchip`]: made after them, each waited
/// for an SRCU grace period of milliseconds), then its idle plan and emulation-failure
/// exits set.
pub(super) fn build_vm(
    checked: &Checked,
    memory: &Arc<GuestMemory>,
) -> Result<Arc<Vm>, LaunchError> {
    let vm = Vm::without_irqchip()?;
    // The filter first: KVM waits for a grace period with `synchronize_srcu`, which is
    // expedited only while the VM's SRCU looks idle, and a slot's grace period just ended
    // makes it look busy (a normal grace period then: 15.6 ms once in ten launches here).
    // A slot's wait is always expedited.
    if checked.plan.cpu_model.syscall_repair {
        vm.trap_lstar_writes()?;
    }
    vm.map_memory(memory, checked.plan.machine.first_ram_slot)?;
    crate::sys::timeline::mark("slots");
    vm.add_irqchip()?;
    vm.apply_idle(&checked.plan.idle)?;
    vm.prepare_vcpus(checked.plan.cores.len())?;
    vm.report_emulation_failures()?;
    crate::sys::timeline::mark("vm_caps");
    Ok(Arc::new(vm))
}

/// Kernel, initrd, command line and the boot structures, in guest memory.
pub(super) fn write_boot(checked: &Checked, memory: &GuestMemory) -> Result<BootInfo, LaunchError> {
    Ok(boot::setup(
        memory.mem(),
        &checked.plan.layout,
        &BootConfig {
            kernel: &checked.kernel,
            initrd: checked.initrd.as_deref(),
            cmdline: &checked.plan.cmdline,
            cpus: checked.plan.cores.len(),
            protocol: checked.plan.protocol,
            virtio_mmio: &checked.plan.machine.virtio_mmio(),
            isa: &[checked.plan.machine.isa(), LEGACY_DEVICES.to_vec()].concat(),
            sleep_port: ACPI_PM_BASE as u16,
            pci: crate::board::pci::host_bridge(&checked.plan.machine),
            // Every backing is fresh at this point: anonymous and hugetlb pages come zeroed
            // from the kernel, a pool extent was scrubbed when it was given back
            // (docs/pool.md), and a partition stops on reset instead of booting again.
            memory_zeroed: true,
        },
    )?)
}

/// The whole launch: check, acquire memory, run, give the memory back.
pub fn launch(cfg: LaunchConfig, observer: &dyn Observer) -> Result<LaunchReport, LaunchError> {
    crate::sys::timeline::mark("args");
    // The configuration's own rules first: a request that breaks one is refused before
    // the host is looked at.
    let cfg = ValidConfig::try_from(cfg)?;
    let host = HostFacts::read(&cfg)?;
    let checked = open(check(cfg, &host)?)?;
    crate::sys::timeline::mark("check");
    let started = Instant::now();
    let acquired = acquire(&checked)?;
    crate::sys::timeline::mark("acquire");
    match acquired {
        Acquired::Unclaimed(ram) => run(checked, ram, started, None, observer),
        Acquired::Extent { claim, ram } => {
            // Opened as root (the vCPU threads join it after the launcher gave root up).
            let cpuset = GuestsCpuset::open(&claim.isolation())?;
            // The keeper takes the claim over: it records the partition while it runs and
            // gives it back, scrubbed, however the launcher ends.
            let mode = match checked.plan.sandbox {
                Sandbox::On(_) => KeeperMode::Confined,
                Sandbox::Off => KeeperMode::Unconfined,
            };
            let keeper = Keeper::spawn(*claim, mode).map_err(|b| {
                // The claim (scrubbed and freed as it drops) stays with us.
                let (e, claim) = *b;
                drop(claim);
                e
            })?;
            crate::sys::timeline::mark("keeper");
            let keeper = std::cell::RefCell::new(keeper);
            let result = {
                let obs = KeeperObserver {
                    inner: observer,
                    keeper: &keeper,
                };
                run(checked, ram, started, cpuset, &obs)
            };
            // The guest is gone (or never ran): the keeper scrubs, then frees the cores
            // and the extent.
            let released = keeper.into_inner().finish();
            let mut report = result?;
            let r = released?;
            report.pool = Some(PoolOutcome {
                name: r.name,
                offset: r.offset,
                len: r.len,
                scrub: r.scrub,
            });
            Ok(report)
        }
    }
}

// The FADT names the RTC's century register; the RTC device must keep it there.
const _: () = assert!(boot::acpi::RTC_CENTURY_REG == devices::rtc::CENTURY_REG);
