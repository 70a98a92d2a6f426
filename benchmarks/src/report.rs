//! The report a person reads: `benchmarks/results/<host>.md` with the guest/host ratio
//! table beside the seeds' published ratios, the probe's paths and memory staircase, the
//! other sections' headlines and the cross-checks; and `<host>-ratios.svg`, the ratios
//! and the pictures beside it (`crate::figures`). Both are made from the results file alone, after every
//! `partition bench` (or by `partition bench --report`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::doc::blk::{BlkSection, GuestRow, Peers};
use crate::doc::compare::CompareSection;
use crate::doc::crosscheck::CrossRow;
use crate::doc::memsetup::MemSetupSection;
use crate::doc::probe::{PathsRun, Peer, ProbeSection};
use crate::doc::submit::SubmitSection;
use crate::doc::submit_vfio::SubmitVfioSection;
use crate::doc::wake::{PolicyRow, WakeHost, WakeMetric, WakeSection};
use crate::doc::{Results, SECTIONS};
use crate::head::Cell;
use crate::lookup::{SEED, guest_values, host_value, twin_index};
use crate::stats::Summary;

mod exits;
mod peers;
mod submit;
mod wake;
use exits::exits;
use peers::{blk, memsetup, peer_builds};
use submit::{cell_us, submit_rows, submit_vfio_rows};
use wake::{noise, wake};

/// Where the report and chart of a results file go.
pub fn paths(results: &Path) -> (PathBuf, PathBuf) {
    let stem = results
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "results".into());
    (
        results.with_file_name(format!("{stem}.md")),
        results.with_file_name(format!("{stem}-ratios.svg")),
    )
}

fn fmt_us(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn status(doc: &Results, s: &str) -> String {
    if let Some((_, why)) = doc.unreadable.iter().find(|(n, _)| n == s) {
        return format!("**does not read**: {why}");
    }
    let Some(h) = doc.head(s) else {
        return "not run".into();
    };
    let limitation = match s {
        "guest" => doc.guest.as_ref().is_some_and(|g| g.host_limitation),
        "submit-vfio" => doc.submit_vfio.as_ref().is_some_and(|v| v.host_limitation),
        _ => false,
    };
    if h.completed {
        return format!(
            "completed {}{}",
            h.finished_at.as_deref().unwrap_or(""),
            if limitation {
                " (host limitation: see below)"
            } else {
                ""
            }
        );
    }
    let impossible = match s {
        "guest" => limitation && doc.guest.as_ref().is_some_and(|g| g.limitation.is_none()),
        _ => limitation,
    };
    format!(
        "{}: {}",
        if impossible {
            "**not possible on this host**"
        } else {
            "**not complete**"
        },
        h.reason.as_deref().unwrap_or("no reason recorded")
    )
}

/// A fact from the provenance as the report prints it ("?" when not recorded).
fn fact(v: &Option<Value>) -> String {
    v.as_ref()
        .map_or("?".into(), |v| v.to_string().trim_matches('"').to_string())
}

/// `v` with `prec` decimals, "—" when not measured.
fn num(v: Option<f64>, prec: usize) -> String {
    v.map_or("—".into(), |v| format!("{v:.prec$}"))
}

/// The Markdown report.
pub fn markdown(doc: &Results, host: &str, svg_name: &str) -> String {
    let mut o = String::new();
    let facts = doc.host_facts();
    let _ = writeln!(o, "# Benchmark report: {host}\n");
    let _ = writeln!(
        o,
        "Made by `partition bench` from `{host}.json` (every number below is in it, with its \
         runs and provenance); regenerate with `partition bench --report`. Method: \
         `docs/benchmarks.md`.\n"
    );
    let _ = writeln!(
        o,
        "Host: {} ({} MHz TSC) · kernel {} · KVM module {} · itself a guest: {} · commit {}{}\n",
        fact(&facts.cpu_model),
        fact(&facts.tsc_mhz),
        fact(&facts.kernel),
        fact(&facts.kvm.vendor_module),
        fact(&facts.kvm.host_is_a_guest),
        fact(&facts.commit),
        if facts.commit_dirty {
            " (with uncommitted changes)"
        } else {
            ""
        },
    );
    let _ = writeln!(o, "| section | state |\n|---|---|");
    for k in SECTIONS {
        let _ = writeln!(o, "| {k} | {} |", status(doc, k).replace('|', "/"));
    }
    for (name, why) in doc
        .unreadable
        .iter()
        .filter(|(n, _)| !SECTIONS.contains(&n.as_str()))
    {
        let _ = writeln!(o, "| {name} | {} |", why.replace('|', "/"));
    }
    hot_paths(&mut o, doc);
    if let Some(p) = &doc.probe {
        probe(&mut o, p);
    }
    if let Some(w) = &doc.wake {
        wake(&mut o, w);
    }
    if let Some(n) = &doc.noise {
        noise(&mut o, n);
    }
    if let Some(b) = &doc.blk {
        blk(&mut o, b);
    }
    if let Some(sub) = &doc.submit {
        submit_rows(&mut o, sub);
    }
    if let Some(v) = &doc.submit_vfio {
        submit_vfio_rows(&mut o, v);
    }
    if let Some(e) = &doc.exits {
        exits(&mut o, e);
    }
    if let Some(m) = &doc.memsetup {
        memsetup(&mut o, m);
    }
    for (section, title) in [
        (&doc.sandbox, "What confinement costs (`sandbox`)"),
        (&doc.builds, "This build against a baseline (`builds`)"),
    ] {
        if let Some(c) = section {
            compare(&mut o, c, title);
        }
    }
    if let Some(rows) = doc.crosscheck.as_ref().and_then(|c| c.rows.as_ref()) {
        crosscheck(&mut o, rows);
    }
    let _ = writeln!(o, "\n## Chart\n\n![ratios]({svg_name})");
    o
}

/// The headline table: the guest against the bare host per idle policy, beside seed 000.
fn hot_paths(o: &mut String, doc: &Results) {
    // Only policies with measurements get columns.
    let policies: Vec<&str> = doc
        .guest
        .iter()
        .flat_map(|g| g.policies.iter().flatten())
        .filter(|p| !p.rows.is_empty())
        .map(|p| p.policy.as_str())
        .collect();
    let _ = writeln!(
        o,
        "\n## Hot paths: the guest against the bare host, beside the seed\n"
    );
    if doc.completed("guest") != Some(true) {
        let _ = writeln!(
            o,
            "The guest columns are empty: {}\n",
            doc.guest
                .as_ref()
                .and_then(|g| g.head.reason.as_deref())
                .unwrap_or("the guest section has not been run")
        );
    }
    if let Some(l) = doc.guest.as_ref().and_then(|g| g.limitation.as_deref()) {
        let _ = writeln!(o, "**Host limitation:** {l}\n");
    }
    let _ = write!(
        o,
        "| path | seed native | seed KVM | seed KVM/native | host (µs) |"
    );
    for p in &policies {
        let _ = write!(o, " guest `{p}` | guest/host `{p}` |");
    }
    let _ = writeln!(o);
    let _ = write!(o, "|---|---|---|---|---|");
    for _ in &policies {
        let _ = write!(o, "---|---|");
    }
    let _ = writeln!(o);
    for (row, names, nat, kvm, ratio) in SEED {
        for name in names.iter() {
            let label = if names.len() > 1 {
                format!(
                    "{row} ({})",
                    if name.ends_with("2cores") {
                        "two cores"
                    } else {
                        "one core"
                    }
                )
            } else {
                row.to_string()
            };
            let h = host_value(doc, name);
            let _ = write!(
                o,
                "| {label} | {nat} | {kvm} | {ratio:.2}x | {} |",
                h.map_or("—".into(), |(m, a, b)| format!(
                    "{} ({}-{})",
                    fmt_us(m),
                    fmt_us(a),
                    fmt_us(b)
                ))
            );
            let g = guest_values(doc, name);
            for p in &policies {
                let v = g.iter().find(|x| x.0 == *p).map(|x| x.1);
                let r = v.zip(h).map(|(v, h)| v / h.0);
                let _ = write!(
                    o,
                    " {} | {} |",
                    v.map_or("—".into(), fmt_us),
                    r.map_or("—".into(), |r| format!("{r:.2}x"))
                );
            }
            let _ = writeln!(o);
        }
    }
    let _ = writeln!(
        o,
        "\nSeed 000 ran lmbench in a 2-vCPU guest without pinning its processes; two-process \
         rows are shown with the partner on the other core (as a 2-vCPU guest mostly runs them) \
         and on the same core (a pure context switch)."
    );
}

/// The memory staircase and the VMM's own exit paths.
fn probe(o: &mut String, p: &ProbeSection) {
    if let Some(st) = p.mem_lat.as_ref().filter(|a| !a.is_empty()) {
        let _ = writeln!(
            o,
            "\n## Memory latency: the probe guest against the host, the same chase\n\n\
             Seed 000 found parity (1.3 ns in L1 to 32 ns in DRAM on both sides).\n\n\
             | working set | host ns | probe guest ns | guest/host |\n|---|---|---|---|"
        );
        for r in st {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} |",
                partition::config::size::format(r.bytes),
                num(r.host_ns, 2),
                num(r.guest_ns, 2),
                r.guest_over_host.map_or("—".into(), |v| format!("{v:.2}x"))
            );
        }
    }
    let _ = writeln!(
        o,
        "\n## The VMM's own paths (probe guest, ns per call)\n\n| path | ours | ours `--no-ioeventfd` | QEMU microvm |\n|---|---|---|---|"
    );
    let qemu = match &p.qemu {
        Some(Peer::Ran(r)) => Some(r),
        _ => None,
    };
    let runs = [p.ours.as_ref(), p.ours_no_ioeventfd.as_ref(), qemu];
    fn path<'a>(run: Option<&'a PathsRun>, t: &str) -> Option<&'a Cell> {
        run.and_then(|r| r.paths_ns.get(t))
    }
    for t in [
        "cpuid",
        "service",
        "pio_in",
        "pio_in_service",
        "mmio_read",
        "mmio_doorbell",
    ] {
        if runs.iter().all(|r| path(*r, t).is_none()) {
            continue;
        }
        let v = |r: Option<&PathsRun>| num(path(r, t).map(|c| c.median_ns), 0);
        let _ = writeln!(
            o,
            "| {t} | {} | {} | {} |",
            v(runs[0]),
            v(runs[1]),
            v(runs[2])
        );
    }
    let pe = |r: Option<&PathsRun>| num(r.and_then(|r| r.pio_exit_ns), 0);
    let _ = writeln!(
        o,
        "| port I/O exit (derived) | {} | {} | {} |",
        pe(runs[0]),
        pe(runs[1]),
        pe(runs[2])
    );
}

/// What a table row adds after its last cell for the runs that failed (nothing if none).
fn failed_cell(failures: &[String]) -> String {
    if failures.is_empty() {
        String::new()
    } else {
        format!(" failed: {}", failures.join("; ").replace('|', "/"))
    }
}

/// Two variants of the same paths (benchmarks/src/compare.rs).
fn compare(o: &mut String, c: &CompareSection, title: &str) {
    if c.variants.is_empty() || c.verdicts.is_empty() {
        return;
    }
    let name = |i: usize| c.variants.get(i).map_or("?", |x| x.name.as_str());
    let _ = writeln!(
        o,
        "\n## {title}\n\n{}\n\n| path | {} (µs) | {} (µs) | second/first | second slower beyond the spread |\n|---|---|---|---|---|",
        c.question.as_deref().unwrap_or(""),
        name(0),
        name(1)
    );
    for r in &c.verdicts {
        let cell = |i: usize| {
            cell_us(
                c.variants
                    .get(i)
                    .and_then(|v| v.paths.get(&r.path))
                    .copied()
                    .flatten(),
            )
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |",
            r.path,
            cell(0),
            cell(1),
            num(r.second_over_first, 2),
            match r.second_slower_beyond_spread {
                Some(true) => "**yes**",
                Some(false) => "no",
                None => "—",
            }
        );
    }
}

/// Our bare-host figures against independent tools.
fn crosscheck(o: &mut String, rows: &[CrossRow]) {
    let _ = writeln!(
        o,
        "\n## Cross-checks: our bare-host figures against independent tools, same session\n\n| figure | unit | ours | theirs (tool) | ours/theirs | within 20% |\n|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} ({}) | {} | {} |",
            r.row,
            r.unit,
            num(r.ours_median, 3),
            num(r.theirs_median, 3),
            r.theirs,
            num(r.ours_over_theirs, 2),
            match r.within_20_percent {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            }
        );
    }
}

/// Writes the report and the chart for `results`.
pub fn write(results: &Path) -> Result<(PathBuf, PathBuf), String> {
    write_from(&Results::read(results)?, results)
}

/// [`write`] from results already read from `results`.
pub fn write_from(doc: &Results, results: &Path) -> Result<(PathBuf, PathBuf), String> {
    let (md, svg) = paths(results);
    let host = results
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let svg_name = svg
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let pictures = crate::figures::write(doc, results, &host)?;
    let mut text = markdown(doc, &host, &svg_name);
    for p in pictures.iter().skip(1) {
        let name = p
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        text.push_str(&format!("\n![{name}]({name})\n"));
    }
    let dir = crate::outdir::OutDir::of(&md)?;
    dir.replace(md.file_name().unwrap_or_default(), text.as_bytes())?;
    Ok((md, svg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The committed vm.json with `patch` laid over its sections: a fixture in the file's
    /// real shape (every patched section must still read as its type).
    fn doc_with(patch: impl FnOnce(&mut Value)) -> Results {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/vm.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        patch(&mut v["sections"]);
        let doc = Results::from_value(&v);
        assert!(doc.unreadable.is_empty(), "{:?}", doc.unreadable);
        doc
    }

    fn hot(name: &str, median: f64, lo: f64, hi: f64) -> Value {
        json!({"name": name, "unit": "us", "median": median, "spread": [lo, hi], "runs": 3,
               "per_run": [lo, median, hi]})
    }

    fn cell(m: f64) -> Value {
        json!({"median_ns": m, "spread_ns": [m - 100.0, m + 100.0], "runs": 3})
    }

    fn ratios_fixture(s: &mut Value) {
        s["host"]["rows"] = json!([
            hot("null_syscall", 0.2, 0.19, 0.21),
            hot("pipe_2cores", 10.0, 9.0, 11.0)
        ]);
        s["guest"]["completed"] = json!(true);
        s["guest"]["policies"] = json!([{"policy": "hlt", "failures": [], "guest_lines": null,
            "rows": [hot("null_syscall", 0.3, 0.3, 0.3), hot("pipe_2cores", 25.0, 25.0, 25.0)]}]);
        s["probe"]["mem_lat"] = json!([
            {"bytes": 512, "host_ns": 1.2, "guest_ns": 1.3, "guest_over_host": 1.0833},
            {"bytes": 1048576, "host_ns": 14.0, "guest_ns": 15.0, "guest_over_host": 1.07}]);
        s["probe"]["ours"]["paths_ns"]["cpuid"] = cell(2980.0);
        s["crosscheck"]["rows"] = json!([{"row": "null syscall", "ours": "hotpaths",
            "theirs": "lat_syscall null", "unit": "us", "ours_median": 0.19, "theirs_median": 0.2,
            "ours_over_theirs": 0.95, "within_20_percent": true, "runs": [3, 3], "failures": []}]);
    }

    #[test]
    fn the_report_has_the_ratios_and_the_seed_beside_them() {
        let md = markdown(&doc_with(ratios_fixture), "box", "box-ratios.svg");
        assert!(
            md.contains(
                "| Null syscall | 0.07 | 0.099 | 1.42x | 0.200 (0.190-0.210) | 0.300 | 1.50x |"
            ),
            "{md}"
        );
        assert!(md.contains("Pipe latency (two cores)"));
        assert!(md.contains("| 25.00 | 2.50x |"), "{md}");
        assert!(md.contains("| 1 MiB | 14.00 | 15.00 | 1.07x |"));
        assert!(md.contains("| cpuid | 2980 |"));
        assert!(
            md.contains("| null syscall | us | 0.190 | 0.200 (lat_syscall null) | 0.95 | yes |")
        );
        assert!(md.contains("![ratios](box-ratios.svg)"));
        // Every wake peer has its row beside the policies.
        assert!(md.contains("| peer: qemu-cpu-pm | "), "{md}");
        assert!(md.contains("| peer: qemu-default | "), "{md}");
        // A memsetup peer not given says so under the table.
        let d = doc_with(|s| {
            ratios_fixture(s);
            s["memsetup"]["peers"] = json!([{"name": "firecracker", "binary": null,
                "version": null, "note": "firecracker not given (--firecracker PATH, or on PATH): no rows"}]);
        });
        let md = markdown(&d, "box", "x.svg");
        assert!(
            md.contains("firecracker not given (--firecracker PATH, or on PATH): no rows."),
            "{md}"
        );
        // A guest that did not run says why instead of inventing columns.
        let d = doc_with(|s| {
            ratios_fixture(s);
            s["guest"]["completed"] = json!(false);
            s["guest"]["reason"] = json!("no image");
            s["guest"]["policies"] = json!([]);
        });
        let md = markdown(&d, "box", "x.svg");
        assert!(md.contains("The guest columns are empty: no image"), "{md}");
        assert!(!md.contains("guest `hlt`"), "{md}");
        // Two variants of the same paths, with the verdict.
        let d = doc_with(|s| {
            s["sandbox"]["question"] = json!("what does it cost?");
            s["sandbox"]["variants"][0]["name"] = json!("--no-sandbox");
            s["sandbox"]["variants"][0]["paths"] = json!({"doorbell_ioeventfd":
                {"median_ns": 15000.0, "spread_ns": [14000.0, 16000.0], "runs": 3}});
            s["sandbox"]["variants"][1]["name"] = json!("sandboxed");
            s["sandbox"]["variants"][1]["paths"] = json!({"doorbell_ioeventfd":
                {"median_ns": 15500.0, "spread_ns": [15000.0, 17000.0], "runs": 3}});
            s["sandbox"]["verdicts"] = json!([{"path": "doorbell_ioeventfd",
                "second_over_first": 1.0333, "second_slower_beyond_spread": false}]);
        });
        let md = markdown(&d, "box", "x.svg");
        assert!(md.contains("## What confinement costs (`sandbox`)"), "{md}");
        assert!(md.contains("what does it cost?"), "{md}");
        assert!(
            md.contains(
                "| doorbell_ioeventfd | 15.00 (14.00-16.00) | 15.50 (15.00-17.00) | 1.03 | no |"
            ),
            "{md}"
        );
    }

    #[test]
    fn submit_rows_stand_beside_their_twins() {
        let twin = |e: &str, w: &str, m: f64| {
            json!({"engine": e, "waiter": w, "twin_of": "x",
            "submit_to_fence": cell(m), "p99": cell(m * 2.0)})
        };
        let d = doc_with(|s| {
            let sub = &mut s["submit"];
            sub["completed"] = json!(false);
            sub["reason"] = json!("no QEMU rows");
            sub["guest"] = json!([
                {"doorbell": "mapped", "policy": "hlt", "completion": "poll",
                 "submit_to_fence": cell(550.0), "p99": cell(600.0), "trapped_doorbells": 0,
                 "engine_thread_busy": 0.99, "submit_to_fence_timed_doorbell": cell(600.0)},
                {"doorbell": "trap", "policy": "hlt", "completion": "irq",
                 "submit_to_fence": cell(80000.0), "p99": cell(90000.0), "trapped_doorbells": 1100}]);
            let mut mapped_poll = twin("polls page", "polls fence", 500.0);
            mapped_poll["submit_to_fence_timed_doorbell"] = cell(540.0);
            sub["host"] = json!([
                mapped_poll,
                twin("polls page", "eventfd", 5000.0),
                twin("polls page", "futex", 6000.0),
                twin("eventfd", "polls fence", 8000.0),
                twin("eventfd", "eventfd", 10000.0)
            ]);
            sub["goals"] = json!([{"goal": "mapped within 1.1x", "ratio": 1.1, "met": true,
                "note": "best policy hlt: 1.10x"}]);
            sub["qemu"] = json!([{"device": "edu", "path": "write to result",
                "peer_of": "trap/poll", "latency": cell(86000.0), "p99": cell(90000.0)}]);
            sub["not_measured"] = json!(["QEMU peers"]);
        });
        let md = markdown(&d, "box", "x.svg");
        assert!(
            md.contains("| submit | **not complete**: no QEMU rows |"),
            "{md}"
        );
        assert!(
            md.contains("| mapped | hlt | poll | 0.55 (0.45-0.65) | 0.60 | 0 | 99% | engine polls page, driver polls fence | 1.10x |"),
            "{md}"
        );
        assert!(md.contains("| trap | hlt | irq | 80.00 (79.90-80.10) | 90.00 | 1100 | — | engine eventfd, driver eventfd | 8.00x |"), "{md}");
        assert!(
            md.contains("| eventfd | polls fence | x | 8.00 (7.90-8.10) | 16.00 |"),
            "{md}"
        );
        assert!(
            md.contains("- Goal: mapped within 1.1x — met (best policy hlt: 1.10x)"),
            "{md}"
        );
        assert!(md.contains("- Not measured: QEMU peers"), "{md}");
        assert!(
            md.contains("| hlt | 0.55 (0.45-0.65) | 0.60 (0.50-0.70) | 0.50 (0.40-0.60) | 0.54 (0.44-0.64) | 1.10x | 1.11x |"),
            "{md}"
        );
        assert!(
            md.contains("| edu | write to result | trap/poll | 86.00 (85.90-86.10) | 90.00 |"),
            "{md}"
        );
        // The picture groups by doorbell mode, with the twin beside ours.
        let svg = crate::chart::svg(&crate::figures::submit(&d));
        assert!(svg.contains(">doorbell mapped</text>") && svg.contains(">doorbell trap</text>"));
        assert!(svg.contains(">poll completion, --idle hlt</text>"), "{svg}");
        assert!(
            svg.contains(">550 ns</text>") && svg.contains(">500 ns</text>"),
            "{svg}"
        );
    }

    #[test]
    fn the_pool_launch_timeline_shows_each_phase_wall_and_cpu() {
        let doc = doc_with(|s| {
            let rows = s["memsetup"]["rows"].as_array_mut().unwrap();
            for r in rows.iter_mut().filter(|r| r["source"] == "pool") {
                r["runs_timeline_ms"] =
                    json!([["exec", [3.0, 5.0, 4.0]], ["args", [1.0, 1.0, 1.0]]]);
                r["runs_timeline_cpu_ms"] = json!([["exec", [2.0, 2.5, 2.25]]]);
            }
        });
        let md = markdown(&doc, "vm", "vm.svg");
        let sizes = md.matches("| exec | 4.00 / 2.25 |").count();
        assert_eq!(sizes, 1, "{md}");
        // A phase with no CPU figure (a VMM before they were recorded) shows none.
        assert!(md.contains("| args | 1.00 / — |"), "{md}");
        assert!(md.contains("Where the pool launch's time"), "{md}");
    }

    #[test]
    fn goals_not_met_against_the_peers_say_why_with_numbers() {
        let doc = doc_with(|s| {
            let m = &mut s["memsetup"];
            let size = 256u64 << 20;
            for r in m["rows"].as_array_mut().unwrap() {
                let cpu = match r["source"].as_str().unwrap() {
                    "pool" => 6.0,
                    "firecracker-hugepages" => 5.0,
                    _ => continue,
                };
                r["size_bytes"] = json!(size);
                r["vmm_cpu_ms_at_first_byte"] =
                    json!({"median": cpu, "min": cpu, "max": cpu, "n": 1, "p99": cpu});
                r["runs_timeline_cpu_ms"] = json!([
                    ["args", [0.1]],
                    ["exec", [1.0]],
                    ["boot", [0.2]],
                    ["vcpus", [0.5]]
                ]);
            }
            m["against_peers"] = json!([{
                "ours": "pool", "size_bytes": size,
                "fastest_peer": "firecracker-hugepages", "first_byte_over_fastest": 0.5,
                "lowest_cpu_peer": "firecracker-hugepages", "cpu_over_lowest": 1.2,
                "rss_over_firecracker": 0.7, "met": false
            }]);
            let w = &mut s["wake"];
            for (i, p) in w["peers"].as_array_mut().unwrap().iter_mut().enumerate() {
                p["ipi_round_trip"]["median_ns"] = json!(if i == 1 { 90.0 } else { 100.0 });
            }
            for p in w["policies"].as_array_mut().unwrap() {
                if p.get("ipi_round_trip").is_some() {
                    let v = if p["name"] == "shared" { 80.0 } else { 150.0 };
                    p["ipi_round_trip"]["median_ns"] = json!(v);
                }
            }
        });
        let md = markdown(&doc, "vm", "vm.svg");
        let line = md
            .lines()
            .find(|l| l.starts_with("Not met for `pool` at 256 MiB"))
            .unwrap_or_else(|| panic!("{md}"));
        // Only the goal missed, with both sides' figures and the largest phases first.
        assert!(
            line.contains(
                "VMM CPU 6.0 ms against firecracker-hugepages's 5.0 ms (its largest phases, \
                 ms: exec 1.00, vcpus 0.50, boot 0.20, of 4 phases)"
            ),
            "{line}"
        );
        assert!(
            !line.contains("first byte") && !line.contains("resident"),
            "{line}"
        );
        let wake = md
            .lines()
            .find(|l| l.starts_with("Goal, an IPI round trip"))
            .unwrap_or_else(|| panic!("{md}"));
        assert!(wake.contains("(the best: "), "{wake}");
        assert!(
            wake.contains(" 90 ns): met by shared 80; not by "),
            "{wake}"
        );
        assert!(
            wake.contains("hlt 150") && !wake.contains("mwait"),
            "{wake}"
        );
    }

    #[test]
    fn a_section_that_does_not_read_is_named_and_the_rest_reported() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/vm.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        v["sections"]["blk"]["params"] = json!("not params");
        v["sections"]["teleport"] = json!({"completed": true});
        let doc = Results::from_value(&v);
        assert!(doc.blk.is_none() && doc.wake.is_some());
        let md = markdown(&doc, "box", "x.svg");
        assert!(md.contains("| blk | **does not read**: "), "{md}");
        assert!(
            md.contains("| teleport | not a section this build knows |"),
            "{md}"
        );
        assert!(md.contains("## Wake-ups (`wake`)"), "{md}");
        assert!(!md.contains("## Block (`blk`)"), "{md}");
        // Not a results file at all: nothing to report, every section "not run".
        let md = markdown(&Results::from_value(&json!([1, 2])), "box", "x.svg");
        assert!(md.contains("| host | not run |") && md.contains("| builds | not run |"));
    }

    #[test]
    fn the_ratios_picture_has_the_rows() {
        let svg = crate::chart::svg(&crate::figures::ratios(&doc_with(ratios_fixture)));
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains(">Null syscall</text>"));
        assert!(svg.contains("Memory latency"));
        assert!(svg.matches("<rect").count() > 12);
    }
}
