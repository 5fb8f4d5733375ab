"""GPU code generation: PTX from the compute rules (``ptx``) and the CUDA artifact (``artifact``)."""
