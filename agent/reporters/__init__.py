"""Reporters turn the verdict into the Node contract (DESIGN.md §4), Events, metrics and logs."""
