"""Our mirror of DCGM 4.6's dcgm_agent: thin ctypes calls into libdcgm.so.4, as DCGM's own module makes them
(no argtypes; handles and group ids are ctypes.c_void_p; str arguments sent as UTF-8 bytes)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from ctypes import byref, c_int, c_int32, c_uint32, c_void_p
from typing import Any

import dcgm_structs

dcgmFP = dcgm_structs._dcgmGetFunctionPointer


def ensure_byte_strings() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            args = tuple(a.encode() if isinstance(a, str) else a for a in args)
            kwargs = {k: v.encode() if isinstance(v, str) else v for k, v in kwargs.items()}
            return fn(*args, **kwargs)

        return wrapper

    return decorator


@ensure_byte_strings()
def dcgmInit() -> int:
    handle = c_void_p()
    return dcgm_structs._dcgmCheckReturn(dcgmFP("dcgmInit")(byref(handle)))  # a stray arg, as DCGM's


@ensure_byte_strings()
def dcgmShutdown() -> int:
    return dcgm_structs._dcgmCheckReturn(dcgmFP("dcgmShutdown")())


@ensure_byte_strings()
def dcgmConnect_v3(
    connection_string: bytes, connectParams: Any, version: int = dcgm_structs.c_dcgmConnectV3Params_version
) -> c_void_p:
    connectParams.version = version
    handle = c_void_p()
    ret = dcgmFP("dcgmConnect_v3")(connection_string, byref(connectParams), byref(handle))
    dcgm_structs._dcgmCheckReturn(ret)
    return handle


@ensure_byte_strings()
def dcgmDisconnect(dcgm_handle: Any) -> int:
    return dcgm_structs._dcgmCheckReturn(dcgmFP("dcgmDisconnect")(dcgm_handle))


@ensure_byte_strings()
def dcgmGetEntityGroupEntities(dcgm_handle: Any, entityGroup: int, flags: int) -> list[int]:
    capacity = dcgm_structs.DCGM_GROUP_MAX_ENTITIES_V2
    count = c_int32(capacity)
    ids = (c_uint32 * capacity)()
    ret = dcgmFP("dcgmGetEntityGroupEntities")(dcgm_handle, entityGroup, ids, byref(count), flags)
    dcgm_structs._dcgmCheckReturn(ret)
    return ids[0 : int(count.value)]


@ensure_byte_strings()
def dcgmGetDeviceAttributes(
    dcgm_handle: Any, gpuId: int, version: int = dcgm_structs.dcgmDeviceAttributes_version3
) -> Any:
    if version != dcgm_structs.dcgmDeviceAttributes_version3:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_VER_MISMATCH)
    attrs = dcgm_structs.c_dcgmDeviceAttributes_v3()
    attrs.version = dcgm_structs.dcgmDeviceAttributes_version3
    ret = dcgmFP("dcgmGetDeviceAttributes")(dcgm_handle, c_int(gpuId), byref(attrs))
    dcgm_structs._dcgmCheckReturn(ret)
    return attrs


@ensure_byte_strings()
def dcgmGroupCreate(dcgm_handle: Any, type: int, groupName: bytes) -> c_void_p:
    group_id = c_void_p()
    ret = dcgmFP("dcgmGroupCreate")(dcgm_handle, type, groupName, byref(group_id))
    dcgm_structs._dcgmCheckReturn(ret)
    return group_id


@ensure_byte_strings()
def dcgmGroupDestroy(dcgm_handle: Any, group_id: Any) -> int:
    return dcgm_structs._dcgmCheckReturn(dcgmFP("dcgmGroupDestroy")(dcgm_handle, group_id))


@ensure_byte_strings()
def dcgmGroupAddEntity(dcgm_handle: Any, group_id: Any, entityGroupId: int, entityId: int) -> int:
    ret = dcgmFP("dcgmGroupAddEntity")(dcgm_handle, group_id, entityGroupId, entityId)
    return dcgm_structs._dcgmCheckReturn(ret)


@ensure_byte_strings()
def dcgmHealthSet(dcgm_handle: Any, groupId: Any, systems: int) -> int:
    return dcgm_structs._dcgmCheckReturn(dcgmFP("dcgmHealthSet")(dcgm_handle, groupId, systems))


@ensure_byte_strings()
def dcgmHealthSet_v2(
    dcgm_handle: Any, groupId: Any, systems: int, updateInterval: int, maxKeepAge: float
) -> int:
    params = dcgm_structs.c_dcgmHealthSetParams_v2()
    params.version = dcgm_structs.dcgmHealthSetParams_version2
    params.groupId = groupId
    params.systems = systems
    params.updateInterval = updateInterval
    params.maxKeepAge = maxKeepAge
    return dcgm_structs._dcgmCheckReturn(dcgmFP("dcgmHealthSet_v2")(dcgm_handle, byref(params)))


@ensure_byte_strings()
def dcgmHealthCheck(
    dcgm_handle: Any, groupId: Any, version: int = dcgm_structs.dcgmHealthResponse_version5
) -> Any:
    if version != dcgm_structs.dcgmHealthResponse_version5:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_VER_MISMATCH)
    results = dcgm_structs.c_dcgmHealthResponse_v5()
    results.version = dcgm_structs.dcgmHealthResponse_version5
    dcgm_structs._dcgmCheckReturn(dcgmFP("dcgmHealthCheck")(dcgm_handle, groupId, byref(results)))
    return results


def helperDiagCheckReturn(ret: int, response: Any) -> Any:
    """A failed diag raises its DCGMError with the system errors of the response as additional info."""
    try:
        dcgm_structs._dcgmCheckReturn(ret)
    except dcgm_structs.DCGMError as e:
        n = min(int(response.numErrors), dcgm_structs.DCGM_DIAG_RESPONSE_ERRORS_MAX)
        info = ", ".join(
            err.msg.decode()
            for err in response.errors[:n]
            if err.testId == dcgm_structs.DCGM_DIAG_RESPONSE_SYSTEM_ERROR
        )
        if info:
            e.SetAdditionalInfo(info)
        raise
    return response


@ensure_byte_strings()
def dcgmActionValidate_v2(
    dcgm_handle: Any, runDiagInfo: Any, runDiagVersion: int = dcgm_structs.dcgmRunDiag_version10
) -> Any:
    response = dcgm_structs.c_dcgmDiagResponse_v12()
    response.version = dcgm_structs.dcgmDiagResponse_version12
    runDiagInfo.version = runDiagVersion
    ret = dcgmFP("dcgmActionValidate_v2")(dcgm_handle, byref(runDiagInfo), byref(response))
    return helperDiagCheckReturn(ret, response)


@ensure_byte_strings()
def dcgmDiagSendHeartbeat(dcgmHandle: Any) -> int:
    return dcgm_structs._dcgmCheckReturn(dcgmFP("dcgmDiagSendHeartbeat")(dcgmHandle))
