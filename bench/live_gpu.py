"""Real-NVML figures for a lent GPU machine: CPU and wall per tier read, NVML inits, RSS with NVML
loaded and where it goes, idle and under a GPU load, the new code beside the old code's way in the
same run.

Usage (repository root; needs pynvml and pyyaml, not kubernetes or tenacity):
    python3 -m bench.live_gpu [--reads 30] [--out DIR]

Per tier, over --reads reads after one warm-up read, per read: the process's own CPU (its threads,
getrusage SELF), its children's CPU (nvidia-smi, getrusage CHILDREN), wall, and NVML inits:
  gpu       new: the inventory on the NVML session kept open (agent.probes.nvml_session)
            old: the same read, then the session shut down (init + attach + shutdown per read)
  topology  new: topo -m and nvlink -s models from NVML field values and sysfs, the NVLink counters,
            the PCI bus and host reads (the scheduler's topology tier)
            old: `nvidia-smi topo -m` and `nvidia-smi nvlink -s`, the counters by a call per link
            and counter on a session shut down after the read, the PCI bus and host reads
then the same during a GPU load (a bf16 8192^3 matmul loop in a child process, if torch imports).
It also prints whether the NVML models equal the nvidia-smi text models on this machine, NVML's raw
answers to the NVLink fields (what the NVML path maps to "no NVLink" / "not answered"), and RSS
in a fresh process at each step: agent modules imported, pynvml imported, nvmlInit, each GPU
attached, one inventory read, one topology read, with the Rss of libnvidia-ml's own mappings.
Nothing is written to the node; --out DIR also writes the figures as live_gpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3): a @ b
torch.cuda.synchronize(); print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20): c = a @ b
    torch.cuda.synchronize()
"""


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def measure(read: Callable[[], object], reads: int) -> dict[str, float]:
    from agent.probes.nvml_session import SESSION

    read()  # warm-up: imports, first init, page cache
    inits = SESSION.inits
    own0, kids0 = _cpu()
    wall0 = time.perf_counter()
    for _ in range(reads):
        read()
    wall = time.perf_counter() - wall0
    own1, kids1 = _cpu()
    return {
        "own_cpu_ms": 1000 * (own1 - own0) / reads,
        "children_cpu_ms": 1000 * (kids1 - kids0) / reads,
        "wall_ms": 1000 * wall / reads,
        "nvml_inits": SESSION.inits - inits,
    }


def tiers(reads: int) -> dict[str, dict[str, float]]:
    from agent.config import parse_config
    from agent.probes.live import LiveSource
    from agent.probes.nvlink_errors import _legacy_links
    from agent.probes.nvml_session import SESSION, Opened

    new = LiveSource(parse_config({}))
    old = LiveSource(parse_config({}), use_nvml=False)

    def gpu_old() -> None:
        new.gpus()
        SESSION.close()

    def topo_new() -> None:
        for read in (new.topo, new.nvlink, new.nvlink_errors, new.pci, new.host):
            read()

    def counters_by_call(opened: Opened) -> None:  # the old read: a call per link and counter
        for index in range(int(opened.nv.nvmlDeviceGetCount())):
            handle = opened.handle(index)
            opened.nv.nvmlDeviceGetPciInfo(handle)
            _legacy_links(opened.nv, handle)

    def topo_old() -> None:
        old.topo()
        old.nvlink()
        SESSION.read(counters_by_call)
        SESSION.close()
        old.pci()
        old.host()

    out = {}
    for name, read in (
        ("gpu new", new.gpus),
        ("gpu old", gpu_old),
        ("topology new", topo_new),
        ("topology old", topo_old),
    ):
        out[name] = measure(read, reads)
        if name.endswith("old"):
            SESSION.close()
    return out


def parity() -> dict[str, Any]:
    """The NVML models beside nvidia-smi's text models on this machine."""
    from agent.config import parse_config
    from agent.probes.live import LiveSource

    new, old = LiveSource(parse_config({})), LiveSource(parse_config({}), use_nvml=False)
    out: dict[str, Any] = {}
    for name in ("topo", "nvlink"):
        a, b = getattr(new, name)(), getattr(old, name)()
        source_a = getattr(a, "source", type(a).__name__)
        same = hasattr(a, "source") and hasattr(b, "source") and replace(a, source=b.source) == b
        out[name] = {"nvml_source": source_a, "equal_to_text": same}
        if not same:
            out[name]["nvml"], out[name]["text"] = repr(a)[:1500], repr(b)[:1500]
    return out


def raw_nvlink() -> list[dict[str, Any]]:
    """NVML's own answers to the fields the NVLink path reads, per GPU (return code, value)."""
    import pynvml

    from agent.probes.nvml_links import FI_LINK_COUNT, FI_SPEED, FI_STATE, MAX_LINKS

    pynvml.nvmlInit()
    out = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            ids = [(FI_LINK_COUNT, 0)] + [
                (f, n) for n in range(MAX_LINKS) for f in (FI_STATE, FI_SPEED, 161, 163)
            ]
            try:
                values = pynvml.nvmlDeviceGetFieldValues(h, ids)
                fields = {
                    f"{f}.{s}": (int(v.nvmlReturn), int(v.value.ullVal))
                    for (f, s), v in zip(ids, values, strict=True)
                }
            except pynvml.NVMLError as exc:
                fields = {"error": str(exc)}
            legacy = []
            for n in range(3):
                try:
                    legacy.append(pynvml.nvmlDeviceGetNvLinkState(h, n))
                except pynvml.NVMLError as exc:
                    legacy.append(f"error {exc.value}")
            out.append({"gpu": i, "fields": fields, "nvmlDeviceGetNvLinkState(0..2)": legacy})
    finally:
        pynvml.nvmlShutdown()
    return out


RSS_STEPS = """
import os, sys, json
sys.path.insert(0, sys.argv[1])
def rss():
    kb = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "RssAnon", "RssFile")):
                k, v = line.split(":")
                kb[k] = int(v.split()[0])
    nvml = 0
    with open("/proc/self/smaps") as f:
        cur = ""
        for line in f:
            if "-" in line.split(" ")[0] and len(line.split()) >= 5:
                cur = line.split()[-1] if len(line.split()) >= 6 else ""
            elif line.startswith("Rss:") and ("nvidia-ml" in cur or "libnvidia" in cur):
                nvml += int(line.split()[1])
    kb["nvidia_mappings"] = nvml
    return {k: round(v / 1024, 1) for k, v in kb.items()}
steps = [("python", rss())]
import agent.probes.live, agent.probes.nvml, agent.probes.nvml_topo, agent.probes.nvlink_errors
import agent.engine.scheduler, agent.checks.registry
steps.append(("agent modules", rss()))
import pynvml
steps.append(("import pynvml", rss()))
pynvml.nvmlInit()
steps.append(("nvmlInit", rss()))
for i in range(pynvml.nvmlDeviceGetCount()):
    pynvml.nvmlDeviceGetHandleByIndex(i)
    steps.append((f"attach GPU {i}", rss()))
from agent.config import parse_config
from agent.probes.live import LiveSource
live = LiveSource(parse_config({}))
live.gpus()
steps.append(("inventory read", rss()))
live.topo(); live.nvlink(); live.nvlink_errors()
steps.append(("topology read", rss()))
print(json.dumps(steps))
"""


def rss_steps() -> list[Any]:
    out = subprocess.run(
        [sys.executable, "-c", RSS_STEPS, str(ROOT)], capture_output=True, text=True, timeout=120, check=False
    )
    if out.returncode != 0:
        return [("failed", out.stderr[-2000:])]
    steps: list[Any] = json.loads(out.stdout)
    return steps


def with_load(seconds: float, run: Callable[[], Any]) -> Any:
    """run() while a child process keeps the GPU busy with bf16 matmuls; None without torch."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LOAD, str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if "ready" not in line:
            return {"skipped": (proc.stderr.read() if proc.stderr else "")[-500:] or "no torch / no GPU"}
        return run()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def machine() -> dict[str, Any]:
    import pynvml

    pynvml.nvmlInit()
    try:
        names = [
            pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
        return {
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "gpus": names,
            "host": platform.node(),
            "cpus": os.cpu_count(),
        }
    finally:
        pynvml.nvmlShutdown()


def table(figures: dict[str, dict[str, float]], gpus: int) -> str:
    lines = [
        f"{'read':16} {'own CPU ms':>11} {'children ms':>12} {'wall ms':>9} {'inits':>6} {'own CPU/GPU':>12}"
    ]
    for name, f in figures.items():
        if "own_cpu_ms" not in f:
            lines.append(f"{name:16} {f}")
            continue
        lines.append(
            f"{name:16} {f['own_cpu_ms']:11.2f} {f['children_cpu_ms']:12.2f} {f['wall_ms']:9.2f} "
            f"{int(f['nvml_inits']):6d} {f['own_cpu_ms'] / max(gpus, 1):12.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reads", type=int, default=30)
    ap.add_argument(
        "--load-seconds", type=float, default=300.0, help="the load's cap; it stops when measured"
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    report: dict[str, Any] = {"machine": machine(), "reads": args.reads}
    gpus = len(report["machine"]["gpus"])
    load = os.getloadavg()
    print(f"machine: {report['machine']}; {args.reads} reads per row after one warm-up; load avg {load}")
    report["idle"] = tiers(args.reads)
    print("\nidle\n" + table(report["idle"], gpus))
    report["load"] = with_load(args.load_seconds, lambda: tiers(args.reads))
    if "skipped" in report["load"]:
        print(f"\nunder load: skipped ({report['load']['skipped']})")
    else:
        print("\nunder a bf16 matmul load\n" + table(report["load"], gpus))
    report["parity"] = parity()
    print(f"\nNVML models vs nvidia-smi text on this machine: {json.dumps(report['parity'], indent=1)}")
    report["rss_steps_mib"] = rss_steps()
    print("\nRSS (MiB) in a fresh process, step by step:")
    for step, kb in report["rss_steps_mib"]:
        print(f"  {step:18} {kb}")
    report["nvlink_raw"] = raw_nvlink()
    raw = json.dumps(report["nvlink_raw"])[:4000]
    print(f"\nNVML raw NVLink answers (field.scope: [return, value]): {raw}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "live_gpu.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
