//! The local API of a running partition (docs/kubernetes.md): HTTP/1.1 and JSON on a Unix
//! socket (`partition launch --api-socket PATH`), as Firecracker and Cloud Hypervisor serve
//! theirs, for an orchestrator that must not parse stderr. Its routes are described in
//! OpenAPI 3 by `openapi.json` beside this file ([`OPENAPI`]; a test holds it to the
//! router):
//!
//! | request | answer |
//! |---|---|
//! | `GET /partition` | what runs: cores, memory, kernel, command line, idle policy, CPU model, sandbox, pid |
//! | `GET /state` | `{"state": "running" \| "paused" \| "stopping", "ran_for_s": ...}` |
//! | `PUT /state` `{"state": "paused" \| "running"}` | pauses (every vCPU leaves the guest and waits) or resumes |
//! | `GET /counters` | per vCPU: exits by reason, instruction assists, KVM's statistics |
//! | `GET /idle` | the idle plan and what KVM reads back about it now |
//! | `PUT /actions` `{"action": "stop"}` | a clean stop: the launcher tears down and exits 0 |
//!
//! One thread serves it, one connection at a time (`Connection: close`), under its own
//! seccomp filter. It never takes a lock a vCPU holds: counters are atomics, KVM's
//! statistics are read from their own descriptors, pausing sets a flag and pulls each vCPU
//! out of `KVM_RUN`. Requests are bounded (8 KiB of head, 4 KiB of body, 2 s to arrive);
//! anything malformed gets a 4xx with the reason and changes nothing. The socket is bound
//! by the launcher while it is root, owned by the sandbox's user, mode 0600.
//!
//! - [`http`]: HTTP/1.1 parsing and answering, apart from what is served.
//! - [`routes`]: the routes, their typed bodies and the router.
//! - [`server`]: the socket and the serving thread.

pub mod http;
pub mod routes;
pub mod server;

pub use routes::{ApiState, ApiVcpu, PartitionDoc};
pub use server::{ApiError, ApiPlace, ApiServer, ApiSocket};

/// The API described in OpenAPI 3.0 (`partition/src/api/openapi.json`).
pub const OPENAPI: &str = include_str!("openapi.json");

#[cfg(test)]
mod tests;
