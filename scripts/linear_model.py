"""A Llama-architecture decoder with every nn.Linear replaced by linear.Linear, against the same
model with stock nn.Linear, in one run on the GPU (needs transformers; random weights, no
download). Writes one JSON file that reporting/model.py renders.

    python scripts/linear_model.py --config 1b --out $OUT/model-1b.json

Steps: tune (or load from the cache) every layer shape x bucket, time a cache load in a fresh
process, then per prefill length and decode batch the model's forward captured in a CUDA graph,
stock and ours (the median of timed replays, one of each in turn, so that the GPU's drift over
the run weighs on both alike), the logits compared; and the per-call cost of one layer, eager
and compiled, against F.linear.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import linear  # noqa: E402
from tuning import loader  # noqa: E402

CONFIGS = {  # Llama-3.2-1B's sizes, and Llama-3-8B's layer sizes with few layers
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
    "8b-layers": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
}
PREFILL = (128, 512, 2048)  # tokens of one sequence
DECODE = (1, 8, 32)  # sequences, one new token each
REPLAYS = 50


def build_model(name: str):
    """The config's model in bfloat16 on the GPU, random weights, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**CONFIGS[name], max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    return model.eval()


def graphed_step(model, ids):
    """The model's forward on `ids` (no KV cache) captured in a CUDA graph: (replay, logits)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(2):
            model(ids, use_cache=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        logits = model(ids, use_cache=False).logits
    return graph.replay, logits


def interleaved_ms(replays: dict) -> dict:
    """name -> median of REPLAYS timed replays (CUDA events) of each of `replays` (name ->
    replay), after warm-up, one of each in turn: a drift of the GPU's clocks over the run (it
    warms up while the portfolio is tuned) then weighs on each alike."""
    for _ in range(5):
        for replay in replays.values():
            replay()
    times = {name: [] for name in replays}
    for _ in range(REPLAYS):
        for name, replay in replays.items():
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(found) for name, found in times.items()}


def replay_ms(replay) -> float:
    """Median of REPLAYS timed replays of one graph (`interleaved_ms` of it alone)."""
    return interleaved_ms({"alone": replay})["alone"]


def steps() -> list[tuple[str, int, int]]:
    """(kind, sequences, tokens per sequence) of every step timed."""
    return [("prefill", 1, t) for t in PREFILL] + [("decode", b, 1) for b in DECODE]


def time_steps(models: dict, vocab: int) -> dict:
    """(name, step) -> each step's graphed time and logits (float32, on the GPU) on fixed token
    ids, for each of `models` (name -> model), their replays interleaved (`interleaved_ms`)."""
    found = {}
    for step in steps():
        kind, batch, tokens = step
        ids = torch.randint(0, vocab, (batch, tokens), device="cuda",
                            generator=torch.Generator(device="cuda").manual_seed(batch * tokens))
        graphs = {name: graphed_step(model, ids) for name, model in models.items()}
        times = interleaved_ms({name: replay for name, (replay, _) in graphs.items()})
        for name, (_, logits) in graphs.items():
            found[name, step] = (times[name], logits.float().clone())
        del graphs
    return found


def call_cost_us(layer, x, calls: int = 2000) -> float:
    """CPU microseconds per eager call, back to back without synchronizing (as a model calls)."""
    with torch.no_grad():
        for _ in range(50):
            layer(x)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            layer(x)
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


def loop_us(fn, x, calls: int = 200) -> float:
    """GPU+CPU microseconds per call in a loop of back-to-back calls (events around the loop)."""
    with torch.no_grad():
        for _ in range(20):
            fn(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn(x)
        end.record()
        end.synchronize()
    return start.elapsed_time(end) / calls * 1000


def call_costs(hidden: int, tokens: int) -> dict:
    """One hidden x hidden layer at `tokens` rows: eager CPU cost per call and back-to-back loop
    time, ours against nn.Linear (and our operator called eagerly); then torch.compile (default,
    reduce-overhead) of each, and one call replayed from a CUDA graph captured by hand."""
    stock = torch.nn.Linear(hidden, hidden, bias=False, device="cuda", dtype=torch.bfloat16)
    ours = linear.Linear.from_linear(stock)
    linear.prepare(ours, say=lambda line: None)
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    op = lambda v: torch.ops.tvm_explorer.linear(v, ours.weight, None, id(ours))  # noqa: E731
    found = {"shape": f"{tokens}x{hidden}x{hidden} bf16",
             "kernel": ours.kernels.for_rows(tokens).candidate.name,
             "eager_cpu_us": {"stock": call_cost_us(stock, x), "ours": call_cost_us(ours, x),
                              "operator": call_cost_us(op, x)},
             "eager_loop_us": {"stock": loop_us(stock, x), "ours": loop_us(ours, x)}}
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        compiled = {name: torch.compile(layer, mode=mode) for name, layer in
                    (("stock", stock), ("ours", ours))}
        found[f"compiled_{mode}_loop_us"] = {name: loop_us(fn, x) for name, fn in compiled.items()}
    found["graph_replay_us"] = {name: graph_replay_us(layer, x) for name, layer in
                                (("stock", stock), ("ours", ours))}
    return found


def graph_replay_us(layer, x, calls: int = 20) -> float:
    """Microseconds per call of `calls` back-to-back calls captured in one CUDA graph."""
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        layer(x)
        with torch.cuda.graph(graph):
            for _ in range(calls):
                layer(x)
    return replay_ms(graph.replay) * 1000 / calls


def load_seconds(config: str, source: str | None = None) -> dict:
    """A fresh process makes the model's distinct layers and loads their kernels from the warm
    cache (or an export directory, `source`): seconds for linear.prepare, and for the whole
    process."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--config", config, "--load-only"]
                          + (["--cache", source] if source else []),
                          capture_output=True, text=True)
    total = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("PREPARE")]
    if done.returncode or not lines:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return {"prepare_s": float(lines[0].split()[1]), "process_s": total,
            "measured_lines": [line for line in done.stdout.splitlines()
                               if not line.startswith("PREPARE")]}


def meta_layers(config: str) -> torch.nn.Module:
    """The config's distinct linear layer shapes as Linears (weights on the GPU, not set)."""
    c = CONFIGS[config]
    head = c["hidden_size"] // c["num_attention_heads"]
    shapes = {(c["hidden_size"], c["hidden_size"]), (c["num_key_value_heads"] * head,
                                                     c["hidden_size"]),
              (c["intermediate_size"], c["hidden_size"]),
              (c["hidden_size"], c["intermediate_size"]), (c["vocab_size"], c["hidden_size"])}
    return torch.nn.ModuleList(linear.Linear(k, n, bias=False, device="cuda")
                               for n, k in sorted(shapes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=CONFIGS, default="1b")
    parser.add_argument("--out")
    parser.add_argument("--load-only", action="store_true",
                        help="only load the config's kernels from the cache, and say how long")
    parser.add_argument("--cache", help="the cache (or export) directory --load-only reads")
    args = parser.parse_args()
    if args.load_only:
        layers = meta_layers(args.config)
        start = time.perf_counter()
        linear.prepare(layers, cache=linear.Cache(args.cache) if args.cache else None)
        print("PREPARE", time.perf_counter() - start)
        return 0
    model = build_model(args.config)
    vocab = model.config.vocab_size
    stock_model = copy.deepcopy(model)
    replaced = linear.replace_linears(model)
    start = time.perf_counter()
    linear.prepare(model)
    tuning_s = time.perf_counter() - start
    timed = time_steps({"stock": stock_model, "ours": model}, vocab)
    exported = tempfile.mkdtemp(prefix="linear-export-") + "/kernels"
    linear.export(model, exported)
    rows = []
    for kind, batch, tokens in steps():
        stock_ms, stock_logits = timed["stock", (kind, batch, tokens)]
        ours_ms, ours_logits = timed["ours", (kind, batch, tokens)]
        diff = (ours_logits - stock_logits).norm() / stock_logits.norm()
        agree = (ours_logits.argmax(-1) == stock_logits.argmax(-1)).float().mean()
        rows.append({"step": kind, "batch": batch, "tokens": tokens, "stock_ms": stock_ms,
                     "ours_ms": ours_ms, "logits_rel_diff": float(diff),
                     "top1_agreement": float(agree)})
        print(rows[-1], flush=True)
    portfolio = [{"layer": layer.label(), "bucket": kernels.table.buckets[i].label(),
                  "chosen": k.candidate.name, "measured": k.measured}
                 for layer, kernels in linear.prepare(model, say=print).items()
                 for i, k in enumerate(kernels.kernels)]
    result = {"config": args.config, "model": CONFIGS[args.config], "linears_replaced": replaced,
              "gpu": torch.cuda.get_device_name(), **loader.versions_here(),
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "tuning_s": tuning_s, "cache_load": load_seconds(args.config),
              "export_load": load_seconds(args.config, exported),
              "steps": rows, "portfolio": portfolio,
              "call_cost": [call_costs(CONFIGS[args.config]["hidden_size"], tokens)
                            for tokens in (1, 16)],
              "timing": f"CUDA graph of the model's forward (no KV cache), median of {REPLAYS} "
                        "replays timed with CUDA events, stock's and ours in turn (L2 as the "
                        "other's replay left it)"}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: result[k] for k in ("tuning_s", "cache_load", "export_load",
                                             "call_cost")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
