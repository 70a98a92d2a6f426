//! hotpaths: lmbench-style kernel hot paths, memory latency and bandwidth, measured the same
//! way on a bare host and inside a Linux guest. Built as a static binary (see
//! `.cargo/config.toml`) so it runs from a busybox initramfs as it runs on the host.
//!
//! Every benchmark is lmbench's loop (named in `--list`), timed lmbench's way
//! (`timing.rs`); the whole suite runs `--runs` times, benchmarks interleaved, and each
//! benchmark reports the median of its runs with the min-max spread. The process pins
//! itself to the first of `--cpus`; two-process benchmarks run twice, with the child on
//! the same CPU and, given a second CPU, on that one.

mod chase;
mod counted;
mod mem;
mod paths;
mod timing;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

use paths::Ctx;
use timing::Enough;

const USAGE: &str = "\
usage: hotpaths [--cpus A[,B]] [--runs N] [--only NAME,...] [--enough-us US]
                [--max-mem BYTES] [--bw-bytes BYTES] [--dir DIR] [--json] [--quick] [--list]

  --cpus A[,B]     pin to CPU A; with B, two-process benchmarks also run with the child on B
                   (default: the first CPU this process may use)
  --runs N         suite runs; each benchmark reports the median of N (default 5)
  --only LIST      run only these benchmarks (see --list; a prefix such as mem_lat selects a group)
  --enough-us US   minimum duration of one timed repetition (default 5000, lmbench's order)
  --max-mem BYTES  largest memory-latency working set (default 268435456 = 256 MiB)
  --bw-bytes BYTES bandwidth buffer size (default 67108864 = 64 MiB)
  --dir DIR        scratch directory for the stat/open file and the exec target (default /tmp)
  --file PATH      the file stat and open/close use (default: one made in the scratch directory)
  --no-thp         do not ask for transparent huge pages for the memory chase (lmbench does not;
                   by default hotpaths does, as a partition's memory is 2 MiB pages)
  --json           print JSON (default: a table)
  --quick          --runs 1 --enough-us 1000 --max-mem 64 MiB --bw-bytes 16 MiB
  --list           list the benchmarks and what lmbench calls them
  --count N1,N2    counted mode: each path benchmark's loop runs N1 then N2 iterations between
                   marks written to --mark-port, nothing timed (root: it needs the port);
                   adds sleep_1ms and, with --blk, blk_read; no memory benchmarks
  --mark-port P    the marks' port (default 0x520, the partition VMM's mark port)
  --blk DEV        the block device blk_read reads 4 KiB at a time with O_DIRECT
";

/// Benchmarks: name, unit, lmbench equivalent.
const LIST: &[(&str, &str, &str)] = &[
    ("null_syscall", "us", "lat_syscall null (getppid)"),
    ("read", "us", "lat_syscall read (1 byte from /dev/zero)"),
    ("write", "us", "lat_syscall write (1 byte to /dev/null)"),
    ("stat", "us", "lat_syscall stat FILE"),
    ("open_close", "us", "lat_syscall open FILE"),
    ("sig_install", "us", "lat_sig install"),
    ("sig_catch", "us", "lat_sig catch"),
    (
        "ctx_switch_1core",
        "us",
        "lat_ctx -s 0 2, both processes on CPU A",
    ),
    ("pipe_1core", "us", "lat_pipe, both processes on CPU A"),
    ("unix_1core", "us", "lat_unix, both processes on CPU A"),
    (
        "ctx_switch_2cores",
        "us",
        "lat_ctx -s 0 2, the second process on CPU B",
    ),
    ("pipe_2cores", "us", "lat_pipe, the child on CPU B"),
    ("unix_2cores", "us", "lat_unix, the child on CPU B"),
    ("fork_exit", "us", "lat_proc fork"),
    (
        "fork_exec",
        "us",
        "lat_proc exec (a static exit(0) program)",
    ),
    (
        "fork_sh",
        "us",
        "lat_proc shell (/bin/sh -c the same program)",
    ),
    ("sleep_1ms", "-", "counted mode only: clock_nanosleep 1 ms"),
    (
        "blk_read",
        "-",
        "counted mode only: 4 KiB O_DIRECT pread of --blk",
    ),
    (
        "mem_lat_<bytes>",
        "ns",
        "lat_mem_rd -t (random chase of 64-byte lines)",
    ),
    ("bw_rd", "MB/s", "bw_mem rd"),
    ("bw_wr", "MB/s", "bw_mem wr"),
    ("bw_bcopy", "MB/s", "bw_mem bcopy"),
];

/// Bad command lines.
#[derive(Debug)]
enum ArgError {
    Value(String, String),
    Unknown(String),
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgError::Value(k, v) => write!(f, "{k}: bad value {v:?}"),
            ArgError::Unknown(a) => write!(f, "unknown argument {a:?}"),
        }
    }
}

struct Args {
    cpus: Vec<usize>,
    runs: usize,
    only: Vec<String>,
    enough: u64,
    max_mem: usize,
    bw_bytes: usize,
    dir: PathBuf,
    file: Option<PathBuf>,
    thp: bool,
    json: bool,
    list: bool,
    count: Option<(u64, u64)>,
    mark_port: u16,
    blk: Option<PathBuf>,
}

fn parse(argv: &[String]) -> Result<Args, ArgError> {
    let mut a = Args {
        cpus: Vec::new(),
        runs: 5,
        only: Vec::new(),
        enough: 5000,
        max_mem: 256 << 20,
        bw_bytes: 64 << 20,
        dir: PathBuf::from("/tmp"),
        file: None,
        thp: true,
        json: false,
        list: false,
        count: None,
        mark_port: 0x520,
        blk: None,
    };
    let mut it = argv.iter();
    while let Some(k) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_default();
        let num = |k: &str, v: String| -> Result<u64, ArgError> {
            v.parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(ArgError::Value(k.into(), v))
        };
        match k.as_str() {
            "--cpus" => {
                let v = val();
                a.cpus = v
                    .split(',')
                    .map(|c| c.parse::<usize>().ok().filter(|&c| c < 4096))
                    .collect::<Option<Vec<_>>>()
                    .filter(|c| (1..=2).contains(&c.len()))
                    .ok_or(ArgError::Value(k.clone(), v))?;
            }
            "--runs" => a.runs = num(k, val())?.min(1000) as usize,
            "--only" => a.only = val().split(',').map(String::from).collect(),
            "--enough-us" => a.enough = num(k, val())?.min(10_000_000),
            "--max-mem" => a.max_mem = num(k, val())?.min(1 << 34) as usize,
            "--bw-bytes" => a.bw_bytes = num(k, val())?.clamp(4096, 1 << 34) as usize,
            "--dir" => a.dir = PathBuf::from(val()),
            "--file" => a.file = Some(PathBuf::from(val())),
            "--json" => a.json = true,
            "--no-thp" => a.thp = false,
            "--quick" => {
                a.runs = 1;
                a.enough = 1000;
                a.max_mem = 64 << 20;
                a.bw_bytes = 16 << 20;
            }
            "--list" => a.list = true,
            "--count" => {
                let v = val();
                a.count = v
                    .split_once(',')
                    .and_then(|(x, y)| Some((x.parse::<u64>().ok()?, y.parse::<u64>().ok()?)))
                    .filter(|&(x, y)| x > 0 && y > x && y <= 100_000_000)
                    .map(Some)
                    .ok_or(ArgError::Value(k.clone(), v))?;
            }
            "--mark-port" => {
                let v = val();
                let n = match v.strip_prefix("0x") {
                    Some(h) => u16::from_str_radix(h, 16).ok(),
                    None => v.parse().ok(),
                };
                a.mark_port = n.ok_or(ArgError::Value(k.clone(), v))?;
            }
            "--blk" => a.blk = Some(PathBuf::from(val())),
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(ArgError::Unknown(other.into())),
        }
    }
    Ok(a)
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: fills a valid set for the calling thread.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return vec![0];
    }
    // SAFETY: CPU_ISSET bounds-checks the index.
    (0..1024)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Whether `name` (a benchmark, or a group such as `mem_lat`) is wanted: named, under a
/// named prefix, or a group one of whose members is named.
fn selected(only: &[String], name: &str) -> bool {
    only.is_empty()
        || only
            .iter()
            .any(|o| name.starts_with(o.as_str()) || o.starts_with(name))
}

/// name -> (unit, values per run); errors by name.
#[derive(Default)]
struct Results {
    values: BTreeMap<String, (String, Vec<f64>)>,
    order: Vec<String>,
    errors: BTreeMap<String, String>,
}

impl Results {
    fn add(&mut self, name: &str, unit: &str, v: f64) {
        if !self.values.contains_key(name) {
            self.order.push(name.to_string());
        }
        self.values
            .entry(name.to_string())
            .or_insert_with(|| (unit.to_string(), Vec::new()))
            .1
            .push(v);
    }
    fn fail(&mut self, name: &str, e: impl std::fmt::Display) {
        self.errors
            .entry(name.to_string())
            .or_insert_with(|| e.to_string());
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

fn run_suite(a: &Args, cpu_a: usize, cpu_b: Option<usize>, ctx: &Ctx) -> Results {
    let mut r = Results::default();
    let want = |n: &str| selected(&a.only, n);
    let counted = ctx.counted.as_ref();
    for _ in 0..a.runs {
        macro_rules! lat {
            ($name:expr, $e:expr) => {
                if want($name) {
                    if let Some(k) = counted {
                        k.begin($name);
                    }
                    match $e {
                        Ok(v) => r.add($name, "us", v),
                        Err(e) => r.fail($name, e),
                    }
                }
            };
        }
        lat!(
            "null_syscall",
            Ok::<f64, paths::PathError>(paths::null_syscall(ctx))
        );
        lat!("read", paths::read_byte(ctx));
        lat!("write", paths::write_byte(ctx));
        lat!("stat", paths::stat(ctx));
        lat!("open_close", paths::open_close(ctx));
        lat!(
            "sig_install",
            Ok::<f64, paths::PathError>(paths::sig_install(ctx))
        );
        lat!("sig_catch", paths::sig_catch(ctx));
        lat!("ctx_switch_1core", paths::context_switch(ctx, Some(cpu_a)));
        lat!("pipe_1core", paths::pipe_round_trip(ctx, Some(cpu_a)));
        lat!("unix_1core", paths::unix_round_trip(ctx, Some(cpu_a)));
        if let Some(b) = cpu_b {
            lat!("ctx_switch_2cores", paths::context_switch(ctx, Some(b)));
            lat!("pipe_2cores", paths::pipe_round_trip(ctx, Some(b)));
            lat!("unix_2cores", paths::unix_round_trip(ctx, Some(b)));
        }
        lat!("fork_exit", paths::fork_exit(ctx));
        lat!("fork_exec", paths::fork_exec(ctx));
        lat!("fork_sh", paths::fork_shell(ctx));
        if counted.is_some() {
            lat!(
                "sleep_1ms",
                Ok::<f64, paths::PathError>(paths::sleep_1ms(ctx))
            );
            if let Some(dev) = &a.blk {
                lat!("blk_read", paths::blk_read(ctx, dev));
            }
            continue;
        }
        if want("mem_lat") {
            for (size, ns) in mem::latency(Enough(a.enough), a.max_mem, a.thp) {
                let name = format!("mem_lat_{size}");
                if want(&name) {
                    r.add(&name, "ns", ns);
                }
            }
        }
        if want("bw") {
            for (what, mbs) in mem::bandwidth(Enough(a.enough), a.bw_bytes) {
                let name = format!("bw_{what}");
                if want(&name) {
                    r.add(&name, "MB/s", mbs);
                }
            }
        }
    }
    r
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hotpaths: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if a.list {
        for (n, u, l) in LIST {
            println!("{n:20} {u:5} {l}");
        }
        return ExitCode::SUCCESS;
    }
    let allowed = allowed_cpus();
    let cpus = if a.cpus.is_empty() {
        vec![allowed.first().copied().unwrap_or(0)]
    } else {
        a.cpus.clone()
    };
    let (cpu_a, cpu_b) = (cpus[0], cpus.get(1).copied());
    if !paths::pin(cpu_a) {
        eprintln!("hotpaths: cannot pin to CPU {cpu_a} (allowed: {allowed:?})");
        return ExitCode::from(2);
    }
    let scratch = a.dir.join(format!("hotpaths.{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&scratch) {
        eprintln!("hotpaths: {}: {e}", scratch.display());
        return ExitCode::from(1);
    }
    let file = a.file.clone().unwrap_or_else(|| scratch.join("stat-me"));
    let hello = scratch.join("hello");
    let setup = (if a.file.is_some() {
        std::fs::metadata(&file).map(|_| ())
    } else {
        std::fs::write(&file, b"hotpaths\n")
    })
    .and_then(|_| std::fs::write(&hello, paths::hello_elf()))
    .and_then(|_| std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o755)));
    if let Err(e) = setup {
        eprintln!("hotpaths: writing into {}: {e}", scratch.display());
        let _ = std::fs::remove_dir_all(&scratch);
        return ExitCode::from(1);
    }
    let enough = Enough(a.enough);
    let counted = match a.count {
        Some((n1, n2)) => match counted::Counted::new(n1, n2, a.mark_port) {
            Ok(k) => Some(k),
            Err(e) => {
                eprintln!("hotpaths: {e}");
                let _ = std::fs::remove_dir_all(&scratch);
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let ctx = Ctx {
        enough,
        overhead: if counted.is_some() {
            0.0
        } else {
            timing::loop_overhead(enough)
        },
        file: file.clone(),
        hello,
        counted,
    };
    let r = run_suite(&a, cpu_a, cpu_b, &ctx);
    let _ = std::fs::remove_dir_all(&scratch);

    if a.json {
        let mut o = String::new();
        let _ = write!(
            o,
            "{{\"suite\":\"hotpaths\",\"version\":1,\"thp\":{},\"runs\":{},\"tries\":{},\"enough_us\":{},\
             \"loop_overhead_us\":{},\"pinning\":{{\"cpu_a\":{},\"cpu_b\":{},\"allowed\":{:?},\
             \"rule\":\"the process is pinned to cpu_a; children of two-process benchmarks run on \
             cpu_a (_1core) or cpu_b (_2cores)\"}},\"file\":{},\"results\":[",
            a.thp,
            a.runs,
            timing::TRIES,
            a.enough,
            json_num(ctx.overhead),
            cpu_a,
            cpu_b.map_or("null".to_string(), |b| b.to_string()),
            allowed,
            json_str(&file.display().to_string()),
        );
        for (i, name) in r.order.iter().enumerate() {
            let (unit, v) = &r.values[name];
            let mut s = v.clone();
            let med = timing::median(&mut s);
            let _ = write!(
                o,
                "{}{{\"name\":{},\"unit\":{},\"median\":{},\"min\":{},\"max\":{},\"per_run\":[{}]}}",
                if i > 0 { "," } else { "" },
                json_str(name),
                json_str(unit),
                json_num(med),
                json_num(s[0]),
                json_num(s[s.len() - 1]),
                v.iter().map(|x| json_num(*x)).collect::<Vec<_>>().join(","),
            );
        }
        o.push_str("],\"errors\":{");
        let errs: Vec<String> = r
            .errors
            .iter()
            .map(|(k, v)| format!("{}:{}", json_str(k), json_str(v)))
            .collect();
        o.push_str(&errs.join(","));
        o.push_str("}}");
        println!("{o}");
    } else {
        println!(
            "hotpaths: {} run(s), cpu {cpu_a}{}, median (min-max)",
            a.runs,
            cpu_b.map_or(String::new(), |b| format!(" and {b}"))
        );
        for name in &r.order {
            let (unit, v) = &r.values[name];
            let mut s = v.clone();
            let med = timing::median(&mut s);
            println!(
                "{name:20} {med:>12.4} {unit:5} ({:.4}-{:.4})",
                s[0],
                s[s.len() - 1]
            );
        }
        for (k, e) in &r.errors {
            println!("{k:20} FAILED: {e}");
        }
    }
    if r.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, ArgError> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn arguments() {
        let a = args("--cpus 1,0 --runs 3 --only null,mem_lat --json").unwrap();
        assert_eq!(a.cpus, [1, 0]);
        assert_eq!(a.runs, 3);
        assert!(a.json);
        assert!(selected(&a.only, "mem_lat_512"));
        assert!(!selected(&a.only, "read"));
        let only = vec!["mem_lat_16384".to_string(), "sig".to_string()];
        assert!(
            selected(&only, "mem_lat"),
            "the group of a named member runs"
        );
        assert!(selected(&only, "mem_lat_16384"));
        assert!(!selected(&only, "mem_lat_512"));
        assert!(selected(&only, "sig_catch"));
        assert!(args("--cpus 1,2,3").is_err());
        assert!(args("--cpus x").is_err());
        assert!(args("--runs 0").is_err());
        assert!(args("--bogus").is_err());
        let c = args("--count 100,1100 --mark-port 0x510 --blk /dev/vda").unwrap();
        assert_eq!((c.count, c.mark_port), (Some((100, 1100)), 0x510));
        assert_eq!(c.blk, Some(PathBuf::from("/dev/vda")));
        assert_eq!(args("--quick").unwrap().mark_port, 0x520);
        for bad in [
            "--count 100",
            "--count 0,10",
            "--count 10,10",
            "--count 20,10",
            "--mark-port 0x1ffff",
        ] {
            assert!(args(bad).is_err(), "{bad}");
        }
        assert_eq!(
            counted::line("pipe_2cores", 1, 0x1004, 100, 1100),
            "hotpaths-count op=pipe_2cores part=1 mark=4100 n1=100 n2=1100"
        );
        let q = args("--quick").unwrap();
        assert_eq!((q.runs, q.enough), (1, 1000));
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        assert_eq!(json_num(f64::NAN), "null");
        assert_eq!(json_num(1.5), "1.5");
    }
}
