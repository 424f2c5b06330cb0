"""Timelines of the failures that do not announce themselves: what the agent says, and when.

Usage: python -m bench.quiet_failures [--interval 1] [--call-timeout 1] [--nvml-timeout 2]

An agent loop (agent/engine/loop.py, no API server: its marks are recorded, not written) on the fakes of
the tests: GPUs through the real pynvml over the fake libnvidia-ml.so.1 (the real 8x H100 recording
gpud-h100x8-535.183.01), DCGM through our binding mirror over the fake libdcgm.so.4 whose answers come
from an engine process. The tiers run every --interval seconds (the shipped 60 s scaled down), the
timeouts are --call-timeout (dcgm.callTimeout) and --nvml-timeout (timeouts.nvml); node.confirmAfter 2
and node.isolation gpu as shipped otherwise. Each change of the checks that matter, of the node's
status, taint and isolation scope is printed with its time since the fault:

  wedge   t=0: GPU 3's correctable ECC starts growing 17,700/s (NVML); t=2 s: the engine process is
          stopped (SIGSTOP); t=8 s: continued (SIGCONT).
  hung    t=0: every NVML call on GPU 3 hangs; t=10 s: it answers again.

With the shipped intervals (60 s) and timeouts (dcgm.callTimeout 10 s, timeouts.nvml 30 s) the same
steps take: wedge → unknown within dcgmHealth interval + callTimeout (≤ 76 s with jitter); a hung GPU
→ unknown within gpu interval + timeouts.nvml less 1 s (≤ 95 s), its own failure one gpu interval later.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.conftest import live_cfg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

H100X8 = ROOT / "tests" / "fixtures" / "nvidia-smi-q" / "gpud-h100x8-535.183.01.txt"
WATCHED = ("gpu.responsive", "gpu.ecc", "dcgm-health", "dcgm-health.suspect")


class Recorder:
    """Wraps the engine's evaluate: prints each change of what the agent would write."""

    def __init__(self, agent: Any) -> None:
        self.agent, self.t0, self.last = agent, time.monotonic(), ""
        self.seen: list[tuple[float, str]] = []
        evaluate = agent.engine.evaluate

        def recorded() -> Any:
            verdict, marks = evaluate()
            self.note(verdict, marks)
            return verdict, marks

        agent.engine.evaluate = recorded

    def note(self, verdict: Any, marks: Any) -> None:
        results = self.agent.engine.results
        checks = "; ".join(
            f"{name} {results[name].status.value}"
            + (f" ({results[name].message[:150]})" if results[name].status.value != "pass" else "")
            for name in WATCHED
            if name in results
        )
        scope = marks.scope.as_text() if marks.scope is not None else "-"
        line = f"node {verdict.status.value}, taint {marks.taint}, scope {scope} | {checks}"
        if line != self.last:
            self.last = line
            at = time.monotonic() - self.t0
            self.seen.append((at, line))
            print(f"  t={at:6.2f} s  {line}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--call-timeout", type=float, default=1.0)
    ap.add_argument("--nvml-timeout", type=float, default=2.0)
    args = ap.parse_args()

    from tests.conftest import build_fake_libdcgm, build_fake_libnvml, cfg
    from tests.fakes.nvml.fake_nvml import FakeLib, from_recordings

    tmp = Path(tempfile.mkdtemp())
    nvml_lib = FakeLib(build_fake_libnvml() / "libnvidia-ml.so.1", tmp / "fake-nvml.conf")
    os.environ["FAKE_NVML_CONFIG"] = str(nvml_lib.path)
    machine = from_recordings(H100X8)
    nvml_lib.write(machine)
    os.environ["GPU_HEALTHCHECK_DCGM_PYTHON"] = str(ROOT / "tests" / "fakes" / "dcgm")
    os.environ["LD_LIBRARY_PATH"] = f"{build_fake_libdcgm()}:{os.environ.get('LD_LIBRARY_PATH', '')}"

    from agent.checks.registry import CHECKS
    from agent.engine.loop import Agent
    from agent.probes.dcgm.bindings import load_bindings
    from agent.probes.dcgm.tiers import DcgmTiers
    from agent.probes.live import LiveSource

    load_bindings()
    import fake_engine  # type: ignore[import-not-found]

    from tests.fakes.dcgm.engine_process import Engine as EngineProcess

    keep = {"gpu.", "dcgm-health"}
    every = args.interval
    config = cfg(
        {
            "intervals": {"gpu": every, "dcgmHealth": every, "efa": 3600, "topology": 3600},
            "timeouts": {"nvml": args.nvml_timeout},
            "dcgm": {"callTimeout": args.call_timeout, "connectTimeout": 1},
            "node": {"isolation": "gpu"},
            "checks": {s.name: False for s in CHECKS if not any(s.name.startswith(k) for k in keep)},
        }
    )
    print(
        f"intervals {every:g} s, dcgm.callTimeout {args.call_timeout:g} s, timeouts.nvml "
        f"{args.nvml_timeout:g} s, confirmAfter 2; loadavg {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs"
    )

    def agent_for() -> Agent:
        fake_engine.reset()
        tiers = DcgmTiers(config, lambda: [])
        source = LiveSource(
            live_cfg(timeout_s=5, nvml_timeout_s=args.nvml_timeout), sys_root=tmp, kmsg_path=str(tmp / "kmsg")
        )
        return Agent(
            source,
            config,
            config_dir=None,
            writer=None,
            node_getter=None,
            kernel_path=None,
            kernel_is_device=False,
            extra_inputs={k: v for k, v in tiers.inputs().items() if k.value == "dcgm_health"},
        )

    # ---- a wedged engine, and a GPU in an ECC storm
    print("\nwedge: t=0 GPU 3 ECC storm 17,700/s; t=2 engine SIGSTOP; t=8 SIGCONT")
    engine = EngineProcess(tmp / "engine.sock")
    fake_engine.reset()
    fake_engine.engine_process(str(engine.path))
    agent = agent_for()
    fake_engine.engine_process(str(engine.path))
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    while (
        "dcgm-health" not in agent.engine.results
        or agent.engine.results["dcgm-health"].status.value != "pass"
    ):
        time.sleep(0.05)
    rec = Recorder(agent)
    stopped = continued = False
    count = 0
    while time.monotonic() - rec.t0 < 14:
        at = time.monotonic() - rec.t0
        count = int(17_700 * at)
        machine.gpus[3]["memerr.0.0.2"] = str(count)
        nvml_lib.write(machine, now=True)
        if at >= 2 and not stopped:
            engine.stop()
            stopped = True
            print(f"  t={at:6.2f} s  ** engine stopped (SIGSTOP)")
        if at >= 8 and not continued:
            engine.cont()
            continued = True
            print(f"  t={at:6.2f} s  ** engine continued (SIGCONT)")
        time.sleep(0.1)
    agent.request_stop()
    loop.join(10)
    engine.kill()
    machine.gpus[3]["memerr.0.0.2"] = "0"
    nvml_lib.write(machine, now=True)
    fake_engine.engine_process("")

    # ---- one hung GPU
    print("\nhung: t=0 every NVML call on GPU 3 hangs; t=10 it answers again")
    agent = agent_for()
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    while "gpu.responsive" not in agent.engine.results:
        time.sleep(0.05)
    time.sleep(every)
    rec = Recorder(agent)
    nvml_lib.lib.fake_nvml_hold_gpu(3, 1)
    print("  t=  0.00 s  ** GPU 3 hangs")
    released = False
    while time.monotonic() - rec.t0 < 10 + 6 * every + args.nvml_timeout:
        if time.monotonic() - rec.t0 >= 10 and not released:
            nvml_lib.lib.fake_nvml_hold_gpu(3, 0)
            released = True
            print(f"  t={time.monotonic() - rec.t0:6.2f} s  ** GPU 3 answers again")
        time.sleep(0.05)
    agent.request_stop()
    loop.join(10)


if __name__ == "__main__":
    main()
