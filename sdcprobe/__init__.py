"""The SDC probe: the same deterministic computation on every GPU of an idle node, outputs compared
bit for bit (docs/guides/odd-gpu-out.md, "sdc.peers").

Silent data corruption leaves no Xid and, in about 99 % of cases, no NaN: a GPU computes a wrong
number and goes on. The GPUs of one node are one model running one software stack, so given the
same inputs they must produce the same bytes; the one whose output differs from its siblings' is
the suspect. This package runs in its own image with a CUDA runtime (Dockerfile.sdcprobe), beside
the agent, whose image stays without CUDA: backend.py (the compute: torch on the GPUs, a pure
Python stand-in for the tests), probe.py (one run: attempt 1, an immediate attempt 2 on any
disagreement, a versioned JSON report), server.py (the node-local HTTP API the agent drives inside
its active-check window; each run a subprocess, killed on abort).
"""

REPORT_VERSION = 1  # the report's schema (agent/core/sdc_report.py reads it)
