"""Our mirror of DCGM 4.6's DcgmDiag: testNamesStr "1".."4" sets validate, entityIds defaults to
"*,cpu:*" (as dcgmi), timeout → timeoutSeconds, Execute → dcgmActionValidate_v2."""

from __future__ import annotations

from typing import Any

import dcgm_agent
import dcgm_structs


class DcgmDiag:
    def __init__(
        self,
        gpuIds: Any = None,
        cpuIds: Any = None,
        testNamesStr: str = "",
        paramsStr: str = "",
        ignoreErrorCodesStr: str = "",
        verbose: bool = True,
        version: int = dcgm_structs.dcgmRunDiag_version10,
        timeout: int = 0,
    ) -> None:
        if version != dcgm_structs.dcgmRunDiag_version10:
            raise ValueError(f"'{version}' is not a valid version for dcgmRunDiag.")
        self.version = version
        self.runDiagInfo = dcgm_structs.c_dcgmRunDiag_v10()
        self.runDiagInfo.flags = 0
        self.SetVerbose(verbose)
        if testNamesStr in ("", "1", "2", "3", "4"):
            self.runDiagInfo.validate = int(testNamesStr or "1")
        elif testNamesStr.isdigit():
            raise ValueError(f"'{testNamesStr}' is not a valid test name.")
        else:
            for i, name in enumerate(testNamesStr.split(",")):
                self.runDiagInfo.testNames[i].value = name.encode()
        self.runDiagInfo.timeoutSeconds = timeout
        self.runDiagInfo.groupId = dcgm_structs.DCGM_GROUP_NULL
        gpus = ",".join(str(g) for g in gpuIds or [])
        cpus = ",".join(f"cpu:{c}" for c in cpuIds or [])
        self.runDiagInfo.entityIds = (",".join(x for x in (gpus, cpus) if x) or "*,cpu:*").encode()
        self.runDiagInfo.ignoreErrorCodes = ignoreErrorCodesStr.encode()

    def SetVerbose(self, val: bool) -> None:
        if val:
            self.runDiagInfo.flags |= dcgm_structs.DCGM_RUN_FLAGS_VERBOSE
        else:
            self.runDiagInfo.flags &= ~dcgm_structs.DCGM_RUN_FLAGS_VERBOSE

    def SetEnableHeartbeat(self, val: bool) -> None:
        if val:
            self.runDiagInfo.flags |= dcgm_structs.DCGM_RUN_FLAGS_ENABLE_HEARTBEAT
        else:
            self.runDiagInfo.flags &= ~dcgm_structs.DCGM_RUN_FLAGS_ENABLE_HEARTBEAT

    def Execute(self, handle: Any) -> Any:
        return dcgm_agent.dcgmActionValidate_v2(handle, self.runDiagInfo, self.version)
