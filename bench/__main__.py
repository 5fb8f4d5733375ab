"""``python -m bench``: Cuvil, ONNX Runtime and PyTorch eager side by side on the model zoo."""

from __future__ import annotations

import sys

from bench.harness import main

if __name__ == "__main__":
    sys.exit(main())
