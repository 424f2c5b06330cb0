"""Build a DERIVED AWS p5 EFA `/sys/class/infiniband` tree in a temporary directory, at test time.

No real EFA sysfs tree is public. This one combines two real sources:
  * the layout of the real Mellanox tree tests/fixtures/infiniband-sysfs/gpud-h100-sys-class-infiniband
    (<dev>/ports/1/{state,phys_state,rate,link_layer,counters/*,hw_counters/*}, values without a
    trailing newline, state "4: ACTIVE", phys_state "5: LinkUp");
  * the 32 real p5 EFA device names and their tx_pkts values from
    tests/fixtures/efa/awsome-p5-32efa-node-exporter-amazonefa-tx-pkts.prom.
Invented, from the kernel efa driver's documented port statistics: the other hw_counter names
(rx_drops, retrans_timeout_events, ... all 0 unless overridden), link_layer "Unspecified",
rate "100 Gb/sec (4X EDR)", and the PCI side: each device sits at 0000:<bus>:00.0 where <bus> is
the decimal number in rdmap<bus>s0 (systemd's predictable naming) written in hex, with vendor
0x1d0f, device 0xefa1, a `device` symlink and a `device/driver` symlink to the efa driver, laid
out as in sysfs (class entry → devices/<pci>/infiniband/<dev>).
The real Mellanox tree is never modified; see the .source.txt beside it for the note on this one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

FIX = Path(__file__).parent / "fixtures"
PROM = FIX / "efa" / "awsome-p5-32efa-node-exporter-amazonefa-tx-pkts.prom"

EFA_HW_COUNTERS = (
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
    "lifespan",
)


def p5_devices() -> dict[str, int]:
    """Device name → tx_pkts, read from the real node_exporter output (32 devices)."""
    out: dict[str, int] = {}
    pattern = re.compile(r'^node_amazonefa_tx_pkts\{device="([^"]+)",port="1"\} (\S+)$')
    for line in PROM.read_text(encoding="utf-8").splitlines():
        m = pattern.match(line)
        if m:
            out[m.group(1)] = int(float(m.group(2)))
    return out


def pci_for(name: str) -> str:
    m = re.match(r"^rdmap(\d+)s\d+$", name)
    assert m is not None, name
    bus = int(m.group(1))
    return f"0000:{bus:02x}:00.0"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def build_efa_tree(
    root: Path,
    *,
    omit: Iterable[str] = (),
    port_state: Mapping[str, tuple[str, str]] | None = None,
    counters: Mapping[str, Mapping[str, int]] | None = None,
    with_links: bool = True,
) -> Path:
    """Write the tree under root and return the class directory (root/class/infiniband).

    omit: device names left out; port_state: name → (state, phys_state) file contents;
    counters: name → {hw_counter: value} overrides; with_links=False writes a copied tree
    (no symlinks: `device` is a plain directory with vendor and uevent, no driver link).
    """
    class_dir = root / "class" / "infiniband"
    class_dir.mkdir(parents=True, exist_ok=True)
    (root / "bus" / "pci" / "drivers" / "efa").mkdir(parents=True, exist_ok=True)
    port_state = port_state or {}
    counters = counters or {}
    skip = set(omit)
    for name, tx_pkts in p5_devices().items():
        if name in skip:
            continue
        pci = pci_for(name)
        pci_dir = root / "devices" / pci
        _write(pci_dir / "vendor", "0x1d0f\n")
        _write(pci_dir / "device", "0xefa1\n")
        _write(pci_dir / "uevent", f"DRIVER=efa\nPCI_ID=1D0F:EFA1\nPCI_SLOT_NAME={pci}\n")
        if with_links:
            dev_dir = pci_dir / "infiniband" / name
            dev_dir.mkdir(parents=True)
            os.symlink("../../../bus/pci/drivers/efa", pci_dir / "driver")
            os.symlink(f"../../../{pci}", dev_dir / "device")
            os.symlink(f"../../devices/{pci}/infiniband/{name}", class_dir / name)
        else:
            dev_dir = class_dir / name
            _write(dev_dir / "device" / "vendor", "0x1d0f\n")
            _write(dev_dir / "device" / "uevent", f"DRIVER=efa\nPCI_SLOT_NAME={pci}\n")
        port = dev_dir / "ports" / "1"
        state, phys = port_state.get(name, ("4: ACTIVE", "5: LinkUp"))
        _write(port / "state", state)
        _write(port / "phys_state", phys)
        _write(port / "rate", "100 Gb/sec (4X EDR)")
        _write(port / "link_layer", "Unspecified")
        values = {c: 0 for c in EFA_HW_COUNTERS}
        values["tx_pkts"] = tx_pkts
        values["lifespan"] = 12
        values.update(counters.get(name, {}))
        for counter, value in values.items():
            _write(port / "hw_counters" / counter, str(value))
    return class_dir
