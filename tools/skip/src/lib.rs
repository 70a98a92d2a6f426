//! The one skip rule of every test in the workspace, unit and end-to-end, on both
//! platforms (this host and the rig, docs/testing.md).
//!
//! A test that cannot run where it is (no root, no second core, no hugepages, no IOMMU)
//! calls [`skip`] with its name and the reason. The line printed is `SKIPPED <test>: <why>`,
//! which `cargo test --show-output` shows and `scripts/rig-suite.sh` counts. But where the
//! platform exists to run that test, its scripts name it in [`MUST_RUN_ENV`]
//! (`scripts/test.sh` for this host, `scripts/rig-suite.sh` inside the rig), and then the
//! same call fails the test instead: a missing prerequisite there is a failure, never a
//! pass.
//!
//! A test also calls [`skip`] when it checks less than it would elsewhere (a check this
//! platform cannot make); the check's name then goes in the test name after a `/`
//! (`vfio::polled_reads/kvm_counts`), so that a platform can require the check by that
//! name.

/// Environment variable listing, comma-separated, the tests that must run on this
/// platform. An entry names a test (`pool::a_reservation_takes_its_cores`), a test binary or
/// module (`cri`, `pod`), or a check within a test (`vfio::polled_reads/kvm_counts`); an
/// entry matches every test name it is a `::`- or `/`-separated prefix of.
pub const MUST_RUN_ENV: &str = "PARTITION_MUST_RUN";

/// Whether `must` (the value of [`MUST_RUN_ENV`]) names `test`.
pub fn required(must: &str, test: &str) -> bool {
    must.split(',').map(str::trim).any(|m| {
        !m.is_empty()
            && test.strip_prefix(m).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with("::") || rest.starts_with('/')
            })
    })
}

/// Says that `test` is SKIPPED here and why, or fails it (panics) if this platform must
/// run it ([`MUST_RUN_ENV`]). Callers return after it.
pub fn skip(test: &str, why: &str) {
    let must = std::env::var(MUST_RUN_ENV).unwrap_or_default();
    if required(&must, test) {
        panic!("{test} must run on this platform ({MUST_RUN_ENV}={must}), but: {why}");
    }
    println!("SKIPPED {test}: {why}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_names_a_test_its_binary_or_a_check() {
        let must = "cri,pool::a_reservation,vfio::polled/kvm_counts";
        assert!(required(must, "cri"));
        assert!(required(must, "cri::a_pod_runs"));
        assert!(required(must, "pool::a_reservation"));
        assert!(required(must, "pool::a_reservation/irqs"));
        assert!(!required(must, "pool::a_reservation_takes"));
        assert!(!required(must, "criminal::x"));
        assert!(required(must, "vfio::polled/kvm_counts"));
        assert!(!required(must, "vfio::polled"));
        assert!(!required("", "cri"));
        assert!(!required(" , ", "cri"));
    }

    #[test]
    #[should_panic(expected = "must run on this platform")]
    fn a_required_test_fails_instead_of_skipping() {
        // SAFETY: the only other test of this crate never reads the environment.
        unsafe { std::env::set_var(MUST_RUN_ENV, "skip::self_test") };
        skip("skip::self_test::required", "nothing here");
    }
}
