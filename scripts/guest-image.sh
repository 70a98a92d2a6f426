#!/usr/bin/env bash
# Builds the Linux guest image the `guest` benchmark section boots: a small kernel from
# Debian's kernel source package configured by benchmarks/guest/kernel.config (on top of
# allnoconfig; no modules), and an initramfs with busybox-static, the hotpaths binary and
# benchmarks/guest/init, which runs the suite, prints its JSON on the serial console and
# powers off.
#
#   scripts/guest-image.sh          (as root: installs the build packages it needs)
#
# Output, cached by content hash (a second run with the same inputs only prints the path):
#   benchmarks/cache/guest-image/kernel-<hash>/{bzImage,vmlinux,config,build.log}
#       <hash> of this script, kernel.config and the source package version
#   benchmarks/cache/guest-image/<hash>/{bzImage,vmlinux,initramfs.cpio,inputs}
#       <hash> of the kernel's, init, the hotpaths binary and the busybox version
#   benchmarks/cache/guest-image/current -> <hash>
# The kernel build takes several minutes on two cores; it is not part of the test run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root "$@"
need_cargo
apt_lists
apt_install gcc make bc bison flex libelf-dev xz-utils cpio gzip lz4 dpkg perl

repo=$(pwd)
cache=$repo/benchmarks/cache/guest-image
dl=$cache/dl
mkdir -p "$dl"

say "building hotpaths"
# The same build partition's build.rs makes of it (its own workspace, `cargo build
# --release --locked`, glibc linked statically by its .cargo/config.toml), without
# building the whole VMM for it; what the environment sets for the outer build stays out.
(cd benchmarks/hotpaths && env -u RUSTFLAGS -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET_DIR \
    -u CARGO_ENCODED_RUSTFLAGS cargo build --release --locked --quiet --target "$TRIPLE")
cp "benchmarks/hotpaths/target/$TRIPLE/release/hotpaths" "$dl/hotpaths"

# Debian's kernel source: the versioned package the linux-source metapackage points at.
# (Whole outputs are captured before parsing: an early-exiting reader would SIGPIPE apt.)
first() { awk -v pat="$1" '$0 ~ pat && !done {print $2; done = 1}'; }
deps=$(apt-cache depends linux-source 2>/dev/null || true)
srcpkg=$(first 'Depends: linux-source-' <<< "$deps")
[ -n "$srcpkg" ] || die "no linux-source-X.Y package in the apt lists"
info=$(apt-cache show "$srcpkg")
srcver=$(first '^Version:' <<< "$info")
info=$(apt-cache show busybox-static)
bbver=$(first '^Version:' <<< "$info")

khash=$( { cat scripts/guest-image.sh benchmarks/guest/kernel.config; echo "$srcpkg $srcver"; } | sha256sum | cut -c1-16)
kdir=$cache/kernel-$khash

if [ ! -f "$kdir/bzImage" ]; then
    src=$cache/src/$srcpkg-$srcver
    if [ ! -f "$src/Makefile" ]; then
        say "fetching $srcpkg $srcver"
        rm -rf "$dl/src-deb" && mkdir -p "$dl/src-deb"
        (cd "$dl/src-deb" && apt-get download "$srcpkg=$srcver" >&2)
        dpkg-deb -x "$dl/src-deb"/*.deb "$dl/src-deb/x"
        tarball=$(ls "$dl/src-deb/x/usr/src/"*.tar.xz)
        rm -rf "$src" && mkdir -p "$src"
        say "unpacking $(basename "$tarball")"
        tar -xJf "$tarball" -C "$src" --strip-components=1
        rm -rf "$dl/src-deb"
    fi
    build=$cache/build-$khash
    mkdir -p "$build"
    say "configuring (allnoconfig + benchmarks/guest/kernel.config)"
    make -s -C "$src" O="$build" allnoconfig KCONFIG_ALLCONFIG="$repo/benchmarks/guest/kernel.config" >&2
    make -s -C "$src" O="$build" olddefconfig >&2
    missing=()
    while read -r line; do
        case "$line" in CONFIG_*=y) grep -qx "$line" "$build/.config" || missing+=("$line") ;; esac
    done < benchmarks/guest/kernel.config
    [ ${#missing[@]} -eq 0 ] || die "the kernel config did not take: ${missing[*]}"
    say "building the kernel with $(nproc) jobs (log: $build/build.log)"
    if ! make -C "$src" O="$build" -j"$(nproc)" bzImage > "$build/build.log" 2>&1; then
        tail -30 "$build/build.log" >&2
        die "kernel build failed"
    fi
    mkdir -p "$kdir.tmp"
    cp "$build/arch/x86/boot/bzImage" "$build/vmlinux" "$build/.config" "$kdir.tmp/"
    mv "$kdir.tmp/.config" "$kdir.tmp/config"
    cp "$build/build.log" "$kdir.tmp/"
    rm -rf "$kdir" && mv "$kdir.tmp" "$kdir"
    rm -rf "$build"
fi

if [ ! -x "$dl/busybox-$bbver/bin/busybox" ]; then
    say "fetching busybox-static $bbver"
    rm -rf "$dl/bb-deb" && mkdir -p "$dl/bb-deb"
    (cd "$dl/bb-deb" && apt-get download "busybox-static=$bbver" >&2)
    dpkg-deb -x "$dl/bb-deb"/*.deb "$dl/busybox-$bbver"
    rm -rf "$dl/bb-deb"
fi

ihash=$( { echo "$khash $bbver"; cat benchmarks/guest/init "$dl/hotpaths"; } | sha256sum | cut -c1-16)
out=$cache/$ihash
if [ ! -f "$out/initramfs.cpio" ]; then
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    mkdir -p "$root"/{bin,proc,sys,dev,tmp}
    cp "$dl/busybox-$bbver/bin/busybox" "$root/bin/busybox"
    for a in sh mount cat echo tr grep basename uname poweroff reboot sleep; do
        ln -s busybox "$root/bin/$a"
    done
    cp "$dl/hotpaths" "$root/bin/hotpaths"
    cp benchmarks/guest/init "$root/init"
    chmod 755 "$root/init" "$root/bin/hotpaths"
    # The kernel opens /dev/console for init before anything is mounted.
    mknod -m 600 "$root/dev/console" c 5 1
    mknod -m 666 "$root/dev/null" c 1 3
    mkdir -p "$out.tmp"
    # Uncompressed: a nested host runs the guest kernel's gunzip in its instruction
    # emulator (280 s of a 2-vCPU boot for these 3.6 MB); the VMM loads the bytes either way.
    (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) > "$out.tmp/initramfs.cpio"
    cp "$kdir/bzImage" "$kdir/vmlinux" "$out.tmp/"
    {
        echo "kernel: $srcpkg $srcver, config benchmarks/guest/kernel.config (kernel-$khash)"
        echo "busybox-static: $bbver"
        echo "hotpaths: sha256 $(sha256sum "$dl/hotpaths" | cut -c1-64)"
        echo "init: sha256 $(sha256sum benchmarks/guest/init | cut -c1-64)"
    } > "$out.tmp/inputs"
    rm -rf "$out" && mv "$out.tmp" "$out"
fi
ln -sfn "$ihash" "$cache/current"
say "guest image: $out"
echo "$out"
