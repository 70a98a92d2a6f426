//! Which reservation holds a core, host-wide: whatever state directory a reservation keeps
//! its ledger in, it claims each of its cores in [`CORE_CLAIMS`] (one file per core naming
//! the state directory). A claim is live while the ledger it names still reserves the
//! core. A reservation's give-back asks here which cores other live reservations hold, so
//! that it never puts an IRQ or a cpuset back onto them.

use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use crate::host::ledger::LedgerLock;

/// Where reservations claim their cores for the whole host, whatever state directory they
/// keep their ledger in: one file per core (`core-N`) naming the state directory that holds
/// it. Under /run, so a reboot (which ends every reservation) clears it.
pub const CORE_CLAIMS: &str = "/run/partition-cores";

/// Errors claiming cores.
#[derive(Debug, thiserror::Error)]
pub enum ClaimsError {
    /// A core another state directory's reservation holds.
    #[error(
        "core {core} is reserved already, by the reservation in {} (one host, one \
         reservation per core: `partition unreserve --state-dir {}` first, or reserve other \
         cores)",
        by.display(),
        by.display()
    )]
    CoreTaken {
        /// The core.
        core: usize,
        /// The state directory whose ledger holds it.
        by: PathBuf,
    },
    /// A filesystem operation failed.
    #[error("{path}: {what}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Operation.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// Whether the ledger in `state_dir` reserves `core` (a claim naming a state directory
/// that no longer does is stale).
fn holds(state_dir: &Path, core: usize) -> bool {
    let Ok(bytes) = crate::sys::files::read_limited(&state_dir.join("ledger.json"), 1 << 20) else {
        return false;
    };
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| {
            v["cores"]["reserved"]
                .as_array()
                .map(|a| a.iter().any(|c| c.as_u64() == Some(core as u64)))
        })
        .unwrap_or(false)
}

/// The state directory whose reservation holds `core` host-wide, if any: the claim in
/// `claims` ([`CORE_CLAIMS`]) naming one whose ledger still reserves it (a stale claim names
/// nobody).
pub fn core_holder(claims: &Path, core: usize) -> Option<PathBuf> {
    let f = claims.join(format!("core-{core}"));
    let holder = crate::sys::files::read_limited(&f, 4096).ok()?;
    let by = PathBuf::from(std::ffi::OsString::from_vec(holder));
    holds(&by, core).then_some(by)
}

/// The first of `cores` a live reservation holds host-wide (`claims`, normally
/// [`CORE_CLAIMS`]), and the state directory holding it.
pub fn claimed_by(claims: &Path, cores: &[usize]) -> Option<(usize, PathBuf)> {
    cores
        .iter()
        .find_map(|&c| core_holder(claims, c).map(|by| (c, by)))
}

/// Every core a live reservation other than `us` holds host-wide: what a give-back of
/// `us` must not put an IRQ or a cpuset back onto (a stale or forged ledger of `us` that
/// names another's cores included).
pub fn held_by_others(claims: &Path, us: &Path) -> Vec<usize> {
    let ours = us.as_os_str().as_encoded_bytes();
    let mut cores: Vec<usize> = std::fs::read_dir(claims)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let core: usize = e
                .file_name()
                .to_str()?
                .strip_prefix("core-")?
                .parse()
                .ok()?;
            let holder = crate::sys::files::read_limited(&e.path(), 4096).ok()?;
            if holder == ours {
                return None;
            }
            let by = PathBuf::from(std::ffi::OsString::from_vec(holder));
            holds(&by, core).then_some(core)
        })
        .collect();
    cores.sort_unstable();
    cores
}

/// Claims `cores` for `state_dir` host-wide ([`CORE_CLAIMS`]); each claim file it creates
/// is pushed to `made` as it is made (the caller gives those back if the reserve fails). A
/// core another live reservation holds is refused, naming it.
pub fn claim_cores(
    claims: &Path,
    cores: &[usize],
    state_dir: &Path,
    made: &mut Vec<PathBuf>,
) -> Result<(), ClaimsError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let io = |path: &Path, what| {
        let path = path.to_path_buf();
        move |source| ClaimsError::Io { path, what, source }
    };
    match std::fs::DirBuilder::new().mode(0o700).create(claims) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(claims, "mkdir")(e)),
    }
    let m = std::fs::symlink_metadata(claims).map_err(io(claims, "stat"))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me || m.mode() & 0o022 != 0 {
        return Err(io(claims, "trust")(std::io::Error::other(
            "not a directory this user owns and nobody else may write",
        )));
    }
    let ours = state_dir.as_os_str().as_encoded_bytes();
    for &core in cores {
        let f = claims.join(format!("core-{core}"));
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&f)
            {
                Ok(mut file) => {
                    made.push(f.clone());
                    file.write_all(ours).map_err(io(&f, "write"))?;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read(&f).map_err(io(&f, "read"))?;
                    if holder == ours {
                        break;
                    }
                    let by = PathBuf::from(std::ffi::OsString::from_vec(holder));
                    if holds(&by, core) {
                        return Err(ClaimsError::CoreTaken { core, by });
                    }
                    // Stale: its reservation is gone.
                    std::fs::remove_file(&f).map_err(io(&f, "remove a stale claim"))?;
                }
                Err(e) => return Err(io(&f, "create")(e)),
            }
        }
    }
    Ok(())
}

/// The state directory as claims name it: its canonical path.
pub fn identity(lock: &LedgerLock) -> PathBuf {
    std::fs::canonicalize(lock.dir()).unwrap_or_else(|_| lock.dir().to_path_buf())
}

/// Gives back the host-wide claims of `cores` that `state_dir` holds.
pub fn release_cores(claims: &Path, cores: &[usize], state_dir: &Path) {
    let ours = state_dir.as_os_str().as_encoded_bytes();
    for core in cores {
        let f = claims.join(format!("core-{core}"));
        if std::fs::read(&f).is_ok_and(|h| h == ours) {
            let _ = std::fs::remove_file(&f);
        }
    }
    let _ = std::fs::remove_dir(claims);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_is_claimed_by_one_reservation_on_the_host() {
        let d = std::env::temp_dir().join(format!("claims-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let (claims, a, b) = (d.join("claims"), d.join("a"), d.join("b"));
        for s in [&a, &b] {
            std::fs::create_dir_all(s).unwrap();
        }
        let ledger = |dir: &Path, cores: &str| {
            std::fs::write(
                dir.join("ledger.json"),
                format!(r#"{{"cores":{{"reserved":{cores}}}}}"#),
            )
            .unwrap()
        };
        let mut made = Vec::new();
        claim_cores(&claims, &[1, 2], &a, &mut made).unwrap();
        assert_eq!(made.len(), 2);
        ledger(&a, "[1,2]");
        // B asks for core 2: refused, naming A.
        let mut made = Vec::new();
        match claim_cores(&claims, &[3, 2], &b, &mut made) {
            Err(ClaimsError::CoreTaken { core, by }) => assert_eq!((core, by), (2, a.clone())),
            r => panic!("{r:?}"),
        }
        // What B had claimed before the refusal (core 3) is in `made`, for its undo.
        assert_eq!(made, vec![claims.join("core-3")]);
        std::fs::remove_file(&made[0]).unwrap();
        // A again (the same plan) makes nothing new; A's reservation gone from its ledger:
        // stale.
        let mut made = Vec::new();
        claim_cores(&claims, &[1, 2], &a, &mut made).unwrap();
        assert!(made.is_empty());
        ledger(&a, "[1]");
        claim_cores(&claims, &[2], &b, &mut made).unwrap();
        assert_eq!(
            std::fs::read(claims.join("core-2")).unwrap(),
            b.as_os_str().as_encoded_bytes()
        );
        // Who holds what, as an ad hoc launch asks: B core 2, A core 1, nobody core 3; and a
        // launch outside the reservation on a held core is refused naming the holder.
        // (B's ledger not yet written: its claim names nobody.)
        assert_eq!(core_holder(&claims, 2), None);
        assert!(held_by_others(&claims, &a).is_empty());
        ledger(&b, "[2]");
        assert_eq!(core_holder(&claims, 2), Some(b.clone()));
        assert_eq!(core_holder(&claims, 1), Some(a.clone()));
        assert_eq!(core_holder(&claims, 3), None);
        assert_eq!(claimed_by(&claims, &[3, 1]), Some((1, a.clone())));
        assert_eq!(claimed_by(&claims, &[3]), None);
        // What each must keep off in its give-back: the other's cores, never its own.
        assert_eq!(held_by_others(&claims, &a), vec![2]);
        assert_eq!(held_by_others(&claims, &b), vec![1]);
        // A third directory holding a copy of B's ledger holds nothing: B's core stays B's.
        let c = d.join("c");
        std::fs::create_dir_all(&c).unwrap();
        ledger(&c, "[2]");
        assert_eq!(held_by_others(&claims, &c), vec![1, 2]);
        // Released by their holders only.
        release_cores(&claims, &[1, 2], &b);
        assert!(claims.join("core-1").exists() && !claims.join("core-2").exists());
        release_cores(&claims, &[1], &a);
        assert!(!claims.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
