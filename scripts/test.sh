#!/usr/bin/env bash
# Everything CI runs: install what the tests need, build our own guest kernel (beside the
# next steps), check formatting and lints, build the no_std core, check docs/deploy's
# manifests against the Kubernetes schemas, run every test on this host's /dev/kvm (a pod
# through containerd's CRI, a reservation against a running irqbalance and our own kernel
# to userspace on two vCPUs with the SYSCALL repair under a short stress among them), then
# the end-to-end suite again on the rig (real KVM under QEMU TCG with an IOMMU, our own
# kernel included: scripts/rig-suite.sh, docs/testing.md). No timing assertions anywhere.
#
#   scripts/test.sh          (as root)
#   scripts/test.sh --long   also Debian's kernel to userspace on a nested kvm_pvm host (a
#                            quarter of an hour and more each there; in the rig they always
#                            run), our own kernel's SYSCALL stress for 10 s instead of 0.2,
#                            and the pool soak's 500 cycles instead of 30
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
case "${1:-}" in
    --long) export PARTITION_LONG_TESTS=1 ;;
    "") ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (scripts/test.sh [--long])" ;;
esac
need_root "$@"
need_cargo
need_kvm
apt_lists
# gcc links the probe guest; dpkg-deb unpacks the Debian kernel the tests fetch; QEMU runs
# the probe as the benchmarks' peer does; containerd and runc run tests/cri.rs's pod;
# protoc builds the CRI client it drives them with; python3-venv holds the manifests'
# schema check.
apt_install gcc binutils dpkg python3 python3-venv containerd runc protobuf-compiler
apt_qemu
# tests/irqbalance.rs runs Debian's irqbalance against a reservation.
PARTITION_IRQBALANCE=$(irqbalance_bin)
export PARTITION_IRQBALANCE
# What this host is for: these fail, not skip, when something they need is missing.
export PARTITION_MUST_RUN=cri,irqbalance,pod,tenancy,crash,pool::a_reservation_takes_its_cores_from_every_other_cpuset,linux_kernel::our_guest_bzimage_reaches_userspace_and_uses_our_disk

# Our own guest kernel (scripts/guest-image.sh: about 7 minutes on two cores the first
# time, cached in benchmarks/cache after), built beside the lints: tests/linux_kernel.rs
# boots it to userspace here and in the rig. Waited for before the tests, so the build does
# not compete with the guests for the cores.
say "our guest kernel, built in the background (log: target/guest-image.log)"
mkdir -p target
scripts/guest-image.sh > target/guest-image.log 2>&1 &
guest_image=$!

say "cargo fmt --check"
cargo fmt --all -- --check
(cd tools/probe-guest && cargo fmt -- --check)
(cd benchmarks/hotpaths && cargo fmt -- --check)

say "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
(cd tools/probe-guest && cargo clippy --release --quiet -- -D warnings)
(cd benchmarks/hotpaths && cargo clippy --release --all-targets --quiet -- -D warnings)

say "no_std build of the pure boot and pool logic"
cargo build -p boot -p pool --no-default-features --quiet

say "docs/deploy/ against the Kubernetes API schemas (kubernetes-validate from PyPI)"
scripts/validate-manifests.sh

say "waiting for our guest kernel (scripts/guest-image.sh)"
if ! wait "$guest_image"; then
    tail -40 target/guest-image.log >&2
    die "scripts/guest-image.sh failed (target/guest-image.log)"
fi

# Our own kernel's boot on this host takes minutes of one core or two (guest ring 0 is
# emulated here); it runs beside the rig suite, whose first machine (single-threaded TCG)
# leaves a core free, rather than before it.
own_kernel_test=our_guest_bzimage_reaches_userspace_and_uses_our_disk

say "cargo test"
# --show-output: a test that skips or checks less than it would on other hardware says so.
cargo test --workspace -- --show-output --skip "$own_kernel_test"
(cd benchmarks/hotpaths && cargo test --release -- --show-output)

say "our own kernel on this host, in the background (log: target/own-kernel-test.log)"
# The test binary cargo built above, run directly: no cargo beside rig-suite.sh's build.
linux_kernel_exe=$(test_exe linux_kernel)
[ -x "$linux_kernel_exe" ] || die "no tests/linux_kernel.rs binary"
(cd tools/partition-cli && "$linux_kernel_exe" --exact "$own_kernel_test" --show-output) \
    > target/own-kernel-test.log 2>&1 &
own_kernel=$!

say "the end-to-end suite on the rig: real KVM, an IOMMU, PCI functions (scripts/rig-suite.sh)"
rig_rc=0
scripts/rig-suite.sh || rig_rc=$?

say "our own kernel on this host (tests/linux_kernel.rs $own_kernel_test)"
own_rc=0
wait "$own_kernel" || own_rc=$?
cat target/own-kernel-test.log
[ "$own_rc" = 0 ] || die "$own_kernel_test failed on this host (above)"
[ "$rig_rc" = 0 ] || die "the rig suite failed (its summary above)"
