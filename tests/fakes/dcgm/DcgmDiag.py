"""Fake DcgmDiag: Execute answers from fake_engine.diag_doc, may block (diag_hold) or fail (diag_error)."""

from __future__ import annotations

from typing import Any

import dcgm_structs
import fake_engine


class DcgmDiag:
    def __init__(
        self,
        gpuIds: Any = None,
        testNamesStr: str = "",
        paramsStr: str = "",
        verbose: bool = True,
        version: int = 0,
        timeout: int = 0,
    ) -> None:
        self.args = {"testNamesStr": testNamesStr, "timeout": timeout, "heartbeat": False}

    def SetEnableHeartbeat(self, enable: bool) -> None:
        self.args["heartbeat"] = enable

    def Execute(self, handle: int) -> Any:
        fake_engine.diag_calls.append(dict(self.args))
        if not fake_engine.up or not fake_engine.connection_alive(handle):
            raise dcgm_structs.DCGMError_ConnectionNotValid()
        if fake_engine.diag_hold.is_set():
            fake_engine.diag_release.wait(30)
        if fake_engine.diag_error is not None:
            raise dcgm_structs.DCGMError(fake_engine.diag_error)
        return fake_engine.diag_response()
