#!/usr/bin/env bash
# Every benchmark, one command: build, fetch the cross-check tools, build the Linux guest
# image, then `partition bench` writes its sections (with
# provenance) into benchmarks/results/<hostname>.json and the report beside it
# (<hostname>.md and <hostname>-ratios.svg). Extra arguments go to `partition bench`
# (--only SECTION,..., --list, --runs N, --report).
#
#   scripts/bench.sh [--only host,probe] [--runs 5]        (as root)
#   scripts/bench.sh --baseline REV [--only builds]        also builds `partition` at git
#       revision REV (a worktree in $TMPDIR, removed at the end; built into
#       target/baseline/) and compares it with this build (the builds section)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root "$@"
need_cargo
need_kvm
apt_lists
apt_install gcc python3 rt-tests stress-ng fio
apt_qemu
cargo build --release --quiet -p partition-cli

args=()
baseline_src=()
drop_baselines() {
    local s
    for s in "${baseline_src[@]}"; do
        git worktree remove --force "$s" 2>/dev/null || rm -rf "$s"
    done
    git worktree prune
}
trap drop_baselines EXIT
while [ $# -gt 0 ]; do
    case "$1" in
        --baseline)
            [ $# -ge 2 ] || die "--baseline needs a git revision"
            rev=$(git rev-parse --short "$2^{commit}") || die "--baseline $2: not a revision"
            # Checked out outside this directory: cargo reads .cargo/config.toml from the
            # directory it runs in and every one above, and a revision from before that
            # file existed must not be built with it (its nested builds expect the old
            # layout). Removed when the bench ends.
            src=$(mktemp -d "${TMPDIR:-/tmp}/partition-baseline-$rev.XXXXXX")
            say "checking out $rev into $src"
            git worktree add --detach "$src" "$rev" >&2
            baseline_src+=("$src")
            say "building the baseline ($rev)"
            out=$PWD/target/baseline/target-$rev
            (cd "$src" && cargo build --release --quiet -p partition-cli --target-dir "$out")
            # Its binary is where its own configuration put it.
            bin=target/baseline/target-$rev/release/partition
            [ -e "$src/.cargo/config.toml" ] && bin=target/baseline/target-$rev/$TRIPLE/release/partition
            args+=(--baseline "$bin" --baseline-label "$rev")
            shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
set -- "${args[@]}"

# lmbench for the crosscheck section: Debian ships it in non-free, which this host's apt
# sources may not list. Fetch the package with a private source list and unpack it under
# target/ without installing anything.
lm=target/tmp/lmbench
lmbin=$lm/root/usr/lib/lmbench/bin/x86_64-linux-gnu
fetch_lmbench() {
    local codename
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    mkdir -p "$lm/lists/partial" "$lm/deb"
    echo "deb http://deb.debian.org/debian $codename non-free" > "$lm/sources.list"
    local aptx=(-o Dir::Etc::SourceList="$PWD/$lm/sources.list" -o Dir::Etc::SourceParts=/dev/null
                -o Dir::State::Lists="$PWD/$lm/lists" -o Dir::Cache="$PWD/$lm/cache")
    apt-get "${aptx[@]}" update -q >&2 &&
        (cd "$lm/deb" && apt-get "${aptx[@]}" download lmbench >&2) &&
        dpkg-deb -x "$lm"/deb/lmbench_*.deb "$lm/root"
}
if [ ! -x "$lmbin/lat_syscall" ]; then
    say "fetching lmbench (Debian non-free) into $lm"
    # Not fatal: without it the crosscheck section says lmbench was not found.
    fetch_lmbench || say "could not fetch lmbench; the crosscheck section will say so"
fi
export PARTITION_LMBENCH=$PWD/$lmbin

# The Linux guest image for the guest section, where a Linux guest can run here.
# The Linux guest image for the guest section (a few minutes the first time, cached after).
# On a nested kvm_pvm host the guest boots under the nested-safe CPU model and runs one round
# per idle policy (about six minutes each there); docs/benchmarks.md says what those rows mean.
scripts/guest-image.sh >/dev/null || say "building the guest image failed; the guest section will say so"

./target/$TRIPLE/release/partition bench "$@"
