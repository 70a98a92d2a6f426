# Shared helpers for the scripts in this directory. Source it; do not run it.

die() { echo "error: $*" >&2; exit 1; }
# Where cargo puts our binaries: .cargo/config.toml names the target (to link glibc
# statically), so they are under target/TRIPLE/{debug,release}.
TRIPLE=x86_64-unknown-linux-gnu
say() { echo "==> $*" >&2; }

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

# apt_lists: makes sure the package lists are there (apt-get download needs them).
apt_lists() {
    if [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ] || [ "${APT_UPDATE:-0}" = 1 ]; then
        say "apt-get update"
        apt-get update -q >&2
    fi
}

