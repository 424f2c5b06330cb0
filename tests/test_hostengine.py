"""hostengine/: the entrypoint with a fake nv-hostengine, the probe and injection (ctypes against a tiny
compiled fake libdcgm that records the struct it received), and the kmsg Xid writer."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.probes.kernel_log import parse_kernel_log
from agent.probes.kmsg_inject import InjectRefused, write_xid_line, xid_line
from agent.probes.xid_events import extract_xids
from hostengine import entrypoint, inject, probe

FAKE = Path(__file__).parent / "fakes" / "dcgm"
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
    assert f"args: -n -b ALL -p {port} --log-level INFO -f -" in out
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


# --------------------------------------------------------------------------- probe (fake bindings)


def test_probe_lists_gpus_and_fails_when_unreachable_or_empty(fake_dcgm: Any) -> None:
    ok, msg = probe.probe("127.0.0.1:5555")
    assert ok and "2 GPU(s)" in msg
    fake_dcgm.gpus = []
    assert not probe.probe("127.0.0.1:5555")[0]
    assert probe.probe("127.0.0.1:5555", allow_no_gpu=True)[0]
    fake_dcgm.up = False
    ok, msg = probe.probe("127.0.0.1:5555")
    assert not ok and "unreachable" in msg
    assert probe.main(["--address", "127.0.0.1:5555"]) == 1


# --------------------------------------------------------------------------- injection


def test_field_value_struct_matches_dcgm_layout() -> None:
    assert ctypes.sizeof(inject.FieldValueV1) == 4120  # dcgm.md §5.1
    assert inject.FieldValueV1.ts.offset == 16 and inject.FieldValueV1.value.offset == 24
    assert inject.FIELD_VALUE_VERSION1 == 4120 | (1 << 24)


FAKE_LIB_C = r"""
#include <stdint.h>
#include <string.h>
typedef struct { unsigned int version; unsigned short fieldId; short fieldType; int status; int64_t ts;
                 union { int64_t i64; double dbl; char str[256]; signed char blob[4096]; } value; } fv_t;
static fv_t seen[16]; static unsigned int groups[16], ents[16];
static uintptr_t handles[16]; static int n = 0;
int dcgmInjectEntityFieldValue(uintptr_t h, unsigned int g, unsigned int e, fv_t *v) {
    if (n >= 16) return -1;
    handles[n] = h; groups[n] = g; ents[n] = e; memcpy(&seen[n], v, sizeof(fv_t)); n++;
    return v->fieldId == 9999 ? -3 : 0;
}
int fake_count(void) { return n; }
int64_t fake_i64(int i) { return seen[i].value.i64; }
int64_t fake_ts(int i) { return seen[i].ts; }
int fake_field(int i) { return seen[i].fieldId; }
int fake_type(int i) { return seen[i].fieldType; }
unsigned int fake_version(int i) { return seen[i].version; }
unsigned int fake_entity(int i) { return ents[i]; }
unsigned int fake_group(int i) { return groups[i]; }
uintptr_t fake_handle(int i) { return handles[i]; }
"""


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler for the fake libdcgm")
    d = tmp_path_factory.mktemp("fakedcgm")
    (d / "fake.c").write_text(FAKE_LIB_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "libfakedcgm.so"), str(d / "fake.c")], check=True)
    lib = ctypes.CDLL(str(d / "libfakedcgm.so"))
    lib.fake_i64.restype = lib.fake_ts.restype = ctypes.c_int64
    lib.fake_version.restype = lib.fake_entity.restype = lib.fake_group.restype = ctypes.c_uint
    lib.fake_handle.restype = ctypes.c_size_t
    return lib


def test_injection_passes_the_dcgm_struct_to_the_c_function(fake_lib: ctypes.CDLL) -> None:
    fn = inject.inject_function(fake_lib)
    start = fake_lib.fake_count()
    fault, _clear, _ = inject.scenarios(79)["pcie-replay"]
    inject.inject_values(fn, 1001, 3, fault, 60.0, now=1_000_000.0)
    i = start
    assert fake_lib.fake_count() == start + 2
    assert (fake_lib.fake_field(i), fake_lib.fake_i64(i)) == (202, 0)
    assert fake_lib.fake_ts(i) == int((1_000_000.0 + 60.0 - 110.0) * 1_000_000)  # replays start at 0, earlier
    assert (fake_lib.fake_field(i + 1), fake_lib.fake_i64(i + 1)) == (202, 100_000)
    assert fake_lib.fake_ts(i + 1) == int(1_000_060.0 * 1_000_000)
    assert fake_lib.fake_type(i) == ord("i") and fake_lib.fake_version(i) == 4120 | (1 << 24)
    assert fake_lib.fake_group(i) == 1 and fake_lib.fake_entity(i) == 3 and fake_lib.fake_handle(i) == 1001


def test_inject_main_end_to_end_passes_the_real_handle(
    fake_dcgm: Any, fake_lib: ctypes.CDLL, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() connects through the bindings (handle = ctypes.c_void_p, as in DCGM's own) and hands that
    connection to dcgmInjectEntityFieldValue of the same library."""
    start = fake_lib.fake_count()
    rc = inject.main(["dbe", "--gpu", "1", "--yes", "--lib", fake_lib._name, "--address", "127.0.0.1:5555"])
    assert rc == 0, capsys.readouterr().err
    assert fake_lib.fake_count() == start + 1
    assert fake_lib.fake_handle(start) == fake_dcgm.next_conn  # the connection id, not a crash
    assert (fake_lib.fake_field(start), fake_lib.fake_entity(start)) == (311, 1)
    assert "dbe on GPU 1 injected" in capsys.readouterr().out


def test_injection_error_status_raises(fake_lib: ctypes.CDLL) -> None:
    fn = inject.inject_function(fake_lib)
    with pytest.raises(RuntimeError, match="status -3"):
        inject.inject_values(fn, 1, 0, [inject.Inject(9999, 1)], 0.0, now=0.0)


def test_scenarios_cover_the_issue_list_and_each_has_a_clear() -> None:
    sc = inject.scenarios(119)
    assert {"xid", "dbe", "row-remap-pending", "nvlink-down", "thermal", "pcie-replay"} <= set(sc)
    assert sc["xid"][0][0] == inject.Inject(230, 119)
    assert sc["dbe"][0][0].field_id == 311 and sc["row-remap-pending"][0][0].field_id == 396
    assert all(clear for _, clear, _ in sc.values())


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
