"""An 8x H100 node read by read, for the trend warnings end to end (tests/test_trends_engine.py and
bench/trend_annotation.py): the p5.48xlarge demo snapshot (examples/snapshots, built from real
recordings) copied to a temp dir, its files rewritten before each gpu-tier read as a node's would
change, and an Engine on it with a wall clock the test moves.

DERIVED, read by read, from the snapshot's real `nvidia-smi -q` (gpud-h100x8-535.183.01.txt), its
real NVLink listing and the real PCI bus of another 8x H100 node (tests/pci_sysfs_tree.py,
lspci -vvv → sysfs), each GPU moved to that bus's GPU addresses (19:00.0 …) so that the bus holds
them:
- `worn=True`, every GPU, read n: one bank at Low and one at None in the remap histogram, n rows
  remapped for correctable errors, 1000·n volatile DRAM correctable errors, 84 °C with 1 °C left to
  T.Limit (3 °C before slowdown), busy (P0, 100 %) at SM 1200 of 1980 MHz with no clock event reason
  active, NVLink CRC errors and correctable AER errors growing by 3 every read on every link/port;
- `worn=False`: the recording as it is (counters flat), only the GPU temperature moving (36 + n % 7 °C).
The snapshot's EFA devices are not on that bus, so pci.inventory is switched off (CONFIG).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from agent.config import Config
from agent.core.facts import Input
from agent.core.pci import PciSample
from agent.engine.engine import Engine
from agent.probes.pci import read_pci
from agent.probes.snapshot import SnapshotSource
from tests.conftest import cfg
from tests.pci_sysfs_tree import build_from_lspci

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
BUS = ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db")  # the lspci node's GPUs
T0 = 1_764_000_000


def config(extra: dict[str, Any] | None = None) -> Config:
    """The shipped config and tables, pci.inventory off (another node's bus), plus `extra`."""
    return cfg({"checks": {"pci.inventory": False}, **(extra or {})})


def _set(block: str, key: str, value: str, after: str = "") -> str:
    """Set the first `key : value` line of a GPU block at or after the line matching `after`."""
    start = re.search(after, block, re.M).start() if after else 0  # type: ignore[union-attr]
    m = re.compile(rf"^(\s*{re.escape(key)}\s*: )(.*)$", re.M).search(block, start)
    assert m is not None, key
    return block[: m.start(2)] + value + block[m.end(2) :]


class Node:
    def __init__(self, tmp: Path, *, worn: bool, cfg: Config | None = None) -> None:
        self.snap = tmp / "snap"
        shutil.copytree(HEALTHY, self.snap, symlinks=True)
        self.devices = build_from_lspci(tmp / "bus")
        self.text = (HEALTHY / "nvidia-smi-q.txt").read_text()
        self.worn = worn
        self.n = 0
        self.now = T0
        self.cfg = cfg or config()
        self.engine = self.new_engine()

    def new_engine(self) -> Engine:
        """An agent (re)started on this node: nothing in memory."""
        return Engine(
            SnapshotSource(self.snap), self.cfg, wall=lambda: self.now, extra_inputs={Input.PCI: self.pci}
        )

    def pci(self) -> PciSample:
        return read_pci(self.devices, taken_at=float(self.now))  # on the node's clock: AER rates per read

    def reboot(self, boot_id: str) -> None:
        (self.snap / "boot_id").write_text(boot_id + "\n")

    def _nvidia_smi(self) -> str:
        blocks = re.split(r"(?m)^(?=GPU 00000000:)", self.text)
        out = [blocks[0]]
        for block, bus in zip(blocks[1:], BUS, strict=True):
            old = block.split("\n", 1)[0].split()[1]
            block = block.replace(old, f"00000000:{bus.upper()}:00.0")
            if self.worn:
                for key, value, after in (
                    ("Correctable Error", str(self.n), "^    Remapped Rows"),
                    ("Max", "2558 bank(s)", "Bank Remap Availability Histogram"),
                    ("Low", "1 bank(s)", "Bank Remap Availability Histogram"),
                    ("None", "1 bank(s)", "Bank Remap Availability Histogram"),
                    ("DRAM Correctable", str(1000 * self.n), "^        Volatile"),
                    ("GPU Current Temp", "84 C", "^    Temperature"),
                    ("GPU T.Limit Temp", "1 C", "^    Temperature"),
                    ("Performance State", "P0", ""),
                    ("Gpu", "100 %", "^    Utilization"),
                    ("SM", "1200 MHz", "^    Clocks$"),
                    ("Idle", "Not Active", "^    Clocks Event Reasons"),
                    ("SW Power Cap", "Not Active", "^    Clocks Event Reasons"),
                    ("HW Power Brake Slowdown", "Not Active", "^    Clocks Event Reasons"),
                    ("SW Thermal Slowdown", "Not Active", "^    Clocks Event Reasons"),
                ):
                    block = _set(block, key, value, after)
            else:
                block = _set(block, "GPU Current Temp", f"{36 + self.n % 7} C", "^    Temperature")
            out.append(block)
        return "".join(out)

    def _nvlink(self) -> str:
        listing = (HEALTHY / "nvidia-smi-nvlink-s.txt").read_text()
        links = len(re.findall(r"Link \d+: 26", listing)) // len(BUS)
        crc = 3 * self.n if self.worn else 0
        gpus = [
            {
                "index": i,
                "pci": f"00000000:{bus}:00.0",
                "links": {
                    str(k): {"replay": 0, "recovery": 0, "crc_flit": crc, "crc_data": 0} for k in range(links)
                },
            }
            for i, bus in enumerate(BUS)
        ]
        return json.dumps({"gpus": gpus}) + "\n"

    def _aer(self) -> None:
        if not self.worn:
            return
        cor = 3 * self.n
        for bus in BUS:
            (self.devices / f"0000:{bus}:00.0" / "aer_dev_correctable").write_text(
                f"RxErr 0\nBadTLP {cor}\nBadDLLP 0\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\n"
                f"HeaderOF 0\nTOTAL_ERR_COR {cor}\n"
            )

    def read(self, *, step: int | None = None) -> None:
        """The node `step` seconds later (default: one read spacing), its files as they then are,
        and one run of the topology and gpu tiers."""
        self.n += 1
        self.now += int(self.cfg.trends.read_spacing_s) if step is None else step
        (self.snap / "nvidia-smi-q.txt").write_text(self._nvidia_smi())
        (self.snap / "nvlink-errors.json").write_text(self._nvlink())
        self._aer()
        self.engine.run_tier("topology")
        self.engine.run_tier("gpu")
