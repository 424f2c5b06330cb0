"""One spec per input (agent/probes/inputs.py): NodeFacts holds one field per spec (and a previous
read where the spec keeps one), the scheduler's tiers are the specs' tiers, and the engine keeps
previous reads and tells the metrics from the specs alone."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

from agent.config import load_config_dir
from agent.core.facts import Input, NodeFacts
from agent.core.host import HostInfo
from agent.core.kernel import KernelXids
from agent.core.pci import PciSample
from agent.core.probed import NotCaptured, Probed, ProbeError, ProbeErrorKind
from agent.core.rdma import RdmaSample
from agent.core.telemetry import NoTelemetry
from agent.engine.engine import Engine
from agent.engine.scheduler import TIER_INPUTS, TIER_INTERVAL
from agent.probes.inputs import SPEC, SPECS, InputSpec, source_readers
from agent.probes.live import LiveSource
from agent.probes.snapshot import SnapshotSource
from tests.conftest import live_cfg

ROOT = Path(__file__).parent.parent
CFG = load_config_dir(ROOT / "config")


def mismatches(specs: tuple[InputSpec, ...], tmp: Path) -> list[str]:
    """What does not hold between the specs and NodeFacts (core may not import the specs)."""
    live, snapshot = LiveSource(live_cfg(), sys_root=tmp, use_nvml=False), SnapshotSource(tmp)
    hints = typing.get_type_hints(NodeFacts)
    out = [f"{i}: no spec" for i in Input if sum(s.input is i for s in specs) != 1]
    for s in specs:
        name = s.input.value
        if hints.get(name) != Probed[s.type]:  # type: ignore[valid-type]
            out.append(f"{name}: NodeFacts.{name} is {hints.get(name)}, the spec says {s.type.__name__}")
        kept = hints.get(s.previous_field)
        if s.keep_previous and kept != s.type | None:
            out.append(f"{name}: keeps its previous read but NodeFacts.{s.previous_field} is {kept}")
        if not s.keep_previous and kept is not None:
            out.append(f"{name}: NodeFacts.{s.previous_field} is never filled (the spec keeps none)")
        if s.tier is not None and s.tier not in TIER_INTERVAL:
            out.append(f"{name}: tier {s.tier} is not a tier of the scheduler")
        if (s.live_reader(live) is None or s.snapshot_reader(snapshot) is None) and not s.unread:
            out.append(f"{name}: a source does not read it and nothing says so (unread)")
    return out


def test_nodefacts_holds_one_field_per_spec_and_a_previous_read_where_kept(tmp_path: Path) -> None:
    assert mismatches(SPECS, tmp_path) == []
    assert list(SPEC) == [s.input for s in SPECS]
    inputs = {f.name for f in dataclasses.fields(NodeFacts) if f.name in {i.value for i in Input}}
    assert inputs == {s.input.value for s in SPECS}


def test_a_spec_out_of_step_with_nodefacts_is_named(tmp_path: Path) -> None:
    host = SPEC[Input.HOST]
    wrong = (
        dataclasses.replace(host, type=PciSample),
        dataclasses.replace(SPEC[Input.KERNEL], keep_previous=True),
        dataclasses.replace(SPEC[Input.PCI], keep_previous=False),
        dataclasses.replace(SPEC[Input.RDMA], tier="rdma"),
        dataclasses.replace(SPEC[Input.NVLINK_ERRORS], live=None),  # its output has no command
    )
    specs = tuple(s for s in SPECS if s.input not in {w.input for w in wrong}) + wrong
    host_field = typing.get_type_hints(NodeFacts)["host"]
    assert mismatches(specs, tmp_path) == [
        f"host: NodeFacts.host is {host_field}, the spec says PciSample",
        "kernel: keeps its previous read but NodeFacts.kernel_previous is None",
        "pci: NodeFacts.pci_previous is never filled (the spec keeps none)",
        "rdma: tier rdma is not a tier of the scheduler",
        "nvlink_errors: a source does not read it and nothing says so (unread)",
    ]
    assert mismatches(SPECS[1:], tmp_path) == ["node: no spec"]


def test_the_tiers_read_what_they_read_before_the_specs() -> None:
    assert TIER_INPUTS == {
        "gpu": (Input.GPUS, Input.DRA),  # the DRA driver's devices, as of the GPUs' read
        "xid": (Input.KERNEL,),
        "efa": (Input.RDMA,),
        "topology": (Input.TOPO, Input.NVLINK, Input.PCI, Input.HOST, Input.NVLINK_ERRORS),
        "dcgm-health": (Input.DCGM_HEALTH,),
        "dcgm-diag": (Input.DCGM_DIAG,),
        "sdc-probe": (Input.SDC,),  # the SDC probe's server, in the active-check window
    }
    assert [s.input for s in SPECS if s.tier is None] == [Input.NODE]  # the Node: as it is now


def test_each_source_reads_every_input_but_the_one_the_agent_polls(tmp_path: Path) -> None:
    every = set(Input) - {Input.DCGM_HEALTH}
    assert set(source_readers(SnapshotSource(tmp_path))) == every
    # the SDC probe's report: the agent asks the node's probe server (an extra input, as DCGM's)
    live = every - {Input.SDC}
    assert set(source_readers(LiveSource(live_cfg(), sys_root=tmp_path, use_nvml=False))) == live
    assert source_readers(SnapshotSource(tmp_path))[Input.HOST]() == NotCaptured("sys/devices/system")


class Metrics(NoTelemetry):
    def __init__(self) -> None:
        self.kernel: list[tuple[int, int, int]] = []

    def record_kernel_log(self, records: int, lost: int, untallied: int) -> None:
        self.kernel.append((records, lost, untallied))


def test_the_engine_keeps_the_previous_read_of_the_inputs_whose_spec_asks(tmp_path: Path) -> None:
    """A read that worked becomes the previous one when its tier reads again; a failed read leaves
    the previous one; an input whose spec keeps none has no previous read."""
    reads: dict[Input, list[Any]] = {
        Input.PCI: [PciSample((), 1.0), PciSample((), 2.0), ProbeError("pci", ProbeErrorKind.TIMEOUT, "x")],
        Input.RDMA: [RdmaSample((), 1.0), RdmaSample((), 2.0), RdmaSample((), 3.0)],
        Input.HOST: [HostInfo(), HostInfo(), HostInfo()],
        Input.KERNEL: [KernelXids((), 7, "kmsg", lost=2, untallied=1)] * 3,
    }
    extra = {name: iter(values).__next__ for name, values in reads.items()}
    metrics = Metrics()
    eng = Engine(SnapshotSource(tmp_path), CFG, extra_inputs=extra, metrics=metrics)
    seen = []
    for _ in range(3):
        for tier in ("topology", "efa", "xid", "dcgm-health"):
            eng.run_tier(tier)
        f = eng.facts()
        seen.append((f.pci_previous, f.rdma_previous))
    assert seen == [
        (None, None),
        (PciSample((), 1.0), RdmaSample((), 1.0)),
        (PciSample((), 2.0), RdmaSample((), 2.0)),  # the pci read that timed out is not kept
    ]
    assert eng.facts().nvlink_errors_previous is None  # never read whole (not captured)
    assert "host_previous" not in {f.name for f in dataclasses.fields(NodeFacts)}
    assert metrics.kernel == [(7, 2, 1)] * 3  # the kernel spec tells the metrics of each read
    assert eng.facts().dcgm_health == NotCaptured("dcgm health (no host engine configured)")
