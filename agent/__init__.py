"""gpu-healthcheck: a node agent that finds broken GPUs and GPU-network adapters."""

__version__ = "0.3.0"
