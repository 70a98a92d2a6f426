//! The bodies of the fuzz targets in `partition/fuzz` (run with `scripts/fuzz.sh`), kept
//! here so that `cargo test` replays the committed corpus through exactly the same code
//! (`partition/tests/fuzz_corpus.rs`). Host plans come from whoever edits /etc; a ledger may have
//! been forged in a state directory (docs/security.md): both parsers and every check on
//! what they describe may refuse the input, never panic.

use std::path::Path;

use crate::host::ledger::Ledger;
use crate::host::plan::HostPlan;

/// A host plan file.
pub fn plan(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = HostPlan::from_toml(text, Path::new("fuzz.toml"), &[0, 1, 2, 3]);
    }
}

/// A ledger file: parsed, then every check `load` makes, and the free-space view.
pub fn ledger(data: &[u8]) {
    let Ok(l) = serde_json::from_slice::<Ledger>(data) else {
        return;
    };
    let _ = l.check();
    let _ = l.check_paths(Path::new("/run/partition"));
    if let Ok(a) = l.allocator() {
        let _ = (a.free_bytes(), a.free_extents().len());
    }
    let _ = l.assigned_cores();
    for p in &l.partitions {
        let _ = l.partition(&p.name);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_targets_refuse_garbage_quietly() {
        for d in [
            &b""[..],
            b"{",
            b"memory = 1",
            b"\xff\xfe",
            b"[]",
            b"{\"version\":1}",
        ] {
            super::plan(d);
            super::ledger(d);
        }
        let l = crate::host::ledger::tests::sample();
        super::ledger(serde_json::to_string(&l).unwrap().as_bytes());
        super::plan(b"memory = \"64M\"\ncores = \"1\"\n");
    }
}
