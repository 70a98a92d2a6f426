# Shared helpers for the scripts in this directory. Source it; do not run it.

die() { echo "error: $*" >&2; exit 1; }
# Where cargo puts our binaries: .cargo/config.toml names the target (to link glibc
# statically), so they are under target/TRIPLE/{debug,release}.
TRIPLE=x86_64-unknown-linux-gnu
# Each step says how far into the script it starts (bash's SECONDS), so a CI log shows
# where its minutes went.
say() { printf '==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }

# load_test_exes: builds the workspace's tests as `cargo test --workspace` does (the same
# binaries, not a second build with other features) and keeps each binary's name and path
# of tools/partition-cli/tests in TEST_EXES, read from cargo's JSON messages. Call it in the
# script's own shell (not inside `$(...)`, whose variables are lost) before several
# test_exe calls, so the build and the reading happen once.
load_test_exes() {
    [ -n "${TEST_EXES:-}" ] && return 0
    # cargo's messages go under the target directory, not /tmp: a run stopped during the
    # build leaves nothing outside the checkout.
    local out err dir=${CARGO_TARGET_DIR:-target}
    mkdir -p "$dir"
    out=$(mktemp "$dir/test-exes.XXXXXX")
    err=$(mktemp "$dir/test-exes.XXXXXX")
    if ! cargo test --workspace --no-run --message-format=json --quiet >"$out" 2>"$err"; then
        # Say why (cargo's own errors), not only its exit code.
        tail -n 40 "$err" >&2
        rm -f "$out" "$err"
        die "the workspace's tests did not build (cargo test --workspace --no-run; its errors above)"
    fi
    TEST_EXES=$(python3 -c 'import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target", {})
    if (m.get("reason") == "compiler-artifact" and t.get("kind") == ["test"] and m.get("executable")
            and "tools/partition-cli" in m.get("manifest_path", "")):
        print(t["name"], m["executable"])' < "$out")
    rm -f "$out" "$err"
}

# test_exe NAME: the path of tools/partition-cli/tests/NAME.rs's test binary (load_test_exes
# first if nothing is loaded yet).
test_exe() {
    load_test_exes
    awk -v n="$1" '$1 == n { print $2 }' <<< "$TEST_EXES"
}

need_root() {
    [ "$(id -u)" = 0 ] || die "run as root (KVM, hugepages and cpusets need it)"
}

need_cargo() {
    command -v cargo >/dev/null 2>&1 || die "cargo not found: install a stable Rust toolchain (https://rustup.rs) first"
}

need_kvm() {
    [ -e /dev/kvm ] || die "/dev/kvm does not exist: this host has no KVM"
}

# apt_install PKG...: installs Debian packages that are missing.
apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}" >&2
    fi
}

# irqbalance_bin: Debian's irqbalance unpacked under target/irqbalance (not installed: the
# package starts its daemon, which would move this host's IRQs under every other test and
# stay behind); prints the binary's path. tests/irqbalance.rs runs it.
irqbalance_bin() {
    local dir=target/irqbalance
    local bin=$dir/usr/sbin/irqbalance
    apt_install libglib2.0-0 libnuma1 libcap-ng0 libsystemd0 libncursesw6
    if [ ! -x "$bin" ]; then
        rm -rf "$dir" && mkdir -p "$dir/deb"
        (cd "$dir/deb" && apt-get download irqbalance >&2) \
            || die "apt-get download irqbalance failed"
        dpkg-deb -x "$dir"/deb/irqbalance_*.deb "$dir"
    fi
    echo "$(pwd)/$bin"
}

# apt_qemu: QEMU 10 from Debian's bookworm-backports suite (added to apt's sources once,
# as /etc/apt/sources.list.d/bookworm-backports.sources), unless a QEMU 10 or later is
# installed. The rig needs it: under bookworm's QEMU 7.2, TCG's SVM never delivers a
# guest's XSETBV intercept to the KVM inside, so that KVM's CPUID 0xd keeps describing the
# old XCR0 (tests/assist.rs's xsave test, Debian's "XSAVE consistency problem" WARN); 7.2's
# multi-threaded TCG also lost IPIs and triple-faulted in 2 of 5 suite runs
# (docs/testing.md, "Which QEMU"). The benchmarks' QEMU peer is the same binary.
QEMU_MIN_MAJOR=10
qemu_major() {
    # Nothing when QEMU is missing (a fresh machine): under pipefail its 127 would end the caller.
    command -v qemu-system-x86_64 >/dev/null || return 0
    qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p'
}
apt_qemu() {
    local major
    major=$(qemu_major)
    if [ -n "$major" ] && [ "$major" -ge "$QEMU_MIN_MAJOR" ] \
        && dpkg-query -W -f='${Status}' qemu-utils 2>/dev/null | grep -q "install ok installed"; then
        return 0
    fi
    . /etc/os-release
    [ "${VERSION_CODENAME:-}" = bookworm ] \
        || die "QEMU ${QEMU_MIN_MAJOR} or later is needed (found ${major:-none}); this script installs it from Debian 12's bookworm-backports only"
    local src=/etc/apt/sources.list.d/bookworm-backports.sources
    if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
        say "adding Debian's bookworm-backports suite to apt's sources ($src)"
        printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" \
            "Suites: bookworm-backports" "Components: main" \
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" > "$src"
    fi
    if ! apt-cache policy qemu-system-x86 2>/dev/null | grep -q "~bpo12"; then
        say "apt-get update (bookworm-backports)"
        apt-get update -q >&2
    fi
    say "installing QEMU from bookworm-backports (found ${major:-none}, need ${QEMU_MIN_MAJOR}+)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        -t bookworm-backports qemu-system-x86 qemu-utils >&2
    major=$(qemu_major)
    [ -n "$major" ] && [ "$major" -ge "$QEMU_MIN_MAJOR" ] \
        || die "bookworm-backports gave QEMU ${major:-none}, not ${QEMU_MIN_MAJOR}+"
}

# rig_qemu_files: prints, one a line, rig.sh's --file arguments that carry this host's
# QEMU and its microvm firmware (QEMU's own and SeaBIOS's microvm build, where present)
# into the rig, for the sections and tests that run QEMU as the peer there.
rig_qemu_files() {
    local qemu f
    qemu=$(command -v qemu-system-x86_64) || return 0
    printf '%s\n' --file "$qemu:$qemu"
    for f in /usr/share/qemu/bios-microvm.bin /usr/share/qemu/qboot.rom /usr/share/qemu/pvh.bin \
        /usr/share/qemu/linuxboot_dma.bin /usr/share/qemu/linuxboot.bin \
        /usr/share/seabios/bios-microvm.bin; do
        [ -e "$f" ] && printf '%s\n' --file "$(readlink -f "$f"):$f"
    done
    return 0
}

# apt_lists: makes sure the package lists are there (apt-get download needs them).
apt_lists() {
    if [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ] || [ "${APT_UPDATE:-0}" = 1 ]; then
        say "apt-get update"
        apt-get update -q >&2
    fi
}


# rig_silence: how long (seconds) a rig machine may say nothing on its command's line
# before scripts/rig.sh calls it hung: the longest deadline any test gives itself
# in the rig (LONGEST_DEADLINE in tools/partition-cli/tests/common/mod.rs, which
# wait_output holds every deadline to on a QEMU TCG machine) plus 120 s for the harness around it.
rig_silence() {
    local d
    d=$(sed -n 's/^pub const LONGEST_DEADLINE: Duration = Duration::from_secs(\([0-9]*\));.*/\1/p' \
        "$(dirname "${BASH_SOURCE[0]}")/../tools/partition-cli/tests/common/mod.rs")
    [ -n "$d" ] || die "no LONGEST_DEADLINE in tools/partition-cli/tests/common/mod.rs"
    echo $((d + 120))
}
