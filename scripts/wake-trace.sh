#!/usr/bin/env bash
# Where an IPI wake-up waits, per idle policy, on this host: the probe guest's IPI
# ping-pong (`probe.bench=wake`, as the wake section runs it: 2 vCPUs on cores 0,1) under
# each policy, with the host kernel tracing what KVM and the scheduler do (kvm_exit,
# kvm_entry, kvm_apic_ipi, kvm_vcpu_wakeup, sched_switch, sched_wakeup, ipi_send_cpu).
# scripts/wake-trace.py reads each trace: per IPI, from the sender's ICR write to the
# target vCPU's next guest entry, and what lay between (the target's thread asleep and
# woken by a host IPI, or polling in KVM's halt loop, or kicked out of the guest).
# docs/idle.md, "Where a wake-up waits on this host", is what it showed.
#
#   scripts/wake-trace.sh [POLICY...]     (default: poll haltpoll hlt shared; as root)
#   WAKE_TRACE_BIN=path/to/partition scripts/wake-trace.sh hlt    (another build, for an A/B)
#
# Traces go to target/wake-trace/POLICY.trace and the summaries to stdout. tracefs is
# mounted for the run if it was not, and every setting is put back (events off, buffer
# size as it was, unmounted if mounted here), on error too.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
case "${1:-}" in -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
need_root
need_cargo
need_kvm
policies=("$@")
[ ${#policies[@]} -gt 0 ] || policies=(poll haltpoll hlt shared)

bin=${WAKE_TRACE_BIN:-}
if [ -z "$bin" ]; then
    say "wake trace: cargo build -p partition-cli"
    cargo build -p partition-cli --quiet
    bin=target/$TRIPLE/debug/partition
fi
[ -x "$bin" ] || die "$bin: not an executable"
out=target/wake-trace
mkdir -p "$out"

t=/sys/kernel/tracing
mounted=
if [ ! -e "$t/trace" ]; then
    mount -t tracefs nodev "$t"
    mounted=1
fi
old_kb=$(cat "$t/buffer_size_kb")
events=(kvm/kvm_exit kvm/kvm_entry kvm/kvm_apic_ipi kvm/kvm_vcpu_wakeup
    sched/sched_switch sched/sched_wakeup ipi/ipi_send_cpu)
on=()
restore() {
    echo 0 > "$t/tracing_on" || true
    for e in "${on[@]}"; do echo 0 > "$t/events/$e/enable" || true; done
    echo > "$t/trace" || true
    echo "${old_kb%% *}" > "$t/buffer_size_kb" || true
    [ -z "$mounted" ] || umount "$t" || true
}
trap restore EXIT
echo 0 > "$t/tracing_on"
echo 65536 > "$t/buffer_size_kb"
for e in "${events[@]}"; do
    [ -e "$t/events/$e/enable" ] || die "this kernel has no $e event"
    if [ "$(cat "$t/events/$e/enable")" != 1 ]; then
        echo 1 > "$t/events/$e/enable"
        on+=("$e")
    fi
done

state=$(mktemp -d /tmp/wake-trace.XXXXXX)
for p in "${policies[@]}"; do
    cmdline="probe.memtest=0 probe.bench=wake probe.wake_n=200 probe.wake_warmup=20"
    # As the wake section: under hlt the probe halts without polling first.
    [ "$p" != hlt ] || cmdline="$cmdline probe.idle=hlt"
    echo > "$t/trace"
    echo 1 > "$t/tracing_on"
    rc=0
    PARTITION_STATE_DIR=$state timeout 120 "$bin" launch --cores 0,1 --memory 64M --probe \
        --idle "$p" --cmdline "$cmdline" > "$out/$p.console" 2> "$out/$p.stderr" || rc=$?
    echo 0 > "$t/tracing_on"
    cp "$t/trace" "$out/$p.trace"
    if [ "$rc" != 0 ]; then
        echo "$p: the launch exited $rc (refused here?): $(tail -n1 "$out/$p.stderr")"
        continue
    fi
    echo "== $p: $(grep -m1 'wake test=ipi' "$out/$p.console" || echo 'no ipi line')"
    python3 scripts/wake-trace.py "$out/$p.trace"
done
rm -rf "$state"
