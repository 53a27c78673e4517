"""The README's example, measured on a GPU: a small float16 model at one token (a decode step),
its last nn.Linear replaced by an exported GEMV kernel; both models checked against float64 and
timed, into a markdown report and a JSON file beside it.

    python3 scripts/export_example.py --report reports/h100-export.md   # + reports/h100-export.json

The kernel is exported with `runner.py --export` (which checks and times it, into kernel.json)
into a scratch directory and loaded back by the export's own load.py, as another project would.
Timing is tuning/measure.py's harness (CUDA events around each call, an L2 flush queued before
each, median): the layer alone, the model's forward called eagerly, and the forward replayed
from a CUDA graph, each with nn.Linear (cuBLAS) and with the exported kernel.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import runpy
import sys
import tempfile
from datetime import datetime, timezone

import torch
from tabulate import tabulate
from torch import nn

import runner
from schedules import Workload
from tuning import measure


class ExportedLinear(nn.Module):
    """y = x W^T for one token (x: 1 x K), through an exported GEMV kernel: y = B x, B = W."""

    def __init__(self, linear: nn.Linear, kernel):
        super().__init__()
        self.weight, self.kernel = linear.weight.detach(), kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(self.weight, x.view(-1)).view(1, -1)


def small_model(features: int) -> nn.Sequential:
    """Two float16 layers of `features` without bias, an activation between them."""
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(features, features, bias=False), nn.SiLU(),
                           nn.Linear(features, features, bias=False))
    return layers.to("cuda", torch.float16).eval()


def described(features: int) -> str:
    """`small_model` in words, for the report."""
    linear = f"Linear({features}, {features}, bias=False)"
    return f"nn.Sequential({linear}, SiLU(), {linear}) in float16, at one token (1 x {features})"


def export_and_load(features: int, schedule: str, scratch: str):
    """`runner.py --export` of the layer's GEMV, then the export's own load.py: the kernel, and
    the command that exported it."""
    flags = ["--op", "gemv", "--shape", f"{features}x{features}", "--dtype", "float16",
             "--schedule", schedule]
    directory = os.path.join(scratch, "kernel")
    if runner.main(flags + ["--export", directory,
                            "--results", os.path.join(scratch, "results.jsonl")]) != 0:
        sys.exit("the export failed; see the line above")
    kernel = runpy.run_path(os.path.join(directory, "load.py"))["load"]()
    return kernel, f"python runner.py {' '.join(flags)} --export DIR"


def graphed(module: nn.Module, x: torch.Tensor):
    """`module(x)` captured in a CUDA graph after a warm-up on a side stream: its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            module(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        module(x)
    return graph.replay


def timings(model: nn.Module, fast: nn.Module, x: torch.Tensor) -> list[dict]:
    """Each way of calling the layer and the model, timed with nn.Linear and with the kernel."""
    hidden = model[1](model[0](x))
    ways = [("the layer alone (eager)", lambda m: (lambda: m[2](hidden))),
            ("the model's forward (eager)", lambda m: (lambda: m(x))),
            ("the model's forward (CUDA graph replay)", lambda m: graphed(m, x))]
    rows = []
    for what, call in ways:
        linear, kernel = (measure.time_kernel(call(m)).median_ms for m in (model, fast))
        rows.append({"what": what, "nn.Linear (cuBLAS) ms": linear, "exported kernel ms": kernel,
                     "saved ms": linear - kernel, "saved %": 100 * (linear - kernel) / linear})
    return rows


def check(model: nn.Module, fast: nn.Module, x: torch.Tensor, wl: Workload) -> dict:
    """Both models against the model in float64, and against each other."""
    exact = copy.deepcopy(model).double()(x.double())
    linear, kernel = model(x), fast(x)
    errors = {"nn.Linear": measure.relative_error(linear, exact),
              "exported kernel": measure.relative_error(kernel, exact)}
    close = torch.allclose(kernel, linear, rtol=1e-2, atol=1e-2)  # the README's assert_close
    return {"rel_error_vs_float64": errors, "tolerance": measure.tolerance(wl),
            "max_abs_difference": float((linear.float() - kernel.float()).abs().max()),
            "allclose": close,
            "match": close and all(e <= measure.tolerance(wl) for e in errors.values())}


def markdown(result: dict) -> str:
    """The report: where, what, the check and the table of times."""
    facts, kernel, checked = result["device"], result["kernel"], result["check"]
    errors = checked["rel_error_vs_float64"]
    return "\n".join([
        "# An exported kernel in a PyTorch model (issue 24)", "",
        f"- GPU: **{facts['gpu']}**, driver {facts['driver']}; TVM {kernel['tvm']}, torch "
        f"{facts['torch']} (CUDA {facts['cuda']}); {result['date']}",
        f"- Kernel: `{result['export_command']}`: {kernel['schedule']} "
        f"({', '.join(f'{k}={v}' for k, v in kernel['knobs'].items())}), {kernel['time_ms']:.4f} "
        f"ms in its kernel.json ({kernel['measured']})",
        f"- Model: {result['model']}; its last Linear replaced by the README's `ExportedLinear`",
        f"- Check: relative error against the model in float64: nn.Linear "
        f"{errors['nn.Linear']:.3g}, exported kernel {errors['exported kernel']:.3g} "
        f"(tolerance {checked['tolerance']:g}); "
        f"largest difference between the two outputs {checked['max_abs_difference']:.3g} "
        f"(the README's assert_close with rtol = atol = 1e-2: "
        f"{'passes' if checked['allclose'] else 'FAILS'}); "
        f"outputs match: {'yes' if checked['match'] else 'NO'}",
        f"- Timing: {measure.timing_method('read')}", "",
        tabulate(result["timings"], headers="keys", tablefmt="github",
                 floatfmt=("", ".4f", ".4f", ".4f", ".1f")), ""])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="The README's export example, measured on a GPU: "
                                "a markdown report and a JSON file beside it.")
    p.add_argument("--report", default="reports/h100-export.md", help="the markdown to write")
    p.add_argument("--features", type=int, default=4096, help="the layers' width (4096)")
    p.add_argument("--schedule", default="blockreduce", help="the GEMV schedule to export")
    args = p.parse_args(argv)
    wl = Workload("gemv", (args.features, args.features), "float16")
    with tempfile.TemporaryDirectory() as scratch, torch.no_grad():
        kernel, command = export_and_load(args.features, args.schedule, scratch)
        model = small_model(args.features)
        fast = copy.deepcopy(model)
        fast[2] = ExportedLinear(model[2], kernel)
        x = torch.randn(1, args.features, device="cuda", dtype=torch.float16)
        result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "device": measure.device_facts(), "kernel": kernel.manifest,
                  "export_command": command, "model": described(args.features),
                  "check": check(model, fast, x, wl), "timings": timings(model, fast, x),
                  "timing_method": measure.timing_method("read")}
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    with open(os.path.splitext(args.report)[0] + ".json", "w") as f:
        json.dump(result, f, indent=2)
    with open(args.report, "w") as f:
        f.write(markdown(result))
    print(markdown(result))
    return 0 if result["check"]["match"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
