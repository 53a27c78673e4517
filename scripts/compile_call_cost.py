#!/usr/bin/env python3
"""What one layer call costs, eager and under torch.compile, on the GPU: F.linear against
linear.Linear running one of our kernels, and the floor a Python operator sets.

    python scripts/compile_call_cost.py --shape 16x4096x4096 --json $OUT/call-cost.json

Each subject is called --calls times back to back on one x (no synchronizing between calls,
as a model's layers run), in each mode it takes: eager, torch.compile's default mode and, for
the two layers, reduce-overhead (CUDA graphs). Per call: `cpu_us`, the loop on the CPU until
its last call returned (perf_counter, the GPU idle when it began); `wall_us`, until the GPU
had finished it too; `event_us`, CUDA events around the loop. Each is the median of --rounds.
The subjects, all bias-free:
- F.linear: nn.Linear, as stock PyTorch runs it (compiled, inductor calls cuBLAS itself);
- Linear: linear.Linear sharing its weight, M's bucket made to run one of our kernels (--kernel,
  by default the bucket's first TVM candidate: v8's heuristic choice; at M = 1 a GEMV rung),
  built here; compiled, it is the operator torch.ops.tvm_explorer.linear;
- operator: that operator called directly as compiled graphs call it (x checked at tracing:
  check=False), uncompiled: the dispatcher, the layer's Python and the kernel;
- kernel: the bucket's run called directly (its output allocated, the TVM function called);
- no-op op: an operator of the same schema defined as ours is (torch.library.Library), whose
  CUDA kernel returns a tensor allocated beforehand: the dispatcher-to-Python floor;
- no-op custom_op: the same through torch.library.custom_op;
- 8 F.linear, 8 Linear: eight such layers (each its own module, the same weight) called on x in
  one forward, as a model's layers are compiled together: times per layer (the time of a call
  over 8), where a compiled module's own cost per call (its guards, its frame) is shared.
Compiled, our layer's operator is lowered to a call into inductor's buffer (linear/inductor.py)
where this torch's inductor allows; the last line says so, or why not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from facts import check_writable  # noqa: E402
import linear  # noqa: E402
from linear import inductor  # noqa: E402
from linear.buckets import BucketTable, buckets_from_edges  # noqa: E402
from linear.candidates import (  # noqa: E402
    LAYER_DTYPES, TORCH, Candidate, LayerShape, build_candidate, candidates, launcher)
from linear.module import _linear_fake  # noqa: E402  the fake our operator registers
from linear.portfolio import BucketKernel, LayerKernels  # noqa: E402
from schedules import ExplorerError, Workload, parse_shape  # noqa: E402
from schedules.errors import KernelFailed, UsageError  # noqa: E402
from tuning import loader, measure  # noqa: E402

ALL_MODES = ("eager", "default", "reduce-overhead")
STACKED = 8  # layers in the stacked subjects
WARMUP = 50
_LIBRARY = torch.library.Library("call_cost_probe", "DEF")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line's arguments (argparse refuses a malformed one)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="16x4096x4096",
                        help="MxNxK: x is M x K, the weight N x K")
    parser.add_argument("--dtype", default="bfloat16", help=" or ".join(LAYER_DTYPES))
    parser.add_argument("--calls", type=int, default=2000, help="calls in one timed loop")
    parser.add_argument("--rounds", type=int, default=3, help="timed loops per subject and mode")
    parser.add_argument("--kernel", help="the candidate our layer runs, by name (default: the "
                                         "bucket's first TVM candidate)")
    parser.add_argument("--json", help="a file for the rows and the run's facts")
    return parser.parse_args(argv)


def checked(args: argparse.Namespace) -> tuple[LayerShape, int, Candidate]:
    """The layer, its M and the candidate the arguments ask for; ExplorerError (one line) for
    anything else, before any GPU work."""
    # the Workload refuses dimensions (their count too) and dtypes before the shape is unpacked
    m, n, k = Workload("gemm", parse_shape(args.shape, "gemm"), args.dtype, None, "nt").shape
    if args.dtype not in LAYER_DTYPES:
        raise UsageError(f"linear layers take {' or '.join(LAYER_DTYPES)}, not {args.dtype}")
    if args.calls < 1 or args.rounds < 1:
        raise UsageError(f"--calls and --rounds are at least 1, not {args.calls} and "
                         f"{args.rounds}")
    if args.json:
        check_writable(args.json, "--json")  # not after the whole GPU run
    layer = LayerShape(n, k, args.dtype)
    ours = [c for c in candidates(layer, _buckets(m)[-1], m) if c.built]
    chosen = [c for c in ours if args.kernel in (None, c.name)]
    if not chosen:
        raise UsageError(f"no candidate {args.kernel or 'of ours'} for {layer.label()} at "
                         f"M = {m}; its candidates: {', '.join(c.name for c in ours)}")
    return layer, m, chosen[0]


def _buckets(m: int) -> tuple:
    """A bucket from M on (its most rows M, as max_tokens = M makes it) and, below M, one that
    runs torch's F.linear."""
    return buckets_from_edges((1, m) if m > 1 else (1,))


def forced_layer(stock: torch.nn.Linear, m: int, candidate: Candidate) -> linear.Linear:
    """A Linear sharing `stock`'s weight whose bucket of M runs `candidate`, built here."""
    buckets = _buckets(m)
    layer = linear.Linear.from_linear(stock, buckets=buckets, max_tokens=m)
    arch = "sm_" + loader.gpu_here()["compute_capability"].replace(".", "")
    function = build_candidate(layer.shape, buckets[-1], candidate, m, arch)["main"]
    torch_kernel = BucketKernel(Candidate(TORCH), launcher(Candidate(TORCH), layer.shape, None),
                                "torch")
    ours = BucketKernel(candidate, launcher(candidate, layer.shape, function), "built here")
    layer.kernels = LayerKernels(layer.shape, BucketTable(buckets),
                                 [torch_kernel, ours][-len(buckets):])
    return layer


def noop_ops(out: torch.Tensor) -> tuple:
    """Two operators of our operator's schema whose CUDA kernels return `out`: one defined as
    ours is (torch.library.Library), one through torch.library.custom_op."""
    _LIBRARY.define("noop(Tensor x, Tensor weight, Tensor? bias, int layer, bool check=True) "
                    "-> Tensor")
    _LIBRARY.impl("noop", lambda x, weight, bias, layer, check=True: out, "CUDA")
    torch.library.register_fake("call_cost_probe::noop", _linear_fake, lib=_LIBRARY)

    @torch.library.custom_op("call_cost_probe::noop_custom", mutates_args=(), device_types="cuda")
    def noop_custom(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    layer: int, check: bool = True) -> torch.Tensor:
        return out

    noop_custom.register_fake(_linear_fake)
    return torch.ops.call_cost_probe.noop.default, noop_custom


class Calls(torch.nn.Module):
    """An operator of our schema as a layer, called as compiled graphs call ours:
    forward(x) = op(x, weight, None, 0, False)."""

    def __init__(self, op, weight: torch.nn.Parameter):
        super().__init__()
        self.op, self.weight = op, weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, self.weight, None, 0, False)


class Stack(torch.nn.Module):
    """Layers called on the same x in one forward, their outputs returned together."""

    def __init__(self, layers: list):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> tuple:
        return tuple(layer(x) for layer in self.layers)


def stacked(stock: torch.nn.Linear, ours: linear.Linear) -> tuple[Stack, Stack]:
    """STACKED copies of the stock layer and of ours (each its own module, sharing the weight;
    ours sharing the kernels too)."""
    copies = [linear.Linear.from_linear(stock, buckets=ours.buckets, max_tokens=ours.max_tokens)
              for _ in range(STACKED)]
    for copy in copies:
        copy.kernels = ours.kernels
    return Stack([copy_stock(stock) for _ in range(STACKED)]), Stack(copies)


def copy_stock(stock: torch.nn.Linear) -> torch.nn.Linear:
    """An nn.Linear of its own sharing `stock`'s weight."""
    layer = torch.nn.Linear(stock.in_features, stock.out_features, bias=False, device="meta")
    layer.weight = stock.weight
    return layer


def subjects(stock: torch.nn.Linear, ours: linear.Linear, m: int) -> dict:
    """name -> (what is called on x, the modes it is timed in, the layers it calls)."""
    out = torch.empty((m, stock.out_features), device="cuda", dtype=stock.weight.dtype)
    noop, noop_custom = noop_ops(out)
    run = ours.kernels.for_rows(m).run
    stock_stack, our_stack = stacked(stock, ours)
    return {"F.linear": (stock, ALL_MODES, 1), "Linear": (ours, ALL_MODES, 1),
            "operator": (lambda x: torch.ops.tvm_explorer.linear.default(
                x, ours.weight, None, ours._key, False), ("eager",), 1),
            "kernel": (lambda x: run(x, ours.weight, None), ("eager",), 1),
            "no-op op": (Calls(noop, stock.weight), ALL_MODES[:2], 1),
            "no-op custom_op": (Calls(noop_custom, stock.weight), ALL_MODES[:2], 1),
            f"{STACKED} F.linear": (stock_stack, ALL_MODES, STACKED),
            f"{STACKED} Linear": (our_stack, ALL_MODES, STACKED)}


def loop_us(fn, x: torch.Tensor, calls: int) -> dict:
    """Per call of `calls` back-to-back calls of fn(x), after warm-up: CPU time until the last
    call returned, wall time until the GPU finished, and the CUDA events' time."""
    for _ in range(WARMUP):
        fn(x)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn(x)
    end.record()
    issued = time.perf_counter()
    end.synchronize()
    done = time.perf_counter()
    return {"cpu_us": (issued - begin) * 1e6 / calls, "wall_us": (done - begin) * 1e6 / calls,
            "event_us": start.elapsed_time(end) * 1e3 / calls}


def measured(name: str, fn, mode: str, x: torch.Tensor, calls: int, rounds: int,
             layers: int) -> dict:
    """One subject in one mode, per layer of the `layers` it calls: each time's median over the
    rounds (all rounds kept), or the error that stopped it, so that one subject that fails
    leaves the others their rows."""
    row = {"subject": name, "mode": mode}
    try:
        run = fn if mode == "eager" else torch.compile(fn, mode=mode)
        found = [{key: us / layers for key, us in loop_us(run, x, calls).items()}
                 for _ in range(rounds)]
    except Exception as e:  # noqa: BLE001  reported in its row
        said = next(iter(str(e).strip().splitlines()), "")  # an exception may say nothing
        return {**row, "error": type(e).__name__ + (f": {said[:200]}" if said else "")}
    return {**row, **{key: statistics.median(r[key] for r in found) for key in found[0]},
            "rounds": found}


HEADER = f"{'subject':16} {'mode':16} {'cpu_us':>8} {'wall_us':>8} {'event_us':>8}"


def line(row: dict) -> str:
    """A row of the table under HEADER: its times, or its error."""
    times = row.get("error") or " ".join(f"{row[key]:8.2f}"
                                         for key in ("cpu_us", "wall_us", "event_us"))
    return f"{row['subject']:16} {row['mode']:16} {times}"


def run_all(layer: LayerShape, m: int, candidate: Candidate, calls: int, rounds: int) -> dict:
    """Build our layer, check it against F.linear, then time every subject in its modes,
    printing each row as it is measured. BuildFailed where the kernel does not build,
    KernelFailed where its error against F.linear is over the layer's tolerance."""
    torch.manual_seed(0)
    dtype = getattr(torch, layer.dtype)
    stock = torch.nn.Linear(layer.in_features, layer.out_features, bias=False, device="cuda",
                            dtype=dtype).requires_grad_(False)
    ours = forced_layer(stock, m, candidate)
    x = torch.randn(m, layer.in_features, device="cuda", dtype=dtype)
    with torch.no_grad():
        want = stock(x).float()
        error = float((ours(x).float() - want).norm() / want.norm())
        allowed = measure.tolerance(layer.gemm(m))  # the portfolio's check's
        if not error <= allowed:  # NaN too
            raise KernelFailed(f"{candidate.name} is wrong for {m}x{layer.out_features}x"
                               f"{layer.in_features} {layer.dtype}: relative error {error:.3g} "
                               f"against F.linear, over {allowed:g}; nothing timed")
        print(f"{m}x{layer.out_features}x{layer.in_features} {layer.dtype} on "
              f"{torch.cuda.get_device_name()}: ours {candidate.name} (relative error "
              f"{error:.2e} against F.linear), {calls} calls a loop, median of {rounds} loops; "
              f"times per layer\n" + HEADER, flush=True)
        called = subjects(stock, ours, m)
        rows = []
        for mode in ALL_MODES:
            torch._dynamo.reset()
            for name, (fn, modes, layers) in called.items():
                if mode in modes:
                    rows.append(measured(name, fn, mode, x, calls, rounds, layers))
                    print(line(rows[-1]), flush=True)
    return {"shape": f"{m}x{layer.out_features}x{layer.in_features}", "dtype": layer.dtype,
            "kernel": candidate.name, "error_vs_f_linear": error, "calls": calls,
            "rounds": rounds, "lowered": lowering_said(), "rows": rows}


def lowering_said() -> str:
    """Whether inductor lowered our operator to a call into its buffer (after a compile)."""
    return "the operator lowered to a call into inductor's buffer" if not inductor.unavailable \
        else f"the operator not lowered ({inductor.unavailable})"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        layer, m, candidate = checked(args)
        if loader.gpu_here() is None:
            print("compile_call_cost.py times calls: it needs a CUDA GPU, and there is none here",
                  file=sys.stderr)
            return 1
        found = run_all(layer, m, candidate, args.calls, args.rounds)
        print(found["lowered"])
    except ExplorerError as e:  # bad input (2), or a kernel that did not build or is wrong (1)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       **loader.versions_here(), "date": time.strftime("%Y-%m-%d"), **found},
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
