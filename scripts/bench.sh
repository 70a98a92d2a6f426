#!/usr/bin/env bash
# Every benchmark, one command: build, then `partition bench` writes its sections (with
# provenance) into benchmarks/results/<hostname>.json. Extra arguments go to
# `partition bench` (--only SECTION, --list, --runs N).
#
#   scripts/bench.sh [--only memsetup] [--runs 5]        (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root "$@"
need_cargo
need_kvm
apt_install gcc qemu-system-x86 python3
cargo build --release --quiet -p partition-cli
exec ./target/release/partition bench "$@"
