//! What the API serves: its routes ([`ROUTES`], which `openapi.json` describes and a test
//! holds to the router), the typed bodies each takes and gives, and [`ApiState::handle`],
//! the router. No socket here: [`super::server`] brings requests in.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use vmm_sys_util::eventfd::EventFd;

use super::http::{Response, err};
use crate::cpu::exits::{ExitCounters, PartitionCounters, VcpuCounters};
use crate::cpu::idle::IdlePlan;
use crate::cpu::readback::Readback;
use crate::kvm::stats::Stats;
use crate::kvm::vcpu::{Kicker, PauseControl};

/// One route: its path and the methods it serves.
pub struct Route {
    /// The path.
    pub path: &'static str,
    /// Each method served on it.
    pub methods: &'static [Method],
}

/// One method of a route: the status of a good answer, the schema of its body (a name in
/// `openapi.json`'s `components.schemas`) and what serves it, given the request's body.
pub struct Method {
    /// `GET`, `PUT`...
    pub name: &'static str,
    /// The status of a good answer.
    pub status: u16,
    /// The good answer's schema.
    pub schema: &'static str,
    /// The answer's body, or the error answer.
    pub serve: fn(&ApiState, &[u8]) -> Result<Value, Response>,
}

/// A body served as JSON.
fn json(body: &impl Serialize) -> Result<Value, Response> {
    serde_json::to_value(body).map_err(|e| err(500, format!("the answer did not serialize: {e}")))
}

/// Every route the API serves, and the router: [`ApiState::handle`] answers from this list
/// alone. A method not listed on a listed path gets 405; any other path 404; a bad request
/// 400 (all with the `Error` schema).
pub const ROUTES: &[Route] = &[
    Route {
        path: "/partition",
        methods: &[Method {
            name: "GET",
            status: 200,
            schema: "Partition",
            serve: |s, _| json(&s.description),
        }],
    },
    Route {
        path: "/state",
        methods: &[
            Method {
                name: "GET",
                status: 200,
                schema: "State",
                serve: |s, _| json(&s.state()),
            },
            Method {
                name: "PUT",
                status: 200,
                schema: "State",
                serve: |s, b| json(&s.put_state(b)?),
            },
            Method {
                name: "PATCH",
                status: 200,
                schema: "State",
                serve: |s, b| json(&s.put_state(b)?),
            },
        ],
    },
    Route {
        path: "/counters",
        methods: &[Method {
            name: "GET",
            status: 200,
            schema: "Counters",
            serve: |s, _| json(&s.counters()),
        }],
    },
    Route {
        path: "/idle",
        methods: &[Method {
            name: "GET",
            status: 200,
            schema: "Idle",
            serve: |s, _| json(&s.idle()),
        }],
    },
    Route {
        path: "/actions",
        methods: &[
            Method {
                name: "PUT",
                status: 202,
                schema: "State",
                serve: |s, b| json(&s.action(b)?),
            },
            Method {
                name: "POST",
                status: 202,
                schema: "State",
                serve: |s, b| json(&s.action(b)?),
            },
        ],
    },
];

/// `GET /partition`: what runs. Made by the launch, which knows these; the API only serves it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PartitionDoc {
    /// The launcher's pid.
    pub pid: u32,
    /// The pool partition's name (none for an ad hoc launch).
    pub name: Option<String>,
    /// Host cores, one vCPU each in order.
    pub cores: Vec<usize>,
    /// What made the cores exclusive (a cgroup's cpuset), when something did.
    pub cores_exclusive_by: Option<String>,
    /// The guest's memory (as the launch report gives it).
    pub memory: Value,
    /// The kernel (or `probe`).
    pub kernel: String,
    /// The kernel command line.
    pub cmdline: String,
    /// The idle policy in force.
    pub idle_policy: String,
    /// The CPU model.
    pub cpu_model: String,
    /// Who the VMM runs as when sandboxed (null when not).
    pub sandbox: Value,
}

/// Whether the vCPUs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// In the guest.
    Running,
    /// Every vCPU out of the guest, waiting.
    Paused,
    /// Tearing down.
    Stopping,
}

/// `GET /state`, and the answer to `PUT /state` and `PUT /actions`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StateDoc {
    /// The state.
    pub state: RunState,
    /// Seconds since the vCPUs started.
    pub ran_for_s: f64,
}

/// The state `PUT /state` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Wanted {
    /// Pause every vCPU.
    Paused,
    /// Resume them.
    Running,
}

/// `PUT /state`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateRequest {
    /// What to go to.
    pub state: Wanted,
}

/// What `PUT /actions` can ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// A clean stop: the launcher tears down and exits 0.
    Stop,
}

/// `PUT /actions`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionRequest {
    /// The action.
    pub action: Action,
}

/// `GET /idle`: the idle plan and what KVM reads back about it now.
#[derive(Clone, Debug, Serialize)]
pub struct IdleDoc {
    /// The policy's name.
    pub policy: &'static str,
    /// Why it was chosen.
    pub reason: String,
    /// What KVM reports back.
    pub readback: Readback,
}

/// One vCPU as the API sees it.
pub struct ApiVcpu {
    /// Index.
    pub index: usize,
    /// Host core.
    pub core: usize,
    /// Exit and assist counters.
    pub counters: Arc<ExitCounters>,
    /// To pull it out of the guest.
    pub kicker: Arc<Kicker>,
    /// KVM's statistics.
    pub stats: Option<Arc<Stats>>,
}

/// What the API serves and controls.
pub struct ApiState {
    /// `GET /partition`.
    pub description: PartitionDoc,
    /// The vCPUs.
    pub vcpus: Vec<ApiVcpu>,
    /// The idle plan in force.
    pub idle: IdlePlan,
    /// The CPUID KVM reported back for vCPU 0.
    pub cpuid_back: Option<Vec<kvm_bindings::kvm_cpuid_entry2>>,
    /// Pausing the vCPUs.
    pub pause: Arc<PauseControl>,
    /// Written to ask the launcher for a clean stop.
    pub stop: Arc<EventFd>,
    /// Set once the launcher is tearing down.
    pub stopping: Arc<AtomicBool>,
    /// When the vCPUs started.
    pub started: Instant,
}

/// A JSON body as `T`, or the 400 that says why not.
fn body<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, Response> {
    serde_json::from_slice(bytes).map_err(|e| err(400, format!("the body: {e}")))
}

impl ApiState {
    fn state(&self) -> StateDoc {
        let state = if self.stopping.load(Ordering::SeqCst) {
            RunState::Stopping
        } else if self.pause.is_paused() {
            RunState::Paused
        } else {
            RunState::Running
        };
        StateDoc {
            state,
            ran_for_s: self.started.elapsed().as_secs_f64(),
        }
    }

    fn kvm(&self, v: &ApiVcpu) -> std::collections::BTreeMap<String, u64> {
        crate::kvm::stats::idle_counters_of(v.stats.as_deref())
    }

    fn counters(&self) -> PartitionCounters {
        PartitionCounters {
            updated_at: crate::host::ledger::now(),
            vcpus: self
                .vcpus
                .iter()
                .map(|v| VcpuCounters::read(v.index, v.core, &v.counters, self.kvm(v)))
                .collect(),
        }
    }

    fn idle(&self) -> IdleDoc {
        let kvm: Vec<_> = self.vcpus.iter().map(|v| (v.index, self.kvm(v))).collect();
        let readback = Readback::new(
            &self.idle,
            self.cpuid_back.as_deref(),
            crate::cpu::cpuid::host_leaf5(),
            &self.description.cmdline,
            kvm.iter().map(|(i, m)| (*i, m)),
        );
        IdleDoc {
            policy: self.idle.policy.name(),
            reason: self.idle.reason.clone(),
            readback,
        }
    }

    fn put_state(&self, bytes: &[u8]) -> Result<StateDoc, Response> {
        let want: StateRequest = body(bytes)?;
        if self.stopping.load(Ordering::SeqCst) {
            return Err(err(400, "the partition is stopping"));
        }
        match want.state {
            Wanted::Paused => {
                let kickers: Vec<_> = self.vcpus.iter().map(|v| v.kicker.clone()).collect();
                self.pause.pause(&kickers);
            }
            Wanted::Running => self.pause.resume(),
        }
        Ok(self.state())
    }

    fn action(&self, bytes: &[u8]) -> Result<StateDoc, Response> {
        let ActionRequest { action } = body(bytes)?;
        match action {
            Action::Stop => {
                self.pause.resume();
                let _ = self.stop.write(1);
                Ok(StateDoc {
                    state: RunState::Stopping,
                    ran_for_s: self.started.elapsed().as_secs_f64(),
                })
            }
        }
    }

    /// The answer to one parsed request, from [`ROUTES`].
    pub fn handle(&self, method: &str, path: &str, bytes: &[u8]) -> Response {
        let Some(route) = ROUTES.iter().find(|r| r.path == path) else {
            return err(404, format!("no resource {path}"));
        };
        match route.methods.iter().find(|m| m.name == method) {
            Some(m) => match (m.serve)(self, bytes) {
                Ok(body) => Response {
                    code: m.status,
                    body,
                },
                Err(r) => r,
            },
            None => err(405, format!("{method} {path} is not served")),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    pub(in crate::api) fn state() -> ApiState {
        ApiState {
            description: PartitionDoc {
                pid: 1,
                name: None,
                cores: vec![1],
                cores_exclusive_by: None,
                memory: json!({"size": 1}),
                kernel: "probe".into(),
                cmdline: String::new(),
                idle_policy: "shared".into(),
                cpu_model: "host".into(),
                sandbox: Value::Null,
            },
            vcpus: Vec::new(),
            idle: crate::cpu::idle::resolve(
                crate::cpu::idle::IdlePolicy::Shared,
                &crate::cpu::idle::IdleCaps::default(),
            )
            .unwrap(),
            cpuid_back: None,
            pause: Arc::new(PauseControl::default()),
            stop: Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()),
            stopping: Arc::new(AtomicBool::new(false)),
            started: Instant::now(),
        }
    }

    #[test]
    fn resources_answer_and_bad_requests_change_nothing() {
        let s = state();
        assert_eq!(s.handle("GET", "/partition", b"").body["cores"], json!([1]));
        assert_eq!(s.handle("GET", "/state", b"").body["state"], "running");
        assert_eq!(s.handle("GET", "/counters", b"").code, 200);
        assert_eq!(s.handle("GET", "/idle", b"").body["policy"], "shared");
        assert_eq!(s.handle("GET", "/nothing", b"").code, 404);
        assert_eq!(s.handle("DELETE", "/state", b"").code, 405);
        assert_eq!(s.handle("PUT", "/state", b"{").code, 400);
        for bad in [
            &br#"{"state":"asleep"}"#[..],
            br#"{"state":5}"#,
            br#"{"state":"paused","also":1}"#,
        ] {
            let r = s.handle("PUT", "/state", bad);
            assert_eq!(r.code, 400, "{r:?}");
            assert!(r.body["error"].is_string(), "{r:?}");
        }
        assert_eq!(
            s.handle("PUT", "/actions", br#"{"action":"explode"}"#).code,
            400
        );
        assert!(!s.pause.is_paused() && s.stop.read().is_err());
        assert_eq!(
            s.handle("PUT", "/state", br#"{"state":"paused"}"#).body["state"],
            "paused"
        );
        assert!(s.pause.is_paused());
        assert_eq!(
            s.handle("PUT", "/state", br#"{"state":"running"}"#).body["state"],
            "running"
        );
        assert_eq!(
            s.handle("PUT", "/actions", br#"{"action":"stop"}"#).code,
            202
        );
        assert_eq!(s.stop.read().unwrap(), 1);
    }
}
