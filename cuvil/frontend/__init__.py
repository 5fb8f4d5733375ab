"""Frontends: torch.export -> CIR and ONNX -> CIR."""
