"""Fake dcgm_structs: the error classes and constants agent/probes/dcgm uses."""

DCGM_OPERATION_MODE_AUTO = 1
DCGM_GROUP_EMPTY = 1
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_TIMEOUT = -11
DCGM_ST_DIAG_ALREADY_RUNNING = -39


class DCGMError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            -21: "The connection to the host engine is not valid any longer",
            -39: "A diag instance is already running, cannot run a new diag until the current one finishes",
        }.get(self.value, f"DCGM error {self.value}")


class DCGMError_ConnectionNotValid(DCGMError):
    def __init__(self) -> None:
        super().__init__(DCGM_ST_CONNECTION_NOT_VALID)


def dcgmExceptionClass(code: int) -> type:
    return DCGMError_ConnectionNotValid if code == DCGM_ST_CONNECTION_NOT_VALID else DCGMError
