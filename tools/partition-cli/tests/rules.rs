//! The tests' own rules, tested: what a test allows itself on one platform and refuses on
//! another (the doubled-interrupt allowance), and how `scripts/rig-suite.sh` judges what a
//! test binary printed inside the rig (a failure or a skip that no rerun removes, a death
//! that may be rerun, a silent hang that fails). Each from made-up inputs: no guest, no
//! rig.

mod common;

use common::*;

/// The doubled-interrupt allowance holds under QEMU TCG only: on a made-up KVM guest's
/// CPU or bare metal, a doubled count fails the test.
#[test]
fn a_doubled_interrupt_is_refused_anywhere_but_under_tcg() {
    let sig = |hypervisor, vendor: &[u8; 12]| CpuSignature {
        hypervisor,
        vendor: *vendor,
    };
    let tcg = sig(true, b"TCGTCGTCGTCG");
    let kvm = sig(true, b"KVMKVMKVM\0\0\0");
    let bare = sig(false, &[0; 12]);
    // TCG's signature without the hypervisor bit is not TCG.
    let forged = sig(false, b"TCGTCGTCGTCG");
    for s in [&tcg, &kvm, &bare, &forged] {
        assert_eq!(allow_doubled(s, "edu", 0, "ctx"), Ok(None), "{s:?}");
    }
    let note = allow_doubled(&tcg, "edu", 2, "took 5, raised 3").unwrap();
    assert!(
        note.as_deref()
            .is_some_and(|n| n.starts_with("NOTE edu: QEMU TCG delivered 2")),
        "{note:?}"
    );
    for s in [&kvm, &bare, &forged] {
        let e = allow_doubled(s, "edu", 1, "took 4, raised 3").unwrap_err();
        assert!(
            e.contains("1 interrupt(s) taken more often than raised: took 4, raised 3"),
            "{e}"
        );
    }
}
