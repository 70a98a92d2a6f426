#!/usr/bin/env bash
# The main job on the embedded default: build the VMM, then boot the built-in probe guest
# on one dedicated core with 128 MiB and print what it measured.
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

cores=$(nproc)
core=$((cores - 1))          # leave core 0 to the host when there is more than one
say "launching the probe guest on core $core with 128 MiB"
./target/release/partition launch --cores "$core" --memory 128M --probe \
    --cmdline "console=ttyS0 demo=1"
