"""Is NVIDIA's DRA driver installed in this cluster? Its DeviceClass `gpu.nvidia.com` exists: the
driver's Helm chart (deviceclass-gpu.yaml) and the GPU Operator's GPUCluster (state-dra-driver)
create it. The validating taint's wait for the driver asks it (engine/driver_wait.py): one GET per
validation, only on a Node without `nvidia.com/gpu`; never in steady state.
"""

from __future__ import annotations

import logging
from typing import Any

from agent.core.device_scope import DRIVER
from agent.reporters.kube_rest import KubeRest, api_status, describe_error

log = logging.getLogger(__name__)

DEVICE_CLASS = f"/apis/resource.k8s.io/v1/deviceclasses/{DRIVER}"
REQUEST_TIMEOUT = (5, 10)  # not kube_rest's (5, 30): one small object, asked again at the next validation


class DriverClass:
    """The reader engine/driver_wait.py calls: True (the DeviceClass exists), False (404: not
    installed, or no resource.k8s.io/v1 served: no DRA at all), or why it could not be read."""

    def __init__(self, rest: Any) -> None:
        self.rest = KubeRest.of(rest)
        self.reads = 0  # GETs sent (tests read it: one per validation)

    def __call__(self) -> bool | str:
        self.reads += 1
        try:
            self.rest.json("GET", DEVICE_CLASS, timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            if api_status(exc) == 404:
                return False
            why = f"could not read DeviceClass {DRIVER}: {describe_error(exc)}"
            log.warning(why)
            return why
        return True


__all__ = ["DEVICE_CLASS", "DriverClass"]
