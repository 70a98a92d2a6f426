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
use exits::exits;

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

/// Wake-ups per idle policy.
fn wake(o: &mut String, w: &WakeSection) {
    let Some(ps) = &w.policies else {
        return;
    };
    let host = |m: fn(&WakeHost) -> &Option<WakeMetric>| {
        num(
            w.host
                .as_ref()
                .and_then(|h| m(h).as_ref())
                .map(|m| m.median_ns),
            0,
        )
    };
    let _ = writeln!(
        o,
        "\n## Wake-ups (`wake`)\n\nHost futex ping-pong {} ns, spin ping-pong {} ns.\n\n| policy | IPI round trip ns | timer lateness ns |\n|---|---|---|",
        host(|h| &h.futex_pingpong),
        host(|h| &h.spin_pingpong),
    );
    for p in ps {
        let (name, ipi, timer) = match p {
            PolicyRow::Measured(r) => (
                r.name.as_str(),
                r.ipi_round_trip.as_ref().map(|m| m.median_ns),
                r.timer_lateness.as_ref().map(|m| m.median_ns),
            ),
            PolicyRow::Refused { name, .. } => (name.as_str(), None, None),
        };
        let _ = writeln!(
            o,
            "| {name} | {} | {} |",
            ipi.map_or("refused".into(), |v| format!("{v:.0}")),
            num(timer, 0),
        );
    }
    // The peers, each in its own mode (QEMU's default and cpu-pm, Cloud Hypervisor,
    // Firecracker), on the same two cores.
    for r in w.peers.iter().flatten() {
        let _ = writeln!(
            o,
            "| peer: {} | {} | {} |",
            r.name,
            num(r.ipi_round_trip.as_ref().map(|m| m.median_ns), 0),
            num(r.timer_lateness.as_ref().map(|m| m.median_ns), 0),
        );
    }
    wake_goal(o, w);
    peer_builds(o, &w.head.peers());
}

/// The wake goal, each of our policies' IPI round trip at or under every peer's: which
/// policies meet it, and the best peer's figure.
fn wake_goal(o: &mut String, w: &WakeSection) {
    let ipi = |r: &crate::doc::wake::WakeRow| r.ipi_round_trip.as_ref().map(|m| m.median_ns);
    let Some((peer, best)) = w
        .peers
        .iter()
        .flatten()
        .filter_map(|r| Some((r.name.as_str(), ipi(r)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
    else {
        return;
    };
    let (mut met, mut not) = (Vec::new(), Vec::new());
    for p in w.policies.iter().flatten() {
        if let PolicyRow::Measured(r) = p {
            if let Some(v) = ipi(r) {
                let e = format!("{} {v:.0}", r.name);
                if v <= best { met.push(e) } else { not.push(e) }
            }
        }
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let _ = writeln!(
        o,
        "\nGoal, an IPI round trip at or under every peer's (the best: {peer} {best:.0} ns): met by {}; not by {} (why: docs/benchmarks.md, \"Against the peers, where we stand\").",
        list(&met),
        list(&not)
    );
}

/// What the host takes from the partition's core: ours, the bare twin and QEMU, quiet and
/// beside the neighbour, each with the ratio to the bare twin under the same neighbour.
fn noise(o: &mut String, n: &crate::doc::noise::NoiseSection) {
    let Some(rows) = &n.rows else {
        return;
    };
    let _ = writeln!(
        o,
        "\n## Noise on the partition's core (`noise`)\n\nCore {}, windows of {} ms, {} \
         rounds; neighbour {}. Cases: `bare` (a host thread), `partition` (our probe guest, \
         ad hoc) and `qemu` pinned to the core; `bare-reserved` and `partition-reserved` on \
         the core `partition reserve` took out of every other cpuset. x bare: against the \
         twin under the same neighbour (the reserved twin for reserved rows).\n",
        n.params.core, n.params.window_ms, n.params.runs, n.params.neighbour
    );
    if let Some(note) = &n.reserved_note {
        let _ = writeln!(o, "Reserved-core rows: {}\n", note.replace('|', "/"));
    }
    let _ = writeln!(
        o,
        "| case | neighbour | noise us/s | x bare | largest gap us | gaps >1 us /s | >10 us /s \
         | >100 us /s | p99.99 gap ns |\n|---|---|---|---|---|---|---|---|---|"
    );
    let cell = |r: &crate::doc::noise::NoiseRow, k: &str, prec: usize| {
        r.metrics.get(k).map_or("-".into(), |s| {
            format!("{:.prec$} ({:.prec$}-{:.prec$})", s.median, s.min, s.max)
        })
    };
    for r in rows {
        // The twin under the same neighbour: the reserved one for the reserved rows.
        let twin = if r.case.ends_with("-reserved") {
            "bare-reserved"
        } else {
            "bare"
        };
        let bare = rows
            .iter()
            .find(|b| b.case == twin && b.neighbour == r.neighbour)
            .and_then(|b| b.metrics.get("noise_us_per_s"))
            .map(|s| s.median);
        let ratio = match (r.metrics.get("noise_us_per_s"), bare) {
            (Some(s), Some(b)) if b > 0.0 => format!("{:.2}", s.median / b),
            _ => "-".into(),
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {ratio} | {} | {} | {} | {} | {} |{}",
            r.case,
            if r.neighbour { "busy" } else { "quiet" },
            cell(r, "noise_us_per_s", 0),
            cell(r, "max_gap_us", 0),
            cell(r, "over_1us_per_s", 0),
            cell(r, "over_10us_per_s", 1),
            cell(r, "over_100us_per_s", 1),
            cell(r, "p9999_gap_ns", 0),
            failed_cell(&r.failures)
        );
    }
    noise_paths(o, &n.paths);
}

/// The wake round trip and the submit-to-fence in our partition, quiet and beside the
/// neighbour, each beside neighbour with its ratio to quiet.
fn noise_paths(o: &mut String, paths: &[crate::doc::noise::PathRow]) {
    if paths.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nOur partition's paths, quiet and beside the same neighbour (`wake-ipi`: the probe's \
         IPI round trip between its two vCPUs, the first on the neighbour's core; \
         `submit-fence`: the mapped doorbell to the engine's fence, polled, the engine on the \
         neighbour's core), us, median of per-run medians (min-max):\n\n| path | policy | \
         neighbour | median us | x quiet | p99 us |\n|---|---|---|---|---|---|"
    );
    let us = |s: &Option<crate::stats::Summary>| {
        s.as_ref().map_or("-".into(), |s| {
            format!(
                "{:.2} ({:.2}-{:.2})",
                s.median / 1e3,
                s.min / 1e3,
                s.max / 1e3
            )
        })
    };
    for r in paths {
        let quiet = paths
            .iter()
            .find(|q| q.path == r.path && !q.neighbour)
            .and_then(|q| q.median_ns.as_ref())
            .map(|q| q.median);
        let ratio = match (&r.median_ns, quiet) {
            (Some(s), Some(q)) if q > 0.0 => format!("{:.2}", s.median / q),
            _ => "-".into(),
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {ratio} | {} |{}",
            r.path,
            r.policy,
            if r.neighbour { "busy" } else { "quiet" },
            us(&r.median_ns),
            us(&r.p99_ns),
            failed_cell(&r.failures)
        );
    }
}

/// What a table row adds after its last cell for the runs that failed (nothing if none).
fn failed_cell(failures: &[String]) -> String {
    if failures.is_empty() {
        String::new()
    } else {
        format!(" failed: {}", failures.join("; ").replace('|', "/"))
    }
}

/// 4 KiB block reads: the host's own, ours, QEMU's.
fn blk(o: &mut String, b: &BlkSection) {
    let Some(ours) = &b.ours else {
        return;
    };
    let _ = writeln!(
        o,
        "\n## Block (`blk`): 4 KiB random read at depth 1, guest polling, µs\n\n| row | cache | median |\n|---|---|---|"
    );
    // Host rows time the read itself, guest rows the guest's polled completion.
    let qemu: &[GuestRow] = match &b.qemu {
        Some(Peers::Rows(r)) => r,
        _ => &[],
    };
    let host = b
        .host
        .iter()
        .flatten()
        .map(|r| (r.name.as_str(), r.lat4k.as_ref()));
    let rust_peers = b.rust_peers.iter().flat_map(|p| match &p.rows {
        Peers::Rows(r) => r.as_slice(),
        Peers::Note(_) => &[],
    });
    let guest = ours
        .iter()
        .chain(qemu)
        .chain(rust_peers)
        .map(|r| (r.name.as_str(), r.lat4k_guest_polls.as_ref()));
    for (name, m) in host.chain(guest) {
        let _ = writeln!(
            o,
            "| {name} | {} | {} |",
            if name.contains("direct") {
                "cold"
            } else {
                "warm"
            },
            num(m.map(|m| m.median / 1000.0), 2)
        );
    }
    for p in &b.rust_peers {
        if let Peers::Note(n) = &p.rows {
            let _ = writeln!(o, "\n{n}.");
        }
    }
    peer_builds(o, &b.head.peers());
}

/// Each Rust peer a section ran: its binary, version and commit, or why it did not run.
fn peer_builds(o: &mut String, peers: &[crate::peers::PeerInfo]) {
    for p in peers {
        let _ = match (&p.note, &p.binary) {
            (Some(note), _) => writeln!(o, "\n{note}."),
            (None, Some(bin)) => writeln!(
                o,
                "\n{}: {} ({}{}).",
                p.name,
                bin.display(),
                p.version.as_deref().unwrap_or("version unknown"),
                p.commit
                    .as_deref()
                    .map(|c| format!(", commit {c}"))
                    .unwrap_or_default()
            ),
            (None, None) => Ok(()),
        };
    }
}

/// Launch to the first serial byte per source and size.
fn memsetup(o: &mut String, m: &MemSetupSection) {
    let Some(rows) = &m.rows else {
        return;
    };
    let _ = writeln!(
        o,
        "\n## Memory setup (`memsetup`): launch to first serial byte\n\nThe VMM's own cost at the first byte: CPU time of all its threads since exec, and its resident set (guest memory on hugepages is counted apart, as hugetlb).\n\n| source | size | first byte, ms | memory, ms | VMM CPU, ms | VMM RSS, MiB | hugetlb, MiB |\n|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let med =
            |s: &Option<Summary>, scale: f64, prec: usize| num(s.map(|s| s.median / scale), prec);
        let _ = writeln!(
            o,
            "| {} | {} MiB | {} | {} | {} | {} | {} |",
            r.source,
            r.size_bytes >> 20,
            med(&r.first_byte_ms, 1.0, 1),
            med(&r.memory_ms, 1.0, 2),
            med(&r.vmm_cpu_ms_at_first_byte, 1.0, 1),
            med(&r.vmm_rss_kib_at_first_byte, 1024.0, 1),
            med(&r.vmm_hugetlb_kib_at_first_byte, 1024.0, 0),
        );
    }
    peer_builds(o, &m.peers);
    if !m.against_peers.is_empty() {
        let _ = writeln!(
            o,
            "\nOurs against the peers' best (the goal: each ratio at most {}):\n\n| ours | size | first byte over the fastest peer's | VMM CPU over the lowest peer's | RSS over Firecracker's | met |\n|---|---|---|---|---|---|",
            crate::doc::memsetup::PEER_GOAL
        );
        for g in &m.against_peers {
            let _ = writeln!(
                o,
                "| {} | {} MiB | {:.2} ({}) | {:.2} ({}) | {} | {} |",
                g.ours,
                g.size_bytes >> 20,
                g.first_byte_over_fastest,
                g.fastest_peer,
                g.cpu_over_lowest,
                g.lowest_cpu_peer,
                num(g.rss_over_firecracker, 2),
                if g.met { "yes" } else { "no" }
            );
        }
        peer_goals_unmet(o, m, rows);
    }
    memsetup_timeline(o, rows);
}

/// For each goal against the peers not met: the figures on both sides and, for the VMM's
/// CPU, the launch's largest CPU phases (from its timeline), so the report says why with
/// numbers; docs/benchmarks.md ("Against the peers, where we stand") reads them.
fn peer_goals_unmet(
    o: &mut String,
    m: &MemSetupSection,
    rows: &[crate::doc::memsetup::MemSetupRow],
) {
    let goal = crate::doc::memsetup::PEER_GOAL;
    let row = |source: &str, size: u64| {
        rows.iter()
            .find(|r| r.source == source && r.size_bytes == size)
    };
    let med = |s: &Option<Summary>| s.map(|s| s.median);
    for g in m.against_peers.iter().filter(|g| !g.met) {
        let (Some(ours), Some(fast), Some(low)) = (
            row(&g.ours, g.size_bytes),
            row(&g.fastest_peer, g.size_bytes),
            row(&g.lowest_cpu_peer, g.size_bytes),
        ) else {
            continue;
        };
        let mut why = Vec::new();
        if g.first_byte_over_fastest > goal {
            why.push(format!(
                "first byte {} ms against {}'s {} ms",
                num(med(&ours.first_byte_ms), 1),
                g.fastest_peer,
                num(med(&fast.first_byte_ms), 1)
            ));
        }
        if g.cpu_over_lowest > goal {
            // Its three largest CPU phases, by median.
            let mut phases: Vec<(&str, f64)> = ours
                .runs_timeline_cpu_ms
                .iter()
                .filter_map(|(n, v)| Some((n.as_str(), crate::stats::summary(v)?.median)))
                .collect();
            phases.sort_by(|a, b| b.1.total_cmp(&a.1));
            let top: Vec<String> = phases
                .iter()
                .take(3)
                .map(|(n, v)| format!("{n} {v:.2}"))
                .collect();
            why.push(format!(
                "VMM CPU {} ms against {}'s {} ms{}",
                num(med(&ours.vmm_cpu_ms_at_first_byte), 1),
                g.lowest_cpu_peer,
                num(med(&low.vmm_cpu_ms_at_first_byte), 1),
                if top.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (its largest phases, ms: {}, of {} phases)",
                        top.join(", "),
                        phases.len()
                    )
                }
            ));
        }
        if let Some(r) = g.rss_over_firecracker.filter(|r| *r > goal) {
            why.push(format!(
                "resident set {} MiB, {r:.2}x Firecracker's",
                num(med(&ours.vmm_rss_kib_at_first_byte).map(|k| k / 1024.0), 1)
            ));
        }
        let _ = writeln!(
            o,
            "\nNot met for `{}` at {} MiB: {} (what stands in the way: docs/benchmarks.md, \"Against the peers, where we stand\").",
            g.ours,
            g.size_bytes >> 20,
            why.join("; ")
        );
    }
}

/// Where our pool launches' time to the first byte goes: each phase's median wall and CPU
/// time, per size (the per-run figures are in the results file).
fn memsetup_timeline(o: &mut String, rows: &[crate::doc::memsetup::MemSetupRow]) {
    let pool: Vec<_> = rows
        .iter()
        .filter(|r| r.source == "pool" && !r.runs_timeline_ms.is_empty())
        .collect();
    let Some(first) = pool.first() else {
        return;
    };
    let _ = write!(
        o,
        "\nWhere the pool launch's time to the first byte goes (`launch --timings`; `exec` is \
         spawn to `main`): median per phase, wall / VMM CPU, ms. Each column's medians need \
         not add up to its total.\n\n| phase |"
    );
    for r in &pool {
        let _ = write!(o, " {} MiB |", r.size_bytes >> 20);
    }
    let _ = write!(o, "\n|---|");
    for _ in &pool {
        let _ = write!(o, "---|");
    }
    for (phase, _) in &first.runs_timeline_ms {
        let _ = write!(o, "\n| {phase} |");
        // This phase's median in one of a row's per-phase lists.
        let med = |l: &[(String, Vec<f64>)]| {
            l.iter()
                .find(|(n, _)| n == phase)
                .and_then(|(_, v)| crate::stats::summary(v))
                .map(|s| s.median)
        };
        for r in &pool {
            let wall = med(&r.runs_timeline_ms);
            let cpu = med(&r.runs_timeline_cpu_ms);
            let _ = write!(o, " {} / {} |", num(wall, 2), num(cpu, 2));
        }
    }
    let _ = write!(o, "\n| **total** |");
    for r in &pool {
        let _ = write!(
            o,
            " {} / {} |",
            num(r.first_byte_ms.map(|s| s.median), 1),
            num(r.vmm_cpu_ms_at_first_byte.map(|s| s.median), 1)
        );
    }
    let _ = writeln!(o);
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

/// A cell in µs: "median (min-max)".
fn cell_us(c: Option<Cell>) -> String {
    c.map_or("—".into(), |c| {
        format!(
            "{:.2} ({:.2}-{:.2})",
            c.median_ns / 1e3,
            c.spread_ns[0] / 1e3,
            c.spread_ns[1] / 1e3
        )
    })
}

/// A p99 cell in µs (its median).
fn p99_us(c: Option<Cell>) -> String {
    num(c.map(|c| c.median_ns / 1e3), 2)
}

/// The `submit-vfio` table: the partition, the bare-host twin and QEMU on one
/// passed-through controller.
fn submit_vfio_rows(o: &mut String, sub: &SubmitVfioSection) {
    let _ = writeln!(
        o,
        "\n## Submission through a passed-through device (`submit-vfio`): submit to completion, µs\n\n\
         {} on {} ({}), one-block reads, {} per completion mode per run, {} runs; the \
         partition's exits to the VMM per submission: {}; interrupts the host counted in its \
         last run: {}.{}\n\n| driver | completion | submit to completion | p99 | / bare-host twin |\n|---|---|---|---|---|",
        sub.device.as_deref().unwrap_or("no device"),
        sub.machine,
        if sub.timings_meaningful {
            "timings are the hardware's"
        } else {
            "an emulated machine: the timings describe the emulator, the exits and \
             interrupts do not"
        },
        sub.samples_per_run,
        sub.runs,
        sub.exits_per_submission
            .map_or("not measured".into(), |v| format!("{v:.3}")),
        sub.host_interrupts
            .map_or("not measured".into(), |v| v.to_string()),
        sub.head
            .reason
            .as_deref()
            .map_or(String::new(), |r| format!(" Not complete: {r}."))
    );
    for r in &sub.rows {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |",
            r.who,
            r.completion,
            cell_us(r.latency),
            cell_us(r.p99),
            r.ratio_to_twin.map_or("—".into(), |v| format!("{v:.2}x"))
        );
    }
}

/// The `submit` tables: guest rows against their twins, the twins, the goals.
fn submit_rows(o: &mut String, sub: &SubmitSection) {
    let _ = writeln!(
        o,
        "\n## GPU-style submission (`submit`): submit to fence, µs\n\nThe probe guest drives the \
         PCI submission engine; each row's twin is the engine's own code between two host \
         threads on the same cores (docs/submission.md).\n\n| doorbell | idle | completion | \
         median (min-max over runs) | p99 | doorbells that exited | engine thread busy | twin | \
         guest/twin |\n|---|---|---|---|---|---|---|---|---|"
    );
    for r in &sub.guest {
        let twin = sub.host.get(twin_index(&r.doorbell, &r.completion));
        let ratio = r
            .submit_to_fence
            .zip(twin.and_then(|t| t.submit_to_fence))
            .map_or("—".into(), |(g, h)| {
                format!("{:.2}x", g.median_ns / h.median_ns)
            });
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {ratio} |",
            r.doorbell,
            r.policy,
            r.completion,
            cell_us(r.submit_to_fence),
            p99_us(r.p99),
            r.trapped_doorbells.map_or("—".into(), |v| v.to_string()),
            r.engine_thread_busy
                .map_or("—".into(), |v| format!("{:.0}%", 100.0 * v)),
            twin.map_or("—".into(), |t| format!(
                "engine {}, driver {}",
                t.engine, t.waiter
            )),
        );
    }
    let _ = writeln!(
        o,
        "\n| bare-host twin: engine | driver | twin of | median (min-max over runs) | p99 |\n|---|---|---|---|---|"
    );
    for t in &sub.host {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |",
            t.engine,
            t.waiter,
            t.twin_of,
            cell_us(t.submit_to_fence),
            p99_us(t.p99),
        );
    }
    mapped_breakdown(o, sub);
    if !sub.qemu.is_empty() {
        let _ = writeln!(
            o,
            "\n| QEMU peer (microvm, PCIe) | what was timed | peer of | median (min-max over runs) | p99 |\n|---|---|---|---|---|"
        );
        for r in &sub.qemu {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} |",
                r.device,
                r.path,
                r.peer_of,
                cell_us(r.latency),
                p99_us(r.p99),
            );
        }
    }
    let writes: Vec<String> = sub
        .guest
        .iter()
        .filter(|r| r.completion == "poll")
        .map(|r| {
            format!(
                "{} --idle {}: {}",
                r.doorbell,
                r.policy,
                cell_us(r.doorbell_write)
            )
        })
        .collect();
    if !writes.is_empty() {
        let _ = writeln!(
            o,
            "\nThe doorbell write alone (µs, the guest's store until it retires): {}.",
            writes.join("; ")
        );
    }
    for g in &sub.goals {
        let _ = writeln!(
            o,
            "\n- Goal: {} — {} ({})",
            g.goal,
            match g.met {
                Some(true) => "met",
                Some(false) => "**not met**",
                None => "not measured",
            },
            g.note
        );
    }
    for n in &sub.not_measured {
        let _ = writeln!(o, "- Not measured: {n}");
    }
}

/// The mapped doorbell with a polled fence, the guest and the twin each with and without
/// timing the doorbell write (what timing it adds, on both sides).
fn mapped_breakdown(o: &mut String, sub: &SubmitSection) {
    let twin = sub.host.get(twin_index("mapped", "poll"));
    let rows: Vec<_> = sub
        .guest
        .iter()
        .filter(|r| r.doorbell == "mapped" && r.completion == "poll")
        .filter(|r| r.submit_to_fence_timed_doorbell.is_some())
        .collect();
    let Some(twin) = twin.filter(|_| !rows.is_empty()) else {
        return;
    };
    let _ = writeln!(
        o,
        "\nThe mapped doorbell with a polled fence, with and without the doorbell write timed \
         (a full fence and a TSC read before the store, one after), µs:\n\n| idle | guest | \
         guest, write timed | twin | twin, write timed | guest/twin | guest/twin, both \
         timed |\n|---|---|---|---|---|---|---|"
    );
    let ratio = |g: Option<Cell>, h: Option<Cell>| {
        g.zip(h).map_or("—".into(), |(g, h)| {
            format!("{:.2}x", g.median_ns / h.median_ns)
        })
    };
    for r in rows {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.policy,
            cell_us(r.submit_to_fence),
            cell_us(r.submit_to_fence_timed_doorbell),
            cell_us(twin.submit_to_fence),
            cell_us(twin.submit_to_fence_timed_doorbell),
            ratio(r.submit_to_fence, twin.submit_to_fence),
            ratio(
                r.submit_to_fence_timed_doorbell,
                twin.submit_to_fence_timed_doorbell
            ),
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
