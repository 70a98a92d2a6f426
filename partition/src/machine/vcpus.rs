//! The vCPU threads above [`crate::kvm::vcpu`]: creating each vCPU with its CPUID, the
//! thread policy (join the reserved cores' cpuset, pin, confine) before its first `KVM_RUN`,
//! and waiting for the first stop, kicking and joining the rest.

use super::check::{Checked, LaunchError};
use super::outcome::{Ending, Observer, VcpuReport};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boot::BootInfo;
use vmm_sys_util::eventfd::EventFd;

use crate::cpu::cpuid::IdleCpuid;
use crate::cpu::exits::StopReason;
use crate::host::isolation::GuestsCpuset;
use crate::kvm::Vm;
use crate::kvm::stats::Stats;
use crate::kvm::syscall::SyscallRepair;
use crate::kvm::vcpu::{self as kvm_vcpu, VcpuContext, VcpuHandle};
use crate::memory::GuestMemory;
use crate::sys::seccomp::Role;
use crate::sys::signals::SignalGuard;

use super::control::Control;
use super::devices::Devices;

/// Created vCPUs: what each thread takes, what the launcher keeps, and the CPUID KVM
/// reported back for vCPU 0.
pub(super) struct Vcpus {
    pub(super) threads: Vec<VcpuThread>,
    pub(super) handles: Vec<VcpuHandle>,
    pub(super) cpuid_back: Option<kvm_bindings::CpuId>,
}

/// A vCPU and where its thread must run.
pub(super) struct VcpuThread {
    /// What the run loop needs.
    pub(super) ctx: VcpuContext,
    /// Where it runs.
    pub(super) policy: ThreadPolicy,
}

/// Where a vCPU thread runs, set up on the thread itself before its first `KVM_RUN`.
pub(super) struct ThreadPolicy {
    /// The host core it is pinned to.
    core: usize,
    /// The reserved cores' cpuset it joins before pinning, if any. Joined, the cpuset's
    /// `tasks` file is let go: the last vCPU thread to join closes it, so the running VMM
    /// holds no writable cgroup file.
    cpuset: Option<Arc<GuestsCpuset>>,
    /// The seccomp filter it installs last (none with `--no-sandbox`).
    pub(super) filter: Option<Arc<seccompiler::BpfProgram>>,
}

/// Why a vCPU thread could not take its place.
#[derive(Debug, thiserror::Error)]
pub enum ThreadError {
    /// The reserved cores' cpuset refused it.
    #[error("joining the reserved cores' cpuset: {0}")]
    Cpuset(#[from] crate::host::isolation::IsolationError),
    /// The kernel refused the pin.
    #[error("pinning to core {0} failed")]
    Pin(usize),
    /// Its seccomp filter could not be installed.
    #[error("{0}")]
    Seccomp(#[from] crate::sys::seccomp::SeccompError),
}

impl ThreadPolicy {
    /// Joins the cpuset, pins to the core, installs the filter: in that order, because
    /// the cpuset must allow the core and the filter forbids both.
    fn enter(mut self) -> Result<(), ThreadError> {
        if let Some(c) = self.cpuset.take() {
            c.join()?;
        }
        if !core_affinity::set_for_current(core_affinity::CoreId { id: self.core }) {
            return Err(ThreadError::Pin(self.core));
        }
        if let Some(f) = &self.filter {
            crate::sys::seccomp::apply(Role::Vcpu, f)?;
        }
        Ok(())
    }
}

/// One vCPU per core, configured (CPUID, LAPIC; vCPU 0 the entry registers), not running.
pub(super) fn create_vcpus(
    checked: &Checked,
    vm: &Vm,
    boot: &BootInfo,
    devices: &Devices,
    memory: &Arc<GuestMemory>,
    cpuset: Option<GuestsCpuset>,
) -> Result<Vcpus, LaunchError> {
    // Only the vCPU contexts hold it (each drops its share once joined).
    let cpuset = cpuset.map(Arc::new);
    let supported = vm.supported_cpuid()?;
    let n = checked.cores.len();
    let idle_cpuid = IdleCpuid {
        mwait: checked.idle.expose_mwait,
        hints_realtime: checked.idle.hints_realtime,
    };
    let mut out = Vcpus {
        threads: Vec::with_capacity(n),
        handles: Vec::with_capacity(n),
        cpuid_back: None,
    };
    for (index, &core) in checked.cores.iter().enumerate() {
        let entry = (index == 0).then_some(&boot.entry);
        let (fd, back) =
            vm.create_vcpu(index, n, &supported, entry, idle_cpuid, &checked.cpu_model)?;
        if index == 0 {
            out.cpuid_back = back;
        }
        let (counters, kicker, mut h) = kvm_vcpu::handles(index, core);
        h.stats = Stats::open(&fd).ok().map(Arc::new);
        out.handles.push(h);
        let ctx = VcpuContext {
            index,
            core,
            fd,
            pio: devices.pio.clone(),
            mmio: devices.mmio.clone(),
            memory: memory.clone(),
            counters,
            kicker,
            pause: Arc::default(),
            syscall: SyscallRepair::new(checked.cpu_model.syscall_repair),
            guest_faults: devices.guest_faults.clone(),
        };
        let policy = ThreadPolicy {
            core,
            cpuset: cpuset.clone(),
            filter: None,
        };
        out.threads.push(VcpuThread { ctx, policy });
    }
    drop(cpuset);
    Ok(out)
}

/// Starts one thread per vCPU, waits for the first stop (or a signal), stops and joins
/// them all: how it ended, and for how long the vCPUs ran.
pub(super) fn run_vcpus(
    vcpus: Vec<VcpuThread>,
    handles: &[VcpuHandle],
    signals: &SignalGuard,
    observer: &dyn Observer,
    main_filter: Option<&seccompiler::BpfProgram>,
    control: &Control,
) -> Result<(Ending, Duration), LaunchError> {
    let os = |what| move |source| LaunchError::Os { what, source };
    kvm_vcpu::install_kick_handler().map_err(os("installing the vCPU kick handler"))?;
    let exit_evt = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(os("eventfd"))?);
    let first_stop: Arc<Mutex<Option<(usize, StopReason)>>> = Arc::new(Mutex::new(None));

    observer.running();
    let spawned = Instant::now();
    let mut threads = Vec::with_capacity(vcpus.len());
    for VcpuThread { ctx, policy } in vcpus {
        let exit_evt = exit_evt.clone();
        let first_stop = first_stop.clone();
        let index = ctx.index;
        let t = std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || {
                let reason = match policy.enter() {
                    Ok(()) => kvm_vcpu::run(ctx),
                    Err(why) => StopReason::RunError(format!("vcpu{index}: {why}")),
                };
                if reason != StopReason::Kicked {
                    let mut f = first_stop.lock().unwrap_or_else(|e| e.into_inner());
                    f.get_or_insert((index, reason));
                }
                let _ = exit_evt.write(1);
            });
        match t {
            Ok(t) => threads.push(t),
            Err(e) => {
                stop_all(handles, threads);
                return Err(LaunchError::Os {
                    what: "starting a vCPU thread",
                    source: e,
                });
            }
        }
    }

    // The launcher's own thread, from here on only waiting, kicking, joining and reporting.
    if let Some(f) = main_filter {
        if let Err(e) = crate::sys::seccomp::apply(Role::Main, f) {
            stop_all(handles, threads);
            return Err(e.into());
        }
    }
    let ending = wait(signals, &exit_evt, &control.stop, &first_stop, || {
        observer.tick(&reports(handles))
    });
    let ran_for = spawned.elapsed();
    control
        .stopping
        .store(true, std::sync::atomic::Ordering::SeqCst);
    stop_all(handles, threads);
    Ok((ending, ran_for))
}

pub(super) fn reports(handles: &[VcpuHandle]) -> Vec<VcpuReport> {
    handles
        .iter()
        .map(|h| VcpuReport {
            index: h.index,
            core: h.core,
            exits: h.counters.snapshot().to_vec(),
            assists: h.counters.assist_snapshot(),
            kvm: h
                .stats
                .as_ref()
                .map(|s| s.idle_counters())
                .unwrap_or_default(),
        })
        .collect()
}

pub(super) fn wait(
    signals: &SignalGuard,
    exit_evt: &EventFd,
    api_stop: &EventFd,
    first_stop: &Mutex<Option<(usize, StopReason)>>,
    mut tick: impl FnMut(),
) -> Ending {
    use std::os::fd::AsRawFd;
    loop {
        let mut fds =
            [signals.fd(), exit_evt.as_raw_fd(), api_stop.as_raw_fd()].map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        // SAFETY: polling three valid fds in a local array.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 3, 1000) };
        if n == 0 {
            tick();
            continue;
        }
        if let Some(sig) = signals.take() {
            return Ending::Signal(sig);
        }
        if fds[2].revents & libc::POLLIN != 0 && api_stop.read().is_ok() {
            return Ending::Requested;
        }
        if fds[1].revents & libc::POLLIN != 0 {
            let _ = exit_evt.read();
            if let Some((vcpu, reason)) =
                first_stop.lock().unwrap_or_else(|e| e.into_inner()).take()
            {
                return Ending::Guest { vcpu, reason };
            }
        }
    }
}

pub(super) fn stop_all(handles: &[VcpuHandle], threads: Vec<std::thread::JoinHandle<()>>) {
    for h in handles {
        h.kicker.kick();
    }
    // A signal can land just before a thread enters KVM_RUN; immediate_exit (set by the
    // kick) makes that KVM_RUN return at once, so joining cannot hang.
    for t in threads {
        let _ = t.join();
    }
}
