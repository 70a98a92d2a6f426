#!/usr/bin/env bash
# The main job on the embedded default: build the VMM, reserve a small hugepage pool and
# one core, launch the built-in probe guest from them, print what it measured, give
# everything back; then a quick look at the hot paths (`partition bench --quick`: the bare
# host's, the probe guest's exit paths, and its memory staircase against the host's).
#
#   scripts/demo.sh        (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root "$@"
need_cargo
need_kvm
apt_install gcc

say "building (release)"
cargo build --release --quiet -p partition-cli
P=./target/$TRIPLE/release/partition
# A state directory of its own, so a real reservation in /run/partition is left alone.
export PARTITION_STATE_DIR=/run/partition-demo

cores=$(nproc)
[ "$cores" -ge 2 ] || die "the demo reserves one core and needs another for the host"
core=$((cores - 1))
trap '$P unreserve >/dev/null 2>&1 || true' EXIT

say "reserving a 256 MiB hugepage pool and core $core"
$P reserve --memory 256M --cores "$core"

say "launching the probe guest as partition 'demo' (128 MiB from the pool)"
$P launch --name demo --cores "$core" --memory 128M --probe \
    --cmdline "console=ttyS0 demo=1 probe.zerocheck=1" --timings

say "the reservation afterwards"
$P status

say "giving everything back"
trap - EXIT
$P unreserve
rm -rf "$PARTITION_STATE_DIR"

say "a quick look at what running here costs (partition bench --quick; scripts/bench.sh is the full run)"
$P bench --quick
