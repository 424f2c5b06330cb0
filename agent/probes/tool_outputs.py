"""The tool outputs the inputs are parsed from, each named once: the command that prints it on a
live node (none: the live source reads it its own way), the file a snapshot keeps it in, and its
parser. The live source runs the command, `gpu-healthcheck snapshot` (probes/capture.py) writes its
output to the file, and the snapshot source parses the file with the same parser (probes/inputs.py
names each input's output); none of them spells a file name or a command itself
(tests/test_tool_outputs.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from agent.core.sdc_report import parse_sdc_report
from agent.probes.dcgm.diag_json import parse_dcgm_diag_json
from agent.probes.node_object import parse_node_json
from agent.probes.nvlink import parse_nvlink
from agent.probes.nvlink_errors import parse_nvlink_errors_json
from agent.probes.nvsmi_text import parse_nvsmi_text
from agent.probes.nvsmi_xml import parse_nvsmi_xml
from agent.probes.topo import parse_topo

T = TypeVar("T")


@dataclass(frozen=True)
class ToolOutput(Generic[T]):
    file: str  # the snapshot file that holds it
    parse: Callable[[str], T]
    argv: tuple[str, ...] = ()  # the command that prints it live; (): read live by a reader of its own
    failure_recorded: bool = True  # capture records the command's failure (errors.json, its problems)
    lost_lines_on_stderr: bool = False  # stderr names lost GPUs: kept with the text (nvsmi_errors)

    @property
    def source(self) -> str:
        """How a live read names it: the command that prints it, else the file."""
        return " ".join(self.argv) if self.argv else self.file


# nvidia-smi -q -x prints "Unable to determine the device handle for GPU…" (a lost GPU) on stderr:
# kept with the XML, the GPU is lost rather than missing from the document.
GPU_XML = ToolOutput(
    "nvidia-smi-q.xml", parse_nvsmi_xml, ("nvidia-smi", "-q", "-x"), lost_lines_on_stderr=True
)
TOPO = ToolOutput("nvidia-smi-topo-m.txt", parse_topo, ("nvidia-smi", "topo", "-m"))
NVLINK = ToolOutput("nvidia-smi-nvlink-s.txt", parse_nvlink, ("nvidia-smi", "nvlink", "-s"))
# The plain-text view too: it shows lost GPUs as text when the XML view cannot. Captured, never run
# live; its failure is the XML view's to tell.
GPU_TEXT = ToolOutput("nvidia-smi-q.txt", parse_nvsmi_text, ("nvidia-smi", "-q"), failure_recorded=False)
# Read live by readers of their own: NVML (our JSON of its counters), the API server, the DCGM tier.
NVLINK_ERRORS = ToolOutput("nvlink-errors.json", parse_nvlink_errors_json)
NODE = ToolOutput("node.json", parse_node_json)
DCGM_DIAG = ToolOutput("dcgm-diag.json", parse_dcgm_diag_json)
SDC = ToolOutput(
    "sdc-probe.json", parse_sdc_report
)  # the SDC probe's report (sdcprobe/), as its server returns it

# In the order capture runs the commands.
OUTPUTS: tuple[ToolOutput[Any], ...] = (GPU_XML, TOPO, NVLINK, GPU_TEXT, NVLINK_ERRORS, NODE, DCGM_DIAG)
COMMANDS: tuple[ToolOutput[Any], ...] = tuple(o for o in OUTPUTS if o.argv)
# The snapshot file that holds each tool's output, by the name the parsed data carries as `source`.
SNAPSHOT_FILES: dict[str, str] = {o.source: o.file for o in COMMANDS}
# errors.json names a command that failed by its file (capture records these commands' failures).
_RECORDED_COMMAND = {o.file: o.source for o in COMMANDS if o.failure_recorded}


def source_of(file: str) -> str:
    """How a probe error names where a snapshot file came from: the command that prints it, or the file."""
    return _RECORDED_COMMAND.get(file, file)
