//! The report a person reads: `benchmarks/results/<host>.md` with the guest/host ratio
//! table beside the seeds' published ratios, the probe's paths and memory staircase, the
//! other sections' headlines and the cross-checks; and `<host>-ratios.svg`, the ratios
//! and the pictures beside it (`crate::figures`). Both are made from the results file alone, after every
//! `partition bench` (or by `partition bench --report`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::lookup::{SEED, completed, guest_values, host_value, twin_index};

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

fn status(doc: &Value, s: &str) -> String {
    match doc["sections"].get(s) {
        None => "not run".into(),
        Some(v) if v["completed"] == true => format!(
            "completed {}{}",
            v["finished_at"].as_str().unwrap_or(""),
            if v["host_limitation"] == true {
                " (host limitation: see below)"
            } else {
                ""
            }
        ),
        Some(v) => format!(
            "{}: {}",
            if v["host_limitation"] == true && v["limitation"].is_null() {
                "**not possible on this host**"
            } else {
                "**not complete**"
            },
            v["reason"].as_str().unwrap_or("no reason recorded")
        ),
    }
}

/// The Markdown report.
pub fn markdown(doc: &Value, host: &str, svg_name: &str) -> String {
    let mut o = String::new();
    let s = &doc["sections"];
    let prov = ["host", "probe", "blk", "wake", "memsetup"]
        .iter()
        .find_map(|k| s.get(*k).map(|v| &v["provenance"]))
        .cloned()
        .unwrap_or(Value::Null);
    let _ = writeln!(o, "# Benchmark report: {host}\n");
    let _ = writeln!(
        o,
        "Made by `partition bench` from `{host}.json` (every number below is in it, with its \
         runs and provenance); regenerate with `partition bench --report`. Method: \
         `docs/benchmarks.md`.\n"
    );
    let p = |k: &str| {
        prov.pointer(k)
            .map(|v| v.to_string().trim_matches('"').to_string())
    };
    let _ = writeln!(
        o,
        "Host: {} ({} MHz TSC) · kernel {} · KVM module {} · itself a guest: {} · commit {}{}\n",
        p("/cpu_model").unwrap_or_else(|| "?".into()),
        p("/tsc_mhz").unwrap_or_else(|| "?".into()),
        p("/kernel").unwrap_or_else(|| "?".into()),
        p("/kvm/vendor_module").unwrap_or_else(|| "?".into()),
        p("/kvm/host_is_a_guest").unwrap_or_else(|| "?".into()),
        p("/commit").unwrap_or_else(|| "?".into()),
        if prov["commit_dirty"] == true {
            " (with uncommitted changes)"
        } else {
            ""
        },
    );
    let _ = writeln!(o, "| section | state |\n|---|---|");
    for k in [
        "host",
        "guest",
        "probe",
        "wake",
        "blk",
        "submit",
        "submit-vfio",
        "memsetup",
        "crosscheck",
        "sandbox",
        "builds",
    ] {
        let _ = writeln!(o, "| {k} | {} |", status(doc, k).replace('|', "/"));
    }

    // The headline table.
    // Only policies with measurements get columns.
    let policies: Vec<String> = s["guest"]["policies"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|p| p["rows"].as_array().is_some_and(|r| !r.is_empty()))
                .filter_map(|p| p["policy"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let guest_ok = completed(doc, "guest") == Some(true);
    let _ = writeln!(
        o,
        "\n## Hot paths: the guest against the bare host, beside the seed\n"
    );
    if !guest_ok {
        let _ = writeln!(
            o,
            "The guest columns are empty: {}\n",
            s["guest"]["reason"]
                .as_str()
                .unwrap_or("the guest section has not been run")
        );
    }
    if let Some(l) = s["guest"]["limitation"].as_str() {
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
                let v = g.iter().find(|x| &x.0 == p).map(|x| x.1);
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

    // Memory staircase.
    if let Some(st) = s["probe"]["mem_lat"].as_array().filter(|a| !a.is_empty()) {
        let _ = writeln!(
            o,
            "\n## Memory latency: the probe guest against the host, the same chase\n\n\
             Seed 000 found parity (1.3 ns in L1 to 32 ns in DRAM on both sides).\n\n\
             | working set | host ns | probe guest ns | guest/host |\n|---|---|---|---|"
        );
        for r in st {
            let size = partition::config::size::format(r["bytes"].as_u64().unwrap_or(0));
            let f = |k: &str| r[k].as_f64().map_or("—".into(), |v| format!("{v:.2}"));
            let _ = writeln!(
                o,
                "| {size} | {} | {} | {} |",
                f("host_ns"),
                f("guest_ns"),
                r["guest_over_host"]
                    .as_f64()
                    .map_or("—".into(), |v| format!("{v:.2}x"))
            );
        }
    }

    // VMM paths.
    if s.get("probe").is_some() {
        let _ = writeln!(
            o,
            "\n## The VMM's own paths (probe guest, ns per call)\n\n| path | ours | ours `--no-ioeventfd` | QEMU microvm |\n|---|---|---|---|"
        );
        let v = |who: &str, t: &str| {
            s["probe"][who]["paths_ns"][t]["median_ns"]
                .as_f64()
                .map_or("—".into(), |x| format!("{x:.0}"))
        };
        for t in [
            "cpuid",
            "service",
            "pio_in",
            "pio_in_service",
            "mmio_read",
            "mmio_doorbell",
        ] {
            if ["ours", "ours_no_ioeventfd", "qemu"]
                .iter()
                .all(|w| s["probe"][w]["paths_ns"][t].is_null())
            {
                continue;
            }
            let _ = writeln!(
                o,
                "| {t} | {} | {} | {} |",
                v("ours", t),
                v("ours_no_ioeventfd", t),
                v("qemu", t)
            );
        }
        let pe = |w: &str| {
            s["probe"][w]["pio_exit_ns"]
                .as_f64()
                .map_or("—".into(), |x| format!("{x:.0}"))
        };
        let _ = writeln!(
            o,
            "| port I/O exit (derived) | {} | {} | {} |",
            pe("ours"),
            pe("ours_no_ioeventfd"),
            pe("qemu")
        );
    }

    // Other sections' headlines.
    if let Some(ps) = s["wake"]["policies"].as_array() {
        let _ = writeln!(
            o,
            "\n## Wake-ups (`wake`)\n\nHost futex ping-pong {} ns, spin ping-pong {} ns.\n\n| policy | IPI round trip ns | timer lateness ns |\n|---|---|---|",
            s["wake"]["host"]["futex_pingpong"]["median_ns"],
            s["wake"]["host"]["spin_pingpong"]["median_ns"]
        );
        for p in ps {
            let _ = writeln!(
                o,
                "| {} | {} | {} |",
                p["name"].as_str().unwrap_or("?"),
                p["ipi_round_trip"]["median_ns"]
                    .as_f64()
                    .map_or("refused".into(), |v| format!("{v:.0}")),
                p["timer_lateness"]["median_ns"]
                    .as_f64()
                    .map_or("—".into(), |v| format!("{v:.0}")),
            );
        }
    }
    if let Some(rows) = s["blk"]["ours"].as_array() {
        let _ = writeln!(
            o,
            "\n## Block (`blk`): 4 KiB random read at depth 1, guest polling, µs\n\n| row | cache | median |\n|---|---|---|"
        );
        // Host rows time the read itself, guest rows the guest's polled completion.
        let host = s["blk"]["host"].as_array().into_iter().flatten();
        let guest = rows
            .iter()
            .chain(s["blk"]["qemu"].as_array().into_iter().flatten());
        for (r, key) in host
            .map(|r| (r, "lat4k"))
            .chain(guest.map(|r| (r, "lat4k_guest_polls")))
        {
            let name = r["name"].as_str().unwrap_or("?");
            let _ = writeln!(
                o,
                "| {name} | {} | {} |",
                if name.contains("direct") {
                    "cold"
                } else {
                    "warm"
                },
                r[key]["median"]
                    .as_f64()
                    .map_or("—".into(), |v| format!("{:.2}", v / 1000.0))
            );
        }
    }
    if let Some(rows) = s["submit"]["guest"].as_array() {
        submit_rows(&mut o, &s["submit"], rows);
    }
    if let Some(rows) = s["submit-vfio"]["rows"].as_array() {
        submit_vfio_rows(&mut o, &s["submit-vfio"], rows);
    }
    if let Some(rows) = s["memsetup"]["rows"].as_array() {
        let _ = writeln!(
            o,
            "\n## Memory setup (`memsetup`): launch to first serial byte\n\nThe VMM's own cost at the first byte: CPU time of all its threads since exec, and its resident set (guest memory on hugepages is counted apart, as hugetlb).\n\n| source | size | first byte, ms | memory, ms | VMM CPU, ms | VMM RSS, MiB | hugetlb, MiB |\n|---|---|---|---|---|---|---|"
        );
        for r in rows {
            let med = |k: &str, scale: f64, prec: usize| {
                r[k]["median"]
                    .as_f64()
                    .map_or("—".into(), |v| format!("{:.*}", prec, v / scale))
            };
            let _ = writeln!(
                o,
                "| {} | {} MiB | {} | {} | {} | {} | {} |",
                r["source"].as_str().unwrap_or("?"),
                r["size_bytes"].as_u64().unwrap_or(0) >> 20,
                med("first_byte_ms", 1.0, 1),
                med("memory_ms", 1.0, 2),
                med("vmm_cpu_ms_at_first_byte", 1.0, 1),
                med("vmm_rss_kib_at_first_byte", 1024.0, 1),
                med("vmm_hugetlb_kib_at_first_byte", 1024.0, 0),
            );
        }
    }

    // Two variants of the same paths (benchmarks/src/compare.rs).
    for (key, title) in [
        ("sandbox", "What confinement costs (`sandbox`)"),
        ("builds", "This build against a baseline (`builds`)"),
    ] {
        let (Some(v), Some(verdicts)) =
            (s[key]["variants"].as_array(), s[key]["verdicts"].as_array())
        else {
            continue;
        };
        let name = |i: usize| v.get(i).and_then(|x| x["name"].as_str()).unwrap_or("?");
        let _ = writeln!(
            o,
            "\n## {title}\n\n{}\n\n| path | {} (µs) | {} (µs) | second/first | second slower beyond the spread |\n|---|---|---|---|---|",
            s[key]["question"].as_str().unwrap_or(""),
            name(0),
            name(1)
        );
        for r in verdicts {
            let path = r["path"].as_str().unwrap_or("?");
            let cell = |i: usize| {
                let c = &v[i]["paths"][path];
                match (
                    c["median_ns"].as_f64(),
                    c["spread_ns"][0].as_f64(),
                    c["spread_ns"][1].as_f64(),
                ) {
                    (Some(m), Some(a), Some(b)) => {
                        format!("{:.2} ({:.2}-{:.2})", m / 1e3, a / 1e3, b / 1e3)
                    }
                    _ => "—".into(),
                }
            };
            let _ = writeln!(
                o,
                "| {path} | {} | {} | {} | {} |",
                cell(0),
                cell(1),
                r["second_over_first"]
                    .as_f64()
                    .map_or("—".into(), |x| format!("{x:.2}")),
                match r["second_slower_beyond_spread"].as_bool() {
                    Some(true) => "**yes**",
                    Some(false) => "no",
                    None => "—",
                }
            );
        }
    }

    // Cross-checks.
    if let Some(rows) = s["crosscheck"]["rows"].as_array() {
        let _ = writeln!(
            o,
            "\n## Cross-checks: our bare-host figures against independent tools, same session\n\n| figure | unit | ours | theirs (tool) | ours/theirs | within 20% |\n|---|---|---|---|---|---|"
        );
        for r in rows {
            let f = |k: &str| r[k].as_f64().map_or("—".into(), |v| format!("{v:.3}"));
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} ({}) | {} | {} |",
                r["row"].as_str().unwrap_or("?"),
                r["unit"].as_str().unwrap_or(""),
                f("ours_median"),
                f("theirs_median"),
                r["theirs"].as_str().unwrap_or(""),
                r["ours_over_theirs"]
                    .as_f64()
                    .map_or("—".into(), |v| format!("{v:.2}")),
                match r["within_20_percent"].as_bool() {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "—",
                }
            );
        }
    }
    let _ = writeln!(o, "\n## Chart\n\n![ratios]({svg_name})");
    o
}

fn cell_us(c: &Value) -> String {
    match (
        c["median_ns"].as_f64(),
        c["spread_ns"][0].as_f64(),
        c["spread_ns"][1].as_f64(),
    ) {
        (Some(m), Some(a), Some(b)) => format!("{:.2} ({:.2}-{:.2})", m / 1e3, a / 1e3, b / 1e3),
        _ => "—".into(),
    }
}

/// The `submit-vfio` table: the partition, the bare-host twin and QEMU on one
/// passed-through controller.
fn submit_vfio_rows(o: &mut String, sub: &Value, rows: &[Value]) {
    let meaningful = sub["timings_meaningful"].as_bool() == Some(true);
    let _ = writeln!(
        o,
        "\n## Submission through a passed-through device (`submit-vfio`): submit to completion, µs\n\n\
         {} on {} ({}), one-block reads, {} per completion mode per run, {} runs; the \
         partition's exits to the VMM per submission: {}; interrupts the host counted in its \
         last run: {}.{}\n\n| driver | completion | submit to completion | p99 | / bare-host twin |\n|---|---|---|---|---|",
        sub["device"].as_str().unwrap_or("no device"),
        sub["machine"].as_str().unwrap_or("?"),
        if meaningful {
            "timings are the hardware's"
        } else {
            "an emulated machine: the timings describe the emulator, the exits and \
             interrupts do not"
        },
        sub["samples_per_run"],
        sub["runs"],
        sub["exits_per_submission"]
            .as_f64()
            .map_or("not measured".into(), |v| format!("{v:.3}")),
        sub["host_interrupts"]
            .as_u64()
            .map_or("not measured".into(), |v| v.to_string()),
        sub["reason"]
            .as_str()
            .map_or(String::new(), |r| format!(" Not complete: {r}."))
    );
    for r in rows {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |",
            r["who"].as_str().unwrap_or("?"),
            r["completion"].as_str().unwrap_or("?"),
            cell_us(&r["latency"]),
            cell_us(&r["p99"]),
            r["ratio_to_twin"]
                .as_f64()
                .map_or("—".into(), |v| format!("{v:.2}x"))
        );
    }
}

/// The `submit` tables: guest rows against their twins, the twins, the goals.
fn submit_rows(o: &mut String, sub: &Value, rows: &[Value]) {
    let _ = writeln!(
        o,
        "\n## GPU-style submission (`submit`): submit to fence, µs\n\nThe probe guest drives the \
         PCI submission engine; each row's twin is the engine's own code between two host \
         threads on the same cores (docs/submission.md).\n\n| doorbell | idle | completion | \
         median (min-max over runs) | p99 | doorbells that exited | engine thread busy | twin | \
         guest/twin |\n|---|---|---|---|---|---|---|---|---|"
    );
    let host = sub["host"].as_array().cloned().unwrap_or_default();
    for r in rows {
        let (d, c) = (
            r["doorbell"].as_str().unwrap_or("?"),
            r["completion"].as_str().unwrap_or("?"),
        );
        let twin = host.get(twin_index(d, c));
        let ratio = r["submit_to_fence"]["median_ns"]
            .as_f64()
            .zip(twin.and_then(|t| t["submit_to_fence"]["median_ns"].as_f64()))
            .map_or("—".into(), |(g, h)| format!("{:.2}x", g / h));
        let _ = writeln!(
            o,
            "| {d} | {} | {c} | {} | {} | {} | {} | {} | {ratio} |",
            r["policy"].as_str().unwrap_or("?"),
            cell_us(&r["submit_to_fence"]),
            r["p99"]["median_ns"]
                .as_f64()
                .map_or("—".into(), |v| format!("{:.2}", v / 1e3)),
            r["trapped_doorbells"]
                .as_u64()
                .map_or("—".into(), |v| v.to_string()),
            r["engine_thread_busy"]
                .as_f64()
                .map_or("—".into(), |v| format!("{:.0}%", 100.0 * v)),
            twin.map_or("—".into(), |t| format!(
                "engine {}, driver {}",
                t["engine"].as_str().unwrap_or("?"),
                t["waiter"].as_str().unwrap_or("?")
            )),
        );
    }
    let _ = writeln!(
        o,
        "\n| bare-host twin: engine | driver | twin of | median (min-max over runs) | p99 |\n|---|---|---|---|---|"
    );
    for t in &host {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |",
            t["engine"].as_str().unwrap_or("?"),
            t["waiter"].as_str().unwrap_or("?"),
            t["twin_of"].as_str().unwrap_or("?"),
            cell_us(&t["submit_to_fence"]),
            t["p99"]["median_ns"]
                .as_f64()
                .map_or("—".into(), |v| format!("{:.2}", v / 1e3)),
        );
    }
    if let Some(peers) = sub["qemu"].as_array().filter(|a| !a.is_empty()) {
        let _ = writeln!(
            o,
            "\n| QEMU peer (microvm, PCIe) | what was timed | peer of | median (min-max over runs) | p99 |\n|---|---|---|---|---|"
        );
        for r in peers {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} |",
                r["device"].as_str().unwrap_or("?"),
                r["path"].as_str().unwrap_or("?"),
                r["peer_of"].as_str().unwrap_or("?"),
                cell_us(&r["latency"]),
                r["p99"]["median_ns"]
                    .as_f64()
                    .map_or("—".into(), |v| format!("{:.2}", v / 1e3)),
            );
        }
    }
    let writes: Vec<String> = rows
        .iter()
        .filter(|r| r["completion"] == "poll")
        .filter_map(|r| {
            Some(format!(
                "{} --idle {}: {}",
                r["doorbell"].as_str()?,
                r["policy"].as_str()?,
                cell_us(&r["doorbell_write"])
            ))
        })
        .collect();
    if !writes.is_empty() {
        let _ = writeln!(
            o,
            "\nThe doorbell write alone (µs, the guest's store until it retires): {}.",
            writes.join("; ")
        );
    }
    for g in sub["goals"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "\n- Goal: {} — {} ({})",
            g["goal"].as_str().unwrap_or("?"),
            match g["met"].as_bool() {
                Some(true) => "met",
                Some(false) => "**not met**",
                None => "not measured",
            },
            g["note"].as_str().unwrap_or("")
        );
    }
    for n in sub["not_measured"].as_array().into_iter().flatten() {
        let _ = writeln!(o, "- Not measured: {}", n.as_str().unwrap_or("?"));
    }
}

/// Writes the report and the chart for `results`.
pub fn write(results: &Path) -> Result<(PathBuf, PathBuf), String> {
    let text =
        std::fs::read_to_string(results).map_err(|e| format!("{}: {e}", results.display()))?;
    let doc: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", results.display()))?;
    let (md, svg) = paths(results);
    let host = results
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let svg_name = svg
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let pictures = crate::figures::write(&doc, results, &host)?;
    let mut text = markdown(&doc, &host, &svg_name);
    for p in pictures.iter().skip(1) {
        let name = p
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        text.push_str(&format!("\n![{name}]({name})\n"));
    }
    std::fs::write(&md, text).map_err(|e| format!("{}: {e}", md.display()))?;
    Ok((md, svg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> Value {
        json!({"sections": {
            "host": {"completed": true, "rows": [
                {"name": "null_syscall", "unit": "us", "median": 0.2, "spread": [0.19, 0.21]},
                {"name": "pipe_2cores", "unit": "us", "median": 10.0, "spread": [9.0, 11.0]}]},
            "guest": {"completed": true, "policies": [{"policy": "hlt", "rows": [
                {"name": "null_syscall", "median": 0.3}, {"name": "pipe_2cores", "median": 25.0}]}]},
            "probe": {"completed": true, "mem_lat": [
                {"bytes": 512, "host_ns": 1.2, "guest_ns": 1.3, "guest_over_host": 1.0833},
                {"bytes": 1048576, "host_ns": 14.0, "guest_ns": 15.0, "guest_over_host": 1.07}],
                "ours": {"paths_ns": {"cpuid": {"median_ns": 2980.0}}, "pio_exit_ns": 5000.0}},
            "crosscheck": {"completed": true, "rows": [
                {"row": "null syscall", "unit": "us", "ours_median": 0.19, "theirs_median": 0.2,
                 "theirs": "lat_syscall null", "ours_over_theirs": 0.95, "within_20_percent": true}]}
        }})
    }

    #[test]
    fn the_report_has_the_ratios_and_the_seed_beside_them() {
        let md = markdown(&doc(), "box", "box-ratios.svg");
        assert!(
            md.contains(
                "| Null syscall | 0.07 | 0.099 | 1.42x | 0.200 (0.190-0.210) | 0.300 | 1.50x |"
            ),
            "{md}"
        );
        assert!(md.contains("Pipe latency (two cores)"));
        assert!(
            md.contains("| 2.50 | 2.50x |") || md.contains("25.00 | 2.50x"),
            "{md}"
        );
        assert!(md.contains("| 1 MiB | 14.00 | 15.00 | 1.07x |"));
        assert!(md.contains("| cpuid | 2980 |"));
        assert!(
            md.contains("| null syscall | us | 0.190 | 0.200 (lat_syscall null) | 0.95 | yes |")
        );
        assert!(md.contains("![ratios](box-ratios.svg)"));
        // A guest that did not run says why instead of inventing columns.
        let mut d = doc();
        d["sections"]["guest"] = json!({"completed": false, "reason": "no image", "policies": []});
        let md = markdown(&d, "box", "x.svg");
        assert!(md.contains("The guest columns are empty: no image"));
        // Two variants of the same paths, with the verdict.
        d["sections"]["sandbox"] = json!({"completed": true, "question": "what does it cost?",
            "variants": [
                {"name": "--no-sandbox", "paths": {"doorbell_ioeventfd": {"median_ns": 15000.0, "spread_ns": [14000.0, 16000.0]}}},
                {"name": "sandboxed", "paths": {"doorbell_ioeventfd": {"median_ns": 15500.0, "spread_ns": [15000.0, 17000.0]}}}],
            "verdicts": [{"path": "doorbell_ioeventfd", "second_over_first": 1.0333, "second_slower_beyond_spread": false}]});
        let md = markdown(&d, "box", "x.svg");
        assert!(md.contains("## What confinement costs (`sandbox`)"), "{md}");
        assert!(
            md.contains(
                "| doorbell_ioeventfd | 15.00 (14.00-16.00) | 15.50 (15.00-17.00) | 1.03 | no |"
            ),
            "{md}"
        );
    }

    #[test]
    fn submit_rows_stand_beside_their_twins() {
        let mut d = doc();
        let cell = |m: f64| json!({"median_ns": m, "spread_ns": [m - 100.0, m + 100.0], "runs": 3});
        let twin = |e: &str, w: &str, m: f64| {
            json!({"engine": e, "waiter": w, "twin_of": "x",
            "submit_to_fence": cell(m), "p99": cell(m * 2.0)})
        };
        d["sections"]["submit"] = json!({"completed": false, "reason": "no QEMU rows",
            "guest": [
                {"doorbell": "mapped", "policy": "hlt", "completion": "poll",
                 "submit_to_fence": cell(550.0), "p99": cell(600.0), "trapped_doorbells": 0,
                 "engine_thread_busy": 0.99},
                {"doorbell": "trap", "policy": "hlt", "completion": "irq",
                 "submit_to_fence": cell(80000.0), "p99": cell(90000.0), "trapped_doorbells": 1100}],
            "host": [twin("polls page", "polls fence", 500.0), twin("polls page", "eventfd", 5000.0),
                     twin("polls page", "futex", 6000.0), twin("eventfd", "polls fence", 8000.0),
                     twin("eventfd", "eventfd", 10000.0)],
            "goals": [{"goal": "mapped within 1.1x", "ratio": 1.1, "met": true, "note": "best policy hlt: 1.10x"}],
            "qemu": [{"device": "edu", "path": "write to result", "peer_of": "trap/poll",
                      "latency": cell(86000.0), "p99": cell(90000.0)}],
            "not_measured": ["QEMU peers"]});
        let md = markdown(&d, "box", "x.svg");
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
    fn the_ratios_picture_has_the_rows() {
        let svg = crate::chart::svg(&crate::figures::ratios(&doc()));
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains(">Null syscall</text>"));
        assert!(svg.contains("Memory latency"));
        assert!(svg.matches("<rect").count() > 12);
    }
}
