"""LoRA adapter loading, constraint checks and verified merge."""
