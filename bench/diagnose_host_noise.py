"""Where the eager call's slow rounds come from (issue #17 diagnostics).

Runs E and G timed the same eager call on an idle host 1.3-2x apart from
round to round (MiniMax M3, a single 540-token photo: 17-18 ms, then 31-35
ms), and a pure-Python probe moved with it (440-1,050 µs): the host's
thread, not the device, runs slow in some rounds. This script times the
eager call of a few real-traffic batches in a child process per host
setting and records, per call, what could explain a slow one:

* ``default``: as the benchmark runs;
* ``one_thread``: PyTorch's intra-op pool of one thread (``OMP_NUM_THREADS``
  and ``torch.set_num_threads``): no pool thread can spin beside the main
  one after a CPU op;
* ``pinned``: the main thread alone pinned to one core (after CUDA and
  the intra-op pool started their threads, which keep every core);
* ``pinned_one_thread``: both.

Per call: host ms until the call returns (``enqueue_ms``), wall ms until
the device is done (``total_ms``), the probe before it (µs), the process's
involuntary context switches during it, the host's steal time (jiffies) and
the core the main thread ran on. Per setting: every thread's CPU time over
the timed loop (a pool thread spinning shows here).

    PYTHONPATH=. python bench/diagnose_host_noise.py --out host_noise.json

Diagnostics, not the benchmark: ``bench/bench_traffic.py`` makes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SETTINGS = ("default", "one_thread", "pinned", "pinned_one_thread")
# Real-traffic batches of the benchmark's seed (17): in runs E and G their
# eager calls were bimodal (MiniMax M3 #12, #20) or the cost-aware eager plan
# fell below 0.97x of eager (DeepSeek-V4.1 #5 in G2).
BATCHES = {"minimax_m3": (12, 20), "deepseek_v41": (5,)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", nargs="*", default=list(SETTINGS))
    p.add_argument("--size", default="full")
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--calls", type=int, default=40, help="timed calls per batch")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _stat_fields(path: str) -> list[str]:
    text = Path(path).read_text()
    return text[text.rindex(")") + 2 :].split()  # after "pid (comm) "


def current_core() -> int:
    """The core the calling thread last ran on (``/proc/thread-self/stat``)."""
    return int(_stat_fields("/proc/thread-self/stat")[36])


def steal_jiffies() -> int:
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


def thread_cpu_jiffies() -> dict[str, int]:
    """user + system jiffies of every thread of this process, by tid."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = _stat_fields(str(task / "stat"))
        except OSError:
            continue
        out[task.name] = int(fields[11]) + int(fields[12])
    return out


def quiet_core() -> int:
    """The allowed core whose hyperthread siblings are not allowed too, else
    the last allowed one: pinning there leaves the main thread no sibling
    of this process."""
    allowed = sorted(os.sched_getaffinity(0))
    for core in reversed(allowed):
        siblings = Path(
            f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list"
        )
        try:
            text = siblings.read_text().strip()
        except OSError:
            continue
        others = {int(c) for c in text.replace("-", ",").split(",")} - {core}
        if not others & set(allowed):
            return core
    return allowed[-1]


def run_child(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import image_traffic
    from bench_encoders import eager_call, images_only_host
    from profile_eager_host import timed
    from profile_launch import host_probe_us

    from reference_towers.registry import REFERENCE_TOWERS

    if "one_thread" in setting:
        torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device=device)  # the driver's threads start here
    # The intra-op pool starts at its first parallel op: start it before
    # pinning, or its threads would inherit the main thread's one core.
    torch.ones(1 << 22).sum()
    pinned = None
    if "pinned" in setting:
        pinned = quiet_core()
        os.sched_setaffinity(0, {pinned})  # pid 0: the calling thread only

    calls: dict[str, Any] = {}
    for stem, indices in BATCHES.items():
        tower = REFERENCE_TOWERS[stem]
        grid = image_traffic.model_grid(stem, tower.config(args.size))
        host = images_only_host(stem, args.size, device, dtype)
        drawn = image_traffic.draw_image_batches(args.seed, max(indices) + 1)
        for index in indices:
            items = [grid(h, w) for h, w in drawn[index]]
            kw = tower.make_mm_kwargs(host, items, device, seed=1000 + index)
            calls[f"{stem}#{index}"] = lambda host=host, kw=kw: eager_call(host, kw)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in calls}
    order = random.Random(0)
    with torch.inference_mode():
        for fn in calls.values():  # warm-up
            fn()
            fn()
        threads_before = thread_cpu_jiffies()
        loop_started = time.perf_counter()
        for _ in range(args.calls):
            names = list(calls)
            order.shuffle(names)
            for name in names:
                probe = host_probe_us(3)
                switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
                steal = steal_jiffies()
                enqueue_ms, total_ms = timed(calls[name])
                samples[name].append(
                    {
                        "enqueue_ms": enqueue_ms,
                        "total_ms": total_ms,
                        "probe_us": probe,
                        "involuntary_switches": resource.getrusage(
                            resource.RUSAGE_SELF
                        ).ru_nivcsw
                        - switches,
                        "steal_jiffies": steal_jiffies() - steal,
                        "core": current_core(),
                    }
                )
        loop_s = time.perf_counter() - loop_started
        threads_after = thread_cpu_jiffies()
    busy = sorted(
        ((threads_after[t] - threads_before.get(t, 0), t) for t in threads_after),
        reverse=True,
    )
    return {
        "setting": setting,
        "torch_threads": torch.get_num_threads(),
        "pinned_core": pinned,
        "allowed_cores": sorted(os.sched_getaffinity(os.getpid())),
        "loop_s": loop_s,
        "clock_ticks": os.sysconf("SC_CLK_TCK"),
        "thread_jiffies_top": [
            {"tid": t, "jiffies": j, "main": t == str(os.getpid())} for j, t in busy[:6]
        ],
        "threads": len(threads_after),
        "calls": {name: summarize(s) | {"samples": s} for name, s in samples.items()},
    }


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    total = [s["total_ms"] for s in samples]
    fast = min(total)
    slow = [s for s in samples if s["total_ms"] > 1.25 * fast]
    quick = [s for s in samples if s["total_ms"] <= 1.25 * fast]

    def median_of(rows: list[dict[str, Any]], key: str) -> float | None:
        return statistics.median(r[key] for r in rows) if rows else None

    return {
        "median_ms": statistics.median(total),
        "min_ms": fast,
        "max_ms": max(total),
        "slow_share": len(slow) / len(samples),
        "probe_us_slow": median_of(slow, "probe_us"),
        "probe_us_quick": median_of(quick, "probe_us"),
        "switches_slow": median_of(slow, "involuntary_switches"),
        "switches_quick": median_of(quick, "involuntary_switches"),
        "steal_total": sum(s["steal_jiffies"] for s in samples),
        "cores": sorted({s["core"] for s in samples}),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args.child, args)))
        return 0
    result: dict[str, Any] = {"cpu_count": os.cpu_count(), "settings": {}}
    for setting in args.settings:
        env = dict(os.environ)
        if "one_thread" in setting:
            env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        cmd = [sys.executable, __file__, "--child", setting, "--out", str(args.out)]
        cmd += ["--size", args.size, "--seed", str(args.seed)]
        cmd += ["--calls", str(args.calls)]
        started = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            result["settings"][setting] = {"error": proc.stderr[-2000:]}
        else:
            result["settings"][setting] = json.loads(proc.stdout.splitlines()[-1])
        entry = result["settings"][setting]
        print(
            f"[{setting}] {time.perf_counter() - started:.0f}s: "
            + (
                "; ".join(
                    f"{n} median {c['median_ms']:.1f} min {c['min_ms']:.1f} "
                    f"max {c['max_ms']:.1f} slow {100 * c['slow_share']:.0f}% "
                    f"probe slow/quick {c['probe_us_slow']}/{c['probe_us_quick']}"
                    for n, c in entry["calls"].items()
                )
                if "calls" in entry
                else entry["error"][-400:]
            ),
            file=sys.stderr,
            flush=True,
        )
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
