#!/usr/bin/env bash
# A benchmark section taken inside the rig (scripts/rig.sh: real kvm_amd on QEMU TCG, an
# IOMMU, QEMU's NVMe): `partition bench --only SECTION ARGS...` runs there as root, with
# QEMU and its firmware beside it for the sections that measure it too; its results come
# back over the rig's output and are merged into benchmarks/results/rig.json (an
# incomplete run never replaces a completed one), and rig.md and its charts are written
# again. The provenance is the rig's own, read inside it (benchmarks/src/provenance.rs),
# with this checkout's commit passed in. Under TCG only exit and interrupt counts describe
# anything; docs/benchmarks.md says how to read each section.
#
#   scripts/rig-bench.sh SECTION [BENCH ARGS...]
#   scripts/rig-bench.sh submit-vfio --vfio 0000:00:04.0
#   scripts/rig-bench.sh exits        (Debian's kernel and initramfs made here and put inside)
#   scripts/rig-bench.sh exits --vfio 0000:00:04.0   (and the NVMe rows, the probe's driver)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
case "${1:-}" in -h|--help|"") sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
need_root
need_cargo
section=$1
shift

commit=$(git rev-parse HEAD 2>/dev/null || true)
dirty=false
[ -n "$(git status --porcelain --untracked-files=no -- . ':(exclude)benchmarks/results' 2>/dev/null)" ] && dirty=true

say "rig bench: cargo build --release -p partition-cli"
cargo build --release -p partition-cli --quiet
bin=target/$TRIPLE/release/partition
files=(--partition "$bin")
# RIG_BENCH_NO_QEMU=1: our rows alone, without QEMU inside (its section is then
# incomplete and not merged; the rows are in target/rig/bench-results.json). For A/B runs
# of our own change, in half the time. (QEMU's guest boots with qboot: SeaBIOS parked its
# AP in a guest-mode HLT the rig's TCG never woke, docs/testing.md.)
if [ -z "${RIG_BENCH_NO_QEMU:-}" ]; then
    mapfile -t -O 2 files < <(rig_qemu_files)
fi

# The exits section's guest: Debian's kernel and the userspace initramfs the Linux tests
# boot (tests/linux_kernel.rs makes them on this host; apt-get is not reachable inside).
extra=()
if [ "$section" = exits ]; then
    say "rig bench: Debian's kernel and the userspace initramfs (tests/linux_kernel.rs)"
    exe=$(test_exe linux_kernel)
    [ -x "$exe" ] || die "could not build tests/linux_kernel.rs"
    "$exe" --exact the_debian_assets_hold_an_elf_kernel_busybox_init_and_the_virtio_modules --quiet >/dev/null
    assets=${CARGO_TARGET_DIR:-target}/$TRIPLE/tmp/assets
    # rig.list's second line names the Debian userspace initramfs (its name hashes its inputs).
    initramfs=$(sed -n 2p "$assets/rig.list" 2>/dev/null || true)
    [ -s "$assets/vmlinux" ] && [ -n "$initramfs" ] && [ -s "$assets/$initramfs" ] || die "no Debian assets in $assets"
    files+=(--file "$assets/vmlinux:/rig/exits/vmlinux" --file "$assets/$initramfs:/rig/exits/base.cpio")
    extra=(--exits-guest /rig/exits)
    # Enabled before the outer machine's second CPU is online; the section only turns the
    # buffer on and off (enabling an event patches kernel text: docs/testing.md).
    export RIG_TRACE_EVENTS="kvm/kvm_exit kvm/kvm_msr"
fi

mkdir -p target/rig
inner=target/rig/bench.sh
{
    echo "export PARTITION_COMMIT='$commit' PARTITION_COMMIT_DIRTY=$dirty"
    echo "mkdir -p /rig/out && cd /rig/out"
    # A function named with --vfio BDF is bound to vfio-pci first, as tests/vfio.rs binds
    # it (the rig boots with every function on its own driver or none).
    prev=""
    for a in "$@"; do
        if [ "$prev" = --vfio ]; then
            d="/sys/bus/pci/devices/$a"
            echo "echo vfio-pci > $d/driver_override"
            echo "[ -e $d/driver ] && echo $a > $d/driver/unbind"
            echo "echo $a > /sys/bus/pci/drivers_probe"
            echo "[ \"\$(basename \"\$(readlink $d/driver)\")\" = vfio-pci ] || { echo 'error: $a did not bind to vfio-pci' >&2; exit 1; }"
        fi
        prev=$a
    done
    printf 'partition bench --only %q' "$section"
    printf ' %q' "$@" ${extra[@]+"${extra[@]}"}
    echo ' --results /rig/out/rig.json; rc=$?'
    echo 'echo RIG-RESULTS-BEGIN; cat /rig/out/rig.json 2>/dev/null; echo; echo RIG-RESULTS-END'
    echo 'exit $rc'
} > "$inner"
out=target/rig/bench.out
rc=0
scripts/rig.sh "${files[@]}" --file "$inner:/rig/bench.sh" --timeout "${RIG_TIMEOUT:-2400}" \
    -- sh /rig/bench.sh | tee "$out" || rc=${PIPESTATUS[0]}
taken=target/rig/bench-results.json
sed -n '/^RIG-RESULTS-BEGIN$/,/^RIG-RESULTS-END$/p' "$out" | sed '1d;$d' > "$taken"
[ -s "$taken" ] || die "the rig gave no results (rig.sh exit $rc)"
if [ -n "${RIG_BENCH_MERGE_POLICY_ROWS:-}" ]; then
    # RIG_BENCH_MERGE_POLICY_ROWS=1 with RIG_BENCH_NO_QEMU=1 and --exits-policies P: this
    # run's rows of P join rig.json's completed exits section, saying which run they came
    # from (a run of many guests in the rig tends to lose the outer machine: docs/idle.md).
    "$bin" bench --merge-policy-rows "$taken" --results benchmarks/results/rig.json
else
    "$bin" bench --merge "$taken" --results benchmarks/results/rig.json
fi
exit "$rc"
