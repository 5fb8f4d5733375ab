"""Translation validation and overflow probing over CIR (z3-backed)."""
