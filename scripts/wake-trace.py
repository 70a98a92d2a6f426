#!/usr/bin/env python3
"""Reads a host trace taken by scripts/wake-trace.sh and says where each IPI waited.

A leg runs from one vCPU's IPI to the other (kvm_apic_ipi, a Fixed IPI, on the sender's
thread) to the other's reply (its next such IPI): the target's wake-up, its guest's
interrupt handler, and its send. How the target was reached, from the host IPI the
sender's thread sent right after the ICR write (ipi_send_cpu's call site):
  asleep   ttwu (or wakeup_preempt, where another thread ran on that core): the
           target's thread had gone to sleep in KVM's halt; the scheduler wakes it on its core (sched_wakeup, sched_switch in, kvm_vcpu_wakeup "wait");
  in guest __apic_accept_irq: the target's thread was running the guest; a kick takes it
           out to inject the interrupt;
  polling  no host IPI: the target's thread was in KVM's halt polling and saw the
           interrupt itself (kvm_vcpu_wakeup "poll").
Prints, per kind, how many legs and the median microseconds from the ICR write to each
step and to the reply. (kvm_pvm traces no kvm_exit or kvm_entry, so the guest's own part
is what is left between the target's wake-up in KVM and its reply.)
"""
import re
import statistics
import sys

LINE = re.compile(
    r"^\s*(?P<task>.+?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>[\d.]+):\s+(?P<ev>\w+):\s?(?P<rest>.*)$"
)


def parse(path):
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                out.append((float(m["ts"]), m["task"].strip(), m["ev"], m["rest"]))
    return out


def legs(events):
    """Each leg: kind, and the step times (us after the ICR write)."""
    ipis = [
        (i, ts, task, int(re.search(r"dst (\w+)", rest)[1], 16))
        for i, (ts, task, ev, rest) in enumerate(events)
        if ev == "kvm_apic_ipi" and "Fixed" in rest and task.startswith("vcpu")
    ]
    out = []
    for n, (i, t0, sender, dst) in enumerate(ipis):
        target = f"vcpu{dst}"
        if target == sender:
            continue
        reply = next((x for x in ipis[n + 1:] if x[2] == target), None)
        if reply is None:
            continue
        steps, kind = {"reply": reply[1]}, "polling"
        for ts, task, ev, rest in events[i + 1:reply[0]]:
            if ev == "ipi_send_cpu" and task == sender and "host_ipi" not in steps:
                steps["host_ipi"] = ts
                kind = "asleep" if "ttwu" in rest or "wakeup_preempt" in rest else "in guest" if "apic_accept_irq" in rest else "other"
            elif ev == "sched_wakeup" and f"comm={target} " in rest + " ":
                steps.setdefault("sched_wakeup", ts)
            elif ev == "sched_switch" and re.search(rf"next_comm={target}\b", rest):
                steps.setdefault("switched_in", ts)
            elif ev == "kvm_vcpu_wakeup" and task == target:
                steps.setdefault("kvm_wakeup", ts)
                steps.setdefault("how", rest.split()[0])
        out.append((kind, {k: (v - t0) * 1e6 if isinstance(v, float) else v for k, v in steps.items()}))
    return out


def main(path):
    ls = legs(parse(path))
    print(f"  {len(ls)} legs (an IPI to the other vCPU's reply)")
    by = {}
    for kind, s in ls:
        by.setdefault(kind, []).append(s)
    for kind, ss in sorted(by.items(), key=lambda kv: -len(kv[1])):
        def med(k):
            v = [s[k] for s in ss if k in s]
            return f"{statistics.median(v):.1f}" if v else "-"
        order = ["host_ipi", "sched_wakeup", "switched_in", "kvm_wakeup", "reply"]
        steps = ", ".join(f"{k} {med(k)}" for k in order if med(k) != "-")
        hows = {}
        for s in ss:
            if "how" in s:
                hows[s["how"]] = hows.get(s["how"], 0) + 1
        print(
            f"  {kind}: {len(ss)} ({100 * len(ss) / max(len(ls), 1):.0f}%); us after the ICR write, "
            f"medians: {steps}; KVM's halt ended by {hows or 'nothing (no halt)'}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
