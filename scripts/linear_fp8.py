"""fp8 linear layers (linear.Linear.from_float8) against torch._scaled_mm, per bucket of M, on
the GPU: each layer's kernels are tuned (or loaded from the cache) for each scale form, then at
every bucket's first and last M the layer's call and _scaled_mm's on the same inputs are
checked against float64 and timed (block scales: torch's block-scaled layer, _scaled_mm's
block form where cuBLAS takes K, else x and W dequantized to bfloat16 then F.linear).

    python scripts/linear_fp8.py --shape 4096x4096 --shape 14336x4096 --out $OUT/linear-fp8.json
    python scripts/linear_fp8.py --shape 4096x4096 --fast-accum   # the layers' fast_accum form
    python scripts/linear_fp8.py --shape 4096x4096 --edges 1,2,3,8,9,16,17  # buckets of one M

Timed as the portfolio times (tuning.measure.time_kernel: the median of launches, each after an
L2 flush, so that the CPU's call cost is not counted); `loop_us` adds the call cost: back-to-back
eager calls of the same M. The baselines: _scaled_mm's default (its sums promoted into float32,
the precision of v8's default for fp8: the fair one) and its use_fast_accum=True form (the fair
one for --fast-accum, whose layers keep their sums in the tensor cores' accumulator; block
scales have no fast form).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import linear  # noqa: E402
from linear.buckets import DEFAULT_EDGES  # noqa: E402
from linear.candidates import torch_layer  # noqa: E402
from linear.module import DEFAULT_MAX_TOKENS  # noqa: E402
from linear.portfolio import dequantized  # noqa: E402
from schedules import parse_shape  # noqa: E402
from schedules.errors import ExplorerError, UsageError  # noqa: E402
from tuning import loader, measure  # noqa: E402

SCALES = ("tensor", "row", "block")
FP8 = torch.float8_e4m3fn


def operands(shape: linear.LayerShape, m: int) -> dict:
    """Standard-normal e4m3 x (m x K) and weight (N x K), their float32 scales in the form the
    layer's shape says (uniform in measure.FP8_SCALE_RANGE), and a bfloat16 bias."""
    low, high = measure.FP8_SCALE_RANGE

    def scale(size):
        return torch.rand(size, device="cuda") * (high - low) + low

    n, k = shape.out_features, shape.in_features
    return {"x": torch.randn(m, k, device="cuda").to(FP8),
            "x_scale": scale(shape.x_scale_shape((m,))),
            "weight": torch.randn(n, k, device="cuda").to(FP8),
            "weight_scale": scale(shape.weight_scale_shape()),
            "bias": torch.randn(n, device="cuda", dtype=torch.bfloat16)}


def loop_us(fn, calls: int = 200) -> float:
    """GPU+CPU microseconds per call of back-to-back eager calls (events around the loop)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls * 1000


def compare_at(layer, ops: dict) -> dict:
    """The layer's call and torch's (_scaled_mm's two forms; block scales: its one) at one M:
    relative error against float64, kernel time (us, L2 flushed) and back-to-back call time
    (us); for a torch form that cuBLAS refuses, what it raised."""
    x, x_scale, w, w_scale, bias = (ops[k] for k in ("x", "x_scale", "weight", "weight_scale",
                                                     "bias"))
    shape = layer.shape
    reference = dequantized(shape, x, x_scale) @ dequantized(shape, w, w_scale, True).T \
        + bias.double()
    precise = torch_layer(dataclasses.replace(shape, fast_accum=False))
    calls = {"ours": lambda: layer(x, x_scale),
             "scaled_mm": lambda: precise(x, x_scale, w, w_scale, bias)}
    if not shape.block_scaled:
        fast = torch_layer(dataclasses.replace(shape, fast_accum=True))
        calls["scaled_mm_fast"] = lambda: fast(x, x_scale, w, w_scale, bias)
    found = {}
    for name, call in calls.items():
        try:
            error = measure.relative_error(call(), reference)
        except RuntimeError as e:  # cuBLAS refuses some forms (CUBLAS_STATUS_NOT_SUPPORTED)
            if name == "ours":
                raise
            found[name] = {"raised": str(e).splitlines()[0]}
            continue
        kernel_us = measure.time_kernel(call, "read").median_ms * 1000
        found[name] = {"error": error, "kernel_us": kernel_us, "loop_us": loop_us(call)}
    return found


def said(label: str, bucket: str, m: int, rung: str, found: dict, baseline: str) -> str:
    """One printed row: our kernel's time, the baseline's and their ratio, the back-to-back
    call times and both errors (or what the baseline raised)."""
    ours, base = found["ours"], found[baseline]
    head = f"{label:>44} {bucket:>11} M={m:<5} {rung:>5}: {ours['kernel_us']:8.1f} us, {baseline}"
    if "raised" in base:
        return f"{head} raised {base['raised'][:120]}; loop {ours['loop_us']:.1f} us; error " \
            f"{ours['error']:.2e}"
    return (f"{head} {base['kernel_us']:8.1f} us ({base['kernel_us'] / ours['kernel_us']:5.2f}x); "
            f"loop {ours['loop_us']:.1f} vs {base['loop_us']:.1f} us; error "
            f"{ours['error']:.2e} vs {base['error']:.2e}")


def measure_layer(shape: linear.LayerShape, max_tokens: int, buckets: tuple) -> list[dict]:
    """One layer shape and scale form: prepared for `buckets`, then compared at every bucket's
    edges with torch's call of the same precision, named `baseline` (fast or not)."""
    torch.manual_seed(0)
    first = operands(shape, 1)
    layer = linear.Linear.from_float8(first["weight"], first["weight_scale"], first["bias"],
                                      max_tokens=max_tokens, fast_accum=shape.fast_accum,
                                      scales=shape.scales, buckets=buckets)
    baseline = "scaled_mm_fast" if shape.fast_accum else "scaled_mm"
    linear.prepare(layer, say=print)
    rows = []
    for bucket, kernel in zip(layer.buckets, layer.kernels.kernels):
        for m in sorted({bucket.first, bucket.most(max_tokens)}):
            ops = {**first, **{key: value for key, value in operands(shape, m).items()
                               if key.startswith("x")}}
            with torch.no_grad():
                found = compare_at(layer, ops)
            rows.append({"layer": layer.shape.label(), "bucket": bucket.label(), "M": m,
                         "kernel": kernel.candidate.name, "baseline": baseline, **found})
            print(said(layer.shape.label(), bucket.label(), m, kernel.candidate.rung, found,
                       baseline), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", required=True,
                        help="a layer's weight, out_features x in_features (repeatable)")
    parser.add_argument("--scales", choices=SCALES, action="append",
                        help="the scale forms to measure (repeatable; default all, block "
                             "scales left out with --fast-accum)")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--edges", default=",".join(map(str, DEFAULT_EDGES)),
                        help="the buckets' first Ms, comma-separated (default %(default)s)")
    parser.add_argument("--fast-accum", action="store_true",
                        help="layers with fast_accum=True, against _scaled_mm's fast form")
    parser.add_argument("--out", help="a JSON file for the rows")
    args = parser.parse_args()
    forms = args.scales or [s for s in SCALES if not (args.fast_accum and s == "block")]
    try:  # bad arguments (checked before the GPU), or what a layer refuses (max_tokens, rows
        # past int32 indices): one line
        shapes = [linear.LayerShape(*parse_shape(text, "gemv"), "float8_e4m3fn", scales,
                                    fast_accum=args.fast_accum)
                  for text in args.shape for scales in forms]
        buckets = linear.buckets_from_text(args.edges)
        if loader.gpu_here() is None:
            raise UsageError("needs a CUDA GPU, and torch sees none here")
        rows = [row for shape in shapes for row in measure_layer(shape, args.max_tokens,
                                                                 buckets)]
    except ExplorerError as e:
        print(f"linear_fp8: {e}", file=sys.stderr)
        return 2
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), **loader.versions_here(),
                       "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                       "timing": measure.timing_method("read"), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
