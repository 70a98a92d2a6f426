//! Every fuzz target's committed corpus (`<crate>/fuzz/seeds/<target>/`, made by
//! `scripts/fuzz.sh`) replayed through the same functions the fuzzer runs: an input that
//! once found a bug stays a test. (Here because this crate sees all three: devices, boot and
//! its own.)

use std::path::Path;

fn replay(krate: &str, target: &str, f: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("fuzz/seeds")
        .join(target);
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        f(&std::fs::read(&p).unwrap());
        n += 1;
    }
    assert!(n > 0, "no inputs in {}", dir.display());
    println!("NOTE {target}: {n} corpus inputs replayed");
}

#[test]
fn virtqueue_corpus() {
    replay("devices", "virtqueue", devices::fuzzing::virtqueue);
}

#[test]
fn mmio_corpus() {
    replay("devices", "mmio", devices::fuzzing::mmio);
}

#[test]
fn virtio_pci_corpus() {
    replay("devices", "virtio_pci", devices::fuzzing::virtio_pci);
}

#[test]
fn kernel_corpus() {
    replay("boot", "kernel", boot::fuzzing::kernel);
}

#[test]
fn plan_corpus() {
    replay("partition", "plan", partition::fuzzing::plan);
}

#[test]
fn ledger_corpus() {
    replay("partition", "ledger", partition::fuzzing::ledger);
}
