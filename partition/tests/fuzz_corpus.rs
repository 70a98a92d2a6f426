//! The fuzz targets' committed corpus (`fuzz/seeds/<target>/`, made by `scripts/fuzz.sh`)
//! replayed through the same functions the fuzzer runs: an input that once found a bug
//! stays a test.

fn replay(target: &str, f: fn(&[u8])) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
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
fn plan_corpus() {
    replay("plan", partition::fuzzing::plan);
}

#[test]
fn ledger_corpus() {
    replay("ledger", partition::fuzzing::ledger);
}
