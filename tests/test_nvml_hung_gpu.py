"""One hung GPU costs one GPU: NVML reads each GPU within its own bound, so a GPU whose calls hang is
`unknown` while the others are judged as usual; once confirmed (node.confirmAfter) the finding is
that GPU's own (gpu.responsive.timeout on its PCI address), which under node.isolation gpu|auto
isolates that device alone; and the NVML session is never shut down under the stuck call.

Through the real pynvml over the fake libnvidia-ml.so.1 (tests/fakes/nvml), its machine the real 8x
H100 recording gpud-h100x8-535.183.01, with every call on GPU 3 held (fake_nvml_hold_gpu)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.core.device_scope import Scope
from agent.core.gpu import GpuInventory
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.probes import nvml
from agent.probes.live import LiveSource
from agent.probes.nvml import read_nvml
from agent.probes.nvsmi_errors import ProbeTimeout
from tests.conftest import cfg, live_cfg
from tests.fakes.nvml.fake_nvml import Machine, from_recordings

FIX = Path(__file__).parent / "fixtures"
H100X8 = FIX / "nvidia-smi-q" / "gpud-h100x8-535.183.01.txt"


@pytest.fixture
def h100x8(fake_nvml: Any) -> Machine:
    machine = from_recordings(H100X8)
    fake_nvml.write(machine)
    return machine


def release(fake_nvml: Any, index: int) -> None:
    """Let GPU `index` answer again and wait for its parked worker to leave the library."""
    fake_nvml.hold_gpu(index, False)
    for worker in nvml._PER_GPU.parked(f"gpu{index}"):
        worker.join(timeout=10)
    assert not nvml._PER_GPU.parked(f"gpu{index}")


def test_a_hung_gpu_is_named_and_the_others_are_read(fake_nvml: Any, h100x8: Machine) -> None:
    healthy = read_nvml(timeout_s=10)
    pci3 = healthy.gpus[3].pci_bus_id
    fake_nvml.hold_gpu(3, True)
    started = time.monotonic()
    inv = read_nvml(timeout_s=1.0)
    took = time.monotonic() - started
    assert 0.8 <= took < 1.5  # the read's bound (less its margin), once
    assert [g.index for g in inv.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert inv.gpus == tuple(g for g in healthy.gpus if g.index != 3)  # the others read as usual
    (hung,) = inv.hung
    assert (hung.index, hung.pci_bus_id, hung.uuid) == (3, pci3, healthy.gpus[3].uuid)  # its last read
    assert hung.message == "NVML calls on this GPU do not return within 1 s; not called again until they do"
    assert hung.waited_s is not None and inv.visible == 8

    started = time.monotonic()
    again = read_nvml(timeout_s=1.0)  # GPU 3 is not called again while its call is stuck: no wait
    assert time.monotonic() - started < 0.5
    assert len(again.gpus) == 7 and again.hung[0].waited_s is None
    assert again.hung[0].message == hung.message  # one text while it lasts: no Node write per cycle
    counts = fake_nvml.counts()
    assert counts["inits"] == 1 and counts["shutdowns"] == 0  # one session, kept

    release(fake_nvml, 3)
    back = read_nvml(timeout_s=10)
    assert back.gpus == healthy.gpus and back.hung == ()
    counts = fake_nvml.counts()
    assert counts["inits"] == 1 and counts["shutdowns"] == 0 and counts["refcount"] == 1


def test_a_gpu_that_never_answered_is_named_by_its_index(fake_nvml: Any, h100x8: Machine) -> None:
    nvml._SEEN.clear()
    fake_nvml.hold_gpu(6, True)  # its first attach hangs: no PCI address known
    inv = read_nvml(timeout_s=2.0)  # the other seven answer within it even on a loaded machine
    assert [(h.index, h.pci_bus_id, h.label) for h in inv.hung] == [(6, None, "GPU 6")]
    release(fake_nvml, 6)


def test_the_session_is_never_shut_down_under_a_stuck_gpu_call(fake_nvml: Any, h100x8: Machine) -> None:
    """GPU 5 asks for a reset, which retires the session after each read (it is shut down so that a
    reset finds no agent on the GPU); GPU 3's stuck worker holds its own reference: the session is
    shut down only when that call returns."""
    read_nvml(timeout_s=10)
    fake_nvml.hold_gpu(3, True)
    h100x8.gpus[5]["field.230"] = "1"  # recovery action: Reset
    fake_nvml.write(h100x8, now=True)
    inv = read_nvml(timeout_s=0.5)
    assert inv.gpus[4].recovery_action == "Reset" and [h.index for h in inv.hung] == [3]
    counts = fake_nvml.counts()
    assert counts["shutdowns"] == 0 and counts["refcount"] == 1  # retired, not shut down under GPU 3
    release(fake_nvml, 3)
    counts = fake_nvml.counts()
    assert counts["shutdowns"] == 1 and counts["refcount"] == 0  # the stuck worker's release did it


def test_the_whole_read_still_times_out_when_what_all_gpus_share_hangs(
    fake_nvml: Any, h100x8: Machine
) -> None:
    read_nvml(timeout_s=10)
    fake_nvml.hold(True)  # the driver version check, the count: every GPU's read needs them
    with pytest.raises(ProbeTimeout, match="did not answer"):
        read_nvml(timeout_s=0.3)
    fake_nvml.hold(False)
    for worker in nvml._WATCHDOG.parked(nvml.SOURCE):
        worker.join(timeout=10)


def engine(tmp_path: Path, **doc: Any) -> Engine:
    config = cfg({"timeouts": {"nvml": 1}, **doc})
    return Engine(LiveSource(live_cfg(timeout_s=5, nvml_timeout_s=1), sys_root=tmp_path), config)


def test_a_hung_gpu_is_unknown_then_its_own_failure_and_the_others_are_judged(
    fake_nvml: Any, h100x8: Machine, tmp_path: Path
) -> None:
    """confirmAfter 2: the first cycle holds GPU 3's finding back (gpu.responsive unknown, nothing
    marked), the others are judged (a DBE on GPU 1 fails at once); the second fails GPU 3 alone, a
    scope of GPU 1 and GPU 3, never the node."""
    h100x8.gpus[1]["memerr.1.0.2"] = "2"  # volatile DRAM uncorrectable on GPU 1: gpu.ecc, reset
    fake_nvml.write(h100x8)
    eng = engine(tmp_path, node={"isolationNodeAtGpus": 3})  # two GPUs at once stay per GPU here
    eng.run_tier("gpu")
    healthy = eng.inputs[next(i for i in eng.inputs if i.value == "gpus")]
    assert isinstance(healthy, GpuInventory)
    pci1, pci3 = healthy.gpus[1].pci_bus_id, healthy.gpus[3].pci_bus_id
    fake_nvml.hold_gpu(3, True)
    eng.run_tier("gpu")
    responsive = eng.results["gpu.responsive"]
    assert responsive.status is Status.UNKNOWN and not responsive.findings
    assert responsive.message.startswith(f"{healthy.gpus[3].label} does not answer: NVML calls on this GPU")
    assert "(failing run 1 of 2, confirming before it counts: node.confirmAfter)" in responsive.message
    ecc = eng.results["gpu.ecc"]
    assert ecc.status is Status.FAIL and [f.entities for f in ecc.findings] == [(healthy.gpus[1].label,)]
    assert eng.results["gpu.count"].status is Status.SKIPPED or eng.results["gpu.count"].findings == ()
    assert "not read: no answer, see gpu.responsive" in eng.results["gpu.persistence"].message
    _, marks = eng.evaluate()
    assert marks.scope == Scope(False, (pci1,))  # GPU 3 not yet: only GPU 1's DBE

    eng.run_tier("gpu")
    responsive = eng.results["gpu.responsive"]
    assert responsive.status is Status.FAIL
    (finding,) = responsive.findings
    assert finding.rule == "gpu.responsive.timeout" and finding.severity is Severity.REBOOT
    assert finding.key == f"gpu.responsive.timeout/{pci3}" and finding.entities == (healthy.gpus[3].label,)
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.FAIL and marks.taint
    assert marks.scope == Scope(False, tuple(sorted((pci1, pci3))))  # isolation gpu: these two alone
    gpus = {g["index"]: g for g in json.loads(marks.results_json)["gpus"]}
    assert gpus[3]["hung"] is True and gpus[3]["status"] == "fail"
    assert gpus[3]["findings"] == [finding.key]
    assert gpus[0]["status"] == "pass" and gpus[1]["status"] == "fail" and len(gpus) == 8
    release(fake_nvml, 3)
    eng.run_tier("gpu")
    assert eng.results["gpu.responsive"].status is Status.PASS


def test_a_hung_gpu_alone_is_isolated_alone(fake_nvml: Any, h100x8: Machine, tmp_path: Path) -> None:
    eng = engine(tmp_path, node={"confirmAfter": 1, "isolation": "gpu"})
    eng.run_tier("gpu")
    pci3 = eng.inputs[next(i for i in eng.inputs if i.value == "gpus")].gpus[3].pci_bus_id
    fake_nvml.hold_gpu(3, True)
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    assert marks.scope == Scope(False, (pci3,))
    release(fake_nvml, 3)


def test_a_gpu_tier_read_that_waited_for_a_hung_gpu_is_timed_as_a_timeout(
    fake_nvml: Any, h100x8: Machine, tmp_path: Path
) -> None:
    from tests.test_confirm import Reads

    reads = Reads()
    # 2 s: the healthy reads answer within it even beside a cold Go build (0.5 s timed one out)
    source = LiveSource(live_cfg(timeout_s=5, nvml_timeout_s=2.0), sys_root=tmp_path, telemetry=reads)
    source.gpus()
    fake_nvml.hold_gpu(2, True)
    source.gpus()
    source.gpus()  # still stuck: no wait
    assert [outcome for _, outcome, _ in reads.reads] == ["ok", "timeout", "ok"]
    release(fake_nvml, 2)


def test_no_thread_is_left_behind_by_healthy_reads(fake_nvml: Any, h100x8: Machine) -> None:
    before = threading.active_count()
    for _ in range(20):
        assert len(read_nvml(timeout_s=10).gpus) == 8
    time.sleep(0.05)
    assert threading.active_count() <= before
