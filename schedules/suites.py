"""Suites: named lists of real shapes, kept as data with where each shape comes from.

`python runner.py --suite NAME` runs every shape of a suite through the suite's rungs and the
baselines (tuning/suite.py); `--report` then shows, per shape, the best correct rung against
cuBLAS (reporting/shapes.py).

The LLM shapes are derived, not typed: a ModelConfig holds the fields of a model's
config.json that its linear layers depend on, and a Layer says how N (output features) and K
(input features) follow from them. A weight is stored N x K (PyTorch's nn.Linear), so the
activations multiply it as A @ B^T: GEMM layout nt, and GEMV's row-major B.

Mistral-7B-v0.1 has the same hidden size, heads, KV heads, head dim and intermediate size as
Llama-3-8B (they differ in vocabulary, RoPE base and Mistral's sliding window, none of which
shapes these GEMMs), so its layers are the same GEMMs: each such shape is listed once, with
both models' names on it.

Which schedules: GEMM suites run the ladder from v4 on, GEMV suites from splitk_vec on, each
with dlight and cuBLAS (and, for GEMV, the seed's Triton kernel); the teaching rungs before them
are left out, for the reasons in WHY_LEFT_OUT, which `--suite NAME --list` and the report say.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from .errors import UsageError
from . import registry
from .workloads import FP8, Workload


@dataclass(frozen=True)
class ModelConfig:
    """The fields of a Hugging Face config.json that a decoder layer's GEMM shapes follow from."""

    name: str
    hidden: int  # hidden_size
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads (grouped-query attention)
    intermediate: int  # intermediate_size (the MLP's width)
    vocab: int = 0  # vocab_size: the LM head's N (0: not in a suite's layers)
    head_size: int | None = None  # head_dim where config.json sets it apart from hidden/heads

    @property
    def head_dim(self) -> int:
        """config.json's head_dim where it has one (Gemma-2, Mistral-Nemo), else hidden_size /
        num_attention_heads, as attention then derives it."""
        return self.head_size or self.hidden // self.heads


LLAMA_3_8B = ModelConfig("Llama-3-8B", hidden=4096, heads=32, kv_heads=8, intermediate=14336)
MISTRAL_7B = ModelConfig("Mistral-7B-v0.1", hidden=4096, heads=32, kv_heads=8, intermediate=14336)
QWEN2_7B = ModelConfig("Qwen2-7B", hidden=3584, heads=28, kv_heads=4, intermediate=18944)
MODELS = (LLAMA_3_8B, MISTRAL_7B, QWEN2_7B)


@dataclass(frozen=True)
class Layer:
    """A linear layer of a decoder block: its name (as vLLM's fused modules are named), what it
    is, and how its N and K follow from a model's config (each rule also in words)."""

    name: str
    what: str
    n_rule: str
    n: Callable[[ModelConfig], int]
    k_rule: str
    k: Callable[[ModelConfig], int]

    def origin(self, config: ModelConfig) -> str:
        """How this layer's N and K follow from `config`, with the numbers."""
        return (f"{self.what}: N = {self.n_rule} = {self.n(config)}, "
                f"K = {self.k_rule} = {self.k(config)}")


LAYERS = (
    Layer("qkv_proj", "q, k and v fused", "(heads + 2 kv_heads) x head_dim",
          lambda c: (c.heads + 2 * c.kv_heads) * c.head_dim, "hidden", lambda c: c.hidden),
    Layer("o_proj", "attention output", "hidden", lambda c: c.hidden, "heads x head_dim",
          lambda c: c.heads * c.head_dim),
    Layer("gate_up_proj", "MLP gate and up fused", "2 intermediate", lambda c: 2 * c.intermediate,
          "hidden", lambda c: c.hidden),
    Layer("down_proj", "MLP down", "hidden", lambda c: c.hidden, "intermediate",
          lambda c: c.intermediate),
)

LM_HEAD = Layer("lm_head", "the LM head", "vocab", lambda c: c.vocab, "hidden", lambda c: c.hidden)

# The wider suites' models: sizes from each model's config.json on the Hugging Face hub
# (hidden_size, num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, and
# head_dim where it is set apart from hidden / heads).
WIDE_MODELS = (
    ModelConfig("Llama-3.2-1B", hidden=2048, heads=32, kv_heads=8, intermediate=8192,
                vocab=128256),
    ModelConfig("Llama-3.2-3B", hidden=3072, heads=24, kv_heads=8, intermediate=8192,
                vocab=128256),
    ModelConfig("Phi-3-mini-4k", hidden=3072, heads=32, kv_heads=32, intermediate=8192,
                vocab=32064),
    ModelConfig("Gemma-2-2B", hidden=2304, heads=8, kv_heads=4, intermediate=9216,
                vocab=256000, head_size=256),
    ModelConfig("Qwen2.5-0.5B", hidden=896, heads=14, kv_heads=2, intermediate=4864,
                vocab=151936),
    ModelConfig("Qwen2.5-14B", hidden=5120, heads=40, kv_heads=8, intermediate=13824,
                vocab=152064),
    ModelConfig("Mistral-Nemo-12B", hidden=5120, heads=32, kv_heads=8, intermediate=14336,
                vocab=131072, head_size=128),
)


@dataclass(frozen=True)
class LayerShape:
    """One layer's weight, N x K, and the models that have it."""

    n: int
    k: int
    models: tuple[str, ...]
    layer: str
    origin: str


def layer_shapes(models=MODELS, layers=LAYERS) -> list[LayerShape]:
    """Each layer's N x K for each model, in model then layer order; models whose layer has the
    same shape share one entry, which names them all."""
    found: dict[tuple[str, int, int], LayerShape] = {}
    for model in models:
        for layer in layers:
            key = (layer.name, layer.n(model), layer.k(model))
            if key in found:
                found[key] = replace(found[key], models=found[key].models + (model.name,))
            else:
                found[key] = LayerShape(*key[1:], (model.name,), layer.name, layer.origin(model))
    return list(found.values())


@dataclass(frozen=True)
class Entry:
    """One shape of a suite: the workload, the models and layer it comes from (or, for a
    user's shape, what it stands for), and how its dimensions were derived. A ragged form
    names its aligned neighbour's shape, so the report can set the two side by side."""

    workload: Workload
    models: tuple[str, ...]
    layer: str
    origin: str
    aligned: tuple[int, ...] | None = None

    def tags(self) -> dict:
        """The fields every record of this shape carries besides the suite's name."""
        tags = {"model": ", ".join(self.models) or "-", "layer": self.layer}
        if self.aligned:
            tags["aligned"] = list(self.aligned)
        return tags


# Why a suite runs its op's ladder from a later rung on: what the rungs before it would cost.
WHY_LEFT_OUT = {
    "gemm": "the seed blog's teaching rungs take 0.05 to 1.2 s per launch at 4096^3 on an H100 "
            "(reports/h100-gemm-ladder.md), which with the check and at least ten timed launches "
            "each is minutes per shape",
    "gemv": "naive is about 15x slower than the rest (reports/h100-gemv.md) and splitk is "
            "splitk_vec without its vector loads",
}


@dataclass(frozen=True)
class Suite:
    """A named list of shapes of one op, and the first rung of that op's ladder it runs (the
    rest of the ladder follows, then the baselines)."""

    name: str
    summary: str
    op: str
    first_rung: str
    entries: tuple[Entry, ...]
    why_left_out: str | None = None  # why the rungs before first_rung are left out, where the
    # op's reason (WHY_LEFT_OUT) is not it

    def _ladder(self) -> tuple[list[str], list[str]]:
        """The op's rungs before `first_rung`, and those from it on."""
        rungs = [e.name for e in registry.entries(self.op) if e.kind == "rung"
                 and all(e.takes(entry.workload) for entry in self.entries)]
        first = rungs.index(self.first_rung)
        return rungs[:first], rungs[first:]

    @property
    def left_out(self) -> str:
        """Which rungs of the ladder this suite does not run, and why."""
        skipped, _ = self._ladder()
        why = self.why_left_out or WHY_LEFT_OUT[self.op]
        return f"{', '.join(skipped)}, because {why}" if skipped else ""

    def schedule_names(self, only: str | None = None) -> list[str]:
        """The schedules run on every shape: the ladder from `first_rung` on, then the baselines
        (dlight). `only` (a rung's name, with knobs as on --schedule; 'all' or None: all of them)
        keeps that one rung and the baselines; a baseline's name keeps the baselines alone."""
        _, rungs = self._ladder()
        baselines = [e.name for e in registry.entries(self.op) if e.baseline]
        if only in (None, "all"):
            return rungs + baselines
        base = only.partition(":")[0]
        if base in baselines:
            return baselines
        if base not in rungs:
            raise UsageError(f"suite {self.name} runs {', '.join(rungs + baselines)}; "
                             f"--schedule {only} is not one of them")
        return [only] + baselines


def _llm_gemms(tokens: tuple[int, ...], dtype: str = "bfloat16", out_dtype: str = "float32",
               shapes: list[LayerShape] | None = None) -> tuple[Entry, ...]:
    """The models' layers (`shapes`, by default layer_shapes()) as GEMMs (nt) of `dtype`
    writing `out_dtype` at each number of tokens M."""
    return tuple(Entry(Workload("gemm", (m, s.n, s.k), dtype, out_dtype, "nt"), s.models,
                       s.layer, f"{s.origin}; M = {m} tokens")
                 for s in (shapes or layer_shapes()) for m in tokens)


RAGGED_K_LAYERS = ("o_proj", "down_proj")  # whose K-1 forms the GEMV suite also runs


def _llm_gemvs(dtypes: tuple[str, ...]) -> tuple[Entry, ...]:
    """The models' layers as decode GEMVs (M = 1) in each dtype; after each of RAGGED_K_LAYERS,
    its K-1 form, which names it as its aligned neighbour."""
    found = []
    for dtype in dtypes:
        for s in layer_shapes():
            found.append(Entry(Workload("gemv", (s.n, s.k), dtype), s.models, s.layer,
                               f"{s.origin}; M = 1 (decode)"))
            if s.layer in RAGGED_K_LAYERS:
                found.append(Entry(Workload("gemv", (s.n, s.k - 1), dtype), s.models,
                                   f"{s.layer} K-1", f"{s.layer} with one input feature less "
                                   f"(K-1): rows of B are not whole 16-byte vectors; aligned "
                                   f"neighbour {s.n}x{s.k}",
                                   aligned=(s.n, s.k)))
    return tuple(found)


def _user_gemm(shape: tuple[int, int, int], models: tuple[str, ...], layer: str,
               origin: str) -> Entry:
    """A float32 GEMM (nn) a user brings, with what it stands for."""
    return Entry(Workload("gemm", shape, "float32"), models, layer, origin)


FP32_RAGGED = (
    _user_gemm((1000, 4096, 4096), ("Llama-3-8B",), "o_proj, 1000 tokens",
               "a ragged batch of 1000 tokens through a 4096-wide layer (Llama-3-8B's o_proj), "
               "unpadded: M is not whole tiles"),
    _user_gemm((3000, 1000, 2000), (), "dense layer",
               "a user's dense layer: 3000 samples, 2000 features in, 1000 out; round decimal "
               "sizes, none of them whole 64-wide tiles"),
    _user_gemm((1000, 1000, 1000), (), "1000^3",
               "the round-number cube people time first; 1000 = 8 x 125: whole 16-byte vectors, "
               "no whole 64- or 128-wide tiles"),
    _user_gemm((4095, 4095, 4095), (), "4096^3 less one",
               "the seed ladder's 4096^3 one short in every dimension: every block's last tile "
               "is partial and rows are not whole 16-byte vectors"),
    _user_gemm((257, 129, 65), (), "2^n + 1",
               "one past a power of two in every dimension: a sliver of a tile on every edge, "
               "odd rows"),
    _user_gemm((128, 50257, 768), ("GPT-2",), "lm_head, 128 tokens",
               "GPT-2's LM head (vocabulary 50257, hidden 768) on 128 tokens: an odd N"),
)

WIDE_TOKENS = (1, 7, 48, 300, 700, 2500)  # M between llm-bf16's, decode's 1 included
WIDE_SHAPES = layer_shapes(WIDE_MODELS, LAYERS + (LM_HEAD,))


def _ragged_16bit() -> tuple[Entry, ...]:
    """16-bit GEMMs with a 16-bit C whose rows TMA cannot load (K or N not a whole 16-byte
    row), and fp16 nn: what a model brings that the 16-byte-row kernels refuse."""
    def entry(shape, dtype, layout, models, layer, origin):
        return Entry(Workload("gemm", shape, dtype, dtype, layout), models, layer, origin)
    return (
        entry((2000, 3000, 4095), "bfloat16", "nt", (), "K = 4095",
              "a user's layer one input feature short of 4096: rows of A and B are 8190 bytes"),
        entry((333, 8192, 8191), "bfloat16", "nt", (), "medium M, K = 8191",
              "333 tokens through an 8192-wide layer one feature short: medium M and ragged K"),
        entry((128, 50257, 768), "bfloat16", "nt", ("GPT-2",), "lm_head, 128 tokens",
              "GPT-2's LM head (vocabulary 50257, hidden 768): N is odd, C's rows 100514 bytes"),
        entry((16, 50257, 768), "float16", "nt", ("GPT-2",), "lm_head, 16 tokens",
              "GPT-2's LM head at a decode batch of 16, fp16"),
        entry((1024, 2304, 768), "float16", "nn", ("GPT-2",), "c_attn, 1024 tokens",
              "GPT-2's fused q, k, v (Conv1D: its weight is K x N, layout nn), 3 x 768 = 2304"),
        entry((1024, 768, 3072), "float16", "nn", ("GPT-2",), "c_proj (MLP), 1024 tokens",
              "GPT-2's MLP projection back to 768 from 4 x 768 (Conv1D, layout nn)"),
        entry((777, 3000, 1001), "float16", "nn", (), "all ragged",
              "a user's odd sizes in every dimension, fp16 nn"),
    )


# Encoders people still run in float32 (sizes from each config.json: hidden_size,
# num_attention_heads, intermediate_size; q, k and v each hidden wide), with an ungated MLP.
ENCODER_MODELS = (
    ModelConfig("BERT-base", hidden=768, heads=12, kv_heads=12, intermediate=3072),
    ModelConfig("ViT-B/16", hidden=768, heads=12, kv_heads=12, intermediate=3072),
    ModelConfig("BERT-large", hidden=1024, heads=16, kv_heads=16, intermediate=4096),
    ModelConfig("ViT-L/16", hidden=1024, heads=16, kv_heads=16, intermediate=4096),
    ModelConfig("ViT-H/14", hidden=1280, heads=16, kv_heads=16, intermediate=5120),
)
ENCODER_LAYERS = (LAYERS[0], LAYERS[1],
                  Layer("up_proj", "MLP up (ungated)", "intermediate", lambda c: c.intermediate,
                        "hidden", lambda c: c.hidden),
                  LAYERS[3])
FP32_TOKENS = (7, 77, 197, 4096)  # a few rows; CLIP's 77 text tokens; ViT-B/16's 197 patches
# and class token; a batch of long sequences

LLM_MODELS = " / ".join(model.name for model in MODELS)
TOKENS = (16, 128, 1000, 4096)  # M of the GEMM suite: decode batches, a ragged prefill, a long one
GEMV_DTYPES = ("float16", "bfloat16")

SUITES = {
    suite.name: suite
    for suite in (
        Suite("llm-bf16", f"{LLM_MODELS} layers as bf16 GEMMs (nt, float32 out) at M = "
              f"{', '.join(map(str, TOKENS))} tokens", "gemm", "v4", _llm_gemms(TOKENS)),
        Suite("llm-fp8", f"{LLM_MODELS} layers as fp8 e4m3 GEMMs (nt, a scale per tensor, "
              f"bfloat16 out, as torch._scaled_mm) at M = {', '.join(map(str, TOKENS))} tokens",
              "gemm", "v8", _llm_gemms(TOKENS, FP8, "bfloat16"),
              why_left_out="the CUDA-core rungs take seconds per launch on these shapes in fp8, "
                           "and v5t, v6 and v7 take no fp8"),
        Suite("llm-gemv", f"{LLM_MODELS} layers as decode GEMVs (M = 1) in "
              f"{' and '.join(GEMV_DTYPES)}, with K-1 forms of {' and '.join(RAGGED_K_LAYERS)} "
              "next to their aligned neighbours", "gemv", "splitk_vec", _llm_gemvs(GEMV_DTYPES)),
        Suite("fp32-ragged", "Float32 GEMMs (nn) on ragged shapes a user brings", "gemm", "v4",
              FP32_RAGGED),
        Suite("wide-bf16", f"{' / '.join(m.name for m in WIDE_MODELS)} layers and LM heads as "
              f"bf16 GEMMs with a bf16 C (nt), as models write them, at M = "
              f"{', '.join(map(str, WIDE_TOKENS))} tokens", "gemm", "v4",
              _llm_gemms(WIDE_TOKENS, "bfloat16", "bfloat16", WIDE_SHAPES)),
        Suite("wide-fp8", "wide-bf16's shapes from 7 tokens on as fp8 e4m3 GEMMs (nt, a scale "
              "per tensor, bfloat16 out, as torch._scaled_mm)", "gemm", "v8",
              _llm_gemms(WIDE_TOKENS[1:], FP8, "bfloat16", WIDE_SHAPES),
              why_left_out="the CUDA-core rungs take seconds per launch on these shapes in fp8, "
                           "and v5t, v6 and v7 take no fp8"),
        Suite("ragged-16bit", "16-bit GEMMs writing a 16-bit C with rows TMA cannot load, and "
              "fp16 nn", "gemm", "v4", _ragged_16bit()),
        Suite("wide-fp32", f"{' / '.join(m.name for m in ENCODER_MODELS)} layers as float32 "
              f"GEMMs (nt, as nn.Linear) at M = {', '.join(map(str, FP32_TOKENS))} tokens",
              "gemm", "v4", _llm_gemms(FP32_TOKENS, "float32", "float32",
                                       layer_shapes(ENCODER_MODELS, ENCODER_LAYERS))),
    )
}


def get(name: str) -> Suite:
    """The suite of that name; a UsageError naming the suites there are for any other."""
    if name not in SUITES:
        raise UsageError(f"unknown suite '{name}'; valid: {', '.join(SUITES)}")
    return SUITES[name]
