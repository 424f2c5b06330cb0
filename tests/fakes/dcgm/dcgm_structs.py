"""Our mirror of DCGM 4.6's dcgm_structs module surface (written for these tests, not NVIDIA's code).

What the project's paths touch, with DCGM's behaviour: libdcgm.so.4 is looked for in each
LD_LIBRARY_PATH entry when the first DcgmHandle is built (not at import), DCGMError(code) returns
the per-code subclass (DCGMError_ConnectionNotValid, ...) with `.value`, str() from a table or
dcgmErrorString, `: 'info'` appended by SetAdditionalInfo; the structs are ctypes Structures with
DCGM's layouts, so sizeof() gives the version words of the C headers.
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_int32,
    c_int64,
    c_ubyte,
    c_uint,
    c_uint32,
    c_ushort,
    c_void_p,
    sizeof,
)
from typing import Any, ClassVar

DCGM_MAX_STR_LENGTH = 256
DCGM_OPERATION_MODE_AUTO = 1
DCGM_OPERATION_MODE_MANUAL = 2
DCGM_GROUP_DEFAULT, DCGM_GROUP_EMPTY = 0, 1
DCGM_GROUP_ALL_GPUS, DCGM_GROUP_ALL_NVSWITCHES, DCGM_GROUP_NULL = 0x7FFFFFFF, 0x7FFFFFFE, 0x7FFFFFFA
DCGM_GROUP_MAX_ENTITIES_V2 = 1024
DCGM_GEGE_FLAG_ONLY_SUPPORTED = 0x00000001
DCGM_ERR_MSG_LEN = 512

# every DCGM_ST_* the mirror maps to a subclass (dcgm_structs.py 4.6 values)
DCGM_ST_OK = 0
DCGM_ST_BADPARAM = -1
DCGM_ST_GENERIC_ERROR = -3
DCGM_ST_MEMORY = -4
DCGM_ST_NOT_CONFIGURED = -5
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_INIT_ERROR = -7
DCGM_ST_NVML_ERROR = -8
DCGM_ST_PENDING = -9
DCGM_ST_UNINITIALIZED = -10
DCGM_ST_TIMEOUT = -11
DCGM_ST_VER_MISMATCH = -12
DCGM_ST_UNKNOWN_FIELD = -13
DCGM_ST_NO_DATA = -14
DCGM_ST_NOT_WATCHED = -16
DCGM_ST_NO_PERMISSION = -17
DCGM_ST_GPU_IS_LOST = -18
DCGM_ST_RESET_REQUIRED = -19
DCGM_ST_FUNCTION_NOT_FOUND = -20
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_GPU_NOT_SUPPORTED = -22
DCGM_ST_MAX_LIMIT = -24
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_ST_REQUIRES_ROOT = -29
DCGM_ST_NVVS_ERROR = -30
DCGM_ST_INSUFFICIENT_SIZE = -31
DCGM_ST_MODULE_NOT_LOADED = -33
DCGM_ST_IN_USE = -34
DCGM_ST_GROUP_IS_EMPTY = -35
DCGM_ST_DIAG_ALREADY_RUNNING = -39
DCGM_ST_NVVS_ISOLATE_ERROR = -51
DCGM_ST_NVVS_KILLED = -53
DCGM_ST_PAUSED = -54
DCGM_ST_NVML_DRIVER_TIMEOUT = -57
DCGM_ST_DIAG_STOPPED = -66
DCGM_ST_GPUS_DETACHED = -67

DCGM_HEALTH_WATCH_PCIE = 0x1
DCGM_HEALTH_WATCH_NVLINK = 0x2
DCGM_HEALTH_WATCH_MEM = 0x10
DCGM_HEALTH_WATCH_THERMAL = 0x80
DCGM_HEALTH_WATCH_ALL = 0xFFFFFFFF
DCGM_HEALTH_RESULT_PASS, DCGM_HEALTH_RESULT_WARN, DCGM_HEALTH_RESULT_FAIL = 0, 10, 20
DCGM_DIAG_RESULT_PASS, DCGM_DIAG_RESULT_SKIP, DCGM_DIAG_RESULT_WARN = 0, 1, 2
DCGM_DIAG_RESULT_FAIL, DCGM_DIAG_RESULT_NOT_RUN = 3, 4
DCGM_RUN_FLAGS_VERBOSE = 0x0001
DCGM_RUN_FLAGS_ENABLE_HEARTBEAT = 0x0020
DCGM_DIAG_RESPONSE_SYSTEM_ERROR = 0x80  # dcgmvalue.DCGM_INT8_BLANK

# ---------------------------------------------------------------------------------------- errors

_MESSAGES = {
    DCGM_ST_OK: "Success",
    DCGM_ST_BADPARAM: "Bad parameter passed to function",
    DCGM_ST_GENERIC_ERROR: "Generic unspecified error",
    DCGM_ST_NOT_CONFIGURED: "Setting not configured",
    DCGM_ST_NOT_SUPPORTED: "Feature not supported",
    DCGM_ST_NVML_ERROR: "NVML error",
    DCGM_ST_TIMEOUT: "Timeout",
    DCGM_ST_VER_MISMATCH: "API version mismatch",
    DCGM_ST_UNKNOWN_FIELD: "Unknown field",
    DCGM_ST_CONNECTION_NOT_VALID: "The connection to the host engine is not valid any longer",
    DCGM_ST_MAX_LIMIT: "Max limit reached for the object",
    DCGM_ST_LIBRARY_NOT_FOUND: "DCGM library could not be found",
    DCGM_ST_INSUFFICIENT_SIZE: "An input argument is not large enough",
    DCGM_ST_DIAG_ALREADY_RUNNING: (
        "A diag instance is already running, cannot run a new diag until the current one finishes"
    ),
    DCGM_ST_NVVS_ISOLATE_ERROR: "The diagnostic returned an error that indicates the need for isolation",
    DCGM_ST_DIAG_STOPPED: "The DCGM Diagnostic was stopped",
}


class DCGMError(Exception):
    """DCGMError(code) is an instance of the code's own subclass, as in DCGM's bindings."""

    _valClassMapping: ClassVar[dict[int, type[DCGMError]]] = {}
    value: int
    info: Any

    def __new__(cls, value: int = DCGM_ST_GENERIC_ERROR) -> DCGMError:
        if cls is DCGMError:
            cls = DCGMError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value, obj.info = value, None
        return obj

    def __init__(self, *_args: Any) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        try:
            if self.value not in _MESSAGES:
                _MESSAGES[self.value] = _dcgmErrorString(self.value).decode()
            msg = _MESSAGES[self.value]
        except BaseException:
            msg = f"DCGM Error with code {self.value}"
        if self.info is not None:
            msg = msg.rstrip(".") + f": '{self.info}'"
        return msg

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DCGMError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def SetAdditionalInfo(self, msg: Any) -> None:
        self.info = msg


def _class_name(const: str) -> str:
    return "DCGMError_" + "".join(p.capitalize() for p in const[len("DCGM_ST_") :].split("_"))


for _name, _code in list(globals().items()):
    if _name.startswith("DCGM_ST_") and isinstance(_code, int) and _code != 0:

        def _new(cls: type[DCGMError], _v: int = _code) -> DCGMError:
            return DCGMError.__new__(cls, _v)

        _cls = type(_class_name(_name), (DCGMError,), {"__new__": _new})
        _cls.__module__ = __name__
        globals()[_cls.__name__] = _cls
        DCGMError._valClassMapping[_code] = _cls


def dcgmExceptionClass(error_code: int) -> type[DCGMError] | None:
    return DCGMError._valClassMapping.get(error_code)


# ---------------------------------------------------------------------------------------- library

dcgmLib: Any = None
libLoadLock = threading.Lock()


def _LoadDcgmLibrary(libDcgmPath: str | None = None) -> None:
    """Load libdcgm.so.4 from libDcgmPath, then each LD_LIBRARY_PATH entry, then the system dirs."""
    global dcgmLib
    with libLoadLock:
        if dcgmLib is not None:
            return
        paths = [os.path.join(libDcgmPath, "libdcgm.so.4")] if libDcgmPath else []
        paths += [f"{p}/libdcgm.so.4" for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
        paths += [f"/usr/lib/{os.uname().machine}-linux-gnu/libdcgm.so.4", "/usr/lib64/libdcgm.so.4"]
        for path in paths:
            if os.path.isfile(path):
                try:
                    dcgmLib = ctypes.CDLL(path)
                    break
                except OSError:
                    continue
    if dcgmLib is None:
        raise DCGMError(DCGM_ST_LIBRARY_NOT_FOUND)


def _dcgmInit(libDcgmPath: str | None = None) -> None:
    _LoadDcgmLibrary(libDcgmPath)


def _dcgmGetFunctionPointer(name: str) -> Any:
    if dcgmLib is None:
        raise DCGMError(DCGM_ST_UNINITIALIZED)
    try:
        return getattr(dcgmLib, name)
    except AttributeError:
        raise DCGMError(DCGM_ST_FUNCTION_NOT_FOUND) from None


def _dcgmCheckReturn(ret: int) -> int:
    if ret != DCGM_ST_OK:
        raise DCGMError(ret)
    return ret


def _dcgmErrorString(result: int) -> bytes:
    fn = _dcgmGetFunctionPointer("dcgmErrorString")
    fn.restype = c_char_p
    return fn(result)  # type: ignore[no-any-return]


def make_dcgm_version(struct: Any, ver: int) -> int:
    return sizeof(struct) | (ver << 24)


# ---------------------------------------------------------------------------------------- structs


class c_dcgmConnectV3Params_v1(Structure):
    _fields_ = [("version", c_uint), ("persistAfterDisconnect", c_uint), ("timeoutMs", c_uint)]


c_dcgmConnectV3Params_version1 = make_dcgm_version(c_dcgmConnectV3Params_v1, 1)
c_dcgmConnectV3Params_version = c_dcgmConnectV3Params_version1


class c_dcgmGroupEntityPair_t(Structure):
    _fields_ = [("entityGroupId", c_uint32), ("entityId", c_uint32)]


class c_dcgmHealthSetParams_v2(Structure):
    _fields_ = [
        ("version", c_uint32),
        ("groupId", c_void_p),
        ("systems", c_uint32),
        ("updateInterval", c_int64),
        ("maxKeepAge", c_double),
    ]


dcgmHealthSetParams_version2 = make_dcgm_version(c_dcgmHealthSetParams_v2, 2)


DCGM_MAX_CLOCKS = 256


class c_dcgmClockSet_v1(Structure):
    _fields_ = [("version", c_uint), ("memClock", c_uint), ("smClock", c_uint)]


class c_dcgmDeviceSupportedClockSets_v1(Structure):
    _fields_ = [("version", c_uint), ("count", c_uint), ("clockSet", c_dcgmClockSet_v1 * DCGM_MAX_CLOCKS)]


class c_dcgmDeviceThermals_v1(Structure):
    _fields_ = [("version", c_uint), ("slowdownTemp", c_uint), ("shutdownTemp", c_uint)]


class c_dcgmDevicePowerLimits_v1(Structure):
    _fields_ = [
        ("version", c_uint),
        ("curPowerLimit", c_uint),
        ("defaultPowerLimit", c_uint),
        ("enforcedPowerLimit", c_uint),
        ("minPowerLimit", c_uint),
        ("maxPowerLimit", c_uint),
    ]


class c_dcgmDeviceIdentifiers_v1(Structure):
    _fields_ = [
        ("version", c_uint),
        ("brandName", c_char * DCGM_MAX_STR_LENGTH),
        ("deviceName", c_char * DCGM_MAX_STR_LENGTH),
        ("pciBusId", c_char * DCGM_MAX_STR_LENGTH),
        ("serial", c_char * DCGM_MAX_STR_LENGTH),
        ("uuid", c_char * DCGM_MAX_STR_LENGTH),
        ("vbios", c_char * DCGM_MAX_STR_LENGTH),
        ("inforomImageVersion", c_char * DCGM_MAX_STR_LENGTH),
        ("pciDeviceId", c_uint32),
        ("pciSubSystemId", c_uint32),
        ("driverVersion", c_char * DCGM_MAX_STR_LENGTH),
        ("virtualizationMode", c_uint32),
    ]


class c_dcgmDeviceMemoryUsage_v1(Structure):
    _fields_ = [
        ("version", c_uint),
        ("bar1Total", c_uint),
        ("fbTotal", c_uint),
        ("fbUsed", c_uint),
        ("fbFree", c_uint),
    ]


class c_dcgmDeviceSettings_v2(Structure):
    _fields_ = [
        ("version", c_uint),
        ("persistenceModeEnabled", c_uint),
        ("migModeEnabled", c_uint),
        ("confidentialComputeMode", c_uint),
    ]


class c_dcgmDeviceAttributes_v3(Structure):
    _fields_ = [
        ("version", c_uint),
        ("clockSets", c_dcgmDeviceSupportedClockSets_v1),
        ("thermalSettings", c_dcgmDeviceThermals_v1),
        ("powerLimits", c_dcgmDevicePowerLimits_v1),
        ("identifiers", c_dcgmDeviceIdentifiers_v1),
        ("memoryUsage", c_dcgmDeviceMemoryUsage_v1),
        ("settings", c_dcgmDeviceSettings_v2),
    ]


dcgmDeviceAttributes_version3 = make_dcgm_version(c_dcgmDeviceAttributes_v3, 3)


class c_dcgmDiagErrorDetail_t(Structure):
    _fields_ = [("msg", c_char * 1024), ("code", c_uint)]


class c_dcgmIncidentInfo_t(Structure):
    _fields_ = [
        ("system", c_uint),
        ("health", c_uint32),
        ("error", c_dcgmDiagErrorDetail_t),
        ("entityInfo", c_dcgmGroupEntityPair_t),
    ]


class c_dcgmHealthResponse_v5(Structure):
    _fields_ = [
        ("version", c_uint32),
        ("overallHealth", c_uint32),
        ("incidentCount", c_uint32),
        ("incidents", c_dcgmIncidentInfo_t * DCGM_GROUP_MAX_ENTITIES_V2),
    ]


dcgmHealthResponse_version5 = make_dcgm_version(c_dcgmHealthResponse_v5, 5)


class c_dcgmDiagTestAuxData_v1(Structure):
    _fields_ = [("version", c_uint), ("data", c_char * 2048)]


class c_dcgmDiagTestRun_v2(Structure):
    _fields_ = [
        ("name", c_char * 32),
        ("pluginName", c_char * 32),
        ("result", c_uint),
        ("numErrors", c_ubyte),
        ("numInfo", c_ubyte),
        ("categoryIndex", c_ubyte),
        ("_unused", c_ubyte),
        ("numResults", c_ushort),
        ("errorIndices", c_ubyte * 32),
        ("infoIndices", c_ubyte * 128),
        ("resultIndices", c_ushort * 1024),
        ("auxData", c_dcgmDiagTestAuxData_v1),
    ]


class c_dcgmDiagEntity_v1(Structure):
    _fields_ = [
        ("entity", c_dcgmGroupEntityPair_t),
        ("serialNum", c_char * DCGM_MAX_STR_LENGTH),
        ("skuDeviceId", c_char * 5),
    ]


class c_dcgmDiagError_v1(Structure):
    _fields_ = [
        ("entity", c_dcgmGroupEntityPair_t),
        ("code", c_uint),
        ("category", c_uint),
        ("severity", c_uint),
        ("msg", c_char * DCGM_ERR_MSG_LEN),
        ("testId", c_uint),
    ]


class c_dcgmDiagInfo_v1(Structure):
    _fields_ = [("entity", c_dcgmGroupEntityPair_t), ("msg", c_char * DCGM_ERR_MSG_LEN), ("testId", c_uint)]


class c_dcgmDiagEntityResult_v1(Structure):
    _fields_ = [("entity", c_dcgmGroupEntityPair_t), ("result", c_int32), ("testId", c_uint)]


DCGM_DIAG_RESPONSE_TESTS_MAX = 20
DCGM_DIAG_RESPONSE_ERRORS_MAX = 32
DCGM_DIAG_RESPONSE_INFO_MAX_V2 = 128
DCGM_DIAG_RESPONSE_RESULTS_MAX = 20 * 1024
DCGM_DIAG_RESPONSE_CATEGORIES_MAX, DCGM_DIAG_RESPONSE_CATEGORY_LEN = 5, 20


class c_dcgmDiagResponse_v12(Structure):
    _fields_ = [
        ("version", c_uint),
        ("numTests", c_ubyte),
        ("numErrors", c_ubyte),
        ("numInfo", c_ubyte),
        ("numCategories", c_ubyte),
        ("numEntities", c_ushort),
        ("numResults", c_ushort),
        ("tests", c_dcgmDiagTestRun_v2 * DCGM_DIAG_RESPONSE_TESTS_MAX),
        ("entities", c_dcgmDiagEntity_v1 * DCGM_GROUP_MAX_ENTITIES_V2),
        ("errors", c_dcgmDiagError_v1 * DCGM_DIAG_RESPONSE_ERRORS_MAX),
        ("info", c_dcgmDiagInfo_v1 * DCGM_DIAG_RESPONSE_INFO_MAX_V2),
        ("results", c_dcgmDiagEntityResult_v1 * DCGM_DIAG_RESPONSE_RESULTS_MAX),
        ("categories", (c_char * DCGM_DIAG_RESPONSE_CATEGORY_LEN) * DCGM_DIAG_RESPONSE_CATEGORIES_MAX),
        ("dcgmVersion", c_char * 12),
        ("dcgmDriverVersion", c_char * DCGM_MAX_STR_LENGTH),
        ("_unused", c_char * 621952),
    ]


dcgmDiagResponse_version12 = make_dcgm_version(c_dcgmDiagResponse_v12, 12)
dcgmDiagResponse_version11 = (dcgmDiagResponse_version12 & 0xFFFFFF) | (11 << 24)  # v11 has v12's size


class c_dcgmRunDiag_v10(Structure):
    _fields_ = [
        ("version", c_uint),
        ("flags", c_uint),
        ("debugLevel", c_uint),
        ("groupId", c_void_p),
        ("validate", c_uint),
        ("testNames", c_char * 50 * 20),
        ("testParms", c_char * 1050 * 100),
        ("fakeGpuList", c_char * 50),
        ("debugLogFile", c_char * 128),
        ("statsPath", c_char * 128),
        ("configFileContents", c_char * 10000),
        ("clocksEventMask", c_char * 50),
        ("pluginPath", c_char * 128),
        ("currentIterations", c_uint),
        ("totalIterations", c_uint),
        ("timeoutSeconds", c_uint),
        ("_unusedBuf", c_char * 128),
        ("failCheckInterval", c_uint),
        ("expectedNumEntities", c_char * 50),
        ("entityIds", c_char * 2048),
        ("watchFrequency", c_uint),
        ("ignoreErrorCodes", c_char * 512),
    ]


dcgmRunDiag_version10 = make_dcgm_version(c_dcgmRunDiag_v10, 10)
dcgmRunDiag_version = dcgmRunDiag_version10
