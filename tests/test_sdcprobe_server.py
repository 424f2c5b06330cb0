"""The SDC probe's node server over real HTTP: each run a real `python -m sdcprobe run` subprocess
on the CPU stand-in; an abort kills that subprocess at once."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdcprobe.server import make_server

ROOT = Path(__file__).resolve().parent.parent


class Args:
    backend, repeats, precisions, seed, size = "cpu", 1, "fp64,fp32,bf16", 1, 8
    cpu_devices, inject, listen, timeout = 4, "", "127.0.0.1:0", 60.0
    cpu_delay = 0.0


def call(base: str, method: str, path: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    req = urllib.request.Request(base + path, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def serve(tmp_path: Path, **over: object) -> Iterator[str]:
    args = Args()
    for k, v in over.items():
        setattr(args, k, v)
    os.environ["PYTHONPATH"] = str(ROOT)
    httpd = make_server(args, tmp_path)  # type: ignore[arg-type]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    yield from serve(tmp_path, inject="2:1,2")


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[str]:
    yield from serve(tmp_path, cpu_delay=5.0)


def wait_done(base: str, run_id: str, limit_s: float = 60.0) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        _, doc = call(base, "GET", f"/runs/{run_id}")
        if doc["state"] != "running":
            return doc
        time.sleep(0.1)
    raise AssertionError("the run did not end")


def test_a_run_reports_its_ladder_over_http(server: str) -> None:
    code, doc = call(server, "POST", "/runs")
    assert code == 202
    done = wait_done(server, doc["id"])
    assert done["state"] == "completed"
    assert [a["differed"] for a in done["report"]["attempts"]] == [{"2": ["gemm/fp32"]}] * 2
    assert call(server, "GET", "/runs/nope")[0] == 404


def test_one_run_at_a_time_and_abort_kills_the_compute(slow: str) -> None:
    code, doc = call(slow, "POST", "/runs")
    assert code == 202
    assert call(slow, "POST", "/runs") == (409, {"id": doc["id"], "error": "a run is in progress"})
    time.sleep(0.5)
    started = time.monotonic()
    code, aborted = call(slow, "POST", f"/runs/{doc['id']}/abort")
    assert code == 200 and aborted["state"] == "aborted"
    done = wait_done(slow, doc["id"], 5.0)  # the compute sleeps 5 s per kernel: killed, not finished
    assert time.monotonic() - started < 3.0
    assert done == {"id": doc["id"], "state": "aborted", "error": "aborted on request"}
    code, again = call(slow, "POST", "/runs")  # the next run may start at once
    assert code == 202 and again["id"] != doc["id"]
    call(slow, "POST", f"/runs/{again['id']}/abort")


def test_the_compute_process_is_gone_after_an_abort(tmp_path: Path) -> None:
    from sdcprobe.server import Run

    out = tmp_path / "r.json"
    cmd = ["python3", "-c", "import time; time.sleep(30)"]
    run = Run("x", cmd, out, 60.0)
    run.abort()
    run.proc.wait(timeout=5)
    assert run.proc.returncode == -9
    timed = Run("y", cmd, out, 0.5)
    timed.proc.wait(timeout=5)
    time.sleep(0.2)
    assert timed.doc() == {"id": "y", "state": "failed", "error": "the run went past 0.5 s and was killed"}
