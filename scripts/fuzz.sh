#!/usr/bin/env bash
# Fuzzes the parsers of hostile input on this machine's stable toolchain (cargo-fuzz and
# libFuzzer; RUSTC_BOOTSTRAP=1 lets cargo-fuzz's sanitizer flags through a stable rustc).
#
#   scripts/fuzz.sh                     list the targets
#   scripts/fuzz.sh TARGET [SECONDS]    run TARGET for SECONDS (default 60)
#   scripts/fuzz.sh all [SECONDS]       every target, SECONDS each
#
# Targets (docs/security.md): virtqueue, mmio, virtio_pci (devices), kernel (boot), plan, ledger
# (partition). A run starts from the committed corpus (<crate>/fuzz/seeds/<target>/), adds
# what it finds to a working corpus (<crate>/fuzz/corpus/<target>/, not committed),
# minimizes that back into the seeds, and prints how many inputs it executed. A finding
# stops the run with libFuzzer's report and the input under <crate>/fuzz/artifacts/; once
# fixed, copy it into the seeds (keep its crash-* name: the merge never drops those).
# `cargo test` replays the seeds through the same code (partition/tests/fuzz_corpus.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_cargo

crate_of() {
    case "$1" in
        virtqueue|mmio|virtio_pci) echo devices ;;
        kernel) echo boot ;;
        plan|ledger) echo partition ;;
        *) return 1 ;;
    esac
}
TARGETS="virtqueue mmio virtio_pci kernel plan ledger"

if [ $# -eq 0 ]; then
    echo "targets: $TARGETS (scripts/fuzz.sh TARGET [SECONDS] | all [SECONDS])"
    exit 0
fi
want=$1
secs=${2:-60}
case "$secs" in ''|*[!0-9]*) die "SECONDS must be a number, not $secs" ;; esac

if ! cargo fuzz --version >/dev/null 2>&1; then
    say "installing cargo-fuzz (crates.io)"
    cargo install cargo-fuzz --locked >&2
fi
export RUSTC_BOOTSTRAP=1

run_one() {
    local t=$1 c dir seeds corpus log
    c=$(crate_of "$t") || die "no target $t (targets: $TARGETS)"
    dir=$c/fuzz
    seeds=$dir/seeds/$t
    corpus=$dir/corpus/$t
    mkdir -p "$seeds" "$corpus"
    cp -n "$seeds"/* "$corpus"/ 2>/dev/null || true
    log=$(mktemp)
    say "fuzzing $t for $secs s"
    if ! (cd "$c" && cargo fuzz run "$t" "fuzz/corpus/$t" -- \
            -max_total_time="$secs" -max_len=4096 -rss_limit_mb=4096 -print_final_stats=1) \
            >"$log" 2>&1; then
        tail -60 "$log" >&2
        rm -f "$log"
        die "$t: a finding (the input is under $dir/artifacts/$t/)"
    fi
    local runs
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    rm -f "$log"
    # Minimize the working corpus into the committed seeds: the fewest inputs that keep
    # every feature it reached (libFuzzer's set-cover merge).
    local min
    min=$(mktemp -d)
    if "$dir/target/x86_64-unknown-linux-gnu/release/$t" -set_cover_merge=1 -max_len=4096 \
            "$min" "$corpus" >/dev/null 2>&1 && [ -n "$(ls -A "$min")" ]; then
        # Inputs that once found a bug (crash-*) stay, whatever the merge keeps.
        cp "$seeds"/crash-* "$min"/ 2>/dev/null || true
        rm -rf "$seeds" && mkdir -p "$seeds" && cp "$min"/* "$seeds"/
    fi
    rm -rf "$min"
    echo "$t: $runs executions in $secs s without a finding; $(ls "$seeds" | wc -l) inputs in $seeds"
}

if [ "$want" = all ]; then
    for t in $TARGETS; do run_one "$t"; done
else
    run_one "$want"
fi
