//! Two ways of running the same VMM paths, measured A B A B in one run: this build against
//! a baseline build (`builds`), or one build with and without a setting. Each variant runs
//! the probe guest twice per round:
//!
//! - `probe.bench=paths` (no memory staircase): the doorbell (a QueueNotify write answered
//!   by an ioeventfd in the kernel) and an MMIO read (an exit to our userspace transport);
//!   the launch's first serial byte from the same run (`partition launch --json`);
//! - `probe.blk=lat,fence` against a 16 MiB image with a polling queue worker
//!   (`poll_us=200`): 4 KiB random reads and GET_ID fences at depth 1, the guest polling
//!   the used ring and waiting for the interrupt.
//!
//! The variants' order is swapped every round; each cell is the median of the per-run
//! medians with the min-max spread over runs. A verdict per path says whether the second
//! variant is slower than the first beyond the spread.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::doc::compare::{CompareParams, CompareSection, VariantDoc, Verdict};
use crate::head::{Cell, Head};
use crate::stats::{Summary, faster, summary};
use crate::{Env, Launch, LaunchJson, pretty, timed_run};

const IMAGE_BYTES: u64 = 16 << 20;
const SAMPLES: usize = 500;
const GAP_US: u64 = 50;

/// One way of running the paths.
pub struct Variant {
    /// Its name in the results.
    pub name: String,
    /// The `partition` binary.
    pub partition: PathBuf,
    /// Extra `partition launch` arguments.
    pub args: Vec<String>,
}

/// The paths compared, each as (results key, what the probe prints it as, unit).
const PATHS: [(&str, &str); 6] = [
    ("doorbell_ioeventfd", "paths/mmio_doorbell"),
    ("mmio_read_exit", "paths/mmio_read"),
    ("blk_lat4k_guest_polls", "blk/lat4k/poll"),
    ("blk_lat4k_guest_waits_for_irq", "blk/lat4k/irq"),
    ("blk_fence_guest_polls", "blk/fence/poll"),
    ("first_output", "launch/first_output"),
];

#[derive(Default)]
struct Runs {
    values: BTreeMap<String, Vec<f64>>,
    failures: Vec<String>,
    commands: Vec<String>,
}

impl Runs {
    fn summary(&self, k: &str) -> Option<Summary> {
        self.values.get(k).and_then(|v| summary(v))
    }
    fn add(&mut self, k: String, v: f64) {
        self.values.entry(k).or_default().push(v);
    }
}

fn launch(env: &Env, v: &Variant, state: &Path, cmdline: &str) -> Launch {
    let env = Env {
        partition: v.partition.clone(),
        ..env.clone()
    };
    let mut l = Launch::new(&env, state, &env.core.to_string(), "64M")
        .probe()
        .cmdline(cmdline)
        .json();
    for a in &v.args {
        l = l.arg(a);
    }
    l
}

/// One launch of `v` with `cmdline` and the image as a disk (`disk_opts` after its path);
/// `record` reads what the run reported into `out`, or says why it cannot.
fn once(
    env: &Env,
    v: &Variant,
    image: &Path,
    (cmdline, disk_opts): (&str, &str),
    what: &str,
    out: &mut Runs,
    record: impl FnOnce(&crate::Run, &mut Runs) -> Result<(), String>,
) {
    let c = launch(env, v, &env.work.join("compare-state"), cmdline)
        .disk(image, disk_opts)
        .command();
    if out.commands.len() < 2 {
        out.commands.push(pretty(&c));
    }
    let r = match timed_run(c, Duration::from_secs(120)) {
        Ok(r) => r,
        Err(e) => return out.failures.push(format!("{what}: {e}")),
    };
    if let Err(why) = record(&r, out) {
        out.failures.push(format!(
            "{what}: exit {:?}, {why}; {}",
            r.status.code(),
            r.stderr.lines().last().unwrap_or("")
        ));
    }
}

fn paths_once(env: &Env, v: &Variant, image: &Path, out: &mut Runs) {
    let cmdline = "probe.memtest=0 probe.bench=paths probe.paths_max_mem=0";
    once(env, v, image, (cmdline, ""), "paths", out, |r, out| {
        let p = crate::probe::parse(&r.stdout);
        let j = LaunchJson::from_stdout(&r.stdout)?;
        if r.status.code() != Some(0) || !p.ok {
            return Err(format!("paths complete {}", p.ok));
        }
        for (k, (m, _, _)) in p.tests {
            out.add(format!("paths/{k}"), m);
        }
        if let Some(ms) = j.timings.first_output_ms {
            out.add("launch/first_output".into(), ms * 1e6);
        }
        Ok(())
    });
}

fn blk_once(env: &Env, v: &Variant, image: &Path, out: &mut Runs) {
    let cmdline = format!(
        "probe.memtest=0 probe.blk=lat,fence probe.blk_n={SAMPLES} probe.blk_gap_us={GAP_US}"
    );
    once(
        env,
        v,
        image,
        (&cmdline, ",poll_us=200"),
        "blk",
        out,
        |r, out| {
            let p = crate::blk::parse_probe(&r.stdout);
            if r.status.code() != Some(0) || !p.ok {
                return Err(format!("result ok {}", p.ok));
            }
            for (k, (m, _)) in p.lat {
                out.add(format!("blk/{k}"), m);
            }
            Ok(())
        },
    );
}

/// Measures `a` and `b` alternately for `env.runs` rounds; the section's body (the caller
/// adds what the comparison is about).
pub fn run(env: &Env, a: &Variant, b: &Variant) -> CompareSection {
    let mut section = CompareSection {
        head: Head::start(env),
        params: CompareParams {
            runs: env.runs,
            vcpu_core: env.core,
            image_bytes: IMAGE_BYTES,
            blk_samples_per_run: SAMPLES,
            blk_gap_us: GAP_US,
            worker_poll_us: 200,
            guest: "probe guest, 1 vCPU, 64 MiB anonymous memory, one virtio-blk disk".into(),
        },
        method: "see benchmarks/src/compare.rs: per round each variant runs the probe's paths \
                 (no staircase) and its blk lat,fence tests; the variants' order swaps every \
                 round; cells are medians of per-run medians with min-max spread"
            .into(),
        question: None,
        variants: Vec::new(),
        verdicts: Vec::new(),
    };
    let image = env.work.join("compare.img");
    if let Err(e) = crate::host::make_image(&image, IMAGE_BYTES) {
        section
            .head
            .fail(format!("making {}: {e}", image.display()));
        return section;
    }
    let variants = [a, b];
    let mut runs: Vec<Runs> = vec![Runs::default(), Runs::default()];
    for round in 0..env.runs {
        for k in 0..2 {
            let i = (k + round) % 2;
            paths_once(env, variants[i], &image, &mut runs[i]);
            blk_once(env, variants[i], &image, &mut runs[i]);
        }
    }
    let _ = std::fs::remove_file(&image);
    section.variants = variants
        .iter()
        .zip(&runs)
        .map(|(v, r)| VariantDoc {
            name: v.name.clone(),
            partition: v.partition.clone(),
            args: v.args.clone(),
            paths: PATHS
                .iter()
                .map(|(k, src)| (k.to_string(), r.summary(src).as_ref().map(Cell::of)))
                .collect(),
            commands: r.commands.clone(),
            failures: r.failures.clone(),
        })
        .collect();
    section.verdicts = PATHS
        .iter()
        .map(|(k, src)| {
            let (sa, sb) = (runs[0].summary(src), runs[1].summary(src));
            Verdict {
                path: k.to_string(),
                first_median_ns: sa.map(|s| s.median),
                second_median_ns: sb.map(|s| s.median),
                second_over_first: sa.zip(sb).map(|(a, b)| b.median / a.median),
                second_slower_beyond_spread: faster(sa, sb),
            }
        })
        .collect();
    let missing = |r: &Runs| -> Vec<String> {
        PATHS
            .iter()
            .filter(|(_, src)| r.values.get(*src).map_or(0, Vec::len) != env.runs)
            .map(|(k, _)| k.to_string())
            .collect()
    };
    let complete = runs
        .iter()
        .all(|r| r.failures.is_empty() && missing(r).is_empty());
    section.head.finish(complete, || {
        variants
            .iter()
            .zip(&runs)
            .filter(|(_, r)| !missing(r).is_empty() || !r.failures.is_empty())
            .map(|(v, r)| {
                format!(
                    "{}: incomplete {:?}; {:?}",
                    v.name,
                    missing(r),
                    r.failures.iter().take(3).collect::<Vec<_>>()
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    });
    section
}

/// `builds`: the baseline build first, this build second.
pub fn builds(env: &Env) -> Option<CompareSection> {
    let base = env.baseline.clone()?;
    let baseline = Variant {
        name: format!("baseline ({})", base.label),
        partition: base.partition,
        args: Vec::new(),
    };
    let current = Variant {
        name: "this build".into(),
        partition: env.partition.clone(),
        args: Vec::new(),
    };
    let mut s = run(env, &baseline, &current);
    s.question = Some(
        "is this build slower than the baseline on the doorbell and polled block paths? \
         (first = baseline, second = this build)"
            .into(),
    );
    Some(s)
}

/// `sandbox`: this build with `--no-sandbox` first, confined (the default) second: what the
/// seccomp filters, the unprivileged user and the pre-started queue threads cost on the
/// doorbell, MMIO-exit and block paths and on launch to first byte.
pub fn sandbox(env: &Env) -> CompareSection {
    let off = Variant {
        name: "--no-sandbox".into(),
        partition: env.partition.clone(),
        args: vec!["--no-sandbox".into()],
    };
    let on = Variant {
        name: "sandboxed".into(),
        partition: env.partition.clone(),
        args: Vec::new(),
    };
    let mut s = run(env, &off, &on);
    s.question = Some(
        "what does confinement cost? (first = --no-sandbox, second = sandboxed: the \
         partition user, no capabilities, a seccomp filter per thread)"
            .into(),
    );
    s
}
