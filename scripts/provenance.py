#!/usr/bin/env python3
"""Facts about this host that a benchmark result must carry, as JSON on stdout.

Every field degrades to null rather than failing: this has to run on machines nobody has
seen. Usage: scripts/provenance.py [REPO]  (REPO for the commit; default: this checkout).
"""
import glob
import json
import os
import platform
import re
import subprocess
import sys


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def run(*cmd, cwd=None):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def cpuinfo_field(name):
    text = read("/proc/cpuinfo") or ""
    m = re.search(r"^%s\s*:\s*(.*)$" % re.escape(name), text, re.M)
    return m.group(1).strip() if m else None


def meminfo():
    out = {}
    for line in (read("/proc/meminfo") or "").splitlines():
        k, _, v = line.partition(":")
        if k.startswith("HugePages") or k in ("Hugepagesize", "MemTotal"):
            out[k] = v.strip()
    return out or None


def params(module):
    d = "/sys/module/%s/parameters" % module
    if not os.path.isdir(d):
        return None
    out = {}
    for p in sorted(os.listdir(d)):
        v = read(os.path.join(d, p))
        if v is not None:
            out[p] = v
    return out


def kvm():
    vendor = None
    for m in ("kvm_intel", "kvm_amd", "kvm_pvm"):
        if os.path.isdir("/sys/module/" + m):
            vendor = m
    flags = (cpuinfo_field("flags") or "").split()
    nested_param = None
    if vendor in ("kvm_intel", "kvm_amd"):
        nested_param = read("/sys/module/%s/parameters/nested" % vendor)
    return {
        "dev_kvm": os.path.exists("/dev/kvm"),
        "vendor_module": vendor,
        "params": params("kvm"),
        "vendor_params": params(vendor) if vendor else None,
        # The host itself runs under a hypervisor ("hypervisor" CPUID bit), so guests here
        # are nested: figures are L2 against an L1 baseline.
        "host_is_a_guest": "hypervisor" in flags,
        "nested_param": nested_param,
    }


def cpuidle():
    states = []
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cpuidle/state*")):
        states.append({"name": read(d + "/name"), "latency_us": read(d + "/latency"),
                       "disabled": read(d + "/disable")})
    return {"driver": read("/sys/devices/system/cpu/cpuidle/current_driver"),
            "governor": read("/sys/devices/system/cpu/cpuidle/current_governor_ro")
            or read("/sys/devices/system/cpu/cpuidle/current_governor"),
            "states": states or None}


def mitigations():
    out = {}
    for p in sorted(glob.glob("/sys/devices/system/cpu/vulnerabilities/*")):
        out[os.path.basename(p)] = read(p)
    return out or None


def rapl():
    zones = glob.glob("/sys/class/powercap/intel-rapl:*") + glob.glob("/sys/class/powercap/amd-rapl:*")
    return {"available": bool(zones), "zones": sorted(read(z + "/name") for z in zones) or None}


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = run("git", "rev-parse", "HEAD", cwd=repo)
    # The results files are what a run writes: they do not make the code dirty.
    dirty = run("git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                ":(exclude)benchmarks/results", cwd=repo)
    facts = {
        "hostname": platform.node() or None,
        "date_utc": run("date", "-u", "+%Y-%m-%dT%H:%M:%SZ"),
        "cpu_model": cpuinfo_field("model name"),
        "microcode": cpuinfo_field("microcode"),
        "cpus_online": read("/sys/devices/system/cpu/online"),
        "smt_active": read("/sys/devices/system/cpu/smt/active"),
        "governor": read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "energy_performance_preference": read("/sys/devices/system/cpu/cpu0/cpufreq/energy_performance_preference"),
        "cpuidle": cpuidle(),
        "kernel": platform.release() or None,
        "kernel_cmdline": read("/proc/cmdline"),
        "mitigations": mitigations(),
        "memory": meminfo(),
        "isolated_cpus": read("/sys/devices/system/cpu/isolated"),
        "nohz_full": read("/sys/devices/system/cpu/nohz_full"),
        "kvm": kvm(),
        "rapl": rapl(),
        "tsc_mhz": cpuinfo_field("cpu MHz"),
        "rustc": run("rustc", "--version"),
        "qemu": run("qemu-system-x86_64", "--version").splitlines()[0] if run("qemu-system-x86_64", "--version") else None,
        "commit": commit,
        "commit_dirty": bool(dirty) if dirty is not None else None,
    }
    json.dump(facts, sys.stdout, indent=2, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
