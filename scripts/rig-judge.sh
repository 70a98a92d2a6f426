# How scripts/rig-suite.sh judges one outer machine's run of test binaries: sourced, never
# run. tools/partition-cli/tests/rules.rs runs these functions on made-up logs.
#
#   rig_judge RUNLOG RC KEPT BIN...
#       RUNLOG  the command's output (the tests' and the RIG-TEST-BEGIN/END markers)
#       RC      rig.sh's exit status (125: the outer machine died or hung)
#       KEPT    the dead machine's kept console (rig.sh's died-*.log), or "" if none
#   prints, for each BIN, one verdict line:
#       BIN ok                     ended with status 0
#       BIN failed rc=N            ended with status N
#       BIN failed: WHY            did not end, and the run shows a failure of its (a test
#                                  printed FAILED or panicked before the machine died, it
#                                  died in one of our VMM's threads, or hung silent while
#                                  the outer machine ran)
#       BIN rerun: WHY             did not end, every test it finished had passed, and the
#                                  outer machine itself died or stopped (or it had not
#                                  begun): may run again
#       BIN did not end: WHY       rig.sh gave up another way (its timeout)
#   and, for each SKIPPED line a BIN printed (ended or not), one line "BIN skipped: LINE".
#
#   rig_sticky OLD NEW
#       the result to keep when a binary that already had OLD gets NEW from a later
#       machine: a failure is never replaced, so no rerun removes one.

# Our VMM's threads, as the outer kernel names them in an oops, a lockup or a hung task.
RIG_OURS='partition|vcpu[0-9]+|blk-q[0-9]*|api|engine|vfio-return'
# A panic seen under QEMU's own KVM guests in the rig too, which names whichever thread
# the outer kernel was scheduling, not a culprit (docs/testing.md, "Deaths that name a
# thread").
RIG_EMULATORS='corrupted stack end detected inside scheduler'

# rig_section RUNLOG BIN: BIN's lines, from its RIG-TEST-BEGIN to its RIG-TEST-END or, if
# it never ended, to the end of the log.
rig_section() {
    awk -v b="RIG-TEST-BEGIN $2" -v e="RIG-TEST-END $2 " '
        $0 == b { on = 1 }
        on { print }
        on && index($0, e) == 1 { on = 0 }' "$1"
}

rig_judge() {
    local runlog=$1 rc=$2 kept=$3 t name end section failed end_of hung_why status
    shift 3
    end_of=""
    [ -n "$kept" ] && [ -f "$kept" ] && end_of=$(tail -n 200 "$kept")
    hung_why=$(sed -n 's/^---- hung: //p' <<< "$end_of" | tail -n1)
    status=$(sed -n 's/^status: //p' <<< "$end_of" | tail -n1)
    for t in "$@"; do
        name=${t%%=*}
        section=$(rig_section "$runlog" "$name")
        grep 'SKIPPED' <<< "$section" | sed "s/^/$name skipped: /" || true
        end=$(sed -n "s/^RIG-TEST-END $name rc=\([0-9]*\)\$/\1/p" <<< "$section" | tail -n1)
        if [ -n "$end" ]; then
            if [ "$end" = 0 ]; then echo "$name ok"; else echo "$name failed rc=$end"; fi
            continue
        fi
        # It did not end. A test it finished that failed is a failure whatever came next.
        failed=$(grep -E -e '^test .* \.\.\. FAILED$' -e "^thread '.*' .*panicked at " <<< "$section" | head -n1 || true)
        if [ -n "$failed" ]; then
            echo "$name failed: before the outer machine stopped: $failed"
            continue
        fi
        if [ "$rc" != 125 ]; then
            echo "$name did not end: rig.sh exit $rc"
            continue
        fi
        # Not begun: whatever stopped the machine was another binary's.
        if [ -z "$section" ]; then
            echo "$name rerun: not begun when the outer machine stopped"
            continue
        fi
        # A panic in one of our VMM's threads, or one of them stuck in the kernel (a soft
        # lockup or a hung task naming it), is ours to answer for.
        if ! grep -Eq "Kernel panic - not syncing: ($RIG_EMULATORS)" <<< "$end_of" \
            && grep -Eq "(Comm: |soft lockup - CPU#[0-9]+ stuck for [0-9]+s! \\[|INFO: task )($RIG_OURS)[: ]" <<< "$end_of"; then
            echo "$name failed: the outer machine died in one of our VMM's threads ($kept)"
            continue
        fi
        # Hung: the heartbeat kept coming (the outer machine ran its timers) while the
        # command said nothing: a test of ours stopped answering, whatever its stacks show.
        # Only a machine whose own clock stopped (no heartbeat), or that QEMU shows not
        # running, is the emulator's.
        if [ -n "$hung_why" ] && [ "${hung_why#no heartbeat}" = "$hung_why" ] \
            && { [ -z "$status" ] || [ "$status" = running ]; }; then
            echo "$name failed: hung: $hung_why while the outer machine ran (its stacks and QEMU's state: $kept)"
            continue
        fi
        if [ -n "$hung_why" ]; then
            echo "$name rerun: the outer machine stopped: $hung_why (QEMU: ${status:-no answer}; $kept)"
        elif grep -Eq "Kernel panic - not syncing: ($RIG_EMULATORS)" <<< "$end_of"; then
            echo "$name rerun: the outer kernel panicked: $(grep -Eo "Kernel panic - not syncing: ($RIG_EMULATORS)" <<< "$end_of" | tail -n1 | cut -d: -f2- | sed 's/^ //') (seen under QEMU's own KVM guests too; $kept)"
        else
            echo "$name rerun: the outer machine died under QEMU TCG ($kept)"
        fi
    done
}

rig_sticky() {
    case "$1" in
        failed*|"did not end"*) echo "$1" ;;
        *) echo "$2" ;;
    esac
}
