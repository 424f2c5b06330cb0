"""`make demo-cluster` shows the main job: on the real API server, three agents under the
manifests' identity, an Xid 79 on one Node taints it and only it, and the operator's commands show it."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import demo_cluster


@pytest.mark.kube
def test_the_demo_taints_the_broken_node_only(kube: Any, tmp_path: Path) -> None:
    out = io.StringIO()
    timings = demo_cluster.run(kube, tmp_path, out)
    text = out.getvalue()
    before, after = text.split("an Xid 79 on gpu-node-b", 1)
    assert before.count(" pass ") == 3 and " fail " not in before
    row = next(line for line in after.splitlines() if line.startswith("gpu-node-b") and "Ready" in line)
    assert row.split()[-2:] == ["fail", "reboot"]
    assert "TaintAdded" in after and "gpu-healthcheck/unhealthy=reboot:NoSchedule" in after
    status = after.split("== gpu-healthcheck status", 1)[1]
    assert status.splitlines()[2].startswith("gpu-node-b") and "Xid 79" in status
    assert timings["fault_to_taint_s"] > 0
    assert "Forbidden" not in text and "403" not in text
