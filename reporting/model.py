"""The model report: a Llama-architecture decoder with linear.Linear against stock nn.Linear,
rendered from the JSON files of scripts/linear_model.py runs (never a live run).

    python -m reporting.model reports/h100-model.md model-1b.json model-8b-layers.json

It opens with each model's step times and speed-up, then the call costs, then per layer shape
and bucket the kernel the portfolio chose and how the best TVM candidate stood against torch's.
"""

from __future__ import annotations

import json
import math
import sys

from reporting.render import markdown_table


def _step_name(row: dict) -> str:
    if row["step"] == "prefill":
        return f"prefill {row['tokens']} tokens"
    return f"decode, batch {row['batch']}"


def step_rows(result: dict) -> list[dict]:
    """One row per timed step: times, speed-up over stock, tokens/s, and the logits' agreement."""
    rows = []
    for row in result["steps"]:
        tokens = row["batch"] * row["tokens"]
        rows.append({"step": _step_name(row), "stock ms": f"{row['stock_ms']:.3f}",
                     "ours ms": f"{row['ours_ms']:.3f}",
                     "speed-up": f"{row['stock_ms'] / row['ours_ms']:.3f}x",
                     "ours tokens/s": f"{tokens / row['ours_ms'] * 1000:,.0f}",
                     "logits vs stock": f"{row['logits_rel_diff']:.2g}",
                     "same top-1": f"{row['top1_agreement'] * 100:.1f}%"})
    return rows


def cost_rows(result: dict) -> list[dict]:
    """Per-call cost of one layer: eager CPU microseconds per call, and microseconds per call
    in a back-to-back loop, eager, compiled and in a CUDA graph."""
    rows = []
    for cost in result["call_cost"]:
        def pair(field: str) -> str:
            values = cost[field]
            return f"{values['ours']:.1f} / {values['stock']:.1f}"
        rows.append({"layer": cost["shape"], "ours runs": cost["kernel"].split(":")[0],
                     "eager CPU us": pair("eager_cpu_us"),
                     "eager loop us": pair("eager_loop_us"),
                     "compiled us": pair("compiled_default_loop_us"),
                     "reduce-overhead us": pair("compiled_reduce-overhead_loop_us"),
                     "CUDA graph us": pair("graph_replay_us")})
    return rows


def _best(measured: dict, built: bool) -> tuple[str, dict] | None:
    """The fastest correct candidate among TVM's (built) or torch's, by the sum of its times."""
    found = [(name, r["times_ms"]) for name, r in measured.items()
             if r["status"] == "ok" and (name != "torch") == built]
    return min(found, key=lambda item: sum(item[1].values()), default=None)


def portfolio_rows(result: dict) -> list[dict]:
    """Per layer shape and bucket: the chosen kernel, and the best TVM candidate's time as a %
    of torch's (torch / TVM x 100, the geometric mean over the bucket's probe Ms)."""
    rows = []
    for entry in result["portfolio"]:
        tvm, torch = _best(entry["measured"], True), _best(entry["measured"], False)
        share = "-"
        if tvm and torch:
            ratios = [torch[1][m] / tvm[1][m] for m in tvm[1]]
            share = f"{math.exp(sum(map(math.log, ratios)) / len(ratios)) * 100:.0f}%"
        failed = sum(r["status"] != "ok" for r in entry["measured"].values())
        rows.append({"layer": entry["layer"], "bucket": entry["bucket"],
                     "chosen": entry["chosen"].split(":")[0],
                     "best TVM candidate": tvm[0].split(":")[0] if tvm else "-",
                     "its % of torch": share, "candidates": len(entry["measured"]),
                     "failed": failed})
    return rows


def knob_rows(result: dict) -> list[dict]:
    """The knobs of each chosen TVM kernel (appendix)."""
    return [{"layer": e["layer"], "bucket": e["bucket"], "kernel": e["chosen"]}
            for e in result["portfolio"] if e["chosen"] != "torch"]


def _load(measured: dict) -> str:
    """A fresh process's load of the kernels, in words."""
    if "prepare_s" not in measured:
        return f"failed ({measured['error']})"
    return (f"{measured['prepare_s']:.3f} s in linear.prepare ({measured['process_s']:.1f} s "
            "for the whole process, imports included)")


def _headline(results: list[dict]) -> list[str]:
    lines = ["| model | step | stock ms | ours ms | speed-up |", "|---|---|---|---|---|"]
    for result in results:
        for row in result["steps"]:
            lines.append(f"| {result['config']} | {_step_name(row)} | {row['stock_ms']:.3f} | "
                         f"{row['ours_ms']:.3f} | {row['stock_ms'] / row['ours_ms']:.3f}x |")
    return lines


def render(results: list[dict], notes: str | None = None) -> str:
    """The report's markdown."""
    first = results[0]
    out = ["# Linear layers in a model: linear.Linear against nn.Linear", "",
           f"{first['gpu']}, torch {first['torch']}, TVM {first['tvm']}, tvm-ffi "
           f"{first['tvm_ffi']}, {first['date']}. Timing: {first['timing']}.", ""]
    out += _headline(results) + [""]
    if notes:
        out += [notes.strip(), ""]
    for result in results:
        model = result["model"]
        out += [f"## {result['config']}: hidden {model['hidden_size']}, intermediate "
                f"{model['intermediate_size']}, {model['num_hidden_layers']} layers, vocabulary "
                f"{model['vocab_size']}", "",
                f"{result['linears_replaced']} nn.Linear replaced. Tuning every distinct layer "
                f"shape x bucket from a cold cache: {result['tuning_s']:.0f} s. Loading them in "
                f"a fresh process from the warm cache: {_load(result['cache_load'])}; from the "
                f"model's export: {_load(result['export_load'])}.", "",
                markdown_table(step_rows(result)), "",
                "Per-call cost of one layer (ours / stock): eager CPU time per call "
                "(perf_counter over 2000 calls, no synchronization), then time per call in a "
                "loop of back-to-back calls: eager, torch.compile default and reduce-overhead, "
                "and replayed from a CUDA graph of 20 calls.", "",
                markdown_table(cost_rows(result)), "",
                "The portfolio per layer shape and bucket of M: the kernel chosen by "
                "measurement, and the best TVM candidate's speed as a % of torch's F.linear "
                "(cuBLAS), geometric mean over the bucket's probe Ms, L2 flushed before each "
                "launch.", "",
                markdown_table(portfolio_rows(result)), ""]
    out += ["## Appendix: the chosen TVM kernels' knobs", ""]
    for result in results:
        out += [f"### {result['config']}", "", markdown_table(knob_rows(result)), ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    """python -m reporting.model OUT.md RESULT.json... [--notes NOTES.md]"""
    notes = None
    if "--notes" in argv:
        at = argv.index("--notes")
        with open(argv[at + 1]) as f:
            notes = f.read()
        argv = argv[:at] + argv[at + 2:]
    target, *sources = argv
    results = []
    for source in sources:
        with open(source) as f:
            results.append(json.load(f))
    with open(target, "w") as f:
        f.write(render(results, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
