//! Confining a launch before its threads start: one seccomp filter per thread role (the
//! vCPU filter widened for PCI and passthrough), the SIGSYS handler, and giving up root.

use super::check::LaunchError;
use std::sync::Arc;

use crate::sys::sandbox::Sandbox;
use crate::sys::seccomp::Role;

/// The seccomp filters of a confined launch, compiled before privileges are dropped.
pub(super) struct Filters {
    pub(super) vcpu: Arc<seccompiler::BpfProgram>,
    pub(super) worker: Arc<seccompiler::BpfProgram>,
    pub(super) engine: Arc<seccompiler::BpfProgram>,
    pub(super) api: Arc<seccompiler::BpfProgram>,
    pub(super) main: seccompiler::BpfProgram,
}

/// Gives up root: compiles every thread's filter, installs the SIGSYS handler and becomes
/// the sandbox's user. Called once everything that needs root exists and before any
/// thread is started but the vCPU threads' seats (which confirm the drop themselves when
/// handed their vCPUs); `None` with `--no-sandbox`.
pub(super) fn confine(
    sandbox: &Sandbox,
    pci: bool,
    passthrough: bool,
) -> Result<Option<Filters>, LaunchError> {
    let Sandbox::On(who) = sandbox else {
        return Ok(None);
    };
    // With PCI functions, a guest's configuration writes (MSI-X routes, a moved doorbell
    // BAR) make the vCPU thread that takes them update KVM's routing, ioeventfds and
    // memory slots; with a passed-through function it also reads and writes the device's
    // VFIO regions (its trapped BAR pages and command register).
    let mut vcpu_ioctls = crate::kvm::vcpu_thread_ioctls();
    if pci {
        vcpu_ioctls.extend(crate::kvm::vm_device_ioctls());
    }
    let region_io: &[i64] = if passthrough {
        &[libc::SYS_pread64, libc::SYS_pwrite64]
    } else {
        &[]
    };
    let f = Filters {
        vcpu: Arc::new(crate::sys::seccomp::filter_with(
            Role::Vcpu,
            &vcpu_ioctls,
            region_io,
        )?),
        worker: Arc::new(crate::sys::seccomp::filter(Role::BlockWorker, &[])?),
        engine: Arc::new(crate::sys::seccomp::filter(Role::Engine, &[])?),
        api: Arc::new(crate::sys::seccomp::filter(Role::Api, &[])?),
        main: crate::machine::vfio::launcher_filter(passthrough)?,
    };
    crate::sys::seccomp::install_violation_handler()?;
    crate::sys::sandbox::drop_privileges(who)?;
    Ok(Some(f))
}
