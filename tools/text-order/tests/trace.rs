//! Traces the tool's own self-test: the functions run by the process, its thread and its
//! forked child are recorded, one never called is not, the exit status comes through, and
//! the script names them.

use std::path::Path;
use std::process::{Command, Output};

/// `text-order trace --out HITS -- text-order selftest`.
fn trace_selftest(me: &str, hits: &Path) -> Output {
    Command::new(me)
        .args(["trace", "--out"])
        .arg(hits)
        .args(["--", me, "selftest"])
        .output()
        .unwrap()
}

#[test]
fn a_trace_sees_the_process_its_thread_and_its_child_and_nothing_else() {
    let me = env!("CARGO_BIN_EXE_text-order");
    let dir = std::env::temp_dir().join(format!("text-order-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hits = dir.join("hits");
    let out = trace_selftest(me, &hits);
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(2) && err.contains("PTRACE") {
        // ptrace refused (a container without CAP_SYS_PTRACE, Yama scope 3): say so.
        eprintln!("SKIP: ptrace is not allowed here: {err}");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    assert_eq!(out.status.code(), Some(7), "{err}");
    let names = std::fs::read_to_string(&hits).unwrap();
    for f in [
        "selftest_called",
        "selftest_in_thread",
        "selftest_in_child",
        "main",
    ] {
        assert!(
            names.lines().any(|l| l.contains(f)),
            "{f} not in the trace:\n{err}"
        );
    }
    assert!(!names.contains("selftest_never_called"), "{names}");
    let called = names
        .lines()
        .position(|l| l.contains("selftest_called"))
        .unwrap();
    let child = names
        .lines()
        .position(|l| l.contains("selftest_in_child"))
        .unwrap();
    assert!(called < child, "first-run order kept");

    // A second trace adds nothing new and keeps the order.
    let again = trace_selftest(me, &hits);
    assert_eq!(again.status.code(), Some(7));
    assert_eq!(std::fs::read_to_string(&hits).unwrap(), names);

    let script = dir.join("order.ld");
    let s = Command::new(me)
        .args(["script", "--hits"])
        .arg(&hits)
        .arg("--out")
        .arg(&script)
        .output()
        .unwrap();
    assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    let text = std::fs::read_to_string(&script).unwrap();
    assert!(text.contains("selftest_in_child"), "{text}");
    assert!(text.contains("INSERT BEFORE .text;"));

    // Bad input: a clear error, status 2.
    let bad = Command::new(me)
        .args(["trace", "--out"])
        .arg(dir.join("x"))
        .args(["--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("/nonexistent/program"));
    std::fs::remove_dir_all(&dir).unwrap();
}
