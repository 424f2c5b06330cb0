"""`gpu-healthcheck snapshot DIR`: record what a live node's tools say, in their own formats, so the
node can be judged offline (bug reports, tests) with `check --from-snapshot DIR`. Each command's
output goes to the file probes/tool_outputs.py names for it, the file the snapshot source parses."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent.core.probed import ProbeError
from agent.probes.command import run_command
from agent.probes.host import CPU_FILES, NODE_FILES
from agent.probes.kernel_log import read_kmsg_live
from agent.probes.nvlink_errors import read_nvlink_errors, to_json
from agent.probes.nvsmi_errors import NvmlUnavailable, ProbeTimeout, ToolReportedFailure
from agent.probes.pci import PCI_ATTRS
from agent.probes.snapshot import BOOT_ID, ERRORS, ITYPE, KMSG
from agent.probes.tool_outputs import COMMANDS, NVLINK_ERRORS

RDMA_PORT_FILES = ("state", "phys_state", "rate", "link_layer")
PCI_FILES = ("vendor", "device", "class", "uevent", "current_link_width", "max_link_width")


def capture(
    out: Path,
    *,
    timeout_s: float = 30.0,
    sys_root: Path = Path("/sys"),
    kmsg_path: str = "/dev/kmsg",
    instance_type: str | None = None,
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id"),
) -> dict[str, str]:
    """Write a snapshot into `out`; returns {file: problem} for what could not be captured."""
    out.mkdir(parents=True, exist_ok=True)
    errors: dict[str, dict[str, str]] = {}
    problems: dict[str, str] = {}

    for tool in COMMANDS:
        name = tool.file
        result = run_command(list(tool.argv), timeout_s)
        if isinstance(result, ProbeError):
            if tool.failure_recorded:
                errors[name] = {"kind": result.kind.value, "message": result.message}
                problems[name] = str(result)
            continue
        (out / name).write_text(result.stdout, encoding="utf-8")
        if result.returncode != 0 and tool.failure_recorded:
            problems[name] = f"exit code {result.returncode}"

    try:
        log = read_kmsg_live(kmsg_path, timeout_s=min(timeout_s, 5.0))
        lines = [
            f"{r.priority if r.priority is not None else 6},{r.seq if r.seq is not None else i},"
            f"{r.ts_us if r.ts_us is not None else 0},-;{r.message}"
            for i, r in enumerate(log.records)
        ]
        (out / KMSG).write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    except OSError as exc:
        errors[KMSG] = {"kind": "unavailable", "message": f"{kmsg_path}: {exc.strerror or exc}"}
        problems[KMSG] = errors[KMSG]["message"]

    try:
        (out / NVLINK_ERRORS.file).write_text(to_json(read_nvlink_errors(timeout_s)), encoding="utf-8")
    except NvmlUnavailable:
        pass  # no NVML on this node (like no /sys/class/infiniband): the file stays absent
    except (ProbeTimeout, ToolReportedFailure) as exc:
        kind = "timeout" if isinstance(exc, ProbeTimeout) else "tool-failed"
        errors[NVLINK_ERRORS.file] = {"kind": kind, "message": str(exc)}
        problems[NVLINK_ERRORS.file] = str(exc)
    _copy_pci(sys_root, out / "sys", problems)
    _copy_host(sys_root, out / "sys")
    _copy_rdma(sys_root, out / "sys", problems)

    try:
        (out / BOOT_ID).write_text(boot_id_path.read_text())
    except OSError as exc:
        problems[BOOT_ID] = exc.strerror or str(exc)
    itype = instance_type or os.environ.get("GPU_HEALTHCHECK_INSTANCE_TYPE")
    if itype:
        (out / ITYPE).write_text(itype + "\n")
    if errors:
        (out / ERRORS).write_text(json.dumps(errors, indent=2) + "\n")
    return problems


def _copy_rdma(sys_root: Path, dest: Path, problems: dict[str, str]) -> None:
    """Copy /sys/class/infiniband (state, rate, counters) and each device's PCI identity.

    sysfs is full of symlinks and write-only files: copy only the small, readable files we parse,
    and re-create each `device` link as a relative link into the copied sys/bus/pci/devices.
    """
    src = sys_root / "class" / "infiniband"
    if not src.is_dir():
        return
    for dev in sorted(src.iterdir()):
        target = dest / "class" / "infiniband" / dev.name
        target.mkdir(parents=True, exist_ok=True)
        for leaf in ("hca_type", "fw_ver", "board_id", "node_type"):
            _copy_file(dev / leaf, target / leaf)
        ports = dev / "ports"
        if ports.is_dir():
            for port in sorted(ports.iterdir()):
                for leaf in RDMA_PORT_FILES:
                    _copy_file(port / leaf, target / "ports" / port.name / leaf)
                for group in ("hw_counters", "counters"):
                    if (port / group).is_dir():
                        for counter in sorted((port / group).iterdir()):
                            _copy_file(counter, target / "ports" / port.name / group / counter.name)
        device = dev / "device"
        if device.exists():
            pci = os.path.basename(os.path.realpath(device))
            pci_dest = dest / "bus" / "pci" / "devices" / pci
            for leaf in PCI_FILES:
                _copy_file(device / leaf, pci_dest / leaf)
            link = target / "device"
            if not link.exists():
                link.symlink_to(Path("..", "..", "..", "bus", "pci", "devices", pci))
        else:
            problems[f"sys/class/infiniband/{dev.name}/device"] = "no device link"


def _copy_pci(sys_root: Path, dest: Path, problems: dict[str, str]) -> None:
    """Copy every PCI function's attributes (agent.probes.pci.PCI_ATTRS) where sysfs keeps them,
    under sys/devices/pci<domain:bus>/.../<BDF>, and re-create sys/bus/pci/devices/<BDF> as relative
    links: the hierarchy is what says which bridge sits above a device."""
    bus = sys_root / "bus" / "pci" / "devices"
    if not bus.is_dir():
        problems["sys/bus/pci/devices"] = f"{bus} not present"
        return
    devices_root = os.path.realpath(sys_root / "devices")
    for entry in sorted(bus.iterdir()):
        real = os.path.realpath(entry)
        rel = os.path.relpath(real, devices_root)
        if rel.startswith(".."):
            rel = os.path.join("pci-unplaced", entry.name)  # not under /sys/devices: keep it flat
        target = dest / "devices" / rel
        target.mkdir(parents=True, exist_ok=True)
        for leaf in PCI_ATTRS:
            _copy_file(Path(real) / leaf, target / leaf)
        if os.path.lexists(os.path.join(real, "physfn")) and not os.path.lexists(target / "physfn"):
            (target / "physfn").symlink_to(os.path.basename(os.readlink(os.path.join(real, "physfn"))))
        link = dest / "bus" / "pci" / "devices" / entry.name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(link):
            link.symlink_to(Path("..", "..", "..", "devices", rel))


def _copy_host(sys_root: Path, dest: Path) -> None:
    """The CPU and NUMA lists (agent.probes.host)."""
    src, dst = sys_root / "devices" / "system", dest / "devices" / "system"
    for folder, leaves in (("cpu", CPU_FILES), ("node", NODE_FILES)):
        for leaf in leaves:
            _copy_file(src / folder / leaf, dst / folder / leaf)


def _copy_file(src: Path, dst: Path) -> None:
    try:
        if not src.is_file():
            return
        data = src.read_bytes()
    except OSError:
        return  # unreadable sysfs attribute (write-only, EIO): leave it out
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
