"""Fake dcgm_agent: the heartbeat call."""

import fake_engine


def dcgmDiagSendHeartbeat(handle: object) -> None:
    fake_engine.heartbeats += 1
