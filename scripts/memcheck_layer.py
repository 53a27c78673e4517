"""A linear layer's kernels under compute-sanitizer's memcheck, on the GPU: the layer (random
weights, seeded) is prepared here (measured, or loaded from --cache), then a second process
under `compute-sanitizer --tool memcheck` loads its kernels from the same cache and calls it at
each M of --ms, every access checked. Ms past max_tokens reach the last bucket's kernel, which
serves any M. Exit status: memcheck's (1 where it found an error), after its report.

    python scripts/memcheck_layer.py --shape 1000x1000 --dtype float8_e4m3fn --scales row \
        --edges 1 2 17 --max-tokens 64 --ms 1 2 16 17 64 65 300 --cache /tmp/layer-cache

torch's caching allocator is off in the checked process, so that each tensor is an allocation
of its own and a write past one is seen, not absorbed by a neighbour in the same pool.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import linear  # noqa: E402
from linear.buckets import buckets_from_edges  # noqa: E402

FP8 = torch.float8_e4m3fn


def layer(args) -> linear.Linear:
    """The layer args describe, its weights drawn from seed 0, on the GPU."""
    torch.manual_seed(0)
    n, k = (int(size) for size in args.shape.split("x"))
    options = {"buckets": buckets_from_edges(tuple(args.edges)), "max_tokens": args.max_tokens}
    if args.dtype == "float8_e4m3fn":
        weight = torch.randn(n, k, device="cuda").to(FP8)
        shape = linear.LayerShape(n, k, args.dtype, args.scales)
        scale = torch.rand(shape.weight_scale_shape(), device="cuda") + 0.5
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        return linear.Linear.from_float8(weight, scale, bias, scales=args.scales, **options)
    dense = torch.nn.Linear(k, n, device="cuda", dtype=getattr(torch, args.dtype))
    return linear.Linear.from_linear(dense, **options)


def call_each_m(model: linear.Linear, ms: list[int]) -> None:
    """The layer called once at each M, on random inputs (fp8: with scales of its form)."""
    for m in ms:
        x = torch.randn(m, model.in_features, device="cuda")
        with torch.no_grad():
            if model.is_fp8:
                scale = torch.rand(model.shape.x_scale_shape((m,)), device="cuda") + 0.5
                model(x.to(FP8), scale)
            else:
                model(x.to(model.weight.dtype))
        torch.cuda.synchronize()
        print(f"M = {m}: called", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", required=True, help="N x K of the weight, e.g. 1000x1000")
    parser.add_argument("--dtype", default="bfloat16",
                        choices=("bfloat16", "float16", "float8_e4m3fn"))
    parser.add_argument("--scales", default="tensor", choices=("tensor", "row", "block"))
    parser.add_argument("--edges", type=int, nargs="+", default=[1, 2, 17])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ms", type=int, nargs="+", required=True)
    parser.add_argument("--cache", required=True, help="the kernels' cache directory")
    parser.add_argument("--checked", action="store_true",
                        help="(the process under memcheck) load from the cache and call")
    args = parser.parse_args()
    model = layer(args)
    linear.prepare(model, cache=linear.Cache(args.cache), say=print)
    if args.checked:
        call_each_m(model, args.ms)
        return 0
    sanitizer = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1"]
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    return subprocess.run(sanitizer + [sys.executable, *sys.argv, "--checked"], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
