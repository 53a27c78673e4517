"""What a linear layer's bucket may run: the candidates a portfolio measures, how each is built
for every M of its bucket, and how each is launched.

A layer is y[M, N] = x[M, K] @ W^T with W stored N x K (nn.Linear's weight): the project's GEMM
in layout nt, its output in the input's dtype. An fp8 layer (e4m3 x and W) also takes their
float32 scales, one per tensor or one per row of x and of W (torch._scaled_mm's tensorwise and
rowwise forms), or per block (DeepSeek-V3's: x's per row per 128 K, W's per 128 x 128 block),
and writes bfloat16 by default. The candidates:
- `torch`: F.linear (cuBLAS), the layer as stock PyTorch runs it; fp8: torch._scaled_mm
  (block scales: its block-scaled form where cuBLAS takes K, else x and W dequantized to
  bfloat16, then F.linear);
- the GEMV rungs (blockreduce, allreduce, rowalign, multirow) for the bucket of M = 1, built for
  the layer's fixed N x K (16-bit layers: the GEMV rungs take no fp8);
- skinny (a GEMV of each row of x at once, on CUDA cores) for a bucket of one M of at most 16
  rows;
- v8 with M as a size given at each call (v8.v8_kernel_any_m), at a few tile shapes, whole
  or with a last, partial wave's tiles split in K to fill the SMs; for a bucket of one M, v8
  built for that M (v8.v8_kernel), its heuristic's choice and the settings a measured `best`
  weighs for that M among them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import tvm

import schedules
from schedules import heuristics, v8
from schedules.errors import ScheduleNotApplicable, WorkloadError
from schedules.registry import with_knob_text
from schedules.workloads import FP8, FP8_BLOCK, FP8_OUT_DTYPE, Workload, fp8_blocks

from tuning import build, explore, measure

from .buckets import Bucket

TORCH = "torch"
GEMV_RUNGS = ("blockreduce", "allreduce", "rowalign", "multirow")  # allreduce: 4-9% faster than
# blockreduce where K leaves blockreduce's last step half idle (Qwen2-7B's K = 3584, on the H100)
V8 = "v8"
SKINNY = "skinny"
V8_WIDTHS = (128, 256)  # block_n tried at every bucket
SPLITS = (1, 2, 3, 4, 6, 8)  # v8's split_k values (its space)
MOST_WORKSPACE_BYTES = 64 << 20  # split K's partials per kernel: a model holds many kernels
LAYER_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class LayerShape:
    """A linear layer's weight: out_features (N) x in_features (K), in `dtype`, which its input
    shares. Its output is in `out_dtype`: the input's for 16-bit layers, bfloat16 by default for
    fp8 ones, whose `scales` go per tensor ("tensor", the default), per row ("row") or per
    block ("block"), as the GEMM workload's (schedules.workloads.FP8_SCALINGS), and whose sums
    are promoted into float32 every few K steps (_scaled_mm's default; v8's promote_k) unless
    `fast_accum`, which keeps them in the tensor cores' own accumulator (_scaled_mm's
    use_fast_accum=True; v8 without promote_k): faster, less precise; block scales are applied
    at each promotion, so they take no fast_accum. With `bias`, the layer adds one, and its
    candidates are checked and timed adding it as they will run (torch's and v8's fuse it, but
    for torch's block scales; the GEMV rungs add it after). A combination the GEMM does not
    take is refused here (WorkloadError)."""

    out_features: int
    in_features: int
    dtype: str
    scales: str | None = None
    out_dtype: str | None = None
    fast_accum: bool = False
    bias: bool = False

    def __post_init__(self):
        default_out = FP8_OUT_DTYPE if self.dtype == FP8 else self.dtype
        wl = Workload("gemm", (1, self.out_features, self.in_features), self.dtype,
                      self.out_dtype or default_out, "nt", self.scales)
        if wl.block_scaled and self.fast_accum:
            raise WorkloadError("block scales are applied as sums are promoted into float32 "
                                "(DeepGEMM's, cuBLAS's): no fast_accum")
        if not wl.is_fp8 and wl.out_dtype != self.dtype:
            raise WorkloadError(f"a {self.dtype} layer writes {self.dtype} (as F.linear does), "
                                f"not {wl.out_dtype}")
        if not wl.is_fp8 and self.fast_accum:
            raise WorkloadError(f"fast_accum is for {FP8} layers; {self.dtype} tensor cores keep "
                                "float32 sums")
        object.__setattr__(self, "out_dtype", wl.out_dtype)
        object.__setattr__(self, "scales", wl.scales)

    @property
    def is_fp8(self) -> bool:
        return self.dtype == FP8

    @property
    def block_scaled(self) -> bool:
        return self.scales == "block"

    def label(self) -> str:
        """The layer in words, as cache keys and progress lines name it: fp8's scaling form and
        output dtype included, so that each form has entries of its own."""
        fp8 = f" scales={self.scales} out={self.out_dtype}" if self.is_fp8 else ""
        fast = " fast_accum" if self.fast_accum else ""
        bias = " bias" if self.bias else ""
        return f"{self.out_features}x{self.in_features} {self.dtype}{fp8}{fast}{bias}"

    def x_scale_shape(self, rows: tuple) -> tuple:
        """An fp8 x of leading shape `rows`' scale: one element (shape ()), one per row
        (rows + (1,)), or one per row per 128 K (rows + (K blocks,))."""
        if self.scales == "row":
            return (*rows, 1)
        return (*rows, fp8_blocks(self.in_features)) if self.scales == "block" else ()

    def weight_scale_shape(self) -> tuple:
        """An fp8 weight's scale: one element, one per output feature as a column (N x 1), or
        one per 128 x 128 block (N blocks x K blocks)."""
        if self.scales == "block":
            return fp8_blocks(self.out_features), fp8_blocks(self.in_features)
        return self.x_scale_shape((self.out_features,))

    def gemm(self, m: int) -> Workload:
        """The layer at m rows as the project's GEMM workload (nt, C in the layer's out_dtype)."""
        return Workload("gemm", (m, self.out_features, self.in_features), self.dtype,
                        self.out_dtype, "nt", self.scales)

    def gemv(self) -> Workload:
        """The layer at one row as the project's GEMV workload (B = W, x = the row)."""
        return Workload("gemv", (self.out_features, self.in_features), self.dtype)


@dataclass(frozen=True)
class Candidate:
    """One kernel a bucket may run: a rung (or `torch`) and its knobs as sorted pairs."""

    rung: str
    knobs: tuple = ()

    @property
    def name(self) -> str:
        return with_knob_text(self.rung, self.knobs)

    @property
    def built(self) -> bool:
        """Whether it is a TVM kernel (torch's is not built)."""
        return self.rung != TORCH


def _gemv_candidates(layer: LayerShape) -> list[Candidate]:
    """The GEMV rungs that take the layer's one-row workload, each with the knobs its heuristic
    picks for it."""
    wl = layer.gemv()
    found = []
    for rung in GEMV_RUNGS:
        entry = schedules.get("gemv", rung)
        if entry.takes(wl):
            found.append(Candidate(rung, tuple(sorted(entry.defaults_for(wl).items()))))
    return found


def _fill_splits(layer: LayerShape, bucket: Bucket, max_tokens: int, block_m: int,
                 block_n: int) -> set[int]:
    """v8's splits of K (its space's) that best fill the SMs with the tiles of a last, partial
    wave (split_tail), at each of the bucket's probe Ms."""
    k_blocks = v8.k_block_count(layer.in_features, v8.ELEMENT_BYTES[layer.dtype])
    found = set()
    for m in bucket.probes(max_tokens):
        last_wave = heuristics.tile_count(layer.gemm(m), block_m, block_n) % heuristics.H100_SMS
        if last_wave:
            found.add(max(s for s in SPLITS
                          if s <= k_blocks and last_wave * s <= heuristics.H100_SMS))
    return found - {1}


def _weighed_settings(wl: Workload) -> list[dict]:
    """The settings of v8 besides its default that a measured `best` weighs for wl (its
    portfolio's v8 entries, tuning.explore.portfolio), each with the rest of its knobs as the
    heuristic picks them for wl."""
    entry = schedules.get("gemm", V8)
    named = [name.partition(":") for name in explore.portfolio(wl)]
    return [dict(entry.with_knobs(text, wl).defaults) for rung, colon, text in named
            if rung == V8 and colon]


def _v8_candidates(layer: LayerShape, bucket: Bucket, max_tokens: int) -> list[Candidate]:
    """v8 for the bucket's rows: the heuristic's own choice for its most rows (unswapped: v8 for
    any M walks M on the tile's rows), then 64-row tiles (at most 64 rows) or 128-row ones at
    each of V8_WIDTHS, whole and with the tiles of a last, partial wave split to fill the SMs at
    the probe Ms (split_tail: its split tiles are counted at each call), and past
    v8.MEDIUM_ROWS rows its MEDIUM_TILES and the tile that fills the SMs best at the most rows
    (`v8.wave_tile`) whole, and where that is one wgmma tall and takes one round of the SMs
    (`v8.one_consumer_tile`), with pingpong; settings v8 refuses, or whose workspace passes
    MOST_WORKSPACE_BYTES, are left out. A fast_accum layer's v8 keeps its sums
    in wgmma's accumulator (no promote_k); a precise one's promotions overlap as the heuristic
    says, for any M in runs of at most MOST_SPLIT_OVERLAP K blocks (`v8.short_overlap`), and
    past v8.MEDIUM_ROWS rows its `v8.halves_tile`, whole, overlaps them by halves of the
    columns (promote_halves) in the heuristic's runs. A bucket of one M builds v8 for
    that number M (`build_candidate`): its heuristic's choice is then its own, swapped and
    overlapped where it says, any tile may split K, and it also weighs what a measured `best`
    weighs for that M (`_weighed_settings`; not for a fast_accum layer: best's fp8 settings
    promote their sums)."""
    most = bucket.most(max_tokens)
    wl = layer.gemm(most)
    if v8.workload_refusal(wl):
        return []
    entry = schedules.get("gemm", V8)
    block_m = 64 if most <= 64 else 128
    accumulate = {"promote_k": None} if layer.fast_accum else {}
    default = accumulate | ({} if bucket.one_m else {"swap_ab": False})
    accumulate["swap_ab"] = False

    def tiles(m: int, n: int, split: int = 1) -> dict:
        """m x n tiles, whole or with a last wave's split in `split`, one CTA each."""
        return {"block_m": m, "block_n": n, "split_k": split, "split_tail": split > 1,
                "cluster_m": 1, "cluster_n": 1, "pingpong": False, **accumulate}

    wanted = [default]
    for block_n in V8_WIDTHS:
        wanted += [tiles(block_m, block_n)] + [
            tiles(block_m, block_n, split)
            for split in sorted(_fill_splits(layer, bucket, max_tokens, block_m, block_n))]
    if most > v8.MEDIUM_ROWS:
        filling = v8.wave_tile(wl, heuristics.H100_SMS, entry.defaults)
        wanted += [tiles(m, n) for m, n in v8.MEDIUM_TILES + ((filling,) if filling else ())]
        lone = v8.one_consumer_tile(wl, heuristics.H100_SMS, entry.defaults)
        wanted += [tiles(*lone) | {"pingpong": True}] if lone else []
        halved = None if layer.fast_accum else v8.halves_tile(wl, heuristics.H100_SMS,
                                                              entry.defaults)
        if halved:  # its promotions overlapped by halves, in the runs the heuristic gives
            wanted.append(tiles(*halved) | {"promote_halves": True})
    if bucket.one_m and not layer.fast_accum:
        wanted += _weighed_settings(wl)
    found = []
    for chosen in wanted:
        knobs = entry.defaults_for(wl, chosen)
        if not bucket.one_m and not knobs["promote_halves"]:  # (halves keep two sets)
            knobs["promote_overlap"] = v8.short_overlap(knobs["promote_overlap"], entry.space)
        if not bucket.one_m and not knobs["split_tail"] and knobs["split_k"] > 1:
            continue  # the heuristic splitting every tile: only for most rows, not any M
        try:
            v8.v8_refusals(wl, **knobs)
        except ScheduleNotApplicable:
            continue
        workspace = v8.any_m_partial_bytes(wl, knobs["block_m"], knobs["block_n"],
                                           knobs["split_k"], knobs["split_tail"],
                                           open_ended=bucket.last is None)
        candidate = Candidate(V8, tuple(sorted(knobs.items())))
        if workspace <= MOST_WORKSPACE_BYTES and candidate not in found:
            found.append(candidate)
    return found


def _skinny_candidates(layer: LayerShape, bucket: Bucket) -> list[Candidate]:
    """skinny, with the knobs its heuristic picks, where the bucket is one M that it takes (at
    most SKINNY_ROWS rows; fp8 scaled per tensor or per row)."""
    if not bucket.one_m:
        return []
    wl, entry = layer.gemm(bucket.first), schedules.get("gemm", SKINNY)
    if not entry.takes(wl):
        return []
    try:
        knobs = entry.defaults_for(wl)
        entry.refuse(wl, **knobs)
    except ScheduleNotApplicable:
        return []
    return [Candidate(SKINNY, tuple(sorted(knobs.items())))]


def candidates(layer: LayerShape, bucket: Bucket, max_tokens: int) -> list[Candidate]:
    """Every candidate of the layer's bucket: torch's, the GEMV rungs where the bucket is M = 1
    (16-bit layers), skinny where it is one M of a few rows, and v8's for the bucket's rows."""
    found = [Candidate(TORCH)]
    if bucket.most(max_tokens) == 1 and not layer.is_fp8:
        found += _gemv_candidates(layer)
    return found + _skinny_candidates(layer, bucket) + _v8_candidates(layer, bucket, max_tokens)


def build_candidate(layer: LayerShape, bucket: Bucket, candidate: Candidate, max_tokens: int,
                    arch: str):
    """Compile a TVM candidate for the layer's bucket (for GPU arch `arch`): the GEMV rung for
    its fixed one-row shape, skinny for the bucket's one M, v8 for that M where the bucket is
    one, else for every M of the bucket. Returns TVM's executable."""
    target = build.cuda_target(arch)
    knobs = dict(candidate.knobs)
    wl = layer.gemm(bucket.most(max_tokens))  # the bucket's most rows
    if candidate.rung == V8 and bucket.one_m:
        mod = tvm.IRModule({"main": v8.v8_kernel(wl, bias=layer.bias, **knobs)})
    elif candidate.rung == V8:
        mod = tvm.IRModule({"main": v8.v8_kernel_any_m(wl, open_ended=bucket.last is None,
                                                       bias=layer.bias, **knobs)})
    elif candidate.rung == SKINNY:
        mod = schedules.get("gemm", SKINNY).apply(wl, target, **knobs)
    else:
        mod = schedules.get("gemv", candidate.rung).apply(layer.gemv(), target, **knobs)
    return build.build(mod, target)


def scaled_linear(x, x_scale, weight, weight_scale, bias=None, out_dtype=torch.bfloat16,
                  use_fast_accum=False, out=None):
    """An fp8 layer as torch runs it: torch._scaled_mm on x (M x K) and the weight (N x K, taken
    as its transpose), x_scale (M x 1, or one element) and weight_scale (N x 1, or one element,
    taken as its transpose: _scaled_mm's 1 x N), by default at _scaled_mm's default precision
    (its sums promoted into float32, as v8's default for fp8 is); the bias added after
    scaling; into `out` where given. (Block scales take `block_scaled_linear` instead.)"""
    return torch._scaled_mm(x, weight.t(), x_scale, weight_scale.t(), bias=bias,
                            out_dtype=out_dtype, use_fast_accum=use_fast_accum, out=out)


def block_scaled_linear(x, x_scale, weight, weight_scale, bias=None, out_dtype=torch.bfloat16,
                        out=None):
    """A block-scaled fp8 layer as torch runs it: torch._scaled_mm's block-scaled form
    (cuBLAS's: measure.cublas_block_scaled_mm) where K is whole groups of
    measure.CUBLAS_BLOCK_K, else what a user without a fused kernel runs: x and W times their
    block scales in bfloat16, then F.linear; the bias added after; into `out`."""
    k = x.shape[1]
    if k % measure.CUBLAS_BLOCK_K == 0:
        y = measure.cublas_block_scaled_mm(x, weight, x_scale, weight_scale, out_dtype, out)
    else:
        dense = [measure.block_dequantize(values, scales, rows, torch.bfloat16) for
                 values, scales, rows in ((x, x_scale, 1), (weight, weight_scale, FP8_BLOCK))]
        y = F.linear(*dense).to(out_dtype) if out is None else out.copy_(F.linear(*dense))
    return y if bias is None else y.add_(bias)


def f_linear(x, weight, bias=None, out=None):
    """A 16-bit layer as torch runs it: F.linear, or into `out` (x of two dimensions) with the
    cuBLAS calls F.linear makes of it (addmm with a bias, else mm)."""
    if out is None:
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def torch_layer(layer: LayerShape):
    """The layer as stock torch runs it, called as `launcher`'s runs are: f_linear, or for an
    fp8 layer scaled_linear (block scales: block_scaled_linear) at the layer's precision and
    output dtype."""
    if not layer.is_fp8:
        return f_linear
    out_dtype = getattr(torch, layer.out_dtype)
    if layer.block_scaled:
        return functools.partial(block_scaled_linear, out_dtype=out_dtype)
    return functools.partial(scaled_linear, out_dtype=out_dtype, use_fast_accum=layer.fast_accum)


def _biases(candidate: Candidate, layer: LayerShape, bias) -> tuple:
    """A GEMM kernel's bias argument: the layer's bias where its kernel was built with one (v8
    for a layer with a bias, which is always called with it), else none."""
    return (bias,) if layer.bias and candidate.rung == V8 else ()


def _plus_bias(candidate: Candidate, out, bias):
    """`out`, plus the bias where there is one that the kernel did not add (the GEMV rungs',
    skinny's: added after, as a second kernel)."""
    return out if bias is None or candidate.rung == V8 else out.add_(bias)


def launcher(candidate: Candidate, layer: LayerShape, function):
    """run(x2d, weight, bias, out=None) -> y2d for the candidate, or for an fp8 layer
    run(x2d, x_scale, weight, weight_scale, bias, out=None) (scales in the shapes the layer's
    `x_scale_shape` and `weight_scale_shape` say), into `out` where given, else into a tensor
    of its own: `function` is its built kernel's entry ("main"), None for torch's
    (`torch_layer`). A GEMV takes the row and writes y as vectors; v8 and skinny take x, W
    (fp8: and their scales, flattened but for block scales' matrices) and y whole, v8 the bias
    too where the layer has one (its kernel adds it: `build_candidate`); the others' bias is
    added after."""
    n, k, out_dtype = layer.out_features, layer.in_features, getattr(torch, layer.out_dtype)
    if candidate.rung == TORCH:
        return torch_layer(layer)
    if candidate.rung in (V8, SKINNY):
        def run_gemm(x, weight, bias=None, out=None, scales=()):
            if out is None:
                out = torch.empty((x.shape[0], n), dtype=out_dtype, device=x.device)
            function(x, weight, *scales, *_biases(candidate, layer, bias), out)
            return _plus_bias(candidate, out, bias)
        if not layer.is_fp8:
            return run_gemm
        flat = not layer.block_scaled  # the scales: a vector each, or blocks' matrices

        def run_gemm_fp8(x, x_scale, weight, weight_scale, bias=None, out=None):
            scales = (x_scale.view(-1), weight_scale.view(-1)) if flat else (x_scale, weight_scale)
            return run_gemm(x, weight, bias, out, scales)
        return run_gemm_fp8

    def run_gemv(x, weight, bias=None, out=None):
        if out is None:
            out = torch.empty((1, n), dtype=out_dtype, device=x.device)
        function(weight, x.view(k), out.view(n))
        return _plus_bias(candidate, out, bias)
    return run_gemv
