"""The host's CPUs and NUMA nodes (sysfs cpu/node)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostInfo:
    """/sys/devices/system/{cpu,node} lists, as sorted ids; None: the file was not there."""

    cpus_online: tuple[int, ...] | None = None
    cpus_present: tuple[int, ...] | None = None
    cpus_possible: tuple[int, ...] | None = None
    numa_online: tuple[int, ...] | None = None
    numa_with_cpu: tuple[int, ...] | None = None  # has_cpu: GH200's GPU memory nodes have none
