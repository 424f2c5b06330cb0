"""Build `/sys/class/infiniband` trees in a temporary directory, at test time.

* from_real(): a copy of the real tree tests/fixtures/infiniband-sysfs/gpud-h100-sys-class-infiniband
  (8 ConnectX-7 NDR 400 Gb/sec InfiniBand ports + a BlueField-3 Ethernet bond at 200 Gb/sec).
* from_ibstat(): DERIVED from a real `ibstat` recording (tests/fixtures/ibstat-ibdevinfo): one
  device per "CA 'name'", one port per "Port N:", with the files the kernel writes for what ibstat
  printed: state "4: ACTIVE" / "1: DOWN" / "2: INIT" / "3: ARMED", phys_state "5: LinkUp" /
  "3: Disabled" / "2: Polling" / "1: Sleep", rate "<Rate> Gb/sec", link_layer as printed.
  ibstat shows no counters: every port gets the IB PMA counters the real tree has, at 0.

* from_ibstatus(): DERIVED from a real `ibstatus` recording, which prints the sysfs values
  themselves ("4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)", link_layer): written back as they
  are; `pci` ({name: BDF}) adds each device's `device` link into root/bus/pci/devices (ibstatus
  shows no PCI address: the mapping is the test's).

Fault variants are made by `state` ({name: (state, phys_state)}), `rate` ({name: text}),
`counters` ({name: {counter: value}}) and `drop` (devices left out), and said in each test.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

FIX = Path(__file__).parent / "fixtures"
REAL = FIX / "infiniband-sysfs" / "gpud-h100-sys-class-infiniband"
IBSTAT = FIX / "ibstat-ibdevinfo"
_STATE = {
    "Active": "4: ACTIVE",
    "Down": "1: DOWN",
    "Initializing": "2: INIT",
    "Init": "2: INIT",
    "Armed": "3: ARMED",
}
_PHYS = {"LinkUp": "5: LinkUp", "Disabled": "3: Disabled", "Polling": "2: Polling", "Sleep": "1: Sleep"}
PMA = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors", "local_link_integrity_errors")


def _adjust(
    class_dir: Path,
    state: Mapping[str, tuple[str, str]],
    rate: Mapping[str, str],
    counters: Mapping[str, Mapping[str, int]],
) -> None:
    for name, (st, phys) in state.items():
        (class_dir / name / "ports" / "1" / "state").write_text(st)
        (class_dir / name / "ports" / "1" / "phys_state").write_text(phys)
    for name, text in rate.items():
        (class_dir / name / "ports" / "1" / "rate").write_text(text)
    for name, values in counters.items():
        for counter, value in values.items():
            (class_dir / name / "ports" / "1" / "counters" / counter).write_text(str(value))


def from_real(
    root: Path,
    *,
    state: Mapping[str, tuple[str, str]] | None = None,
    rate: Mapping[str, str] | None = None,
    counters: Mapping[str, Mapping[str, int]] | None = None,
    drop: Iterable[str] = (),
) -> Path:
    class_dir = root / "class" / "infiniband"
    shutil.copytree(REAL, class_dir, ignore=shutil.ignore_patterns(*drop) if drop else None)
    _adjust(class_dir, state or {}, rate or {}, counters or {})
    return class_dir


def from_ibstat(
    root: Path,
    recording: str,
    *,
    state: Mapping[str, tuple[str, str]] | None = None,
    counters: Mapping[str, Mapping[str, int]] | None = None,
) -> Path:
    class_dir = root / "class" / "infiniband"
    dev = port = None
    for line in (IBSTAT / recording).read_text(encoding="utf-8").splitlines():
        m = re.match(r"^CA '([^']+)'", line)
        if m:
            dev, port = class_dir / m.group(1), None
            continue
        m = re.match(r"^\s+Port (\d+):", line)
        if m and dev is not None:
            port = dev / "ports" / m.group(1)
            (port / "counters").mkdir(parents=True)
            for counter in PMA:
                (port / "counters" / counter).write_text("0")
            continue
        m = re.match(r"^\s+(State|Physical state|Rate|Link layer): (.+)$", line)
        if m and port is not None:
            key, value = m.group(1), m.group(2).strip()
            if key == "State":
                (port / "state").write_text(_STATE.get(value, value))
            elif key == "Physical state":
                (port / "phys_state").write_text(_PHYS.get(value, value))
            elif key == "Rate":
                (port / "rate").write_text(f"{value} Gb/sec")
            else:
                (port / "link_layer").write_text(value)
    _adjust(class_dir, state or {}, {}, counters or {})
    return class_dir


def from_ibstatus(root: Path, recording: str, *, pci: Mapping[str, str] | None = None) -> Path:
    class_dir = root / "class" / "infiniband"
    port = None
    names = {"state": "state", "phys state": "phys_state", "rate": "rate", "link_layer": "link_layer"}
    for line in (IBSTAT / recording).read_text(encoding="utf-8").splitlines():
        m = re.match(r"^Infiniband device '([^']+)' port (\d+) status:", line)
        if m:
            port = class_dir / m.group(1) / "ports" / m.group(2)
            port.mkdir(parents=True)
            continue
        m = re.match(r"^\s+(state|phys state|rate|link_layer):\s+(.+)$", line)
        if m and port is not None:
            (port / names[m.group(1)]).write_text(m.group(2).strip())
    for name, bdf in (pci or {}).items():
        target = os.path.relpath(root / "bus" / "pci" / "devices" / bdf, class_dir / name)
        os.symlink(target, class_dir / name / "device")
    return class_dir
