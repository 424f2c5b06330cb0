"""A real etcd + kube-apiserver for the test suite, the way controller authors use envtest.

See tools/kube-bins/README.md. Fixtures live in tests/kubeenv/fixtures.py.
"""

from .binaries import KubeBinaries, KubeUnavailable, ensure_binaries, find_binaries
from .env import KubectlError, KubeEnv, unique_name
from .server import ControlPlane, ControlPlaneError

__all__ = [
    "ControlPlane",
    "ControlPlaneError",
    "KubeBinaries",
    "KubeEnv",
    "KubeUnavailable",
    "KubectlError",
    "ensure_binaries",
    "find_binaries",
    "unique_name",
]
