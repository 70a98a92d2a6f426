#!/usr/bin/env bash
# Our end-to-end suite on the rig (scripts/rig.sh: real KVM on QEMU TCG's SVM, an IOMMU,
# QEMU's NVMe, edu and ivshmem): the same test binaries `cargo test` builds, run inside
# the outer machine as root with the sandbox on, unchanged. There they take the paths real
# hardware takes: kvm_amd, the mwait idle policy with its exits disabled, `--cpu-model
# host` with no assists, cgroup v2 isolated partitions, Debian's kernel to userspace on
# one and two vCPUs, VFIO passthrough. docs/testing.md.
#
#   scripts/rig-suite.sh [TEST...]    TEST: a test binary of tools/partition-cli/tests,
#                                     optionally NAME=FILTER (default: the suite below)
#
# Exits non-zero when any test fails inside, when a test prints SKIPPED inside that is not
# on the allowed list below (with its reason; every binary run is in PARTITION_MUST_RUN
# there, so a skip fails its test too), when the rig is not what it must be (no kvm_amd,
# /dev/kvm, IOMMU groups or vfio-pci: rig.sh exit 3), or when a binary's run is judged a
# failure (scripts/rig-judge.sh): a FAILED or SKIPPED printed by any run of a binary is its
# result, and no rerun removes it; a machine that died in one of our VMM's threads, or hung
# silent while its heartbeat went on (its processes' kernel stacks and QEMU's state shown),
# fails the binary it was running. Only a binary whose every finished test had passed when
# the outer machine itself died (QEMU TCG's: rig.sh exit 125, its console kept as
# target/rig/died-*.log) or stopped its clock runs again, on a new machine, printed as
# RERUN with the console's end; after the third death nothing more runs. linux_kernel runs
# on an outer machine under QEMU's
# multi-threaded TCG, the others on one under single-threaded TCG (RIG_TCG_THREAD=single or
# multi runs them all under that one; docs/testing.md, "Which TCG threading").
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/rig-judge.sh
case "${1:-}" in -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
need_root
need_cargo
apt_lists
# protoc: the test binaries' build (tests/cri.rs's CRI client); gcc and binutils link the
# probe guest.
apt_install cpio xz-utils dpkg python3 gcc binutils protobuf-compiler
apt_qemu

# What runs inside: test binary names (tools/partition-cli/tests/NAME.rs), each with an
# optional filter: the tests whose paths real hardware takes differently (the idle
# policies with mwait, the CPU model and the SYSCALL canary, cgroup v2 isolation and the
# pool, a triple fault's report, VFIO, Linux to userspace). The rest run on this host in
# every `scripts/test.sh` and can run here by name (`scripts/rig-suite.sh blk engine`):
# every minute of emulated machine is a minute it can die in (docs/testing.md).
suite=(idle assist teardown pool pod vfio linux_kernel)
[ $# -gt 0 ] && suite=("$@")

say "rig suite: building the test binaries"
# The workspace's build, as `cargo test --workspace` (scripts/test.sh) makes it: the same
# binaries, not a second build with other features.
load_test_exes

root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}
case "$target" in /*) ;; *) target=$root/$target ;; esac
mkdir -p "$target/rig"

# Tests that may print SKIPPED inside the rig, each with why (anything else that skips
# there fails the suite: the rig exists to run them). "BINARY:TEST|reason".
# None today: the exits section's test, the last on it, runs in every suite since
# 2026-12-05 (a triple fault fails it, as it fails the other two-vCPU boots).
allowed_skips=()

# The Linux tests' assets, made on this host (apt-get is not reachable inside): the test
# that checks them makes them.
asset_files=()
if printf '%s\n' "${suite[@]}" | grep -q '^linux_kernel'; then
    say "rig suite: Debian's kernel and the userspace initramfs (tests/linux_kernel.rs)"
    "$(test_exe linux_kernel)" --exact the_debian_assets_hold_an_elf_kernel_busybox_init_and_the_virtio_modules \
        --quiet >/dev/null
    assets="$target/$TRIPLE/tmp/assets"
    while read -r f; do
        asset_files+=(--file "$assets/$f:$assets/$f")
    done < "$assets/rig.list"
fi

# Our own guest kernel (scripts/guest-image.sh: cached, so built only the first time,
# about 7 minutes; scripts/test.sh has built it by now): tests/linux_kernel.rs boots it on
# two vCPUs.
own_kernel="$root/benchmarks/cache/guest-image/current/bzImage"
if printf '%s\n' "${suite[@]}" | grep -q '^linux_kernel'; then
    say "rig suite: our own guest kernel (scripts/guest-image.sh)"
    scripts/guest-image.sh >/dev/null
    asset_files+=(--file "$(readlink -f "$own_kernel"):$own_kernel")
fi

# The vfio tests' QEMU peer (QEMU microvm with vfio-pci, the submit-vfio section): QEMU,
# its microvm firmware and SeaBIOS's microvm build, where this host has them.
qemu_files=()
if printf '%s\n' "${suite[@]}" | grep -q '^vfio'; then
    mapfile -t qemu_files < <(rig_qemu_files)
fi

# One machine's run of the test binaries in "$@": the script it runs, then rig.sh.
# Its output (the tests' and the RIG-* markers) is kept in $runlog.
run_machine() {
    local script="$target/rig/suite.sh" t name filter exe
    local files=(--partition "$target/$TRIPLE/debug/partition"
        --file "$target/$TRIPLE/debug/partition:$target/$TRIPLE/debug/partition"
        --file "$target/$TRIPLE/debug/partition-bench:$target/$TRIPLE/debug/partition-bench")
    # Every binary run here must run: a skip inside fails its test (tools/skip).
    local must
    must=$(printf '%s\n' "$@" | sed 's/=.*//' | paste -sd, -)
    {
        echo "mkdir -p '$target/$TRIPLE/tmp'"
        echo "export PARTITION_MUST_RUN='$must'"
        echo "fail=0"
    } > "$script"
    for t in "$@"; do
        name=${t%%=*}
        filter=""
        [ "$name" != "$t" ] && filter=${t#*=}
        exe=$(test_exe "$name")
        [ -n "$exe" ] || die "no test binary named $name (tools/partition-cli/tests/$name.rs)"
        files+=(--file "$exe:$exe")
        {
            echo "echo \"RIG-TEST-BEGIN $name\""
            echo "'$exe' --show-output $filter; rc=\$?"
            echo "echo \"RIG-TEST-END $name rc=\$rc\""
            echo "[ \$rc = 0 ] || fail=1"
        } >> "$script"
    done
    echo 'exit $fail' >> "$script"
    scripts/rig.sh "${files[@]}" ${asset_files[@]+"${asset_files[@]}"} \
        ${qemu_files[@]+"${qemu_files[@]}"} --file "$script:/rig/suite.sh" \
        --timeout "${RIG_TIMEOUT:-2400}" -- sh /rig/suite.sh | tee "$runlog"
    return "${PIPESTATUS[0]}"
}

# What became of each binary: "ok", "failed rc=N", "skipped-in-rig", or empty (not run).
declare -A result
declare -A skips
declare -A logs
declare -A dead
declare -A rerun_why
declare -A rerun_end
reruns=()
deaths=0
machines=0
stage_rc=0
ready=1

# Which of QEMU's TCG modes each binary runs under (docs/testing.md, "Which QEMU"): one
# host thread taking turns for both outer CPUs (single) removes every race between the
# emulator's threads and runs the probe, pool and VFIO binaries as fast as two threads do;
# Debian's boots keep both outer CPUs busy and need a thread each (multi). RIG_TCG_THREAD
# set runs everything under that mode.
multi_binaries=(linux_kernel)
mode_of() {
    if [ -n "${RIG_TCG_THREAD:-}" ]; then echo "$RIG_TCG_THREAD"; return; fi
    local m
    for m in "${multi_binaries[@]}"; do [ "$1" = "$m" ] && { echo multi; return; }; done
    echo single
}

# oops_head LOG: the last kernel oops or panic on a console, from its first line (a BUG,
# an Oops, a general protection fault, a WARNING, a lockup, a panic), at most 60 lines.
oops_head() {
    local heads='BUG: |Oops: |general protection fault|kernel BUG at|WARNING: CPU: |soft lockup - CPU#|INFO: task |cut here|PANIC: |Out of memory|Kernel panic - '
    local found last start
    found=$(grep -n -E "($heads)" "$1" | cut -d: -f1 || true)
    last=$(tail -n 1 <<< "$found")
    [ -n "$last" ] || { echo "(no oops on the console)"; return; }
    # The first head line within 120 lines before the last one: a panic that follows an
    # oops starts at the oops.
    start=$(awk -v l="$last" '$1 <= l && l - $1 < 120 { print $1; exit }' <<< "$found")
    sed -n "${start},$((start + 59))p" "$1"
}

# One group of binaries (one TCG mode): a machine, and a new one for what may run again
# each time the outer machine dies (scripts/rig-judge.sh says which may).
run_group() {
    local mode=$1 t name rc kept line verdict
    shift
    local pending=("$@") left
    while [ ${#pending[@]} -gt 0 ]; do
        machines=$((machines + 1))
        runlog="$target/rig/suite-run-$machines.out"
        say "rig suite (TCG thread=$mode): ${pending[*]}"
        rc=0
        RIG_TCG_THREAD=$mode run_machine "${pending[@]}" || rc=$?
        if [ "$rc" = 3 ]; then
            echo "FAIL rig suite: the rig was not ready (above): nothing ran" >&2
            stage_rc=1
            ready=0
            return
        fi
        kept=""
        if [ "$rc" = 125 ]; then
            deaths=$((deaths + 1))
            kept=$(ls -t "$target"/rig/died-*.log 2>/dev/null | head -n1)
        fi
        left=()
        while IFS= read -r line; do
            name=${line%% *}
            verdict=${line#* }
            case "$verdict" in
                "skipped: "*)
                    # A skip sticks, whatever a later machine's run of the binary prints.
                    skips[$name]+="${verdict#skipped: }"$'\n' ;;
                "rerun: "*)
                    for t in "${pending[@]}"; do [ "${t%%=*}" = "$name" ] && left+=("$t"); done
                    rerun_why[$name]=${verdict#rerun: }
                    rerun_end[$name]=$kept ;;
                *)
                    result[$name]=$(rig_sticky "${result[$name]:-}" "$verdict")
                    logs[$name]=$runlog
                    dead[$name]=$kept ;;
            esac
        done < <(rig_judge "$runlog" "$rc" "$kept" "${pending[@]}")
        pending=()
        [ ${#left[@]} -eq 0 ] && break
        for t in "${left[@]}"; do
            name=${t%%=*}
            if [ "$deaths" -gt 2 ]; then
                result[$name]=$(rig_sticky "${result[$name]:-}" "not run: the outer machine died $deaths times")
            else
                reruns+=("$name on a new machine: ${rerun_why[$name]}|${rerun_end[$name]}")
                pending+=("$t")
            fi
        done
    done
}

for mode in single multi; do
    group=()
    for t in "${suite[@]}"; do [ "$(mode_of "${t%%=*}")" = "$mode" ] && group+=("$t"); done
    if [ ${#group[@]} -gt 0 ] && [ "$ready" = 1 ]; then run_group "$mode" "${group[@]}"; fi
done

# The summary: every binary, every SKIPPED and whether it may, every rerun.
echo "==> rig suite summary" >&2
for t in "${suite[@]}"; do
    name=${t%%=*}
    r=${result[$name]:-not run}
    echo "  $name: $r" >&2
    [ "$r" = ok ] || stage_rc=1
    if [ "${r#failed rc=}" != "$r" ]; then
        # Why it failed, where a CI log that keeps only the end shows it: each failed
        # test's panic and the lines after it (its assertion's message), at most 80 lines.
        rig_section "${logs[$name]}" "$name" \
            | sed -n '/^failures:$/,/^test result:/p' | grep -A 25 -e '^---- ' -e 'panicked at' \
            | head -n 80 | sed 's/^/    | /' >&2
    elif [ "${r#failed: before}" != "$r" ]; then
        # A test that failed before the machine stopped: its panic, from the partial log.
        rig_section "${logs[$name]}" "$name" | grep -A 25 'panicked at' \
            | head -n 80 | sed 's/^/    | /' >&2
    elif [ "${r#failed: hung}" != "$r" ]; then
        # Whose hang it was: our processes' threads inside the outer machine (their
        # kernel stacks, dumped by the machine once the command had been silent a while)
        # and QEMU's view of the outer CPUs.
        sed -n '/^RIG-STACKS/,/^RIG-STACKS-END/p' "${dead[$name]}" | head -n 150 | sed 's/^/    | /' >&2
        sed -n '/^---- QEMU.s state when it was stopped/,$p' "${dead[$name]}" | head -n 40 | sed 's/^/    | /' >&2
    elif [ "${r#failed: the outer machine died}" != "$r" ]; then
        # What the outer kernel said first (the oops's head: what, where, which thread, the
        # call trace), which a CI log that keeps only the end would otherwise lose: from
        # the first line of the last oops on the console, at most 60 lines.
        oops_head "${dead[$name]}" | sed 's/^/    | /' >&2
    fi
    if [ -n "${skips[$name]:-}" ]; then
        while IFS= read -r line; do
            [ -n "$line" ] || continue
            reason=""
            for a in ${allowed_skips[@]+"${allowed_skips[@]}"}; do
                who=${a%%|*}          # BINARY:TEST
                if [ "${who%%:*}" = "$name" ] && [[ "$line" == *"${who#*:}"* ]]; then
                    reason=${a#*|}
                fi
            done
            if [ -n "$reason" ]; then
                echo "    allowed: $line ($reason)" >&2
            else
                echo "    FAIL: a test skipped inside the rig: $line" >&2
                stage_rc=1
            fi
        done < <(printf '%s' "${skips[$name]}" | awk '!seen[$0]++')
    fi
done
for r in ${reruns[@]+"${reruns[@]}"}; do
    echo "  RERUN ${r%|*}" >&2
    # The dead machine's console end: what a reader needs to judge the rerun.
    [ -n "${r##*|}" ] && tail -n 15 "${r##*|}" 2>/dev/null | sed 's/^/    | /' >&2
done
exit "$stage_rc"
