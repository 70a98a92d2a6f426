//! Lookups into a results file ([`Results`]) that the report's tables and its pictures share: seed 000's
//! table, whether a section completed, a hot path's host and guest figures, the bare-host
//! twin of a submit row.

use crate::doc::Results;

/// Seed 000's table (KVM guest at default idle against multikernel on the same machine):
/// (row, our hotpaths names, native us, KVM us, KVM/native).
pub const SEED: &[(&str, &[&str], f64, f64, f64)] = &[
    ("Null syscall", &["null_syscall"], 0.070, 0.099, 1.42),
    ("read()", &["read"], 0.099, 0.124, 1.26),
    ("write()", &["write"], 0.082, 0.114, 1.39),
    ("stat()", &["stat"], 0.354, 0.379, 1.07),
    ("open()/close()", &["open_close"], 0.554, 0.586, 1.06),
    (
        "Signal handler install",
        &["sig_install"],
        0.123,
        0.159,
        1.29,
    ),
    ("Signal handler catch", &["sig_catch"], 0.770, 0.881, 1.14),
    (
        "Context switch (2 procs)",
        &["ctx_switch_2cores", "ctx_switch_1core"],
        1.37,
        3.42,
        2.50,
    ),
    (
        "Pipe latency",
        &["pipe_2cores", "pipe_1core"],
        3.24,
        7.06,
        2.18,
    ),
    (
        "AF_UNIX stream latency",
        &["unix_2cores", "unix_1core"],
        4.81,
        7.48,
        1.55,
    ),
    ("fork + exit", &["fork_exit"], 115.0, 123.0, 1.07),
    ("fork + /bin/sh", &["fork_sh"], 730.0, 761.0, 1.04),
];

/// A hot path's bare-host figure: (median, min, max).
pub fn host_value(doc: &Results, name: &str) -> Option<(f64, f64, f64)> {
    let r = doc
        .host
        .as_ref()?
        .rows
        .as_ref()?
        .iter()
        .find(|r| r.name == name)?;
    Some((r.median, r.spread[0], r.spread[1]))
}

/// (policy, value) for a guest benchmark, per measured policy.
pub fn guest_values(doc: &Results, name: &str) -> Vec<(String, f64)> {
    doc.guest
        .iter()
        .flat_map(|g| g.policies.iter().flatten())
        .filter_map(|p| {
            let r = p.rows.iter().find(|r| r.name == name)?;
            Some((p.policy.clone(), r.median))
        })
        .collect()
}

/// The bare-host twin row (index into `submit.host`) a guest row is measured against.
pub fn twin_index(doorbell: &str, completion: &str) -> usize {
    match (doorbell, completion) {
        ("mapped", "poll") => 0,
        ("mapped", _) => 1,
        (_, "poll") => 3,
        _ => 4,
    }
}
