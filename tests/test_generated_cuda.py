"""Golden CUDA: the source each rung family generates on a fixed set of workloads and knobs,
pinned by its sha256 in tests/golden/cuda-sha256.json. Moving or reshaping a rung's code
(issue 50) must leave what it generates byte for byte as it was; a change that is meant to
alter a kernel fails here until the golden file is regenerated and the diff reviewed.

v8 is covered most densely (static M: nn/nt, fp16/bf16/fp8, float32 and 16-bit C, split_k,
split_tail, tma_store on and off, clusters along M and N, pingpong, ragged shapes, rows staged
for TMA, fp8's promoted sums; and v8 for
any M, as linear/ builds it, whole and with a split last wave); every other rung family by one
workload, but v6 and v7: their tensor intrinsics (tvm.s_tir.tensor_intrin) take about 45 s
of one core to import, more than this whole test."""

import hashlib
import json
import os
from pathlib import Path

import pytest

import schedules
from linear.buckets import Bucket
from linear.candidates import V8, Candidate, LayerShape, build_candidate
from schedules import Workload
from schedules.workloads import FP8
from tuning import build

GOLDEN = Path(__file__).parent / "golden" / "cuda-sha256.json"
REGENERATE = "UPDATE_GOLDEN=1 python3 -m pytest -p no:xdist tests/test_generated_cuda.py"


def gemm(shape, dtype="float16", out_dtype=None, layout="nn", scales=None):
    return Workload("gemm", shape, dtype, out_dtype, layout, scales)


# (case id, rung, workload, knobs set over the rung's defaults for the workload)
V8_CASES = [
    ("v8-nt-f16-c16-4096", gemm((4096, 4096, 4096), "float16", "float16", "nt"), {}),
    ("v8-nn-bf16-c32-4096-registers", gemm((4096, 4096, 4096), "bfloat16", layout="nn"),
     {"tma_store": False}),
    ("v8-nt-bf16-ragged-1000", gemm((1000, 1000, 1000), "bfloat16", "bfloat16", "nt"), {}),
    ("v8-nn-f16-ragged-small", gemm((100, 304, 40), "float16", "float16", "nn"), {}),
    ("v8-nt-bf16-decode-16", gemm((16, 6144, 4096), "bfloat16", layout="nt"),
     {"swap_ab": False, "block_n": 128}),  # 64x128 tiles, K split in 2
    ("v8-nt-bf16-decode-16-swapped", gemm((16, 6144, 4096), "bfloat16", layout="nt"), {}),
    ("v8-nt-bf16-split-k-128", gemm((128, 4096, 4096), "bfloat16", "bfloat16", "nt"),
     {"split_k": 2}),
    ("v8-nt-bf16-split-tail", gemm((1000, 4608, 3584), "bfloat16", layout="nt"),
     {"block_m": 128, "block_n": 256, "split_k": 8, "split_tail": True, "tma_store": False}),
    ("v8-nt-fp8-c16-4096", gemm((4096, 4096, 4096), FP8, layout="nt"),
     {"block_n": 256, "stages": 4, "promote_k": None}),
    ("v8-nt-fp8-c32-ragged-split", gemm((1000, 1000, 1008), FP8, "float32", "nt"),
     {"split_k": 2, "tma_store": False, "promote_k": None}),
    ("v8-nt-fp8-c16-4096-promoted", gemm((4096, 4096, 4096), FP8, layout="nt"), {}),
    ("v8-nt-bf16-c16-staged-4095", gemm((2000, 3000, 4095), "bfloat16", "bfloat16", "nt"), {}),
    ("v8-nn-f16-c16-staged-b", gemm((1000, 1001, 1024), "float16", "float16", "nn"), {}),
    ("v8-nt-bf16-tall-256x144", gemm((1000, 4608, 3584), "bfloat16", layout="nt"),
     {"block_m": 256, "block_n": 144, "tma_store": True, "stages": 3}),
    ("v8-nn-f16-cluster-m", gemm((2048, 2048, 1024), "float16", "float16", "nn"),
     {"block_m": 128, "block_n": 256, "cluster_m": 2}),
    ("v8-nt-bf16-cluster-n", gemm((1000, 2048, 1024), "bfloat16", layout="nt"),
     {"block_m": 128, "block_n": 128, "cluster_n": 2, "tma_store": False}),
    ("v8-nt-f16-pingpong", gemm((2048, 2048, 1024), "float16", "float16", "nt"),
     {"block_m": 128, "block_n": 192, "pingpong": True}),
    ("v8-nn-bf16-c32-pingpong-ragged", gemm((999, 1024, 520), "bfloat16", layout="nn"),
     {"block_m": 128, "block_n": 128, "pingpong": True, "tma_store": False}),
    ("v8-nt-bf16-c16-swap-ab-300", gemm((300, 5120, 5120), "bfloat16", "bfloat16", "nt"),
     {"swap_ab": True, "tma_store": False, "block_m": 128, "block_n": 152, "split_k": 1}),
    ("v8-nt-fp8-rowwise-swap-ab-split", gemm((300, 2000, 1000), FP8, "bfloat16", "nt", "row"),
     {"swap_ab": True, "tma_store": False, "block_n": 152, "split_k": 2}),
]
V8_ANY_M_CASES = [  # (case id, layer, bucket, max_tokens, knobs)
    ("v8-any-m-whole", LayerShape(4096, 4096, "bfloat16"), Bucket(257, 1024), 1024,
     {"block_m": 128, "block_n": 256, "split_k": 1, "split_tail": False}),
    ("v8-any-m-split-tail", LayerShape(4608, 3584, "float16"), Bucket(65, 256), 1024,
     {"block_m": 128, "block_n": 128, "split_k": 4, "split_tail": True}),
    # fp8's promotions overlapped on split tiles: with v8's tile count of a symbolic M written
    # -(-M // rows), this did not lower ("Let cannot bind the same var to two different values")
    ("v8-any-m-fp8-overlap-split", LayerShape(4096, 14336, FP8, "row", bias=True), Bucket(2, 16),
     4096, {"block_m": 64, "block_n": 128, "split_k": 4, "split_tail": True,
            "promote_overlap": 4}),
]
OTHER_CASES = [
    ("gemm-naive", "naive", gemm((64, 64, 64), "float32"), {}),
    ("gemm-v3", "v3", gemm((256, 256, 256), "float32"), {}),
    ("gemm-v4", "v4", gemm((256, 256, 256), "float32"), {}),
    ("gemm-v5p", "v5p", gemm((300, 260, 200), "float32"), {}),
    ("gemm-v5k", "v5k", gemm((128, 128, 4096), "float32"), {}),
    ("gemm-v5t", "v5t", gemm((512, 512, 512), "float32"), {}),
    ("gemm-v5t-ragged", "v5t", gemm((257, 129, 65), "float32"), {}),  # copies zero-filling
    ("gemv-multirow", "multirow", Workload("gemv", (1024, 1000), "float16"), {}),
    ("gemv-rowalign", "rowalign", Workload("gemv", (1024, 1000), "float16"), {}),
    ("bgemv-bitdecode", "bitdecode", Workload("batched_gemv", (2, 512, 1024), "nvfp4"), {}),
    ("bgemv-dp4a", "dp4a", Workload("batched_gemv", (2, 512, 1024), "nvfp4"), {}),
]


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _rung_source(rung: str, wl: Workload, knobs: dict) -> str:
    target = build.cuda_target("sm_90")
    return build.cuda_source(build.build(schedules.get(wl.op, rung).apply(wl, target, **knobs),
                                         target))


def _any_m_source(layer: LayerShape, bucket: Bucket, max_tokens: int, knobs: dict) -> str:
    entry = schedules.get("gemm", V8)
    chosen = entry.defaults_for(layer.gemm(bucket.most(max_tokens)), knobs)
    candidate = Candidate(V8, tuple(sorted(chosen.items())))
    return build.cuda_source(build_candidate(layer, bucket, candidate, max_tokens, "sm_90"))


CASES = ([(case, lambda wl=wl, knobs=knobs: _rung_source("v8", wl, knobs))
          for case, wl, knobs in V8_CASES]
         + [(case, lambda args=args: _any_m_source(*args)) for case, *args in V8_ANY_M_CASES]
         + [(case, lambda rung=rung, wl=wl, knobs=knobs: _rung_source(rung, wl, knobs))
            for case, rung, wl, knobs in OTHER_CASES])


def _golden() -> dict:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.mark.parametrize("case, source", CASES, ids=[case for case, _ in CASES])
def test_generated_cuda_is_byte_identical_to_its_golden_digest(case, source):
    digest = _digest(source())
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps({**_golden(), case: digest}, indent=1, sort_keys=True) + "\n")
    expected = _golden().get(case)
    assert expected is not None, f"{GOLDEN} has no digest for {case}: run `{REGENERATE}`"
    assert digest == expected, (f"{case}'s CUDA changed; if that is intended, run `{REGENERATE}` "
                                "and review the kernels' diff")
