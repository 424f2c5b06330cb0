"""The engine: tiers on their schedule, state kept across cycles (latches, hysteresis), the verdict."""
