"""`dcgmi diag -r N -j` against a remote engine, for the quarantine Job (agent/cli/quarantine.py)."""

from __future__ import annotations

from agent.probes.command import CommandOutput, run_command


def run_dcgmi_diag(dcgmi: str, host: str, level: int, timeout_s: float) -> tuple[int, str]:
    """(exit status, stdout then stderr); (-1, why) when dcgmi could not run or did not finish (killed)."""
    out = run_command([dcgmi, "diag", "--host", host, "-r", str(level), "-j"], timeout_s)
    if not isinstance(out, CommandOutput):
        return -1, f"{out.source}: {out.message}"
    return out.returncode, out.stdout + (("\n" + out.stderr) if out.stderr.strip() else "")
