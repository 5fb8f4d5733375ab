"""Run the zoo's CUDA modules on a GPU: ``python -m bench.cuda_check`` (``bench/device_check.sh``).

For each zoo model: compile for ``cuda``, run it on GPU 0 (kernel by kernel, then as one captured
CUDA graph), compare both with the reference interpreter, and time it against PyTorch CUDA eager
(medians of interleaved calls, host-to-host: inputs copied in and outputs copied back each call, as
a caller of the library sees it). Prints one row per model; exits 1 if any output disagrees.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import cuvil
from bench.models import ZOO, agreement
from cuvil.runtime import load


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def check(name: str, repeat: int) -> tuple[bool, str]:
    zm = ZOO[name]
    proto = zm.to_onnx()
    inputs = zm.example_inputs_numpy()
    want = cuvil.run_reference(cuvil.import_model(proto), inputs)
    compiled = cuvil.compile(proto, target="cuda", cache=False)
    assert compiled.library_path is not None
    ok = True
    parts = []
    for graph in (False, True):
        model = load(compiled.library_path, cuda_graph=graph)
        got = model.run(inputs)
        worst = max(agreement(g, w).relative for g, w in zip(got, want, strict=True))
        ok = ok and all(agreement(g, w).within(rtol=1e-4, min_cosine=0.99999) for g, w in zip(got, want, strict=True))
        parts.append(f"{'graph' if graph else 'kernels'} max rel {worst:.2g}")
    cuvil_ms = _median_ms(lambda: model.run(inputs), repeat)
    torch_ms = float("nan")
    if zm.has_torch_reference:
        import torch

        net = zm.build().cuda().eval()
        ins = [torch.from_numpy(a) for a in inputs]

        def eager() -> None:
            with torch.no_grad():
                out = net(*[t.cuda() for t in ins])
            for t in torch.utils._pytree.tree_leaves(out):
                t.cpu()

        eager()
        torch_ms = _median_ms(eager, repeat)
    return ok, (f"{name:<16} {'ok ' if ok else 'BAD'} {', '.join(parts)}; cuvil {cuvil_ms:.3f} ms, "
                f"torch eager {torch_ms:.3f} ms, ratio {cuvil_ms / torch_ms:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    all_ok = True
    for name in args.models.split(","):
        ok, line = check(name, args.repeat)
        all_ok = all_ok and ok
        print(line, flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
