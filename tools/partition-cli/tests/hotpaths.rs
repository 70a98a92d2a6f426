//! The benchmark vehicles end to end: the embedded hotpaths binary runs and reports every
//! benchmark it is asked for; the probe guest's `paths` bench times the VMM's paths and
//! walks the memory staircase; `bench --report` renders a results file; bad bench
//! arguments are refused. No timing is asserted: only that what is measured is there,
//! positive and finite.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(300);

/// The tests that launch guests or run `bench` (which reserves a core for its cases) take
/// turns: run side by side, a bench could not have its reserved core while another test's
/// guest or bench held it, and its section came out incomplete (1 run in 6 here).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn the_embedded_hotpaths_binary_is_static_and_reports_what_it_is_asked() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("hotpaths-bin");
    let bin = dir.path("hotpaths");
    let out = run(&["hotpaths-binary", "-o", bin.to_str().unwrap()], LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // Static: no PT_INTERP program header (it must run from a busybox initramfs).
    let elf = std::fs::read(&bin).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[32..40].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    assert!(phnum > 0);
    for i in 0..phnum {
        let t = u32::from_le_bytes(elf[phoff + i * phentsize..][..4].try_into().unwrap());
        assert_ne!(t, 3, "hotpaths has a program interpreter (PT_INTERP)");
    }
    let o = std::process::Command::new(&bin)
        .args([
            "--json",
            "--runs",
            "2",
            "--enough-us",
            "200",
            "--max-mem",
            "65536",
        ])
        .args([
            "--only",
            "null_syscall,sig_catch,pipe_1core,fork_exec,mem_lat",
        ])
        .arg("--dir")
        .arg(dir.path(""))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["runs"], 2);
    let names: Vec<&str> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "null_syscall",
            "sig_catch",
            "pipe_1core",
            "fork_exec",
            "mem_lat_512",
            "mem_lat_1024",
            "mem_lat_2048",
            "mem_lat_4096",
            "mem_lat_8192",
            "mem_lat_16384",
            "mem_lat_32768",
            "mem_lat_65536"
        ]
    );
    for r in doc["results"].as_array().unwrap() {
        let m = r["median"].as_f64().unwrap();
        assert!(m.is_finite() && m >= 0.0, "{r}");
        assert_eq!(r["per_run"].as_array().unwrap().len(), 2, "{r}");
    }
    assert!(
        doc["errors"].as_object().unwrap().is_empty(),
        "{}",
        doc["errors"]
    );
    // Its scratch directory is gone.
    let left: Vec<_> = std::fs::read_dir(dir.path(""))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("hotpaths."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // Bad arguments are refused with status 2.
    let o = std::process::Command::new(&bin)
        .args(["--cpus", "1,2,3"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn the_probe_times_the_vmm_paths_and_walks_the_staircase() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !kvm_available("the_probe_times_the_vmm_paths_and_walks_the_staircase") {
        return;
    }
    let dir = Scratch::new("probe-paths");
    let disk = dir.file("d.img", &vec![0u8; 1 << 20]);
    let out = run(
        &[
            "launch",
            "--cores",
            "0",
            "--memory",
            "64M",
            "--probe",
            "--disk",
            &format!("path={}", disk.display()),
            "--cmdline",
            "probe.memtest=0 probe.bench=paths probe.paths_n=20 probe.paths_max_mem=1048576",
        ],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}\n{}", out.stderr, out.stdout);
    let line = |t: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(&format!("probe: paths test={t} ")))
            .map(String::from)
    };
    for t in ["cpuid", "service", "mmio_read", "mmio_doorbell"] {
        let l = line(t).unwrap_or_else(|| panic!("no {t} in:\n{}", out.stdout));
        let median: u64 = l
            .split_whitespace()
            .find_map(|w| w.strip_prefix("median_ns="))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(median > 0, "{l}");
    }
    // A port read: in ring 3, or (a hypervisor refusing IOPL 3) through the service.
    assert!(
        line("pio_in").is_some() || line("pio_in_service").is_some(),
        "{}",
        out.stdout
    );
    let sizes: Vec<u64> = out
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("probe: paths mem_lat size="))
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(sizes, (9..=20).map(|s| 1u64 << s).collect::<Vec<_>>());
    assert!(out.stdout.contains("probe: paths end"));
    // The MMIO reads exited to the VMM (12 repetitions of 20); the doorbell writes did
    // not: KVM answered them through the ioeventfd.
    let exits = out
        .stderr
        .lines()
        .find(|l| l.contains("exits:"))
        .unwrap_or("");
    assert!(exits.contains("mmio_read=240"), "{exits}");
    assert!(!exits.contains("mmio_write"), "{exits}");
}

/// `partition ARGS` is refused as bad input: exit 2, with `why` on stderr.
fn refused(args: &[&str], why: &str) {
    let out = run(args, LIMIT);
    assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr);
    assert!(out.stderr.contains(why), "{args:?}: {}", out.stderr);
}

#[test]
fn bench_refuses_bad_arguments_and_reports_from_a_results_file() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = run(&["bench", "--only", "nosuch"], LIMIT);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("no section \"nosuch\""),
        "{}",
        out.stderr
    );
    let out = run(&["bench", "--runs", "0"], LIMIT);
    assert_eq!(out.code(), 2);
    // The builds section compares with another build, which must be given and exist.
    let out = run(&["bench", "--only", "builds"], LIMIT);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("needs --baseline"), "{}", out.stderr);
    // The exits section needs its guest, and its loop counts must be N1 < N2.
    let out = run(&["bench", "--only", "exits"], LIMIT);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("needs --exits-guest"), "{}", out.stderr);
    for bad in ["5,5", "50", "0,10", "x,y", "10,5"] {
        let out = run(&["bench", "--exits-count", bad, "--list"], LIMIT);
        assert_eq!(out.code(), 2, "--exits-count {bad}: {}", out.stderr);
        assert!(out.stderr.contains("N1,N2"), "{bad}: {}", out.stderr);
    }
    // Its idle policies are known names, each once.
    for (bad, why) in [
        ("mwait,bogus", "not an idle policy"),
        ("hlt,hlt", "named twice"),
        ("", "not an idle policy"),
    ] {
        let out = run(&["bench", "--exits-policies", bad, "--list"], LIMIT);
        assert_eq!(out.code(), 2, "--exits-policies {bad:?}: {}", out.stderr);
        assert!(out.stderr.contains(why), "{bad:?}: {}", out.stderr);
    }
    let out = run(
        &["bench", "--exits-policies", "mwait,hlt,shared", "--list"],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // Merging another run's policy rows needs both results files, each with an exits
    // section; a file that is not there is the user's error.
    refused(
        &[
            "bench",
            "--merge-policy-rows",
            "/nonexistent/from.json",
            "--results",
            "/nonexistent/into.json",
        ],
        "--merge-policy-rows",
    );
    refused(
        &[
            "bench",
            "--only",
            "builds",
            "--baseline",
            "/nonexistent/partition",
        ],
        "not a file",
    );
    let out = run(&["bench", "--list"], LIMIT);
    assert_eq!(out.code(), 0);
    for s in [
        "host",
        "guest",
        "probe",
        "crosscheck",
        "wake",
        "blk",
        "memsetup",
        "sandbox",
        "builds",
    ] {
        assert!(
            out.stdout.lines().any(|l| l.starts_with(s)),
            "{s} missing from --list:\n{}",
            out.stdout
        );
    }
    // --report renders a results file into the report and the chart.
    let dir = Scratch::new("bench-report");
    // Sections in the shape the harness writes them (the report reads them as types); a
    // third that does not is named in the report, not a reason to write none.
    let results = dir.file(
        "box.json",
        br#"{"sections":{
            "host":{"completed":true,"started_at":"x","provenance":{},"method":"m",
                "params":{"runs":3,"cpus":[0,1],"pinning":"p","hotpaths_args":[]},
                "rows":[{"name":"null_syscall","unit":"us","median":0.2,"spread":[0.19,0.21],
                         "runs":3,"per_run":[0.19,0.2,0.21]}]},
            "guest":{"completed":false,"reason":"no image here","started_at":"x","provenance":{},
                "params":{"runs":0,"runs_asked":3,"vcpus_on_cores":[1],"memory":"1G",
                          "hotpaths_args":"","time_limit_s":60},
                "policies":[]},
            "probe":{"completed":true}}}"#,
    );
    let out = run(
        &["bench", "--report", "--results", results.to_str().unwrap()],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let md = std::fs::read_to_string(dir.path("box.md")).unwrap();
    assert!(
        md.contains("| Null syscall | 0.07 | 0.099 | 1.42x | 0.200"),
        "{md}"
    );
    assert!(
        md.contains("The guest columns are empty: no image here"),
        "{md}"
    );
    assert!(md.contains("| probe | **does not read**: "), "{md}");
    let svg = std::fs::read_to_string(dir.path("box-ratios.svg")).unwrap();
    assert!(svg.starts_with("<svg"));
    // A results file that is not JSON is refused as bad input (exit 2: issue 33), not an
    // empty report.
    let bad = dir.file("bad.json", b"{not json");
    let out = run(
        &["bench", "--report", "--results", bad.to_str().unwrap()],
        LIMIT,
    );
    assert_eq!(out.code(), 2, "{}", out.stderr);
}

/// The run removes its scratch directory at the end; the variable the supervisor passes it
/// in must not let a caller aim that at a directory of theirs.
#[test]
fn a_hand_set_scratch_variable_cannot_aim_the_run_at_a_directory() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !kvm_and_two_cores("a_hand_set_scratch_variable_cannot_aim_the_run_at_a_directory") {
        return;
    }
    let dir = Scratch::new("bench-env");
    let victim = dir.path("victim");
    std::fs::create_dir_all(&victim).unwrap();
    let sentinel = dir.file("victim/keep", b"mine");
    let child = partition()
        .env("TMPDIR", &dir.0)
        .env("PARTITION_BENCH_WORK", &victim)
        .args(["bench", "--quick"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child, LIMIT, "bench --quick");
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(std::fs::read(&sentinel).unwrap(), b"mine");
    let left: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("partition-bench-"))
        .collect();
    assert!(left.is_empty(), "scratch directories left: {left:?}");
}

/// The `noise` section's code paths at a small size (100 ms windows, one round): every case
/// quiet and beside the neighbour gives a row with all six figures, none failed, and the
/// report renders the table. No figure is judged: this checks the harness, not the host.
#[test]
fn the_noise_section_runs_every_case_quiet_and_beside_the_neighbour() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !kvm_available("the_noise_section_runs_every_case_quiet_and_beside_the_neighbour") {
        return;
    }
    if host_cores() < 2 {
        skip(
            "hotpaths::the_noise_section_runs_every_case_quiet_and_beside_the_neighbour",
            "needs a \
             second core for the neighbour",
        );
        return;
    }
    let dir = Scratch::new("bench-noise");
    let results = dir.path("noise.json");
    let out = run(
        &[
            "bench",
            "--only",
            "noise",
            "--runs",
            "1",
            "--noise-ms",
            "100",
            "--results",
            results.to_str().unwrap(),
        ],
        Duration::from_secs(300),
    );
    assert_eq!(out.code(), 0, "{}\n{}", out.stderr, out.stdout);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let s = &doc["sections"]["noise"];
    assert_eq!(s["completed"], true, "{s:#}");
    assert_eq!(s["params"]["window_ms"], 100, "{s:#}");
    let rows = s["rows"].as_array().unwrap();
    let qemu = find_in_path("qemu-system-x86_64").is_some();
    let mut cases = vec!["bare", "partition"];
    if qemu {
        cases.push("qemu");
    }
    // The reserved core's rows: the twin where the reservation is a cgroup v1 cpuset (this
    // host's), the pool partition always (as root).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        if s["reserved_note"].is_null() {
            cases.push("bare-reserved");
        }
        cases.push("partition-reserved");
    }
    assert_eq!(rows.len(), 2 * cases.len(), "{s:#}");
    for neighbour in [false, true] {
        for case in &cases {
            let r = rows
                .iter()
                .find(|r| r["case"] == *case && r["neighbour"] == neighbour)
                .unwrap_or_else(|| panic!("no {case} row, neighbour {neighbour}: {s:#}"));
            assert_eq!(r["failures"], serde_json::json!([]), "{r:#}");
            for m in benchmarks::noise::METRICS {
                assert_eq!(r["metrics"][m]["n"], 1, "{m} in {r:#}");
            }
            // Beside the neighbour, it was seen running through the window (stress-ng
            // alive, its guest launched, none of its launches failed).
            let seen = if neighbour {
                serde_json::json!(1)
            } else {
                serde_json::Value::Null
            };
            assert_eq!(r["neighbour_windows"], seen, "{r:#}");
        }
    }
    // The two paths, quiet and beside the neighbour, one run each.
    let paths = s["paths"].as_array().expect("paths");
    assert_eq!(paths.len(), 4, "{s:#}");
    for neighbour in [false, true] {
        for path in ["wake-ipi", "submit-fence"] {
            let r = paths
                .iter()
                .find(|r| r["path"] == path && r["neighbour"] == neighbour)
                .unwrap_or_else(|| panic!("no {path} path, neighbour {neighbour}: {s:#}"));
            assert_eq!(r["failures"], serde_json::json!([]), "{r:#}");
            assert_eq!(r["median_ns"]["n"], 1, "{r:#}");
            assert!(r["median_ns"]["median"].as_f64().unwrap() > 0.0, "{r:#}");
            let seen = if neighbour {
                serde_json::json!(1)
            } else {
                serde_json::Value::Null
            };
            assert_eq!(r["neighbour_windows"], seen, "{r:#}");
        }
    }
    let md = std::fs::read_to_string(dir.path("noise.md")).unwrap();
    assert!(md.contains("## Noise on the partition's core"), "{md}");
    assert!(md.contains("| submit-fence | auto | busy |"), "{md}");
    // The provenance names the host settings the figures were taken under.
    assert!(
        s["provenance"]["host_report"]["findings"].is_array(),
        "{s:#}"
    );
}
