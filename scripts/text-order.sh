#!/usr/bin/env bash
# Regenerates tools/partition-cli/launch-order.ld, the linker script that puts the
# functions a launch runs at the front of the `partition` binary's .text, in the order they
# run (docs/architecture.md, "Building"). It builds the release binary, reserves a small
# pool and one core in a state directory of its own, traces two probe launches with
# tools/text-order (the benchmark's pool launch and the demo's), gives everything back and
# writes the script. Run it after a change to the launch path, a dependency or the
# toolchain, and commit the result; then rebuild.
#
#   scripts/text-order.sh      (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
need_cargo
need_kvm
apt_install gcc binutils

say "building (release)"
cargo build --release --quiet -p partition-cli -p text-order
P=./target/$TRIPLE/release/partition
T=./target/$TRIPLE/release/text-order
cores=$(nproc)
[ "$cores" -ge 2 ] || die "the traced launches reserve one core and need another for the host"
core=$((cores - 1))
work=$(mktemp -d)
export PARTITION_STATE_DIR=$work/state
trap '$P unreserve >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# traced WHAT ARGS...: adds what the launch ARGS run to the list; its output is shown only
# if it fails.
traced() {
    say "tracing $1"
    shift
    $T trace --out "$work/hits" -- $P launch --name order --cores "$core" "$@" \
        >"$work/log" 2>&1 || { cat "$work/log" >&2; die "the traced launch failed"; }
    tail -n 1 "$work/log" >&2
}
$P reserve --memory 256M --cores "$core" >/dev/null 2>&1
traced "the benchmark's pool launch" --memory 256M --probe --cmdline probe.memtest=0 --json
traced "the demo's launch" --memory 128M --probe --cmdline "console=ttyS0 demo=1 probe.zerocheck=1" --timings
$P unreserve >/dev/null 2>&1

archives=()
for a in libc.a libgcc.a libgcc_eh.a; do
    f=$(cc -print-file-name=$a)
    [ -f "$f" ] && archives+=(--archive "$f")
done
$T script --hits "$work/hits" "${archives[@]}" --out tools/partition-cli/launch-order.ld
say "wrote tools/partition-cli/launch-order.ld ($(grep -c '^    ' tools/partition-cli/launch-order.ld) entries); rebuild to use it"
