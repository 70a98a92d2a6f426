//! Which pictures the report draws, from the results file: the guest/host ratios
//! (`<host>-ratios.svg`: the hot paths beside seed 000, the memory staircase, the
//! cross-checks), and one picture per section that has figures of its own: submit (grouped
//! by doorbell mode, ours beside the bare-host twin and the QEMU peer), wake, noise, blk
//! and memsetup. Every axis is logarithmic and every bar carries its value ([`crate::chart`]).

use std::path::{Path, PathBuf};

use partition::config::size::format as bytes;

use crate::chart::{BLUE, GREY, Group, LIGHT, ORANGE, Panel, Row, Unit, svg};
use crate::doc::Results;
use crate::doc::blk::{GuestRow, Metric, Peers};
use crate::doc::memsetup::MemSetupRow;
use crate::doc::wake::{PolicyRow, WakeHost, WakeMetric, WakeRow};
use crate::head::Cell;
use crate::lookup::{SEED, guest_values, host_value, twin_index};
use crate::stats::Summary;

fn series(names: &[(&str, &'static str)]) -> Vec<(String, &'static str)> {
    names.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

fn panel(title: &str, unit: Unit, s: &[(&str, &'static str)], groups: Vec<Group>) -> Panel {
    Panel {
        title: title.into(),
        unit,
        series: series(s),
        groups,
        band: None,
        goal: None,
        empty_note: "not measured in this results file".into(),
    }
}

fn median_ns(c: &Option<Cell>) -> Option<f64> {
    c.map(|c| c.median_ns)
}

/// The ratios picture: hot paths (seed 000 and ours), the memory staircase by working set,
/// the cross-checks against their ±20% band.
pub fn ratios(doc: &Results) -> Vec<Panel> {
    let first_policy = doc
        .guest
        .as_ref()
        .and_then(|g| g.policies.as_ref()?.first())
        .map(|p| p.policy.clone());
    let measured = doc.completed("guest") == Some(true);
    let rows = SEED
        .iter()
        .map(|(row, names, _, _, ratio)| {
            let ours = first_policy.as_ref().filter(|_| measured).and_then(|p| {
                let g = guest_values(doc, names[0])
                    .into_iter()
                    .find(|x| &x.0 == p)?
                    .1;
                Some(g / host_value(doc, names[0])?.0)
            });
            Row {
                label: row.to_string(),
                values: vec![ours, Some(*ratio)],
            }
        })
        .collect();
    let ours_name = match (&first_policy, measured) {
        (Some(p), true) => format!("ours, --idle {p}"),
        _ => "ours: the guest section did not complete on this host".into(),
    };
    let hot = panel(
        "Hot paths: guest / bare host (lmbench-style, median)",
        Unit::Ratio,
        &[(&ours_name, BLUE), ("seed 000: KVM / native", LIGHT)],
        vec![Group {
            title: String::new(),
            rows,
        }],
    );
    let stair: Vec<Row> = doc
        .probe
        .iter()
        .flat_map(|p| p.mem_lat.iter().flatten())
        .filter_map(|r| {
            let host = r.host_ns?;
            Some(Row {
                label: bytes(r.bytes),
                values: vec![r.guest_over_host, r.qemu_ns.map(|q| q / host)],
            })
        })
        .collect();
    let stair = panel(
        "Memory latency by working set: guest / host (same pointer chase)",
        Unit::Ratio,
        &[("probe in our partition", BLUE), ("probe in QEMU", ORANGE)],
        vec![Group {
            title: String::new(),
            rows: stair,
        }],
    );
    let cc: Vec<Row> = doc
        .crosscheck
        .iter()
        .flat_map(|c| c.rows.iter().flatten())
        .filter_map(|r| {
            let tool = r.theirs.split_whitespace().next()?;
            Some(Row {
                label: format!("{} ({tool})", r.row),
                values: vec![r.ours_over_theirs],
            })
        })
        .collect();
    let mut cross = panel(
        "Cross-checks: ours / an independent tool (green: within ±20%)",
        Unit::Ratio,
        &[("ours / theirs", BLUE)],
        vec![Group {
            title: String::new(),
            rows: cc,
        }],
    );
    cross.band = Some((
        1.0 - crate::crosscheck::TOLERANCE,
        1.0 + crate::crosscheck::TOLERANCE,
    ));
    vec![hot, stair, cross]
}

/// Submit to fence by doorbell mode: ours (red past the goal), the bare-host twin, QEMU.
pub fn submit(doc: &Results) -> Vec<Panel> {
    let Some(sub) = &doc.submit else {
        return Vec::new();
    };
    let mut groups: Vec<Group> = Vec::new();
    for mode in ["trap", "ioeventfd", "mapped"] {
        let rows: Vec<Row> = sub
            .guest
            .iter()
            .filter(|r| r.doorbell == mode)
            .map(|r| {
                let c = r.completion.as_str();
                let twin = sub
                    .host
                    .get(twin_index(mode, c))
                    .and_then(|t| median_ns(&t.submit_to_fence));
                let peer = sub
                    .qemu
                    .iter()
                    .find(|q| q.peer_of == format!("{mode}/{c} submit to fence"))
                    .and_then(|q| median_ns(&q.latency));
                Row {
                    label: format!("{c} completion, --idle {}", r.policy),
                    values: vec![median_ns(&r.submit_to_fence), twin, peer],
                }
            })
            .collect();
        if !rows.is_empty() {
            groups.push(Group {
                title: format!("doorbell {mode}"),
                rows,
            });
        }
    }
    vec![panel(
        "Submission engine: submit to fence, median",
        Unit::Nanos,
        &[
            ("ours (guest driver)", BLUE),
            ("bare-host twin", GREY),
            ("QEMU peer (edu)", ORANGE),
        ],
        groups,
    )]
}

/// Wakeups: IPI and shared-memory round trips and timer lateness, per idle policy and peer.
pub fn wake(doc: &Results) -> Vec<Panel> {
    let Some(w) = &doc.wake else {
        return Vec::new();
    };
    let who = |name: &str| {
        // Ours are the idle policies; every other row is a peer VMM's.
        if crate::wake::POLICIES.contains(&name) {
            0
        } else {
            2
        }
    };
    let measured: Vec<&WakeRow> = w
        .policies
        .iter()
        .flatten()
        .filter_map(|p| match p {
            PolicyRow::Measured(r) => Some(&**r),
            PolicyRow::Refused { .. } => None,
        })
        .chain(w.peers.iter().flatten())
        .collect();
    let metric = |m: &Option<WakeMetric>| m.as_ref().map(|m| m.median_ns);
    type Pick = fn(&WakeRow) -> &Option<WakeMetric>;
    type HostPick = fn(&WakeHost) -> &Option<WakeMetric>;
    let measure = |key: Pick, host_keys: &[(HostPick, &str)]| {
        let mut rows: Vec<Row> = measured
            .iter()
            .filter_map(|p| {
                let v = metric(key(p))?;
                let mut values = vec![None, None, None];
                values[who(&p.name)] = Some(v);
                let label = if who(&p.name) == 2 {
                    p.name.clone()
                } else {
                    format!("--idle {}", p.name)
                };
                Some(Row { label, values })
            })
            .collect();
        for (k, label) in host_keys {
            if let Some(v) = w.host.as_ref().and_then(|h| metric(k(h))) {
                rows.push(Row {
                    label: label.to_string(),
                    values: vec![None, Some(v), None],
                });
            }
        }
        rows
    };
    let groups = vec![
        Group {
            title: "IPI round trip (vCPU to vCPU and back)".into(),
            rows: measure(
                |r| &r.ipi_round_trip,
                &[
                    (|h| &h.futex_pingpong, "host: futex ping-pong"),
                    (|h| &h.spin_pingpong, "host: spin ping-pong"),
                ],
            ),
        },
        Group {
            title: "shared-memory round trip".into(),
            rows: measure(
                |r| &r.shm_round_trip,
                &[(|h| &h.spin_pingpong, "host: spin ping-pong")],
            ),
        },
        Group {
            title: "timer lateness".into(),
            rows: measure(
                |r| &r.timer_lateness,
                &[(|h| &h.timer_lateness, "host: timer")],
            ),
        },
    ];
    vec![panel(
        "Wakeups, median",
        Unit::Nanos,
        &[("ours", BLUE), ("bare host", GREY), ("peer VMMs", ORANGE)],
        groups,
    )]
}

/// Block: 4 KiB read latency, ours by doorbell and cache, QEMU's, the host's own reads.
pub fn blk(doc: &Results) -> Vec<Panel> {
    let Some(b) = &doc.blk else {
        return Vec::new();
    };
    let cache = |c: &str| c.split(':').next().unwrap_or("?").to_string();
    // Every peer's rows: QEMU's, then the Rust peers' (Firecracker's) that have any.
    let mut peers: Vec<GuestRow> = match &b.qemu {
        Some(Peers::Rows(r)) => r.clone(),
        _ => Vec::new(),
    };
    for p in &b.rust_peers {
        if let Peers::Rows(r) = &p.rows {
            peers.extend(r.iter().cloned());
        }
    }
    type Pick = fn(&GuestRow) -> &Option<Metric>;
    let rows = |key: Pick| {
        let mut out: Vec<Row> = Vec::new();
        for (list, slot) in [(b.ours.as_deref().unwrap_or_default(), 0), (&peers[..], 2)] {
            for r in list {
                let Some(v) = key(r).as_ref().map(|m| m.median) else {
                    continue;
                };
                let mut values = vec![None, None, None];
                values[slot] = Some(v);
                let label = if slot == 0 {
                    format!("ours {}, {}", r.name, cache(&r.cache))
                } else {
                    format!("{}, {}", r.name, cache(&r.cache))
                };
                out.push(Row { label, values });
            }
        }
        for r in b.host.iter().flatten() {
            if let Some(m) = &r.lat4k {
                out.push(Row {
                    label: r.name.clone(),
                    values: vec![None, Some(m.median), None],
                });
            }
        }
        out
    };
    vec![panel(
        "virtio-blk: one 4 KiB read, median",
        Unit::Nanos,
        &[("ours", BLUE), ("bare host", GREY), ("peer", ORANGE)],
        vec![
            Group {
                title: "the guest polls for the completion".into(),
                rows: rows(|r| &r.lat4k_guest_polls),
            },
            Group {
                title: "the guest waits for the interrupt".into(),
                rows: rows(|r| &r.lat4k_guest_waits_for_irq),
            },
        ],
    )]
}

/// Noise: the time the host takes from the core per second, ours beside the bare twin and
/// QEMU, on the pinned core and on the reserved one, quiet and beside the neighbour.
pub fn noise(doc: &Results) -> Vec<Panel> {
    let Some(rows) = doc.noise.as_ref().and_then(|n| n.rows.as_ref()) else {
        return Vec::new();
    };
    let lost = |case: &str, neighbour: bool| {
        rows.iter()
            .find(|r| r.case == case && r.neighbour == neighbour)
            .and_then(|r| r.metrics.get("noise_us_per_s"))
            // us per second, drawn in ns: "28 ms" lost in each second.
            .map(|s| s.median * 1000.0)
    };
    let group = |neighbour: bool, title: &str| Group {
        title: title.into(),
        rows: vec![
            Row {
                label: "core pinned".into(),
                values: vec![
                    lost("partition", neighbour),
                    lost("bare", neighbour),
                    lost("qemu", neighbour),
                ],
            },
            Row {
                label: "core reserved".into(),
                values: vec![
                    lost("partition-reserved", neighbour),
                    lost("bare-reserved", neighbour),
                    None,
                ],
            },
        ],
    };
    vec![panel(
        "noise: time the host took from the core in each second, median",
        Unit::Nanos,
        &[("ours", BLUE), ("bare twin", GREY), ("QEMU peer", ORANGE)],
        vec![group(false, "quiet"), group(true, "beside the neighbour")],
    )]
}

/// Memory set-up: launch to the first serial byte and the VMM's CPU time, by guest size and
/// source (ours and QEMU's).
pub fn memsetup(doc: &Results) -> Vec<Panel> {
    let rows: &[MemSetupRow] = doc
        .memsetup
        .as_ref()
        .and_then(|m| m.rows.as_deref())
        .unwrap_or_default();
    let mut sizes: Vec<u64> = rows.iter().map(|r| r.size_bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    type Pick = fn(&MemSetupRow) -> &Option<Summary>;
    let group = |key: Pick| -> Vec<Group> {
        sizes
            .iter()
            .map(|&size| Group {
                title: format!("{} guest", bytes(size)),
                rows: rows
                    .iter()
                    .filter(|r| r.size_bytes == size)
                    .filter_map(|r| {
                        let v = key(r).as_ref()?.median;
                        // Ours are the three memory sources of `partition launch`; every
                        // other row is a peer VMM's (QEMU, Cloud Hypervisor, Firecracker).
                        let slot = if crate::memsetup::OURS.contains(&r.source.as_str()) {
                            0
                        } else {
                            1
                        };
                        let mut values = vec![None, None];
                        values[slot] = Some(v);
                        Some(Row {
                            label: r.source.clone(),
                            values,
                        })
                    })
                    .collect(),
            })
            .collect()
    };
    let s = [("ours", BLUE), ("peer VMMs", ORANGE)];
    vec![
        panel(
            "Launch to the guest's first serial byte, median",
            Unit::Millis,
            &s,
            group(|r| &r.first_byte_ms),
        ),
        panel(
            "The VMM's own CPU time to the first byte, median",
            Unit::Millis,
            &s,
            group(|r| &r.vmm_cpu_ms_at_first_byte),
        ),
    ]
}

/// A passed-through controller's reads (submit-vfio): by completion, ours beside the
/// bare-host twin and QEMU with the same device.
pub fn submit_vfio(doc: &Results) -> Vec<Panel> {
    let Some(s) = &doc.submit_vfio else {
        return Vec::new();
    };
    let groups = ["poll", "irq"]
        .iter()
        .map(|c| {
            let of = |who: &str| {
                s.rows
                    .iter()
                    .find(|r| r.completion == *c && r.who == who)
                    .and_then(|r| median_ns(&r.latency))
            };
            Group {
                title: format!("{c} completion"),
                rows: vec![Row {
                    label: "one 4 KiB read".into(),
                    values: vec![of("partition"), of("bare-host twin"), of("QEMU vfio-pci")],
                }],
            }
        })
        .collect();
    let device = s.device.as_deref().unwrap_or("a passed-through device");
    vec![panel(
        &format!("Passthrough: {device}, submit to completion, median"),
        Unit::Nanos,
        &[
            ("ours", BLUE),
            ("bare-host twin (VFIO from host userspace)", GREY),
            ("QEMU vfio-pci", ORANGE),
        ],
        groups,
    )]
}

/// Exits per operation (exits): ours beside QEMU's, per operation (log axis: an operation
/// with no exit has no bar).
pub fn exits(doc: &Results) -> Vec<Panel> {
    let Some(e) = &doc.exits else {
        return Vec::new();
    };
    let of = |vmm: &str, op: &str| {
        e.rows
            .iter()
            .find(|r| r.vmm == vmm && r.op == op)
            .and_then(|r| r.total)
            .map(|t| t.median)
    };
    let rows = e
        .params
        .ops
        .iter()
        .map(|op| Row {
            label: op.clone(),
            values: vec![of("partition", op), of("qemu", op)],
        })
        .collect();
    vec![panel(
        "Exits per operation on real KVM (kvm_amd), counted by the host's tracepoint, median",
        Unit::Count,
        &[("ours", BLUE), ("QEMU", ORANGE)],
        vec![Group {
            title: String::new(),
            rows,
        }],
    )]
}

/// Every picture of `doc` that has figures: (file name, SVG text), named after `host`.
pub fn all(doc: &Results, host: &str) -> Vec<(String, String)> {
    let mut out = vec![(format!("{host}-ratios.svg"), svg(&ratios(doc)))];
    for (name, draw) in [
        ("submit", submit as fn(&Results) -> Vec<Panel>),
        ("wake", wake),
        ("noise", noise),
        ("blk", blk),
        ("memsetup", memsetup),
        ("submit-vfio", submit_vfio),
        ("exits", exits),
    ] {
        if doc.head(name).is_some() {
            out.push((format!("{host}-{name}.svg"), svg(&draw(doc))));
        }
    }
    out
}

/// Writes [`all`] beside `results`; the paths written.
/// Each is put in the results' directory by descriptor, never written through a link
/// planted at its name (`crate::outdir`).
pub fn write(doc: &Results, results: &Path, host: &str) -> Result<Vec<PathBuf>, String> {
    let dir = crate::outdir::OutDir::of(results)?;
    all(doc, host)
        .into_iter()
        .map(|(name, text)| dir.replace(std::ffi::OsStr::new(&name), text.as_bytes()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(name: &str) -> Results {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("results")
            .join(name);
        let doc = Results::read(&p).unwrap();
        assert!(doc.unreadable.is_empty(), "{:?}", doc.unreadable);
        doc
    }

    /// Renders `text` as resvg would show it; the count of pixels of `colour`.
    fn pixels(text: &str, colour: &str) -> usize {
        let opt = resvg::usvg::Options::default();
        let tree = resvg::usvg::Tree::from_str(text, &opt).expect("the SVG parses");
        let size = tree.size().to_int_size();
        let mut pm = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
        resvg::render(
            &tree,
            resvg::tiny_skia::Transform::default(),
            &mut pm.as_mut(),
        );
        let png = pm.encode_png().expect("it encodes as PNG");
        assert!(png.len() > 1000, "an empty PNG");
        let rgb = u32::from_str_radix(colour.trim_start_matches('#'), 16).unwrap();
        let want = [(rgb >> 16) as u8, (rgb >> 8) as u8, rgb as u8];
        pm.pixels()
            .iter()
            .filter(|p| [p.red(), p.green(), p.blue()] == want && p.alpha() == 255)
            .count()
    }

    #[test]
    fn every_chart_of_the_committed_results_renders_with_its_bars() {
        let doc = committed("vm.json");
        let charts = all(&doc, "vm");
        let names: Vec<&str> = charts.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "vm-ratios.svg",
                "vm-submit.svg",
                "vm-wake.svg",
                "vm-noise.svg",
                "vm-blk.svg",
                "vm-memsetup.svg"
            ]
        );
        for (name, text) in &charts {
            // Rendered to a PNG, each shows bars of ours (blue): a chart that broke (bad
            // markup, bars off the canvas, nothing drawn) does not.
            let blue = pixels(text, BLUE);
            assert!(blue > 1500, "{name}: {blue} blue pixels");
            // Every bar carries its value.
            assert_eq!(
                text.matches(r#"class="bar""#).count(),
                text.matches(r#"class="value""#).count(),
                "{name}"
            );
        }
        let find = |n: &str| &charts.iter().find(|c| c.0 == n).unwrap().1;
        // The seed's bars are drawn beside ours, on a log axis marked at 1x.
        let ratios = find("vm-ratios.svg");
        assert!(pixels(ratios, LIGHT) > 500);
        assert!(ratios.contains(">1x</text>") && ratios.contains(">0.1x</text>"));
        assert!(
            ratios.contains(">1000x</text>"),
            "the log axis reaches our 3000x"
        );
        assert!(
            ratios.contains(">1.42x</text>"),
            "seed 000's null syscall ratio"
        );
        // Working sets in KiB and MiB.
        assert!(ratios.contains(">4 KiB</text>") && ratios.contains(">1 MiB</text>"));
        // Submit: grouped by doorbell mode, the twin and the QEMU peer beside ours.
        let sub = find("vm-submit.svg");
        for g in ["doorbell trap", "doorbell ioeventfd", "doorbell mapped"] {
            assert!(sub.contains(&format!(">{g}</text>")), "{g}");
        }
        assert!(pixels(sub, GREY) > 200 && pixels(sub, ORANGE) > 100);
        assert!(find("vm-memsetup.svg").contains(">256 MiB guest</text>"));
        // Noise: the pinned and the reserved core, quiet and beside the neighbour.
        let noise = find("vm-noise.svg");
        for t in [
            "quiet",
            "beside the neighbour",
            "core pinned",
            "core reserved",
        ] {
            assert!(noise.contains(&format!(">{t}</text>")), "{t}");
        }
        assert!(pixels(noise, GREY) > 200 && pixels(noise, ORANGE) > 100);
    }

    #[test]
    fn a_results_file_without_a_section_draws_no_picture_for_it() {
        let doc = committed("rig.json");
        let charts = all(&doc, "rig");
        let names: Vec<&str> = charts.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(
            names,
            ["rig-ratios.svg", "rig-submit-vfio.svg", "rig-exits.svg"]
        );
        // Exits: a bar of ours and of QEMU's for each operation that takes any.
        let exits = &charts[2].1;
        assert!(pixels(exits, BLUE) > 500 && pixels(exits, ORANGE) > 500);
        let e = doc.exits.as_ref().unwrap();
        let pipe = e
            .rows
            .iter()
            .find(|r| r.vmm == "partition" && r.op == "pipe_2cores")
            .and_then(|r| r.total)
            .expect("the partition's pipe row");
        assert!(exits.contains(&format!(">{}</text>", Unit::Count.show(pipe.median))));
        let text = &charts[0].1;
        assert!(text.contains("the guest section did not complete"));
        let legend = 3 * 12 * 12;
        assert!(
            pixels(text, BLUE) <= legend + 50,
            "no bars of ours, only the legends"
        );
        assert!(pixels(text, LIGHT) > 500, "the seed's bars");
        let vfio = &charts[1].1;
        assert!(pixels(vfio, BLUE) > 500 && pixels(vfio, GREY) > 500 && pixels(vfio, ORANGE) > 500);
        // The partition's polled read, labelled as the file records it.
        let s = doc.submit_vfio.as_ref().unwrap();
        let polled = s
            .rows
            .iter()
            .find(|r| r.completion == "poll" && r.who == "partition")
            .and_then(|r| median_ns(&r.latency))
            .expect("the partition's polled row");
        let label = format!(">{}</text>", Unit::Nanos.show(polled));
        assert!(
            vfio.contains(&label),
            "the partition's polled read: {label}"
        );
    }
}
