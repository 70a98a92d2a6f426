//! Controlling a running partition from outside its vCPUs: the stop and pause state shared
//! by the launcher, the vCPU threads and the local API, and starting the API thread.

use super::error::LaunchError;
use super::open::Checked;
use super::outcome::MemoryReport;
use std::sync::Arc;
use std::time::Instant;

use vmm_sys_util::eventfd::EventFd;

use crate::kvm::vcpu::VcpuHandle;
use crate::kvm::vcpu::{self as kvm_vcpu};
use crate::sys::sandbox::Sandbox;
use crate::sys::seccomp::Role;

/// How the launcher's wait is told to end, and what the vCPUs' pause state is.
pub(super) struct Control {
    /// Written by the API to ask for a clean stop.
    pub(super) stop: Arc<EventFd>,
    /// Set once teardown starts.
    pub(super) stopping: Arc<std::sync::atomic::AtomicBool>,
    /// Shared with every vCPU thread.
    pub(super) pause: Arc<kvm_vcpu::PauseControl>,
}

impl Control {
    pub(super) fn new() -> Result<Self, LaunchError> {
        Ok(Self {
            stop: Arc::new(
                EventFd::new(libc::EFD_NONBLOCK).map_err(|source| LaunchError::Os {
                    what: "eventfd",
                    source,
                })?,
            ),
            stopping: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            pause: Arc::new(kvm_vcpu::PauseControl::default()),
        })
    }
}

/// Starts the API thread on `sock`, serving this launch.
pub(super) fn start_api(
    sock: crate::api::ApiSocket,
    checked: &Checked,
    handles: &[VcpuHandle],
    cpuid_back: Option<&kvm_bindings::CpuId>,
    memory: &MemoryReport,
    control: &Control,
    filter: Option<Arc<seccompiler::BpfProgram>>,
) -> Result<crate::api::ApiServer, LaunchError> {
    let description = crate::api::PartitionDoc {
        pid: std::process::id(),
        name: checked.plan.name().map(str::to_string),
        cores: checked.plan.cores.clone(),
        cores_exclusive_by: checked.plan.cores_from.clone(),
        memory: serde_json::to_value(memory).unwrap_or_default(),
        kernel: checked.kernel_name.clone(),
        cmdline: checked.plan.cmdline.clone(),
        idle_policy: checked.plan.idle.policy.name().to_string(),
        cpu_model: checked.plan.cpu_model.name.to_string(),
        sandbox: match &checked.plan.sandbox {
            Sandbox::On(who) => serde_json::to_value(who).unwrap_or_default(),
            Sandbox::Off => serde_json::Value::Null,
        },
    };
    let state = crate::api::ApiState {
        description,
        vcpus: handles
            .iter()
            .map(|h| crate::api::ApiVcpu {
                index: h.index,
                core: h.core,
                counters: h.counters.clone(),
                kicker: h.kicker.clone(),
                stats: h.stats.clone(),
            })
            .collect(),
        idle: checked.plan.idle.clone(),
        cpuid_back: cpuid_back.map(|c| c.as_slice().to_vec()),
        pause: control.pause.clone(),
        stop: control.stop.clone(),
        stopping: control.stopping.clone(),
        started: Instant::now(),
    };
    crate::api::ApiServer::start(sock, state, move || match &filter {
        Some(f) => crate::sys::seccomp::apply(Role::API, f),
        None => Ok(()),
    })
    .map_err(|source| LaunchError::Os {
        what: "starting the API thread",
        source,
    })
}
