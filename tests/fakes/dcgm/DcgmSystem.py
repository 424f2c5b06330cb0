"""Our mirror of DCGM 4.6's DcgmSystem: discovery.GetEntityGroupEntities(entityGroupId, onlySupported),
discovery.GetGpuAttributes(gpuId)."""

from __future__ import annotations

from typing import Any

import dcgm_agent
import dcgm_structs


class DcgmSystemDiscovery:
    def __init__(self, dcgmHandle: Any) -> None:
        self._dcgmHandle = dcgmHandle

    def GetEntityGroupEntities(self, entityGroupId: int, onlySupported: bool) -> list[int]:
        flags = dcgm_structs.DCGM_GEGE_FLAG_ONLY_SUPPORTED if onlySupported else 0
        return dcgm_agent.dcgmGetEntityGroupEntities(self._dcgmHandle.handle, entityGroupId, flags)

    def GetGpuAttributes(self, gpuId: int) -> Any:
        return dcgm_agent.dcgmGetDeviceAttributes(self._dcgmHandle.handle, gpuId)


class DcgmSystem:
    def __init__(self, dcgmHandle: Any) -> None:
        self._dcgmHandle = dcgmHandle
        self.discovery = DcgmSystemDiscovery(dcgmHandle)
