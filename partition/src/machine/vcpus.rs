//! The vCPU threads above [`crate::kvm::vcpu`]: their seats (one thread per vCPU, started
//! first, which joins the reserved cores' cpuset and pins itself while the launcher builds
//! the VM), creating each vCPU with its CPUID, the thread's confinement before its first
//! `KVM_RUN`, and waiting for the first stop, kicking and joining the rest.

use super::error::LaunchError;
use super::open::Checked;
use super::outcome::{Ending, Observer, VcpuReport};
use crate::cpu::exits::VcpuCounters;
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

/// A vCPU and how its thread is confined.
pub(super) struct VcpuThread {
    /// What the run loop needs.
    pub(super) ctx: VcpuContext,
    /// Its confinement.
    pub(super) policy: ThreadPolicy,
}

/// How a vCPU thread is confined, on the thread itself before its first `KVM_RUN` (its
/// seat has already put it on its core).
#[derive(Default)]
pub(super) struct ThreadPolicy {
    /// The sandbox's user, which the thread checks it now is (none with `--no-sandbox`).
    pub(super) uid: Option<u32>,
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
    /// The stop signals could not be blocked in it.
    #[error("blocking the stop signals: {0}")]
    Signals(std::io::Error),
    /// It did not give up root with the process.
    #[error("{0}")]
    Sandbox(#[from] crate::sys::sandbox::SandboxError),
}

impl ThreadPolicy {
    /// Confirms the thread gave up root with the process (its own `no_new_privs`, its uid,
    /// no capabilities), then installs the filter.
    fn enter(self) -> Result<(), ThreadError> {
        if let Some(uid) = self.uid {
            crate::sys::sandbox::confirm_thread(uid)?;
        }
        if let Some(f) = &self.filter {
            crate::sys::seccomp::apply(Role::VCPU, f)?;
        }
        Ok(())
    }
}

/// What a seat runs once its vCPU exists: told whether the seat took its place.
type SeatJob = Box<dyn FnOnce(Result<(), ThreadError>) + Send>;

/// The vCPU threads, started before the vCPUs exist so that the slow part of taking their
/// places overlaps the VM's construction: joining the reserved cores' cpuset moves the
/// thread between cgroups, which waits for an RCU grace period (docs/security.md, "The
/// vCPU threads' seats", has the measurement), and pinning. Each then waits for its job.
/// Dropped without jobs, the threads end and are joined.
pub(super) struct Seats {
    seats: Vec<(
        std::sync::mpsc::Sender<SeatJob>,
        std::thread::JoinHandle<()>,
    )>,
}

impl Seats {
    /// One thread per core, named `vcpu<index>`: blocks the stop signals (the launcher's
    /// signalfd takes them), joins `cpuset` if given, pins itself to its core. The cpuset's
    /// `tasks` file is let go once every seat joined: the running VMM holds no writable
    /// cgroup file.
    pub(super) fn start(
        cores: &[usize],
        cpuset: Option<GuestsCpuset>,
    ) -> Result<Self, LaunchError> {
        let cpuset = cpuset.map(Arc::new);
        let mut out = Self {
            seats: Vec::with_capacity(cores.len()),
        };
        for (index, &core) in cores.iter().enumerate() {
            let (tx, rx) = std::sync::mpsc::channel::<SeatJob>();
            let cpuset = cpuset.clone();
            let t = std::thread::Builder::new()
                .name(format!("vcpu{index}"))
                .spawn(move || {
                    let placed = take_place(core, cpuset);
                    if let Ok(job) = rx.recv() {
                        job(placed);
                    }
                })
                .map_err(|source| LaunchError::Os {
                    what: "starting a vCPU thread",
                    source,
                })?;
            out.seats.push((tx, t));
        }
        Ok(out)
    }

    /// Gives each seat its job, in order; the threads to join.
    fn seat(mut self, jobs: Vec<SeatJob>) -> Vec<std::thread::JoinHandle<()>> {
        let mut threads = Vec::with_capacity(self.seats.len());
        let mut jobs = jobs.into_iter();
        for (tx, t) in self.seats.drain(..) {
            if let Some(job) = jobs.next() {
                // A seat that already ended (it cannot before a job) just joins.
                let _ = tx.send(job);
            }
            threads.push(t);
        }
        threads
    }
}

impl Drop for Seats {
    fn drop(&mut self) {
        for (tx, t) in self.seats.drain(..) {
            drop(tx);
            let _ = t.join();
        }
    }
}

/// Moves the calling thread (the launcher's main thread, and with it every thread it starts
/// afterwards: devices' workers, the API, KVM's own worker for the VM) off `cores`, onto
/// the other cores it may use, so the vCPU threads have their cores to themselves. Nothing
/// changes when the partition has every core. Returns the cores it moved to.
pub(super) fn keep_off(cores: &[usize]) -> Option<Vec<usize>> {
    let others: Vec<usize> = crate::config::cores::available()
        .into_iter()
        .filter(|c| !cores.contains(c) && *c < libc::CPU_SETSIZE as usize)
        .collect();
    if others.is_empty() {
        return None;
    }
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in &others {
        // SAFETY: sets one bit of a valid set, c < CPU_SETSIZE (above).
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: applies a valid set to the calling thread (pid 0).
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        // Outside this process's cpuset, say: the threads stay where they may run.
        log::debug!(
            "keeping the VMM's threads off cores {}: {}",
            crate::config::cores::format(cores),
            std::io::Error::last_os_error()
        );
        return None;
    }
    Some(others)
}

/// A seat's first steps: the stop signals blocked, the cpuset joined, the core pinned (in
/// that order: the cpuset must allow the core).
fn take_place(core: usize, cpuset: Option<Arc<GuestsCpuset>>) -> Result<(), ThreadError> {
    crate::sys::signals::block_in_this_thread().map_err(ThreadError::Signals)?;
    if let Some(c) = cpuset {
        c.join()?;
    }
    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        return Err(ThreadError::Pin(core));
    }
    Ok(())
}

/// One vCPU per core, configured (CPUID, LAPIC; vCPU 0 the entry registers), not running.
pub(super) fn create_vcpus(
    checked: &Checked,
    vm: &Vm,
    boot: &BootInfo,
    devices: &Devices,
    memory: &Arc<GuestMemory>,
) -> Result<Vcpus, LaunchError> {
    let supported = vm.supported_cpuid()?;
    let n = checked.plan.cores.len();
    let idle_cpuid = IdleCpuid {
        mwait: checked.plan.idle.expose_mwait,
        hints_realtime: checked.plan.idle.hints_realtime,
    };
    let mut out = Vcpus {
        threads: Vec::with_capacity(n),
        handles: Vec::with_capacity(n),
        cpuid_back: None,
    };
    for (index, &core) in checked.plan.cores.iter().enumerate() {
        let entry = (index == 0).then_some(&boot.entry);
        let (fd, back) = vm.create_vcpu(
            index,
            n,
            &supported,
            entry,
            idle_cpuid,
            &checked.plan.cpu_model,
        )?;
        if index == 0 {
            out.cpuid_back = back;
        }
        let (counters, kicker, mut h) = kvm_vcpu::handles(index, core);
        h.stats = Stats::open(&fd).ok().map(Arc::new);
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
            syscall: SyscallRepair::new(checked.plan.cpu_model.syscall_repair),
            guest_faults: devices.output.fault_lines.clone(),
            stats: h.stats.clone(),
        };
        out.handles.push(h);
        out.threads.push(VcpuThread {
            ctx,
            policy: ThreadPolicy::default(),
        });
    }
    Ok(out)
}

/// Sets each vCPU running on its seat, waits for the first stop (or a signal), stops and
/// joins them all: how it ended, and for how long the vCPUs ran.
/// What the launcher's own thread does once the vCPUs run: the VM's last step
/// ([`Vm::end_pit_reinject`](crate::kvm::vm::Vm::end_pit_reinject)), then its filter.
pub(super) struct MainThread<'a> {
    /// Its seccomp filter, when confined.
    pub filter: Option<&'a seccompiler::BpfProgram>,
    /// The VM.
    pub vm: &'a crate::kvm::vm::Vm,
}

/// How long the launcher waits for the first vCPU's first exit before it takes the PIT out
/// of reinject mode ([`run_vcpus`]).
const FIRST_ENTRY_WAIT: Duration = Duration::from_millis(50);

pub(super) fn run_vcpus(
    seats: Seats,
    vcpus: Vec<VcpuThread>,
    handles: &[VcpuHandle],
    signals: &SignalGuard,
    observer: &dyn Observer,
    main: MainThread<'_>,
    control: &Control,
) -> Result<(Ending, Duration), LaunchError> {
    let MainThread {
        filter: main_filter,
        vm,
    } = main;
    let os = |what| move |source| LaunchError::Os { what, source };
    kvm_vcpu::install_kick_handler().map_err(os("installing the vCPU kick handler"))?;
    let exit_evt = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(os("eventfd"))?);
    let first_stop: Arc<Mutex<Option<(usize, StopReason)>>> = Arc::new(Mutex::new(None));

    observer.running();
    let spawned = Instant::now();
    let jobs: Vec<SeatJob> = vcpus
        .into_iter()
        .map(|VcpuThread { ctx, policy }| {
            let exit_evt = exit_evt.clone();
            let first_stop = first_stop.clone();
            let index = ctx.index;
            Box::new(move |placed: Result<(), ThreadError>| {
                let reason = match placed.and_then(|()| policy.enter()) {
                    Ok(()) => kvm_vcpu::run(ctx),
                    Err(why) => StopReason::RunError(format!("vcpu{index}: {why}")),
                };
                if reason != StopReason::Kicked {
                    let mut f = first_stop.lock().unwrap_or_else(|e| e.into_inner());
                    f.get_or_insert((index, reason));
                }
                let _ = exit_evt.write(1);
            }) as SeatJob
        })
        .collect();
    let threads = seats.seat(jobs);
    // With the guest running, the PIT leaves reinject mode: KVM waits for two SRCU grace
    // periods there (`Vm::end_pit_reinject`), which the guest no longer waits for. Not
    // before the first vCPU's first entry is over: that entry moves the PIT's timer to its
    // core under the lock the ioctl holds throughout (`__kvm_migrate_pit_timer`), so the
    // guest would wait after all. Its first exit says it is; a guest that does not exit
    // soon is not waited for longer than `FIRST_ENTRY_WAIT`.
    let t = Instant::now();
    while !handles.first().is_none_or(|h| h.counters.any()) && t.elapsed() < FIRST_ENTRY_WAIT {
        std::thread::sleep(Duration::from_micros(100));
    }
    if let Err(e) = vm.end_pit_reinject() {
        stop_all(handles, threads);
        return Err(e.into());
    }

    // The launcher's own thread, from here on only waiting, kicking, joining and reporting.
    if let Some(f) = main_filter {
        if let Err(e) = crate::sys::seccomp::apply(Role::MAIN, f) {
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
            counters: VcpuCounters::read(
                h.index,
                h.core,
                &h.counters,
                crate::kvm::stats::idle_counters_of(h.stats.as_deref()),
            ),
            marks: h.counters.marks(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_seat_takes_its_core_first_and_runs_its_job_there() {
        let seats = Seats::start(&[0], None).expect("a seat");
        let (tx, rx) = std::sync::mpsc::channel();
        let job: SeatJob = Box::new(move |placed| {
            // SAFETY: sched_getcpu has no preconditions.
            let cpu = unsafe { libc::sched_getcpu() };
            let name = std::thread::current().name().map(String::from);
            let _ = tx.send((placed.is_ok(), cpu, name));
        });
        for t in seats.seat(vec![job]) {
            t.join().unwrap();
        }
        let (placed, cpu, name) = rx.recv().unwrap();
        assert!(placed);
        assert_eq!(cpu, 0, "pinned before the job ran");
        assert_eq!(name.as_deref(), Some("vcpu0"));
    }

    #[test]
    fn seats_given_no_job_end_and_are_joined() {
        // A launch that fails before its vCPUs run drops its seats: nothing runs, nothing
        // is left behind, the drop does not hang.
        let ran = Arc::new(AtomicUsize::new(0));
        let seats = Seats::start(&[0, 0], None).expect("two seats");
        let count = |n: &Arc<AtomicUsize>| -> SeatJob {
            let n = n.clone();
            Box::new(move |_| {
                n.fetch_add(1, Ordering::SeqCst);
            })
        };
        drop(seats);
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        // Fewer jobs than seats: the one without a job ends on its own.
        let seats = Seats::start(&[0, 0], None).expect("two seats");
        for t in seats.seat(vec![count(&ran)]) {
            t.join().unwrap();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_seat_that_cannot_pin_tells_its_job() {
        // 1023: the highest core core_affinity can name; no machine here has it online.
        let seats = Seats::start(&[1023], None).expect("a seat");
        let (tx, rx) = std::sync::mpsc::channel();
        let job: SeatJob = Box::new(move |placed| {
            let _ = tx.send(placed.err().map(|e| e.to_string()));
        });
        for t in seats.seat(vec![job]) {
            t.join().unwrap();
        }
        assert_eq!(
            rx.recv().unwrap().as_deref(),
            Some("pinning to core 1023 failed")
        );
    }
}
