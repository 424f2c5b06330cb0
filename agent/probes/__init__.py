"""Probes read the machine (or a node snapshot) and return typed data or a typed failure."""
