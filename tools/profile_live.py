#!/usr/bin/env python3
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
"""Where one live-benchmark case spends its CPU, against the bare XDP_PASS program.

Runs `mpsteer bench --live --rounds 1` with one case (root; needs `perf`, Debian package
linux-perf), records `perf record -a` for a few seconds inside the bare program's transfer
and inside the case's, and prints per kernel/BPF symbol the CPU seconds per GB moved in each
(what the server received while perf recorded) and the difference, largest first, then the total of the BPF programs and the flow table's
hash lookups. Transfers run in the order none, bare_xdp, <case>; each recording starts a
fixed time after the previous transfer's line, so keep --delay inside the case's setup and
--seconds - --delay - --window above zero. The shipped agent's case starts a process and
loads programs first: give it a longer --delay.

    sudo tools/profile_live.py chain4_rate_limit
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

LOOKUP = {"htab_map_hash", "lookup_nulls_elem_raw", "memcmp", "__htab_map_lookup_elem"}


def rx_bytes(netns):
    """Bytes the namespace's interfaces received (the server's: the data moved)."""
    out = subprocess.run(["ip", "-n", netns, "-j", "-s", "link", "show"], capture_output=True,
                         text=True, check=True).stdout
    return sum(i["stats64"]["rx"]["bytes"] for i in json.loads(out) if i["ifname"] != "lo")


def record(path, delay, window, netns, moved):
    time.sleep(delay)
    before = rx_bytes(netns)
    subprocess.run(["perf", "record", "-a", "-F", "2000", "-o", path, "--", "sleep", str(window)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    moved[path] = (rx_bytes(netns) - before) / 1e9


def cpu_s_by_symbol(path, window, cpus):
    out = subprocess.run(["perf", "report", "-i", path, "--no-children", "--sort", "sym",
                          "--stdio", "-g", "none"], capture_output=True, text=True,
                         check=True).stdout
    total = window * cpus  # CPU seconds the recording covered
    by = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[0].endswith("%") or line.lstrip().startswith("#"):
            continue
        by[" ".join(parts[2:])] = float(parts[0][:-1]) / 100 * total
    return by


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", help="a --cases name of `mpsteer bench --live`")
    ap.add_argument("--mpsteer", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                      "src", "cli", "mpsteer"))
    ap.add_argument("--seconds", type=int, default=9, help="length of each transfer")
    ap.add_argument("--delay", type=float, default=3.5,
                    help="seconds from the previous transfer's end to the recording")
    ap.add_argument("--window", type=float, default=5, help="seconds recorded")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    if not shutil.which("perf"):
        sys.exit("profile_live: perf not found (apt install linux-perf)")
    cpus = os.cpu_count()
    tmp = tempfile.mkdtemp(prefix="mpsteer-profile-")
    bench = subprocess.Popen([a.mpsteer, "bench", "--live", "--rounds", "1", "--seconds",
                              str(a.seconds), "--cases", a.case],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    server_ns = f"mps-b{bench.pid % 1000000}-srv"  # the bench's lab (src/lab/lab.h)
    moved = {}  # GB the server received while each recording ran
    threads = []
    follows = {"none": "bare_xdp", "bare_xdp": a.case}
    for line in bench.stderr:
        if not line.startswith("round 1/1 "):
            continue
        key = line[len("round 1/1 "):].split(":", 1)[0]
        if key in follows:
            t = threading.Thread(target=record, args=(os.path.join(tmp, follows[key] + ".data"),
                                                      a.delay, a.window, server_ns, moved))
            t.start()
            threads.append(t)
    for t in threads:
        t.join()
    if bench.wait() != 0:
        sys.exit("profile_live: the benchmark failed")
    gb = {k: moved[os.path.join(tmp, k + ".data")] for k in ("bare_xdp", a.case)}
    per_gb = {k: {s: v / gb[k] for s, v in cpu_s_by_symbol(os.path.join(tmp, k + ".data"),
                                                          a.window, cpus).items()}
              for k in gb}
    shutil.rmtree(tmp)
    base, case = per_gb["bare_xdp"], per_gb[a.case]
    rows = sorted(((case.get(s, 0) - base.get(s, 0), base.get(s, 0), case.get(s, 0), s)
                   for s in set(base) | set(case)), reverse=True)
    print(f"CPU s per GB moved: bare_xdp -> {a.case} (difference)")
    for d, b, c, s in rows[:a.top]:
        print(f"{b:7.3f} -> {c:7.3f}  ({d:+.3f})  {s}")
    progs = sum(v for s, v in case.items() if s.startswith("bpf_prog_"))
    lookups = sum(v for s, v in case.items() if s in LOOKUP)
    idle = ("safe_halt", "idle")  # the idle loop's symbols (VM: pv_native_safe_halt)
    busy = {k: sum(v for s, v in per_gb[k].items() if not any(i in s for i in idle))
            for k in per_gb}
    print(f"busy: {busy['bare_xdp']:.2f} -> {busy[a.case]:.2f} s/GB; {a.case}'s BPF programs "
          f"{progs:.3f} s/GB, flow-table lookups {lookups:.3f} s/GB")


if __name__ == "__main__":
    main()
