"""Our mirror of DCGM 4.6's DcgmHandle: connect with dcgmConnect_v3 ("tcp://" + ipAddress or
"unix://" + unixSocketPath); no address at all would start an embedded engine (refused here: the agent
must never start one). Every handle is kept in the class list, as DCGM's bindings do."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, ClassVar

import dcgm_agent
import dcgm_structs
import pydcgm


class DcgmHandle:
    handleLock = threading.Lock()
    handles: ClassVar[list[DcgmHandle]] = []

    def __init__(
        self,
        handle: Any = None,
        ipAddress: str | None = None,
        opMode: int = dcgm_structs.DCGM_OPERATION_MODE_AUTO,
        persistAfterDisconnect: bool = False,
        unixSocketPath: str | None = None,
        timeoutMs: int = 0,
        decoratorHandle: Any = None,
    ) -> None:
        self._handleCreated = False
        if handle is not None:
            self.handle = handle
            return
        if ipAddress is not None and unixSocketPath is not None:
            raise dcgm_structs.DCGMError(dcgm_structs.DCGM_ST_BADPARAM)
        dcgm_structs._dcgmInit()
        dcgm_agent.dcgmInit()
        if ipAddress is None and unixSocketPath is None:
            raise AssertionError("fake: an embedded engine was requested (the agent must never start one)")
        params = dcgm_structs.c_dcgmConnectV3Params_v1()
        params.version = dcgm_structs.c_dcgmConnectV3Params_version
        params.timeoutMs = timeoutMs
        params.persistAfterDisconnect = 1 if persistAfterDisconnect else 0
        address = "tcp://" + ipAddress if ipAddress is not None else "unix://" + str(unixSocketPath)
        self.handle = dcgm_agent.dcgmConnect_v3(address, params)
        self.isEmbedded = False
        self._handleCreated = True
        with DcgmHandle.handleLock:
            DcgmHandle.handles.append(self)

    def __del__(self) -> None:
        if self._handleCreated:
            self.Shutdown()

    def GetSystem(self) -> Any:
        return pydcgm.DcgmSystem(self)

    def FromDecorator(self) -> bool:
        return False

    def Shutdown(self) -> None:
        if not self._handleCreated:
            return
        with contextlib.suppress(AttributeError):  # at interpreter exit, as DCGM's
            dcgm_agent.dcgmDisconnect(self.handle)
        self._handleCreated = False
        self.handle = None
