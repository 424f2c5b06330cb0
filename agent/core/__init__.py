"""Core types every layer speaks: severity, findings, the probed data, the Node contract. No I/O."""
