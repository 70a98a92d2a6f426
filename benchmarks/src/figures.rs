//! Which pictures the report draws, from the results file: the guest/host ratios
//! (`<host>-ratios.svg`: the hot paths beside seed 000, the memory staircase, the
//! cross-checks), and one picture per section that has figures of its own: submit (grouped
//! by doorbell mode, ours beside the bare-host twin and the QEMU peer), wake, blk and
//! memsetup. Every axis is logarithmic and every bar carries its value ([`crate::chart`]).

use std::path::{Path, PathBuf};

use serde_json::Value;

use partition::config::size::format as bytes;

use crate::chart::{BLUE, GREY, Group, LIGHT, ORANGE, Panel, Row, Unit, svg};
use crate::lookup::{SEED, completed, guest_values, host_value, twin_index};

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

fn median_ns(v: &Value) -> Option<f64> {
    v["median_ns"].as_f64()
}

/// The ratios picture: hot paths (seed 000 and ours), the memory staircase by working set,
/// the cross-checks against their ±20% band.
pub fn ratios(doc: &Value) -> Vec<Panel> {
    let first_policy = doc["sections"]["guest"]["policies"]
        .as_array()
        .and_then(|a| a.first())
        .and_then(|p| p["policy"].as_str())
        .map(String::from);
    let measured = completed(doc, "guest") == Some(true);
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
    let stair: Vec<Row> = doc["sections"]["probe"]["mem_lat"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let host = r["host_ns"].as_f64()?;
            Some(Row {
                label: bytes(r["bytes"].as_u64()?),
                values: vec![
                    r["guest_over_host"].as_f64(),
                    r["qemu_ns"].as_f64().map(|q| q / host),
                ],
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
    let cc: Vec<Row> = doc["sections"]["crosscheck"]["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let tool = r["theirs"].as_str()?.split_whitespace().next()?;
            Some(Row {
                label: format!("{} ({tool})", r["row"].as_str()?),
                values: vec![r["ours_over_theirs"].as_f64()],
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
pub fn submit(doc: &Value) -> Vec<Panel> {
    let sub = &doc["sections"]["submit"];
    let host = sub["host"].as_array().cloned().unwrap_or_default();
    let qemu = sub["qemu"].as_array().cloned().unwrap_or_default();
    let mut groups: Vec<Group> = Vec::new();
    for mode in ["trap", "ioeventfd", "mapped"] {
        let rows: Vec<Row> = sub["guest"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["doorbell"].as_str() == Some(mode))
            .map(|r| {
                let c = r["completion"].as_str().unwrap_or("?");
                let twin = host
                    .get(twin_index(mode, c))
                    .and_then(|t| median_ns(&t["submit_to_fence"]));
                let peer = qemu
                    .iter()
                    .find(|q| q["peer_of"].as_str() == Some(&format!("{mode}/{c} submit to fence")))
                    .and_then(|q| median_ns(&q["latency"]));
                Row {
                    label: format!(
                        "{c} completion, --idle {}",
                        r["policy"].as_str().unwrap_or("?")
                    ),
                    values: vec![median_ns(&r["submit_to_fence"]), twin, peer],
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
pub fn wake(doc: &Value) -> Vec<Panel> {
    let w = &doc["sections"]["wake"];
    let who = |name: &str| {
        if name.starts_with("qemu") { 2 } else { 0 }
    };
    let measure = |key: &str, host_keys: &[(&str, &str)]| {
        let mut rows: Vec<Row> = w["policies"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(w["peers"].as_array().into_iter().flatten())
            .filter_map(|p| {
                let name = p["name"].as_str()?;
                let v = median_ns(&p[key])?;
                let mut values = vec![None, None, None];
                values[who(name)] = Some(v);
                let label = if who(name) == 2 {
                    name.to_string()
                } else {
                    format!("--idle {name}")
                };
                Some(Row { label, values })
            })
            .collect();
        for (k, label) in host_keys {
            if let Some(v) = median_ns(&w["host"][*k]) {
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
                "ipi_round_trip",
                &[
                    ("futex_pingpong", "host: futex ping-pong"),
                    ("spin_pingpong", "host: spin ping-pong"),
                ],
            ),
        },
        Group {
            title: "shared-memory round trip".into(),
            rows: measure(
                "shm_round_trip",
                &[("spin_pingpong", "host: spin ping-pong")],
            ),
        },
        Group {
            title: "timer lateness".into(),
            rows: measure("timer_lateness", &[("timer_lateness", "host: timer")]),
        },
    ];
    vec![panel(
        "Wakeups, median",
        Unit::Nanos,
        &[("ours", BLUE), ("bare host", GREY), ("QEMU peer", ORANGE)],
        groups,
    )]
}

/// Block: 4 KiB read latency, ours by doorbell and cache, QEMU's, the host's own reads.
pub fn blk(doc: &Value) -> Vec<Panel> {
    let b = &doc["sections"]["blk"];
    let cache = |r: &Value| {
        r["cache"]
            .as_str()
            .and_then(|c| c.split(':').next())
            .unwrap_or("?")
            .to_string()
    };
    let rows = |key: &str| {
        let mut out: Vec<Row> = Vec::new();
        for (list, slot) in [("ours", 0), ("qemu", 2)] {
            for r in b[list].as_array().into_iter().flatten() {
                let Some(v) = r[key]["median"].as_f64() else {
                    continue;
                };
                let mut values = vec![None, None, None];
                values[slot] = Some(v);
                let name = r["name"].as_str().unwrap_or("?");
                let label = if slot == 0 {
                    format!("ours {name}, {}", cache(r))
                } else {
                    format!("{name}, {}", cache(r))
                };
                out.push(Row { label, values });
            }
        }
        for r in b["host"].as_array().into_iter().flatten() {
            if let (Some(name), Some(v)) = (r["name"].as_str(), r["lat4k"]["median"].as_f64()) {
                out.push(Row {
                    label: name.to_string(),
                    values: vec![None, Some(v), None],
                });
            }
        }
        out
    };
    vec![panel(
        "virtio-blk: one 4 KiB read, median",
        Unit::Nanos,
        &[("ours", BLUE), ("bare host", GREY), ("QEMU peer", ORANGE)],
        vec![
            Group {
                title: "the guest polls for the completion".into(),
                rows: rows("lat4k_guest_polls"),
            },
            Group {
                title: "the guest waits for the interrupt".into(),
                rows: rows("lat4k_guest_waits_for_irq"),
            },
        ],
    )]
}

/// Memory set-up: launch to the first serial byte and the VMM's CPU time, by guest size and
/// source (ours and QEMU's).
pub fn memsetup(doc: &Value) -> Vec<Panel> {
    let rows = doc["sections"]["memsetup"]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut sizes: Vec<u64> = rows
        .iter()
        .filter_map(|r| r["size_bytes"].as_u64())
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let group = |key: &str| -> Vec<Group> {
        sizes
            .iter()
            .map(|&size| Group {
                title: format!("{} guest", bytes(size)),
                rows: rows
                    .iter()
                    .filter(|r| r["size_bytes"].as_u64() == Some(size))
                    .filter_map(|r| {
                        let source = r["source"].as_str()?;
                        let v = r[key]["median"].as_f64()?;
                        let slot = if source.starts_with("qemu") { 1 } else { 0 };
                        let mut values = vec![None, None];
                        values[slot] = Some(v);
                        Some(Row {
                            label: source.to_string(),
                            values,
                        })
                    })
                    .collect(),
            })
            .collect()
    };
    let s = [("ours", BLUE), ("QEMU microvm", ORANGE)];
    vec![
        panel(
            "Launch to the guest's first serial byte, median",
            Unit::Millis,
            &s,
            group("first_byte_ms"),
        ),
        panel(
            "The VMM's own CPU time to the first byte, median",
            Unit::Millis,
            &s,
            group("vmm_cpu_ms_at_first_byte"),
        ),
    ]
}

/// A passed-through controller's reads (submit-vfio): by completion, ours beside the
/// bare-host twin and QEMU with the same device.
pub fn submit_vfio(doc: &Value) -> Vec<Panel> {
    let s = &doc["sections"]["submit-vfio"];
    let groups = ["poll", "irq"]
        .iter()
        .map(|c| {
            let of = |who: &str| {
                s["rows"].as_array().into_iter().flatten().find_map(|r| {
                    (r["completion"].as_str() == Some(c) && r["who"].as_str() == Some(who))
                        .then(|| median_ns(&r["latency"]))
                        .flatten()
                })
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
    let device = s["device"].as_str().unwrap_or("a passed-through device");
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

/// Every picture of `doc` that has figures: (file name, SVG text), named after `host`.
pub fn all(doc: &Value, host: &str) -> Vec<(String, String)> {
    let has = |s: &str| doc["sections"][s].is_object();
    let mut out = vec![(format!("{host}-ratios.svg"), svg(&ratios(doc)))];
    for (name, draw) in [
        ("submit", submit as fn(&Value) -> Vec<Panel>),
        ("wake", wake),
        ("blk", blk),
        ("memsetup", memsetup),
        ("submit-vfio", submit_vfio),
    ] {
        if has(name) {
            out.push((format!("{host}-{name}.svg"), svg(&draw(doc))));
        }
    }
    out
}

/// Writes [`all`] beside `results`; the paths written.
pub fn write(doc: &Value, results: &Path, host: &str) -> Result<Vec<PathBuf>, String> {
    all(doc, host)
        .into_iter()
        .map(|(name, text)| {
            let p = results.with_file_name(&name);
            std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
            Ok(p)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(name: &str) -> Value {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("results")
            .join(name);
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
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
    }

    #[test]
    fn a_results_file_without_a_section_draws_no_picture_for_it() {
        let doc = committed("rig.json");
        let charts = all(&doc, "rig");
        let names: Vec<&str> = charts.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(names, ["rig-ratios.svg", "rig-submit-vfio.svg"]);
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
        assert!(
            vfio.contains(">92.5 µs</text>"),
            "the partition's polled read"
        );
    }
}
