"""gpu.allocatable on a DRA-only node (the GPU Operator without a device plugin: no nvidia.com/gpu on
the Node): the GPUs seen against the devices NVIDIA's DRA driver publishes in this node's
ResourceSlices, and against the instance profile.

The healthy node is examples/snapshots/p5.48xlarge-dra (the healthy p5.48xlarge recording, its Node
without nvidia.com/gpu, the slice shaped as cmd/gpu-kubelet-plugin writes it: see SOURCE.md there);
each mismatch is that slice changed in one place, written here. The real API server:
tests/test_dra_only_kube.py."""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.checks import gpu_allocatable
from agent.core.dra import DraSlices
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult
from agent.core.gpu import GpuInventory
from agent.core.node import NodeObject
from agent.core.probed import NotCaptured, ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.engine.gpu_verdicts import gpu_verdicts
from agent.probes.dra_slices import parse_slices_json, slices_from_objects
from agent.probes.node_object import node_from_dict
from agent.probes.snapshot import SLICES, SnapshotSource
from agent.probes.source import gather_facts
from tests.conftest import cfg

ROOT = Path(__file__).parent.parent
DRA_SNAP = ROOT / "examples" / "snapshots" / "p5.48xlarge-dra"
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
NODE = "ip-10-1-2-3.ec2.internal"
CFG = cfg()
GPU3 = ("0000:86:00.0", "GPU-6b932a61-abfd-5ea1-b26a-7dea7f2fa601")


def recorded_slices() -> dict[str, Any]:
    return dict(json.loads((DRA_SNAP / SLICES).read_text()))


def devices(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["items"][0]["spec"]["devices"])


@functools.cache
def base_facts() -> NodeFacts:
    """The DRA-only snapshot read once (each test replaces the part it changes)."""
    return gather_facts(SnapshotSource(DRA_SNAP), CFG)


def with_(**parts: Any) -> NodeFacts:
    return replace(base_facts(), **parts)


def judged(
    slices: dict[str, Any] | None = None, node: dict[str, Any] | None = None
) -> tuple[CheckResult, NodeFacts]:
    """gpu.allocatable on the DRA-only snapshot with its slices (and Node) replaced."""
    parts: dict[str, Any] = {}
    if slices is not None:
        parts["dra"] = parse_slices_json(json.dumps(slices), NODE)
    if node is not None:
        parts["node"] = node_from_dict(node)
    facts = with_(**parts)
    return gpu_allocatable.check_allocatable(facts, CFG), facts


def rules(result: CheckResult) -> list[str]:
    return [f.rule for f in result.findings]


# ------------------------------------------------------------------------------- healthy: pass


def test_the_healthy_dra_only_node_passes_on_the_drivers_devices() -> None:
    facts = gather_facts(SnapshotSource(DRA_SNAP), CFG)  # node.json and resourceslices.json read
    result = gpu_allocatable.check_allocatable(facts, CFG)
    assert isinstance(facts.node, NodeObject) and facts.node.plugin_gpus == 0  # no device plugin
    assert result.status is Status.PASS, result.message
    assert result.message == "NVIDIA's DRA driver publishes the 8 GPU(s) seen"


def test_no_check_is_skipped_for_want_of_nvidia_com_gpu() -> None:
    """Every check skipped on the DRA-only node is skipped on the device-plugin node too, for a
    reason that is not the Node's resource."""
    from agent.checks.registry import CHECKS, run_checks

    dra = {r.name: r for r in run_checks(CHECKS, base_facts(), CFG)}
    plugin = {r.name: r for r in run_checks(CHECKS, gather_facts(SnapshotSource(HEALTHY), CFG), CFG)}
    skipped = {n for n, r in dra.items() if r.status is Status.SKIPPED}
    # the driver's own taints (checks/dra_taints.py): nothing to read where no DRA driver publishes
    assert skipped | {"gpu.driver-taints"} == {n for n, r in plugin.items() if r.status is Status.SKIPPED}
    assert not any("nvidia.com/gpu" in dra[n].message for n in skipped)
    assert dra["gpu.allocatable"].status is Status.PASS


def test_a_node_with_both_publishers_is_compared_with_both() -> None:
    """The device plugin's 8 and the driver's 8 (a cluster moving from one to the other)."""
    facts = gather_facts(SnapshotSource(HEALTHY), CFG)
    dra = parse_slices_json((DRA_SNAP / SLICES).read_text(), NODE)
    result = gpu_allocatable.check_allocatable(replace(facts, dra=dra), CFG)
    assert result.status is Status.PASS
    assert result.message == "8 GPU(s) allocatable; NVIDIA's DRA driver publishes the 8 GPU(s) seen"


def test_a_kubelet_that_keeps_nvidia_com_gpu_at_zero_is_no_device_plugin() -> None:
    """A plugin that left (capacity and allocatable "0") is not "the plugin marked 8 unhealthy"."""
    node = json.loads((DRA_SNAP / "node.json").read_text())
    node["status"]["capacity"] = node["status"]["allocatable"] = {"nvidia.com/gpu": "0"}
    result, _ = judged(node=node)
    assert result.status is Status.PASS and "DRA driver publishes the 8" in result.message
    # ... while a plugin that registered 8 and marks all unhealthy still warns
    node["status"]["capacity"] = {"nvidia.com/gpu": "8"}
    result, _ = judged(node=node)
    assert "gpu.allocatable.below-visible" in rules(result)


# ------------------------------------------------------------------------------- mismatch: fail


def test_a_gpu_the_driver_does_not_publish_is_named() -> None:
    doc = recorded_slices()
    doc["items"][0]["spec"]["devices"] = [d for d in devices(doc) if d["name"] != "gpu-3"]
    result, facts = judged(doc)
    assert result.status is Status.WARN
    (f,) = result.findings
    assert (f.rule, f.severity) == ("gpu.allocatable.dra-unpublished", Severity.MONITOR)
    assert f.key == "gpu.allocatable.dra-unpublished/00000000:86:00.0"
    assert f.entities == ("GPU 3 (0000:86:00.0)",)
    assert GPU3[1] in f.message and "does not publish it" in f.message
    # the per-GPU verdict: GPU 3 has no DRA device and carries the finding; the others name theirs
    out = gpu_verdicts([result], facts.gpus, result.status, dra=facts.dra)
    assert [e.get("dra") for e in out] == [
        "gpu-0",
        "gpu-1",
        "gpu-2",
        None,
        "gpu-4",
        "gpu-5",
        "gpu-6",
        "gpu-7",
    ]
    assert out[3]["findings"] == [f.key] and out[3]["status"] == "warn"


def test_a_gpu_the_driver_publishes_that_nvml_does_not_list_is_named() -> None:
    doc = recorded_slices()
    extra = copy.deepcopy(devices(doc)[7])
    extra["name"] = "gpu-8"
    extra["attributes"]["uuid"] = {"string": "GPU-00000000-0000-0000-0000-00000000d9d9"}
    extra["attributes"]["resource.kubernetes.io/pciBusID"] = {"string": "0000:d9:00.0"}
    doc["items"][0]["spec"]["devices"].append(extra)
    result, _ = judged(doc)
    (f,) = result.findings
    assert (f.rule, f.severity) == ("gpu.allocatable.dra-unseen", Severity.MONITOR)
    assert f.entities == ("gpu-8 (0000:d9:00.0)",) and "do not list" in f.message


def test_a_gpu_found_by_uuid_where_the_driver_names_no_pci_address() -> None:
    doc = recorded_slices()
    for d in devices(doc):
        del d["attributes"]["resource.kubernetes.io/pciBusID"]
    result, facts = judged(doc)
    assert result.status is Status.PASS, result.message
    assert gpu_verdicts([result], facts.gpus, result.status, dra=facts.dra)[3]["dra"] == "gpu-3"


def test_the_profile_judges_the_drivers_count_when_the_gpus_cannot_be_read() -> None:
    doc = recorded_slices()
    doc["items"][0]["spec"]["devices"] = devices(doc)[:7]
    _, facts = judged(doc)
    blind = replace(facts, gpus=ProbeError("nvidia-smi -q -x", ProbeErrorKind.UNREADABLE, "cut"))
    result = gpu_allocatable.check_allocatable(blind, CFG)
    assert rules(result) == ["gpu.allocatable.dra-count"] and result.status is Status.UNKNOWN
    assert "publishes 7 GPU(s), p5.48xlarge has 8" in result.message
    whole = replace(blind, dra=base_facts().dra)
    result = gpu_allocatable.check_allocatable(whole, CFG)
    assert result.findings == () and result.status is Status.UNKNOWN  # the GPUs: not looked at


# ------------------------------------------------------------------------------- no evidence


@pytest.mark.parametrize(
    ("dra", "status", "says"),
    [
        (DraSlices(NODE), Status.SKIPPED, "no gpu.nvidia.com device for this node"),
        (NotCaptured("ResourceSlices (no API access)"), Status.SKIPPED, "ResourceSlices (no API access)"),
        (
            ProbeError("ResourceSlices", ProbeErrorKind.UNAVAILABLE, "not listed yet"),
            Status.UNKNOWN,
            "not listed",
        ),
        (
            DraSlices(NODE, incomplete="the DRA driver is republishing (pool x)"),
            Status.UNKNOWN,
            "republishing",
        ),
    ],
)
def test_without_the_drivers_devices_it_is_skipped_or_unknown_never_fail(
    dra: Any, status: Status, says: str
) -> None:
    result = gpu_allocatable.check_allocatable(with_(dra=dra), CFG)
    assert (result.status, result.findings) == (status, ()), result.message
    assert says in result.message
    if status is Status.SKIPPED:
        assert "no nvidia.com/gpu on the Node" in result.message  # both publishers named


def test_a_pool_being_republished_is_not_compared() -> None:
    """Generation 2 declares 2 slices and one is listed: the driver is mid-republish."""
    doc = recorded_slices()
    doc["items"][0]["spec"]["pool"].update(generation=2, resourceSliceCount=2)
    doc["items"][0]["spec"]["devices"] = devices(doc)[:4]
    result, _ = judged(doc)
    assert result.status is Status.UNKNOWN and result.findings == ()
    assert "1 of its 2 slices of generation 2" in result.message


# ------------------------------------------------------------------------------- what the driver writes


def slice_obj(
    devs: list[dict[str, Any]],
    *,
    node: str = NODE,
    driver: str = "gpu.nvidia.com",
    generation: int = 1,
    count: int = 1,
    name: str = "s",
    **extra: Any,
) -> dict[str, Any]:
    spec = {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
        "devices": devs,
        **extra,
    }
    return {"metadata": {"name": name}, "spec": spec}


def test_older_generations_other_nodes_and_other_drivers_are_left_out() -> None:
    gpus = devices(recorded_slices())
    parsed = slices_from_objects(
        [
            slice_obj(gpus[:2], generation=1, name="old"),  # superseded
            slice_obj(gpus, generation=2, name="new"),
            slice_obj(gpus[:1], node="other-node", name="theirs"),
            slice_obj([{"name": "channel-0"}], driver="compute-domain.nvidia.com", name="cd"),
        ],
        NODE,
    )
    assert [d.name for d in parsed.devices] == [f"gpu-{i}" for i in range(8)]
    assert parsed.slices == 1 and parsed.incomplete == ""


def test_split_slices_of_dynamic_mig_count_as_one_pool() -> None:
    """DynamicMIG on 1.35+: a slice of shared counters only, then one slice per GPU (its whole
    device and its abstract MIG partitions, which have no uuid)."""
    gpus = devices(recorded_slices())
    counters = slice_obj(
        [], generation=3, count=9, name="counters", sharedCounters=[{"name": "gpu-0-counters"}]
    )
    per_gpu = []
    for i, g in enumerate(gpus):
        part = {
            "name": f"gpu-{i}-mig-1g10gb-19-{i}",
            "attributes": {
                "type": {"string": "migdyn"},
                "parentUUID": g["attributes"]["uuid"],
                "resource.kubernetes.io/pciBusID": g["attributes"]["resource.kubernetes.io/pciBusID"],
            },
        }
        per_gpu.append(slice_obj([g, part], generation=3, count=9, name=f"gpu-{i}"))
    parsed = slices_from_objects([counters, *per_gpu], NODE)
    assert parsed.incomplete == "" and parsed.slices == 9
    published = parsed.gpus()
    assert len(published) == 8 and all(
        p.partitions == 1 and p.device == f"gpu-{i}" for i, p in enumerate(published)
    )
    assert "of its 9 slices" in slices_from_objects([counters, *per_gpu[:7]], NODE).incomplete


def test_a_mig_gpu_is_published_by_its_mig_devices() -> None:
    """Static MIG (an Ampere-style GPU in MIG mode): only MIG devices, type mig, with the parent's
    UUID and PCI address; the verdict counts them. A GPU in MIG mode with no MIG device made has
    nothing to publish: no finding."""
    doc = recorded_slices()
    g3 = next(d for d in devices(doc) if d["name"] == "gpu-3")
    migs = [
        {
            "name": f"gpu-3-mig-3g40gb-9-{start}",
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": f"MIG-0000000{start}-aaaa-bbbb-cccc-dddddddddddd"},
                "parentUUID": g3["attributes"]["uuid"],
                "profile": {"string": "3g.40gb"},
                "resource.kubernetes.io/pciBusID": g3["attributes"]["resource.kubernetes.io/pciBusID"],
            },
        }
        for start in (0, 4)
    ]
    doc["items"][0]["spec"]["devices"] = [
        d for d in devices(doc) if d["name"] not in ("gpu-3", "gpu-5")
    ] + migs
    _, facts = judged(doc)
    assert isinstance(facts.gpus, GpuInventory)
    inv = facts.gpus
    mig_on = replace(inv, gpus=tuple(replace(g, mig_mode=True) if g.index in (3, 5) else g for g in inv.gpus))
    facts = replace(facts, gpus=mig_on)
    result = gpu_allocatable.check_allocatable(facts, CFG)
    assert result.status is Status.PASS, result.message
    assert "MIG mode on with no MIG device published: GPU 5 (0000:a8:00.0)" in result.message
    entry = gpu_verdicts([result], facts.gpus, result.status, dra=facts.dra)[3]
    assert entry.get("dra") is None and entry["draPartitions"] == 2


def test_a_passthrough_gpu_nvml_cannot_see_is_no_finding() -> None:
    """Bound to vfio-pci for a VM (the driver's PassthroughSupport: `gpu-vfio-<n>`, its own uuid)."""
    gpus = devices(recorded_slices())
    vfio = {
        "name": "gpu-vfio-8",
        "attributes": {
            "type": {"string": "vfio"},
            "uuid": {"string": "4f5a4d0e-1111-5222-8333-944455556666"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:d9:00.0"},
        },
    }
    dra = slices_from_objects([slice_obj([*gpus, vfio])], NODE)
    result = gpu_allocatable.check_allocatable(with_(dra=dra), CFG)
    assert result.status is Status.PASS and "passthrough (vfio) only" in result.message


def test_the_v1beta1_shape_and_a_malformed_file() -> None:
    g = devices(recorded_slices())[0]
    beta = {"name": g["name"], "basic": {"attributes": g["attributes"]}}
    (d,) = slices_from_objects([slice_obj([beta])], NODE).devices
    assert (d.name, d.type, d.pci, d.uuid) == (
        "gpu-0",
        "gpu",
        "00000000:53:00.0",
        g["attributes"]["uuid"]["string"],
    )
    with pytest.raises(ValueError, match="no name"):
        slices_from_objects([slice_obj([{"attributes": {}}])], NODE)
    with pytest.raises(ValueError, match="2 nodes"):
        slices_from_objects([slice_obj([g]), slice_obj([g], node="b")], None)


# ------------------------------------------------------------------------------- the engine


def test_the_engine_names_each_gpus_dra_device_in_the_results_annotation() -> None:
    from agent.core.results_doc import decode_results

    eng = Engine(SnapshotSource(DRA_SNAP), CFG)
    for tier in ("gpu", "xid", "efa", "topology"):
        eng.run_tier(tier)
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.PASS
    assert isinstance(eng.inputs[Input.DRA], DraSlices)
    doc = decode_results(marks.results_json)
    assert doc is not None
    assert [(g["index"], g["pci"], g["dra"]) for g in doc["gpus"]][3] == (3, GPU3[0], "gpu-3")
    assert doc["gpus"][3]["uuid"] == GPU3[1]
