"""Degraded-mode policy synthesis and runtime guards."""
