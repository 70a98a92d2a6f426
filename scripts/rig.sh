#!/usr/bin/env bash
# The second proving ground: real KVM (kvm_amd on QEMU TCG's emulated AMD SVM with nested
# paging), an emulated Intel IOMMU with interrupt remapping, and real PCI functions
# (QEMU's NVMe, edu, ivshmem-plain with a 256 GiB 64-bit prefetchable BAR, and e1000e for
# its PCIe extended capabilities). Boots an
# outer Linux (Debian's generic 6.12 kernel) from an initramfs holding our binary, runs one
# command inside as root and returns its exit status; the command's output comes back on
# a serial line of its own (the outer kernel's log goes to a file). docs/testing.md.
#
#   scripts/rig.sh [options] [--] COMMAND [ARG...]
#
#   --partition BIN   the partition binary to put inside (default: a release build, made
#                     here when missing or older than the sources)
#   --file SRC[:DST]  also put the host file SRC inside, at DST (default /rig/<name>),
#                     with the shared libraries it links; may be given many times
#   --timeout SECS    give up on the outer machine after SECS (default 900)
#   --log FILE        where the outer kernel's console goes (default target/rig/console.log)
#   --mem MIB         the outer machine's memory (default 6144: the pool tests reserve
#                     4 GiB of hugepages in it)
#
# RIG_OMIT_MODULES="kvm_amd ..." leaves those modules out (to see the rig refuse to run
# without them). RIG_TCG_THREAD=single|multi picks QEMU's TCG threading (default multi;
# docs/testing.md, "Which QEMU"). RIG_VRAM=SIZE: ivshmem's BAR (default 256G, a sparse file;
# 512G does not fit the outer machine's 40-bit physical address width). RIG_SILENCE=SECS: a machine silent that long on the
# command's line is hung, stopped and reported as a death (exit 125; default: the longest
# deadline a test gives itself plus 120 s, scripts/lib.sh rig_silence).
# RIG_MODULE_PARAMS="kvm-amd:npt=0 ...": parameters given to modules as they are loaded
# (an experiment's knob: the suite's configuration passes none).
# RIG_TRACE_EVENTS="kvm/kvm_exit ...": tracepoints enabled while the machine has one CPU,
# before the second comes online (tracing itself off), so a command that traces only turns
# the buffer on and off: enabling an event patches kernel text, which QEMU's multi-threaded
# TCG has run stale with two CPUs (docs/testing.md, "Which TCG threading").
# RIG_STALL=SECS: a machine whose heartbeat (a console line every 10 s of its own clock)
# stops that long is poked once through QEMU's monitor, and hung if it stays silent as
# long again (default 60). Before the command runs, the machine checks it is what it must
# be: kvm_amd loaded, /dev/kvm, IOMMU groups, vfio-pci; anything missing stops it with
# RIG-NOT-READY and exit status 3, the console's module lines printed.
#
# Inside: busybox, /dev/kvm (kvm_amd), vfio-pci loaded, IOMMU groups, cgroup v2 mounted at
# /sys/fs/cgroup with +cpuset, the `partition` user, our binary as /usr/bin/partition and
# the files asked for; the command runs in /rig with PATH=/usr/bin:/bin. The rig's PCI
# functions: 00:03.0 edu and 00:03.1 pci-testdev (one multifunction slot: one IOMMU group),
# 00:04.0 NVMe (a 64 MiB namespace), 00:05.0 ivshmem-plain, 00:06.0 e1000e (no network
# behind it; AER, serial number and ARI extended capabilities; an expansion ROM).
# Everything is downloaded with apt-get download and cached under target/rig/.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }

bin=""
files=()
timeout=900
mem=6144
cache=target/rig
log=""
while [ $# -gt 0 ]; do
    case "$1" in
        --partition) bin="$2"; shift 2 ;;
        --file) files+=("$2"); shift 2 ;;
        --timeout) timeout="$2"; shift 2 ;;
        --log) log="$2"; shift 2 ;;
        --mem) mem="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        -*) die "unknown option $1 (scripts/rig.sh --help)" ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || die "no command to run inside (scripts/rig.sh --help)"
need_root
command -v cpio >/dev/null 2>&1 \
    && command -v xz >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 \
    && command -v gcc >/dev/null 2>&1 && [ -e /usr/lib/x86_64-linux-gnu/libc.a ] || {
    apt_lists
    apt_install cpio xz-utils dpkg gcc libc6-dev
}
apt_qemu
silence=${RIG_SILENCE:-$(rig_silence)}
case "$silence" in ''|*[!0-9]*) die "RIG_SILENCE is a number of seconds, not '$silence'" ;; esac
[ "$silence" -gt 60 ] || die "RIG_SILENCE must exceed 60 s (the machine dumps its stacks 60 s before)"
tcg_thread=${RIG_TCG_THREAD:-multi}
case "$tcg_thread" in single|multi) ;; *) die "RIG_TCG_THREAD is single or multi, not '$tcg_thread'" ;; esac
say "rig: $(qemu-system-x86_64 --version | head -1), TCG thread=$tcg_thread"
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
log=${log:-$cache/console.log}

# The outer kernel and busybox, from Debian's packages (once).
fetch() { # fetch PKG DIR: apt-get download PKG (a metapackage resolved) and unpack to DIR
    local pkg=$1 dir=$2 real
    [ -e "$dir/.done" ] && return 0
    apt_lists
    # Lists older than the package (a security update replaced the version they name): read
    # them again once.
    apt-cache show "$pkg" >/dev/null 2>&1 || APT_UPDATE=1 apt_lists
    real=$(apt-cache depends "$pkg" 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-.*\)/\1/p' | head -n1 || true)
    real=${real:-$pkg}
    say "rig: downloading $real"
    rm -rf "$dir" "$dir.deb" && mkdir -p "$dir.deb"
    # A list naming a version the mirror no longer has: read the lists again, once.
    (cd "$dir.deb" && apt-get download -q "$real" >&2) \
        || { APT_UPDATE=1 apt_lists && (cd "$dir.deb" && apt-get download -q "$real" >&2); } \
        || die "apt-get download $real failed"
    dpkg-deb -x "$dir.deb"/*.deb "$dir"
    rm -rf "$dir.deb"
    echo "$real" > "$dir/.done"
}
fetch linux-image-6.12-amd64 "$cache/kernel"
fetch busybox-static "$cache/busybox"
vmlinuz=$(ls "$cache"/kernel/boot/vmlinuz-* | head -n1)
moddir=$(ls -d "$cache"/kernel/lib/modules/* | head -n1)

# The base initramfs (kernel modules, busybox, /init), rebuilt when this script changes.
base="$cache/base.cpio"
if [ ! -e "$base" ] || [ "$0" -nt "$base" ] || [ scripts/rig-holder.c -nt "$base" ]; then
    say "rig: building the outer machine's initramfs"
    root="$cache/base-root"
    rm -rf "$root" && mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,etc,rig,lib/modules}
    cp "$cache/busybox/bin/busybox" "$root/bin/busybox"
    # Modules in load order, each after what its .modinfo says it depends on.
    order=()
    add_module() {
        local name=$1 f deps d
        for d in "${order[@]:-}"; do [ "$d" = "$name" ] && return 0; done
        f=$(find "$moddir/kernel" -name "$name.ko.xz" -o -name "${name//_/-}.ko.xz" | head -n1)
        [ -n "$f" ] || die "module $name is not in $(basename "$moddir")"
        deps=$(xz -dc "$f" | tr '\0' '\n' | sed -n 's/^depends=//p' | head -n1)
        for d in ${deps//,/ }; do add_module "$d"; done
        order+=("$name")
        xz -dc "$f" > "$root/lib/modules/$name.ko"
    }
    for m in kvm-amd vfio-pci vfio_iommu_type1; do add_module "$m"; done
    printf '%s\n' "${order[@]}" > "$root/lib/modules/load"
    # nvme is there for commands that give a device back to its host driver; not loaded
    # (/lib/modules/host-nvme: its modules in load order).
    loaded=${#order[@]}
    for m in nvme; do add_module "$m"; done
    printf '%s\n' "${order[@]:$loaded}" > "$root/lib/modules/host-nvme"
    # The holder (scripts/rig-holder.c): a VM that lives as long as the machine.
    gcc -static -Os -o "$root/bin/kvm-holder" scripts/rig-holder.c
    cat > "$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
partition:x:999:999:partition VMM:/nonexistent:/bin/false
EOF
    cat > "$root/etc/group" <<'EOF'
root:x:0:
partition:x:999:
EOF
    cat > "$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
# /tmp stays the initramfs's own (writable) directory: a checkout under /tmp has its test
# binaries there.
mount -t tmpfs run /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo +cpuset > /sys/fs/cgroup/cgroup.subtree_control
# A heartbeat on the console every 10 s of this machine's own clock: scripts/rig.sh reads a
# machine whose heartbeat stops as one whose timers stopped firing (docs/testing.md).
# And when the command's line (ttyS1, whose mtime the kernel keeps to 8 s) has been silent
# for /rig/dump-after seconds, once per silence: the kernel stacks of every thread of the
# command's processes (RIG-STACKS ... RIG-STACKS-END on the console), so a hang that
# rig.sh stops shows whose it was.
rig_stacks() {
    echo "RIG-STACKS the command's line silent $1 s; uptime $(cut -d' ' -f1 /proc/uptime)"
    for p in /proc/[0-9]*; do
        exe=$(readlink "$p/exe" 2>/dev/null) || continue
        case "$exe" in /bin/busybox|/bin/kvm-holder|"") continue ;; esac
        echo "== pid ${p#/proc/} $exe"
        for t in "$p"/task/*; do
            echo "-- ${t##*/} $(cat "$t/comm" 2>/dev/null) state $(sed 's/^.*) //' "$t/stat" 2>/dev/null | cut -d' ' -f1) wchan $(cat "$t/wchan" 2>/dev/null)"
            cat "$t/stack" 2>/dev/null
        done
    done
    echo "RIG-STACKS-END"
}
(dump_after=$(cat /rig/dump-after 2>/dev/null || echo 0); dumped=0
 while :; do
    sleep 10
    echo "rig-alive $(cut -d' ' -f1 /proc/uptime)" > /dev/ttyS0
    quiet=$(( $(date +%s) - $(stat -c %Y /dev/ttyS1 2>/dev/null || date +%s) ))
    if [ "$dump_after" -gt 0 ] && [ "$quiet" -ge "$dump_after" ]; then
        [ "$dumped" = 1 ] || rig_stacks "$quiet" > /dev/ttyS0 2>&1
        dumped=1
    else
        dumped=0
    fi
 done) &
ip link set lo up 2>/dev/null
for m in $(cat /lib/modules/load); do
    if grep -qx "$m" /rig/omit-modules 2>/dev/null; then
        echo "rig: $m left out (RIG_OMIT_MODULES)" > /dev/console
        continue
    fi
    params=$(sed -n "s/^$m //p" /rig/module-params 2>/dev/null)
    [ -n "$params" ] && echo "rig: $m $params (RIG_MODULE_PARAMS)" > /dev/console
    insmod /lib/modules/$m.ko $params || echo "rig: insmod $m failed" > /dev/console
done
# A cpuset cgroup and a VM that live as long as the machine: the kernel patches its code
# when the first of either appears or the last goes (scripts/rig-holder.c says why).
mkdir /sys/fs/cgroup/rig-hold
kvm-holder &
# Tracepoints a command asked for (RIG_TRACE_EVENTS), enabled with one CPU too: enabling
# one patches kernel text.
if [ -s /rig/trace-events ]; then
    t=/sys/kernel/tracing
    [ -e $t/events ] || mount -t tracefs nodev $t
    echo 0 > $t/tracing_on
    for e in $(cat /rig/trace-events); do
        echo 1 > $t/events/$e/enable || echo "rig: trace event $e failed" > /dev/console
    done
fi
# The second CPU only now (maxcpus=1): the kernel's boot-time code patching and the
# modules' (kvm updates static calls in the core kernel) ran with one CPU.
echo 1 > /sys/devices/system/cpu/cpu1/online
stty -F /dev/ttyS1 raw -echo 2>/dev/null
dmesg -n 1
out=/dev/ttyS1
# What the rig is for, checked before anything runs: a suite must not pass on skips.
missing=""
grep -q '^kvm_amd ' /proc/modules || missing="$missing kvm_amd"
[ -e /dev/kvm ] || missing="$missing /dev/kvm"
[ "$(ls /sys/kernel/iommu_groups 2>/dev/null | wc -l)" -gt 0 ] || missing="$missing iommu-groups"
[ -d /sys/bus/pci/drivers/vfio-pci ] || missing="$missing vfio-pci"
[ "$(nproc)" -ge 2 ] || missing="$missing second-cpu"
facts="kernel=$(uname -r) cpus=$(nproc) kvm=$([ -e /dev/kvm ] && echo yes || echo no) iommu_groups=$(ls /sys/kernel/iommu_groups 2>/dev/null | wc -l) uptime=$(cut -d' ' -f1 /proc/uptime)"
cd /rig
if [ -n "$missing" ]; then
    echo "RIG-NOT-READY missing=${missing# } $facts" > $out
    rc=3
else
    echo "RIG-READY $facts" > $out
    sh /rig/cmd > $out 2>&1 < /dev/null
    rc=$?
fi
echo "RIG-EXIT rc=$rc uptime=$(cut -d' ' -f1 /proc/uptime)" > $out
sync
poweroff -f
EOF
    chmod 755 "$root/init"
    (cd "$root" && find . | cpio -o -H newc --quiet) > "$base.tmp"
    mv "$base.tmp" "$base"
fi

# Our binary, its libraries, the command and the files asked for: a second archive the
# kernel unpacks over the first.
if [ -z "$bin" ]; then
    bin=target/$TRIPLE/release/partition
    if [ ! -x "$bin" ] || [ -n "$(find partition devices boot pool tools/partition-cli tools/probe-guest -newer "$bin" -name '*.rs' -print -quit)" ]; then
        need_cargo
        say "rig: cargo build --release -p partition-cli"
        cargo build --release -p partition-cli --quiet
    fi
fi
[ -x "$bin" ] || die "$bin is not an executable"
run=$(mktemp -d "$cache/run.XXXXXX")
trap 'rm -rf "$run"' EXIT
extra="$run/root"
mkdir -p "$extra/usr/bin" "$extra/rig"
# Without its debug sections: the outer kernel unpacks the archive under TCG.
strip --strip-debug -o "$extra/usr/bin/partition" "$bin" 2>/dev/null || cp "$bin" "$extra/usr/bin/partition"
# The benchmarks' program, which `partition bench` runs from beside it.
if [ -x "$(dirname "$bin")/partition-bench" ]; then
    strip --strip-debug -o "$extra/usr/bin/partition-bench" "$(dirname "$bin")/partition-bench" 2>/dev/null ||
        cp "$(dirname "$bin")/partition-bench" "$extra/usr/bin/partition-bench"
fi
libs_of() { # the shared libraries (and loader) a dynamic executable needs, into the rig
    local lib
    for lib in $(ldd "$1" 2>/dev/null | grep -o '/[^ ]*' || true); do
        [ -e "$extra$lib" ] && continue
        mkdir -p "$extra$(dirname "$lib")"
        cp -L "$lib" "$extra$lib"
    done
}
libs_of "$bin"
for f in "${files[@]:-}"; do
    [ -n "$f" ] || continue
    src=${f%%:*}
    dst=${f#*:}
    [ "$dst" = "$f" ] && dst=/rig/$(basename "$src")
    [ -e "$src" ] || die "--file $src: no such file"
    mkdir -p "$extra$(dirname "$dst")"
    if [ -x "$src" ] && head -c 4 "$src" | grep -q ELF; then
        strip --strip-debug -o "$extra$dst" "$src" 2>/dev/null || cp -L "$src" "$extra$dst"
        libs_of "$src"
    else
        cp -L "$src" "$extra$dst"
    fi
done
{
    printf '#!/bin/sh\n'
    printf '%q ' "$@"
    printf '\n'
} > "$extra/rig/cmd"
for m in ${RIG_OMIT_MODULES:-}; do echo "${m//-/_}"; echo "${m//_/-}"; done > "$extra/rig/omit-modules"
for e in ${RIG_TRACE_EVENTS:-}; do echo "$e"; done > "$extra/rig/trace-events"
echo $((silence - 60)) > "$extra/rig/dump-after"
# "MODULE:PARAM=VALUE": each as the module is loaded, under both spellings of its name.
for p in ${RIG_MODULE_PARAMS:-}; do
    m=${p%%:*}
    echo "${m//-/_} ${p#*:}"
    echo "${m//_/-} ${p#*:}"
done > "$extra/rig/module-params"
(cd "$extra" && find . | cpio -o -H newc --quiet) > "$run/extra.cpio"
cat "$base" "$run/extra.cpio" > "$run/initrd.cpio"

# The NVMe's namespace: 64 MiB of zeros, new each run.
truncate -s 64M "$run/nvme.img"
# ivshmem's BAR 2 (a GPU's VRAM aperture): a sparse file, so only the pages touched take disk.
vram=${RIG_VRAM:-256G}
truncate -s "$vram" "$run/vram.img"
out="$run/out"
: > "$out"
say "rig: booting the outer machine (console: $log)"
qemu=(qemu-system-x86_64 -machine q35,kernel-irqchip=split -accel "tcg,thread=$tcg_thread"
    -cpu EPYC,+svm,+npt -smp 2 -m "$mem" -display none -no-reboot -nodefaults
    -kernel "$vmlinuz" -initrd "$run/initrd.cpio"
    -append "console=ttyS0 intel_iommu=on iommu=pt panic=-1 quiet maxcpus=1 tsc=reliable"
    -serial "file:$log" -serial "file:$out"
    -device intel-iommu,intremap=on
    -device edu,addr=03.0,multifunction=on
    -device pci-testdev,addr=03.1
    -drive "file=$run/nvme.img,if=none,id=nv,format=raw"
    -device nvme,serial=rig-nvme,drive=nv,addr=04.0
    -object "memory-backend-file,id=vram,size=$vram,mem-path=$run/vram.img,share=on"
    -device ivshmem-plain,memdev=vram,addr=05.0
    -device e1000e,addr=06.0
    -qmp "unix:$run/qmp.sock,server=on,wait=off" -name rig,debug-threads=on
    -d cpu_reset -D "$log.resets")
# QEMU's own warnings (TCG lacks some of EPYC's features) go to a file beside the log.
"${qemu[@]}" 2> "$log.qemu" &
qpid=$!
tail -f --pid=$qpid "$out" | sed -u 's/\r$//' &
tpid=$!
deadline=$((SECONDS + timeout))
# Two watchdogs. The machine's heartbeat (a console line every 10 s of its own clock, from
# the first on): when none has come for RIG_STALL seconds (default 60), the machine's timers have stopped firing
# (docs/testing.md, "Which QEMU": QEMU TCG lost the outer machine's timer wake-up). QEMU is
# then poked once through its monitor (a QMP query, which wakes its main loop); a
# heartbeat within RIG_STALL more seconds means the poke woke it, and the run goes on,
# said on stderr; none means it is hung: stopped, reported as a death (exit 125), its
# console kept. And a machine that says nothing on the command's line for RIG_SILENCE
# seconds (default: the longest deadline a test gives itself, plus 120 s: rig_silence in
# scripts/lib.sh) is hung too; 60 s before that the machine dumps its command's stacks on
# the console (above).
stall=${RIG_STALL:-60}
# qmp WHAT: asks QEMU's monitor. "status": its run state (a poke that wakes its main loop);
# "state": the outer machine as QEMU sees it, each CPU's registers (HLT=1: halted) and
# local APIC (its timer, IRR and ISR) and the interrupt counts: which side lost a wake-up
# (docs/testing.md, "Which QEMU").
qmp() {
    python3 - "$run/qmp.sock" "$1" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(20)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.readline()
def ask(cmd, **args):
    f.write(json.dumps({"execute": cmd, "arguments": args} if args else {"execute": cmd}) + "\n")
    f.flush()
    while True:
        a = json.loads(f.readline())
        if "event" not in a:
            return a
ask("qmp_capabilities")
status = ask("query-status").get("return", {}).get("status", "?")
if sys.argv[2] == "status":
    print(status)
    sys.exit(0)
print("status:", status)
for c in ask("query-cpus-fast").get("return", []):
    i = c.get("cpu-index")
    for line in ("info registers", "info lapic"):
        print(f"-- cpu {i}: {line}")
        print(ask("human-monitor-command", **{"command-line": line, "cpu-index": i}).get("return", ""))
print("-- info irq")
print(ask("human-monitor-command", **{"command-line": "info irq"}).get("return", ""))
PY
}
qmp_poke() { qmp status 2>/dev/null || echo "no answer"; }
qmp_state() { # QEMU's view (qmp state) and each QEMU thread's kernel wait
    qmp state 2>&1 || echo "no answer from QEMU's monitor"
    local t
    for t in /proc/$qpid/task/*; do
        echo "thread $(cat "$t/comm" 2>/dev/null): state $(awk '{ sub(/^.*\) /, ""); print $1 }' "$t/stat" 2>/dev/null) wchan $(cat "$t/wchan" 2>/dev/null)"
    done
}
# QEMU's CPU time so far, in seconds (user + system of all its threads).
qemu_cpu_s() {
    awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.1f", ($12 + $13) / hz }' "/proc/$qpid/stat" 2>/dev/null || echo "?"
}
cpu_at_poke=0
said=0
quiet_since=$SECONDS
beat=0
beat_since=$SECONDS
# How far the console has been read for heartbeats: each second reads only what is new (a
# beat split across two reads is counted by its first part, or missed once if the split
# falls inside "rig-alive": the next comes 10 s later).
log_read=0
poked_at=""
hung=0
while kill -0 $qpid 2>/dev/null; do
    now_said=$(stat -c %s "$out" 2>/dev/null || echo 0)
    log_size=$(stat -c %s "$log" 2>/dev/null || echo 0)
    now_beat=$beat
    # QEMU truncates the console file when it opens it, perhaps after the first read here.
    [ "$log_size" -lt "$log_read" ] && log_read=0
    if [ "$log_size" -gt "$log_read" ]; then
        new_beats=$(tail -c +$((log_read + 1)) "$log" | head -c $((log_size - log_read)) | grep -c '^rig-alive' || true)
        now_beat=$((beat + ${new_beats:-0}))
        log_read=$log_size
    fi
    if [ "$now_said" != "$said" ]; then
        said=$now_said
        quiet_since=$SECONDS
    fi
    if [ "$now_beat" != "$beat" ]; then
        beat=$now_beat
        beat_since=$SECONDS
        if [ -n "$poked_at" ]; then
            echo "rig: NOTE the outer machine's heartbeat stopped for $((SECONDS - poked_at + stall)) s and came back after a QMP poke (its timers stalled: docs/testing.md)" >&2
            poked_at=""
        fi
    elif [ "$beat" = 0 ]; then
        : # Booting: the heartbeat has not begun (RIG_SILENCE and the timeout guard this).
    elif [ -z "$poked_at" ] && [ $((SECONDS - beat_since)) -ge "$stall" ]; then
        poked_at=$SECONDS
        cpu_at_poke=$(qemu_cpu_s)
        echo "rig: the outer machine's heartbeat stopped ${stall} s ago (QEMU CPU ${cpu_at_poke} s): poking QEMU's monitor: $(qmp_poke)" >&2
    elif [ -n "$poked_at" ] && [ $((SECONDS - poked_at)) -ge "$stall" ]; then
        # How busy QEMU was since the poke tells a machine whose timers stopped (its vCPUs
        # idle, waiting for an interrupt that never comes) from one spinning.
        echo "error: the outer machine's heartbeat stopped $((SECONDS - beat_since)) s ago and a QMP poke did not bring it back: hung, stopped (QEMU used $(awk -v a="$cpu_at_poke" -v b="$(qemu_cpu_s)" 'BEGIN { printf "%.1f", b - a }') s of CPU in the $((SECONDS - poked_at)) s since the poke)" >&2
        hung=1
        hung_why="no heartbeat for $((SECONDS - beat_since)) s, a QMP poke did not help"
    fi
    if [ "$hung" = 0 ] && [ $((SECONDS - quiet_since)) -ge "$silence" ]; then
        echo "error: the outer machine said nothing for ${silence} s (RIG_SILENCE): hung, stopped" >&2
        hung=1
        hung_why="nothing on the command's line for ${silence} s"
    fi
    if [ "$hung" = 1 ]; then
        # Whichever watchdog stopped it: QEMU's view of the machine first, for the record.
        qmp_state > "$run/state" 2>&1 || true
        kill $qpid 2>/dev/null || true
        wait $qpid 2>/dev/null || true
        break
    fi
    if [ $SECONDS -ge $deadline ]; then
        echo "error: the rig did not finish within ${timeout} s; the outer console's end:" >&2
        kill $qpid 2>/dev/null || true
        tail -n 40 "$log" >&2 || true
        wait $qpid 2>/dev/null || true
        wait $tpid 2>/dev/null || true
        exit 124
    fi
    sleep 1
done
wait $qpid || true
wait $tpid 2>/dev/null || true
rc=$(sed -n 's/^RIG-EXIT rc=\([0-9]*\).*/\1/p' "$out" | tail -n1)
if grep -q '^RIG-NOT-READY' "$out"; then
    echo "error: the rig is not what it must be, missing: $(sed -n 's/^RIG-NOT-READY missing=\(.*\) kernel=.*/\1/p' "$out"); the console's module lines:" >&2
    grep -E 'rig: |insmod|kvm|vfio|iommu|DMAR' "$log" | tail -n 40 >&2 || true
    exit 3
fi
if [ -z "$rc" ] || [ "$hung" = 1 ]; then
    # Kept for the record: what the outer kernel said as it died.
    # The outer kernel is quiet (only emergencies reach the console), and an outer triple
    # fault says nothing there at all: QEMU's own log of CPU resets (-d cpu_reset; a reset
    # after boot is the machine dying) and its stderr are kept beside it.
    kept="$cache/died-$(date +%Y%m%dT%H%M%S).log"
    {
        cat "$log"
        echo "---- QEMU's stderr"
        grep -v "TCG doesn't support" "$log.qemu"
        echo "---- QEMU's last CPU resets (-d cpu_reset)"
        tail -n 80 "$log.resets"
        [ "$hung" = 1 ] && echo "---- hung: $hung_why"
        [ -s "$run/state" ] && { echo "---- QEMU's state when it was stopped (QMP)"; cat "$run/state"; }
    } > "$kept" 2>/dev/null || true
    echo "error: the outer machine stopped before the command ended (its whole console: $kept); its end:" >&2
    tail -n 40 "$log" >&2 || true
    grep -v "TCG doesn't support" "$log.qemu" >&2 || true
    exit 125
fi
exit "$rc"
