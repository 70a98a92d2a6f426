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
# Exits non-zero when any test fails inside, or the rig itself fails.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
case "${1:-}" in -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
need_root
need_cargo
apt_lists
apt_install qemu-system-x86 cpio xz-utils dpkg python3

# What runs inside: test binary names (tools/partition-cli/tests/NAME.rs), each with an
# optional filter: the tests whose paths real hardware takes differently (the idle
# policies with mwait, the CPU model and the SYSCALL canary, cgroup v2 isolation and the
# pool, a triple fault's report, VFIO, Linux to userspace). The rest run on this host in
# every `scripts/test.sh` and can run here by name (`scripts/rig-suite.sh blk engine`):
# every minute of emulated machine is a minute it can die in (docs/testing.md).
suite=(idle assist teardown pool vfio linux_kernel)
[ $# -gt 0 ] && suite=("$@")

say "rig suite: building the test binaries"
# The workspace's build, as `cargo test --workspace` (scripts/test.sh) makes it: the same
# binaries, not a second build with other features.
json=$(cargo test --workspace --no-run --message-format=json --quiet 2>/dev/null)
exe_of() {
    python3 -c '
import json, sys
name = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target", {})
    if (m.get("reason") == "compiler-artifact" and t.get("kind") == ["test"] and t.get("name") == name
            and m.get("executable") and "tools/partition-cli" in m.get("manifest_path", "")):
        print(m["executable"])
' "$1" <<< "$json"
}

root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}
case "$target" in /*) ;; *) target=$root/$target ;; esac
files=(--partition "$target/$TRIPLE/debug/partition")
# The tests find the binary under test where cargo built it.
files+=(--file "$target/$TRIPLE/debug/partition:$target/$TRIPLE/debug/partition")
script="$target/rig/suite.sh"
mkdir -p "$target/rig"
{
    echo "mkdir -p '$target/$TRIPLE/tmp'"
    echo "fail=0"
} > "$script"
for t in "${suite[@]}"; do
    name=${t%%=*}
    filter=""
    [ "$name" != "$t" ] && filter=${t#*=}
    exe=$(exe_of "$name")
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

# The Linux tests' assets, made on this host (apt-get is not reachable inside): the test
# that checks them makes them.
if printf '%s\n' "${suite[@]}" | grep -q '^linux_kernel'; then
    say "rig suite: Debian's kernel and the userspace initramfs (tests/linux_kernel.rs)"
    "$(exe_of linux_kernel)" --exact the_debian_assets_hold_an_elf_kernel_busybox_init_and_the_virtio_modules \
        --quiet >/dev/null
    assets="$target/$TRIPLE/tmp/assets"
    while read -r f; do
        files+=(--file "$assets/$f:$assets/$f")
    done < "$assets/rig.list"
fi

# The vfio tests' QEMU peer (QEMU microvm with vfio-pci, the submit-vfio section): QEMU,
# its microvm firmware and SeaBIOS's microvm build, where this host has them.
if printf '%s\n' "${suite[@]}" | grep -q '^vfio' && command -v qemu-system-x86_64 >/dev/null; then
    qemu=$(command -v qemu-system-x86_64)
    files+=(--file "$qemu:$qemu")
    for f in /usr/share/qemu/bios-microvm.bin /usr/share/qemu/qboot.rom /usr/share/qemu/pvh.bin \
        /usr/share/qemu/linuxboot_dma.bin /usr/share/qemu/linuxboot.bin \
        /usr/share/seabios/bios-microvm.bin; do
        [ -e "$f" ] && files+=(--file "$(readlink -f "$f"):$f")
    done
fi

say "rig suite: ${suite[*]}"
run_rig() {
    scripts/rig.sh "${files[@]}" --file "$script:/rig/suite.sh" --timeout "${RIG_TIMEOUT:-2400}" \
        -- sh /rig/suite.sh
}
# A test that fails inside fails the suite, never run again. The outer machine itself
# dying (rig.sh exit 125: its kernel panicked or QEMU stopped, with the console's end
# printed) is QEMU TCG's, not ours (docs/testing.md, "A limit of the rig"): then the whole
# suite runs once more on a new machine, said loudly.
rc=0
run_rig || rc=$?
if [ "$rc" = 125 ]; then
    echo "NOTE rig suite: the outer machine died under QEMU TCG (its console's end is above); running the suite once more on a new one" >&2
    rc=0
    run_rig || rc=$?
fi
exit "$rc"
