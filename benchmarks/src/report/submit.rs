//! The report's `submit` and `submit-vfio` parts: the engine's submission paths and the
//! passed-through controller's, ours against the bare-host twin and QEMU.

use std::fmt::Write as _;

use super::*;

/// A cell in µs: "median (min-max)".
pub(super) fn cell_us(c: Option<Cell>) -> String {
    c.map_or("—".into(), |c| {
        format!(
            "{:.2} ({:.2}-{:.2})",
            c.median_ns / 1e3,
            c.spread_ns[0] / 1e3,
            c.spread_ns[1] / 1e3
        )
    })
}

/// A table row of three names, a timing's median (min-max) and its p99, in µs.
fn timed_row(o: &mut String, names: [&str; 3], median: Option<Cell>, p99: Option<Cell>) {
    let _ = writeln!(
        o,
        "| {} | {} | {} | {} | {} |",
        names[0],
        names[1],
        names[2],
        cell_us(median),
        p99_us(p99)
    );
}

/// A p99 cell in µs (its median).
pub(super) fn p99_us(c: Option<Cell>) -> String {
    num(c.map(|c| c.median_ns / 1e3), 2)
}

/// The `submit-vfio` table: the partition, the bare-host twin and QEMU on one
/// passed-through controller.
pub(super) fn submit_vfio_rows(o: &mut String, sub: &SubmitVfioSection) {
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
pub(super) fn submit_rows(o: &mut String, sub: &SubmitSection) {
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
        timed_row(
            o,
            [&t.engine, &t.waiter, &t.twin_of],
            t.submit_to_fence,
            t.p99,
        );
    }
    mapped_breakdown(o, sub);
    if !sub.qemu.is_empty() {
        let _ = writeln!(
            o,
            "\n| QEMU peer (microvm, PCIe) | what was timed | peer of | median (min-max over runs) | p99 |\n|---|---|---|---|---|"
        );
        for r in &sub.qemu {
            timed_row(o, [&r.device, &r.path, &r.peer_of], r.latency, r.p99);
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
pub(super) fn mapped_breakdown(o: &mut String, sub: &SubmitSection) {
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
