"""Fake pydcgm: DcgmHandle (connects to fake_engine), DcgmSystem discovery, DcgmGroup with health."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace as NS
from typing import Any

import dcgm_structs
import fake_engine


def _alive(generation: int) -> None:
    if not fake_engine.up or generation != fake_engine.generation:
        raise dcgm_structs.DCGMError_ConnectionNotValid()


class DcgmHandle:
    def __init__(
        self,
        handle: Any = None,
        ipAddress: Any = None,
        opMode: int = 1,
        persistAfterDisconnect: bool = False,
        unixSocketPath: Any = None,
        timeoutMs: int = 0,
    ) -> None:
        if ipAddress is None and unixSocketPath is None:
            raise AssertionError("fake: an embedded engine was requested (the agent must never start one)")
        fake_engine.connects.append(
            {"ipAddress": ipAddress, "timeoutMs": timeoutMs, "persistAfterDisconnect": persistAfterDisconnect}
        )
        if not fake_engine.up:
            raise dcgm_structs.DCGMError_ConnectionNotValid()
        self.generation = fake_engine.generation
        fake_engine.next_conn += 1
        self.conn = fake_engine.next_conn
        fake_engine.conns[self.conn] = self.generation
        self.handle = ctypes.c_void_p(self.conn)  # the real bindings' handle is a c_void_p, not an int
        self.closed = False

    def GetSystem(self) -> Any:
        _alive(self.generation)
        gen = self.generation

        def entities(group: int, onlySupported: bool = True) -> list[int]:
            _alive(gen)
            return list(fake_engine.gpus if group == 1 else fake_engine.switches if group == 3 else [])

        return NS(discovery=NS(GetEntityGroupEntities=entities))

    def Shutdown(self) -> None:
        self.closed = True
        fake_engine.disconnect(self.conn)  # the engine frees the groups of a closed connection


class _Health:
    def __init__(self, group: DcgmGroup) -> None:
        self.group = group

    def Set(self, mask: int, updateInterval: int = 0, maxKeepAge: float = 0.0) -> None:
        _alive(self.group.generation)
        fake_engine.health_sets.append((mask, updateInterval, maxKeepAge))

    def Check(self) -> Any:
        _alive(self.group.generation)
        if fake_engine.health_error is not None:
            raise dcgm_structs.DCGMError(fake_engine.health_error)
        mine = [i for i in fake_engine.incidents if (i["group"], i["id"]) in self.group.entities]
        incs = [
            NS(
                system=i["system"],
                health=i["health"],
                error=NS(code=i["code"], msg=i["msg"].encode()),
                entityInfo=NS(entityGroupId=i["group"], entityId=i["id"]),
            )
            for i in mine
        ]
        return NS(
            overallHealth=max((i["health"] for i in mine), default=0),
            incidentCount=len(incs),
            incidents=incs + [NS()] * 4,
        )  # unused array slots, as in the fixed-size C array


class DcgmGroup:
    def __init__(
        self, dcgmHandle: DcgmHandle, groupId: Any = None, groupName: Any = None, groupType: int = 1
    ) -> None:
        _alive(dcgmHandle.generation)
        self.generation = dcgmHandle.generation
        self.entities: list[tuple[int, int]] = []
        self.health = _Health(self)
        self._groupId = fake_engine.group_create(dcgmHandle.conn)

    def Delete(self) -> None:
        _alive(self.generation)
        fake_engine.group_destroy(self._groupId)

    def AddEntity(self, entityGroupId: int, entityId: int) -> None:
        _alive(self.generation)
        self.entities.append((entityGroupId, entityId))
