"""hostengine/: the entrypoint with a fake nv-hostengine, the probe and injection (main() of each, on our
DCGM binding mirror over the fake libdcgm.so.4), and the kmsg Xid writer."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.core.severity import Severity
from agent.probes.kernel_log import parse_kernel_log
from agent.probes.kmsg_inject import InjectRefused, write_xid_line, xid_line
from agent.probes.xid_events import extract_xids
from hostengine import entrypoint, inject, probe

REPO = Path(__file__).parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


FAKE_ENGINE = """#!{py}
import signal, sys, time
print("fake nv-hostengine args: " + " ".join(sys.argv[1:]), flush=True)
signal.signal(signal.SIGTERM, lambda *a: (print("fake engine: got SIGTERM", flush=True), sys.exit(0)))
print("Started host engine version 4.6.0 using port number: 5555", flush=True)
while True:
    time.sleep(0.05)
"""


def test_entrypoint_runs_engine_in_foreground_forwards_log_and_stops_on_sigterm(tmp_path: Path) -> None:
    binary = tmp_path / "nv-hostengine"
    binary.write_text(FAKE_ENGINE.format(py=sys.executable))
    binary.chmod(0o755)
    (tmp_path / "proc").mkdir()
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hostengine",
            "--binary",
            str(binary),
            "--port",
            str(port),
            "--proc",
            str(tmp_path / "proc"),
            "--log-level",
            "info",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Started host engine" in line:
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    out = "".join(lines) + rest
    assert f"args: -n -b 127.0.0.1 -p {port} --log-level INFO -f -" in out
    assert "fake engine: got SIGTERM" in out  # the child was terminated, its log forwarded
    assert proc.returncode == 0


def test_entrypoint_refuses_when_the_port_already_answers(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc = entrypoint.main(["--port", str(port), "--binary", "/nonexistent/nv-hostengine"])
    assert rc == entrypoint.EXIT_ALREADY_SERVED
    assert "refusing to start" in capsys.readouterr().out


def test_entrypoint_refuses_when_another_engine_process_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "comm").write_text("nv-hostengine\n")
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "comm").write_text("bash\n")
    rc = entrypoint.main(["--port", str(free_port()), "--proc", str(tmp_path)])
    assert rc == entrypoint.EXIT_ALREADY_SERVED
    assert "already running on this node (pid 4242)" in capsys.readouterr().out


# --------------------------------------------------------------------------- probe (fake libdcgm)


def test_probe_lists_gpus_and_fails_when_unreachable_or_empty(fake_dcgm: Any) -> None:
    ok, msg = probe.probe("127.0.0.1:5555")
    assert ok and "2 GPU(s)" in msg
    fake_dcgm.set_gpus([])
    assert not probe.probe("127.0.0.1:5555")[0]
    assert probe.probe("127.0.0.1:5555", allow_no_gpu=True)[0]
    fake_dcgm.set_up(False)
    ok, msg = probe.probe("127.0.0.1:5555", timeout_s=0.2)
    assert not ok and "unreachable" in msg
    assert probe.main(["--address", "127.0.0.1:5555", "--timeout", "0.2"]) == 1
    assert fake_dcgm.stat("open_connections") == 0  # every probe closes its connection


def test_probe_main_end_to_end(fake_dcgm: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fake_dcgm.set_gpus([0, 1, 2, 3])
    assert probe.main(["--address", "127.0.0.1:5555"]) == 0
    assert "ok: 4 GPU(s) [0, 1, 2, 3]" in capsys.readouterr().out
    fake_dcgm.fail("dcgmGetEntityGroupEntities", -8)  # the engine answers, NVML does not
    assert probe.main(["--address", "127.0.0.1:5555"]) == 1
    assert "answered with an error: DCGMError_NvmlError" in capsys.readouterr().out


# --------------------------------------------------------------------------- injection


def test_field_value_struct_matches_dcgm_layout() -> None:
    assert ctypes.sizeof(inject.FieldValueV1) == 4120  # dcgm.md §5.1
    assert inject.FieldValueV1.ts.offset == 16 and inject.FieldValueV1.value.offset == 24
    assert inject.FIELD_VALUE_VERSION1 == 4120 | (1 << 24)


def test_injection_passes_the_dcgm_struct_to_the_c_function(fake_dcgm: Any) -> None:
    from agent.probes.dcgm.client import DcgmClient

    c = DcgmClient("127.0.0.1:5555", 1.0, 0.0)
    fn = inject.inject_function(ctypes.CDLL("libdcgm.so.4"))  # the library the bindings loaded (soname)
    now = time.time()
    inject.inject_values(
        fn,
        c.handle().handle,
        3,
        [inject.Inject(202, 0, baseline=True), inject.Inject(202, 100_000)],
        60.0,
        now,
    )
    base, fault = fake_dcgm.injected()
    assert (base["gpu"], base["field"], base["value"]) == (3, 202, 0)
    assert base["ts"] == int((now - inject.BASELINE_AGE_S) * 1_000_000)  # recent past, whatever --offset
    assert (fault["field"], fault["value"], fault["ts"]) == (202, 100_000, int((now + 60.0) * 1_000_000))
    assert fault["type"] == ord("i") and fault["version"] == 4120 | (1 << 24)
    c.close()


def test_injection_error_status_raises(fake_dcgm: Any) -> None:
    from agent.probes.dcgm.client import DcgmClient

    c = DcgmClient("127.0.0.1:5555", 1.0, 0.0)
    fn = inject.inject_function(ctypes.CDLL("libdcgm.so.4"))
    with pytest.raises(RuntimeError, match="status -13"):  # DCGM_ST_UNKNOWN_FIELD
        inject.inject_values(fn, c.handle().handle, 0, [inject.Inject(9999, 1)], 0.0, now=0.0)
    c.close()
    with pytest.raises(RuntimeError, match="status -21"):  # a closed connection
        inject.inject_values(fn, ctypes.c_void_p(1), 0, [inject.Inject(311, 1)], 0.0, now=0.0)


def test_inject_main_end_to_end_passes_the_real_handle(
    fake_dcgm: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() connects through the bindings (handle = ctypes.c_void_p, as in DCGM's own) and hands that
    connection to dcgmInjectEntityFieldValue of the same library."""
    rc = inject.main(["dbe", "--gpu", "1", "--yes", "--address", "127.0.0.1:5555"])
    assert rc == 0, capsys.readouterr().err
    (value,) = fake_dcgm.injected()
    assert (value["gpu"], value["field"], value["value"]) == (1, 311, 2)
    assert "dbe on GPU 1 injected" in capsys.readouterr().out
    assert fake_dcgm.stat("open_connections") == 0
    fake_dcgm.set_up(False)
    assert inject.main(["dbe", "--gpu", "1", "--yes", "--address", "127.0.0.1:5555", "--timeout", "0.2"]) == 1
    assert "unreachable" in capsys.readouterr().err


EXPECTED = {  # scenario -> the agent's findings (rule -> severity) after one health poll
    "xid": {"dcgm-health.unlisted-fail": Severity.RESET},  # Xid 79: DCGM_FR_FALLEN_OFF_BUS (120)
    "dbe": {"dcgm-health.mem.4": Severity.RESET},
    "row-remap-failure": {"dcgm-health.mem.80": Severity.ISOLATE},
    "row-remap-uncorrectable": {"dcgm-health.mem.84": Severity.ISOLATE},
    "nvlink-errors": {"dcgm-health.nvlink.71": Severity.RESET, "dcgm-health.*.101": Severity.MONITOR},
    "thermal": {"dcgm-health.thermal.10": Severity.MONITOR},
    "pcie-replay": {"dcgm-health.pcie.3": Severity.MONITOR},
}


def findings_after_poll(poller: Any) -> dict[str, Severity]:
    from agent.checks.dcgm import check_dcgm_health
    from agent.config import load_config_dir
    from agent.core.facts import NodeFacts

    rep = poller.poll()
    res = check_dcgm_health(NodeFacts(dcgm_health=rep), load_config_dir())
    assert all(f.entities == ("GPU 1",) for f in res.findings), res.findings
    return {f.rule: f.severity for f in res.findings}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_scenario_fires_its_incident_and_the_agent_finding(
    fake_dcgm: Any, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """inject main() → the engine's health watch (modelled on DcgmHealthWatch.cpp 4.6 in the fake) → the
    agent's poller and dcgm-health check: the finding the scenario documents, on the GPU injected."""
    from agent.probes.dcgm.client import DcgmClient
    from agent.probes.dcgm.health import HealthPoller

    poller = HealthPoller(DcgmClient("127.0.0.1:5555", 1.0, 0.0))
    assert findings_after_poll(poller) == {}  # healthy before
    assert inject.main([name, "--gpu", "1", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "expect incident" in out and inject.scenarios(79)[name].finding in out
    assert findings_after_poll(poller) == EXPECTED[name]
    assert inject.main([name, "--gpu", "1", "--yes", "--clear"]) == 0
    after = findings_after_poll(poller)
    if name == "xid":
        assert after == EXPECTED[name]  # DCGM keeps its Xid history until the engine restarts
        fake_dcgm.restart()
        poller.poll()  # notices the lost connection
        assert findings_after_poll(poller) == {}
    elif any(i.baseline for i in inject.scenarios(79)[name].fault):
        assert after == EXPECTED[name]  # rate scenarios: the rise stays in the 60 s window for a minute
    else:
        assert after == {}


def test_rate_scenarios_need_their_baseline(fake_dcgm: Any) -> None:
    """A lone future sample of a rate field fires nothing (the reason the baseline exists)."""
    from agent.probes.dcgm.client import DcgmClient
    from agent.probes.dcgm.health import HealthPoller

    c = DcgmClient("127.0.0.1:5555", 1.0, 0.0)
    poller = HealthPoller(c)
    poller.poll()
    fn = inject.inject_function(ctypes.CDLL("libdcgm.so.4"))
    inject.inject_values(fn, c.handle().handle, 1, [inject.Inject(241, 10_000_000)], 60.0, time.time())
    assert findings_after_poll(poller) == {}


def test_subsystem_xids_are_warnings_and_unwatched_codes_nothing(fake_dcgm: Any) -> None:
    from agent.probes.dcgm.client import DcgmClient
    from agent.probes.dcgm.health import HealthPoller

    poller = HealthPoller(DcgmClient("127.0.0.1:5555", 1.0, 0.0))
    poller.poll()
    assert inject.main(["xid", "--xid", "13", "--gpu", "1", "--yes"]) == 0  # no health rule for Xid 13
    assert findings_after_poll(poller) == {}
    assert inject.main(["xid", "--xid", "43", "--gpu", "1", "--yes"]) == 0  # a MEM subsystem Xid
    assert findings_after_poll(poller) == {"dcgm-health.*.101": Severity.MONITOR}


def test_inject_refuses_without_yes(capsys: pytest.CaptureFixture[str]) -> None:
    assert inject.main(["dbe", "--gpu", "0"]) == 2
    assert "--yes" in capsys.readouterr().err


# --------------------------------------------------------------------------- kmsg


def test_kmsg_line_is_parsed_by_our_own_xid_path(tmp_path: Path) -> None:
    out = tmp_path / "kmsg"
    line = write_xid_line(out, 79, "0000:53:00.0", yes=True)
    assert out.read_text() == f"<4>{line}\n"
    assert line.startswith("NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen")
    events = extract_xids(parse_kernel_log(line + "\n"))
    assert [(e.code, e.pci) for e in events][:1] == [(79, events[0].pci)] and "53:00" in str(events[0].pci)


def test_kmsg_refuses_without_yes_and_bad_pci(tmp_path: Path) -> None:
    with pytest.raises(InjectRefused, match="--yes"):
        write_xid_line(tmp_path / "kmsg", 48, "0000:53:00.0", yes=False)
    assert not (tmp_path / "kmsg").exists()
    with pytest.raises(InjectRefused, match="PCI"):
        xid_line(48, "gpu0")
    assert os.path.basename(xid_line(13, "53:00.0")).startswith("NVRM: Xid (PCI:0000:53:00): 13")
