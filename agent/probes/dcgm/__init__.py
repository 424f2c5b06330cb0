"""DCGM through the shared nv-hostengine: bindings, client, health watches, diagnostics."""
