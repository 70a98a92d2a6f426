//! The results file: `benchmarks/results/<host>.json`, one object per section.
//!
//! Every section has `completed`. A failed or partial run never replaces a completed
//! section: the earlier result stays and gains a `kept_earlier_result_for` note describing
//! the attempt. A results file that does not parse is never overwritten.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// Errors reading or writing the results file.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// The existing file does not parse: it is left alone.
    #[error(
        "{path} does not parse ({reason}); it was left untouched and the new section written to {aside}"
    )]
    Unparsable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
        /// Where the new section went instead.
        aside: PathBuf,
    },
    /// A section without a boolean `completed`.
    #[error("section {0} has no boolean `completed`")]
    NoCompleted(String),
    /// The file or its directory could not be reached or written (by descriptor:
    /// `crate::outdir`, `partition::sys::files`).
    #[error("{0}")]
    Place(String),
}

/// What happened to a section on [`store_section`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Written.
    Written,
    /// The new run was incomplete and an earlier completed result was kept.
    KeptEarlier,
}

/// Merges `section` into the results file at `path` under `name`.
pub fn store_section(path: &Path, name: &str, section: Value) -> Result<Stored, ResultsError> {
    let completed = section
        .get("completed")
        .and_then(Value::as_bool)
        .ok_or_else(|| ResultsError::NoCompleted(name.to_string()))?;
    // The directory walked to (and made) once by descriptor; the file read through the
    // same walk's rules, and replaced by a temporary renamed over it (never written
    // through a link planted there).
    let dir = crate::outdir::OutDir::of(path).map_err(ResultsError::Place)?;
    let name_of = |p: &Path| p.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    let read = partition::sys::files::read_limited(path, crate::doc::MAX_RESULTS);
    let mut doc = match read {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) if v.is_object() => v,
            parsed => {
                let aside = path.with_extension(format!("{name}.json.new"));
                let reason = parsed
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| "not a JSON object".into());
                dir.replace(
                    &name_of(&aside),
                    serde_json::to_string_pretty(&section)
                        .unwrap_or_default()
                        .as_bytes(),
                )
                .map_err(ResultsError::Place)?;
                return Err(ResultsError::Unparsable {
                    path: path.to_path_buf(),
                    reason,
                    aside,
                });
            }
        },
        Err(e) if e.io().map(std::io::Error::kind) == Some(std::io::ErrorKind::NotFound) => {
            json!({ "sections": {} })
        }
        Err(e) => return Err(ResultsError::Place(format!("{}: {e}", path.display()))),
    };
    if !doc.get("sections").is_some_and(Value::is_object) {
        doc["sections"] = json!({});
    }
    let earlier_completed = doc["sections"]
        .get(name)
        .and_then(|s| s.get("completed"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let stored = if !completed && earlier_completed {
        doc["sections"][name]["kept_earlier_result_for"] = json!({
            "attempted_at": section.get("finished_at").cloned().unwrap_or(Value::Null),
            "reason": section.get("reason").cloned().unwrap_or(Value::Null),
            "note": "this attempt did not complete; the earlier completed result above was kept",
        });
        Stored::KeptEarlier
    } else {
        doc["sections"][name] = section;
        Stored::Written
    };
    let text = serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n";
    dir.replace(&name_of(path), text.as_bytes())
        .map_err(ResultsError::Place)?;
    Ok(stored)
}

/// The results file for this host: `<repo>/benchmarks/results/<hostname>.json`.
pub fn default_path(repo: &Path) -> PathBuf {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    repo.join("benchmarks/results").join(format!("{host}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    use vmm_sys_util::tempdir::TempDir;

    /// A results file in a fresh directory that is removed when the test
    /// ends, passed or failed.
    fn tmp(name: &str) -> (TempDir, PathBuf) {
        let d = TempDir::new_with_prefix(std::env::temp_dir().join(format!("results-{name}-")))
            .unwrap();
        let p = d.as_path().join("host.json");
        (d, p)
    }

    #[test]
    fn failed_runs_never_replace_completed_ones() {
        let (_dir, p) = tmp("keep");
        let good = json!({"completed": true, "value": 1});
        assert_eq!(
            store_section(&p, "a", good.clone()).unwrap(),
            Stored::Written
        );
        let bad = json!({"completed": false, "reason": "guest died", "finished_at": "t"});
        assert_eq!(store_section(&p, "a", bad).unwrap(), Stored::KeptEarlier);
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(doc["sections"]["a"]["value"], 1);
        assert_eq!(
            doc["sections"]["a"]["kept_earlier_result_for"]["reason"],
            "guest died"
        );
        // A completed run replaces, and drops the note.
        store_section(&p, "a", json!({"completed": true, "value": 2})).unwrap();
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(doc["sections"]["a"]["value"], 2);
        assert!(
            doc["sections"]["a"]
                .get("kept_earlier_result_for")
                .is_none()
        );
        // An incomplete run with nothing earlier is written as is (it says why).
        store_section(&p, "b", json!({"completed": false, "reason": "no qemu"})).unwrap();
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(doc["sections"]["b"]["reason"], "no qemu");
        assert_eq!(doc["sections"]["a"]["value"], 2);
    }

    #[test]
    fn unparsable_files_are_left_alone() {
        let (_dir, p) = tmp("garbage");
        std::fs::write(&p, "{ not json").unwrap();
        let e = store_section(&p, "a", json!({"completed": true})).unwrap_err();
        assert!(matches!(e, ResultsError::Unparsable { .. }));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{ not json");
        assert!(matches!(
            store_section(&p, "a", json!({"value": 1})),
            Err(ResultsError::NoCompleted(_))
        ));
    }
}
