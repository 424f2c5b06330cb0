"""Our mirror of DCGM 4.6's DcgmGroup: a named group is created on the engine (dcgmGroupCreate) and lives
there until Delete() (dcgmGroupDestroy) or until its connection closes; there is no __del__."""

from __future__ import annotations

from typing import Any

import dcgm_agent
import dcgm_structs
import pydcgm


class DcgmGroupHealth:
    def __init__(self, dcgmHandle: Any, groupId: Any, dcgmGroup: Any) -> None:
        self._dcgmHandle, self._groupId, self._dcgmGroup = dcgmHandle, groupId, dcgmGroup

    def Set(self, systems: int, updateInterval: int | None = None, maxKeepAge: float | None = None) -> None:
        if updateInterval is None or maxKeepAge is None:
            ret = dcgm_agent.dcgmHealthSet(self._dcgmHandle.handle, self._groupId, systems)
        else:
            ret = dcgm_agent.dcgmHealthSet_v2(
                self._dcgmHandle.handle, self._groupId, systems, updateInterval, maxKeepAge
            )
        dcgm_structs._dcgmCheckReturn(ret)

    def Check(self, version: int = dcgm_structs.dcgmHealthResponse_version5) -> Any:
        return dcgm_agent.dcgmHealthCheck(self._dcgmHandle.handle, self._groupId, version)


class DcgmGroup:
    def __init__(
        self,
        dcgmHandle: Any,
        groupId: Any = None,
        groupName: str | None = None,
        groupType: int = dcgm_structs.DCGM_GROUP_EMPTY,
    ) -> None:
        self._dcgmHandle = dcgmHandle
        if groupId is None and groupName is None:
            raise pydcgm.DcgmException("Either groupId or groupName is required")
        self._groupId = (
            groupId
            if groupId is not None
            else dcgm_agent.dcgmGroupCreate(dcgmHandle.handle, groupType, groupName)
        )
        self.name = groupName
        self.health: Any = DcgmGroupHealth(dcgmHandle, self._groupId, self)

    def _IsGroupIdStatic(self) -> bool:
        gid = getattr(self._groupId, "value", self._groupId)
        return gid in (dcgm_structs.DCGM_GROUP_ALL_GPUS, dcgm_structs.DCGM_GROUP_ALL_NVSWITCHES)

    def Delete(self) -> None:
        self.health = None
        if self._groupId is not None and not self._IsGroupIdStatic():
            ret = dcgm_agent.dcgmGroupDestroy(self._dcgmHandle.handle, self._groupId)
            dcgm_structs._dcgmCheckReturn(ret)
        self._groupId = None

    def AddEntity(self, entityGroupId: int, entityId: int) -> None:
        if self._IsGroupIdStatic():
            raise pydcgm.DcgmException("Can't add an entity to a static group")
        ret = dcgm_agent.dcgmGroupAddEntity(self._dcgmHandle.handle, self._groupId, entityGroupId, entityId)
        dcgm_structs._dcgmCheckReturn(ret)

    def GetId(self) -> Any:
        return self._groupId
