"""Measurement on the GPU: correctness against float64, timing, the card's ceilings, baselines.

Every kernel, TVM's or cuBLAS's, goes through the same `time_kernel` harness: warm-up, then
CUDA events around each timed launch, the L2 cache flushed before each one (see FLUSHES), and
the median with min and max reported.
"""

from __future__ import annotations

import functools
import math
import subprocess
from typing import Callable

from facts import FLUSHES, SCALE_EXPONENTS, SEARCH_BUDGET_MS
from facts.record import Timing  # what time_kernel gives: the timing a record carries
from schedules import fp4
from schedules.errors import KernelFailed, UsageError
from schedules.workloads import DTYPE_BYTES, FP8, FP8_BLOCK, Workload

# fp8: the tensor cores add e4m3 products in an accumulator of fewer bits than float32's (v8, and
# torch._scaled_mm with use_fast_accum, which then err alike): 1.3e-3 at K = 4096 and 2e-3 at 8192
# on an H100 with a 16-bit C (notebook/logs/h100-v8-check-fp8-2026-11-24.log), growing about as
# sqrt(K); the 16-bit inputs' 1e-2 leaves room for K in the hundreds of thousands.
TOLERANCE = {"float32": 1e-5, "tf32": 1e-3, "float16": 1e-2, "bfloat16": 1e-2, FP8: 1e-2,
             fp4.NAME: 1e-3}


def tolerance(wl: Workload, tf32: bool = False) -> float:
    """The error a correct kernel may have: that of its input dtype (TF32 for cuBLAS's TF32
    row), or of its output dtype where that rounds more."""
    return max(TOLERANCE["tf32" if tf32 else wl.dtype], TOLERANCE[wl.out_dtype])


def _torch():
    import torch  # lazy: seconds to import; only a GPU check or measurement needs it

    return torch


def gpu_present() -> bool:
    torch = _torch()
    return torch.cuda.is_available()


def device_facts() -> dict:
    """Name, driver, arch, SM count and L2 size of GPU 0."""
    torch = _torch()
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        driver = "unknown"
    return {
        "gpu": props.name,
        "driver": driver,
        "arch": f"sm_{props.major}{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_bytes": props.L2_cache_size,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def timing_method(flush: str) -> str:
    return (f"CUDA events around each launch, {FLUSHES[flush]} queued before each one so the "
            "launch is already waiting when the GPU reaches it; median of many after warm-up")


FLUSH_BYTES = 256 << 20
SLEEP_CYCLES = 200_000  # ~100 us at H100 clocks: the GPU waits while the CPU queues the launch
BUDGET_MS = 1500.0  # timing budget of a schedule the runner was asked for
SLOWER_THAN_BEST = 2.0  # a search candidate whose first launch takes this many times the best
CUTOFF_SAMPLES = 3  # so far cannot be the best: it is timed with this many samples only


def time_kernel(
    run: Callable[[], object],
    flush: str = "read",
    budget_ms: float = BUDGET_MS,
    max_samples: int = 200,
    min_samples: int = 10,
    cutoff_ms: float | None = None,
) -> Timing:
    """Median time of `run()` on the GPU, one launch per sample between two CUDA events.

    Before each sample the GPU gets work of its own (an L2 flush, or a sleep with a warm L2)
    and the launch is queued behind it, so the CPU's launch cost never shows in the number.
    A kernel whose first timed launch takes longer than `cutoff_ms` (a search's candidate far
    slower than its best) gets CUTOFF_SAMPLES samples and no warm-up."""
    torch = _torch()
    run()  # first launch: module load, lazy initialisation
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end), 1e-3)
    hopeless = cutoff_ms is not None and estimate > cutoff_ms
    for _ in range(0 if hopeless else max(1, int(min(50.0, budget_ms / 10) / estimate))):
        run()  # warm-up, clocks up
    samples = CUTOFF_SAMPLES if hopeless else int(min(max_samples, max(min_samples,
                                                                      budget_ms / estimate)))
    if flush in ("read", "write"):
        nbytes = max(FLUSH_BYTES, 2 * torch.cuda.get_device_properties(0).L2_cache_size)
        buffer = torch.zeros(nbytes // 4, dtype=torch.int32, device="cuda")
        busy = buffer.sum if flush == "read" else buffer.zero_
    else:
        busy = lambda: torch.cuda._sleep(SLEEP_CYCLES)  # noqa: E731
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(samples)
    ]
    for begin, finish in events:
        busy()
        begin.record()
        run()
        finish.record()
    torch.cuda.synchronize()
    times = sorted(b.elapsed_time(f) for b, f in events)
    return Timing(
        median_ms=times[len(times) // 2],
        min_ms=times[0],
        max_ms=times[-1],
        samples=samples,
        method=timing_method(flush),
    )


# -- correctness -------------------------------------------------------------------------------

def torch_dtype(name: str):
    """The torch dtype of one of the workload dtypes (they share their names)."""
    return getattr(_torch(), name)


# Per element an nvfp4 check decodes (B's and x's): its float64 value, as much again while the
# decode interleaves both nibbles' values, and the float16 copy the cuBLAS baseline holds.
DECODE_BYTES = 8 + 8 + 2
SCALE_DRAW_BYTES = 8  # per scale drawn: its float32 exponent and its float32 power of two


def bytes_needed(wl: Workload) -> int:
    """GPU memory one check of `wl` holds at its peak: the inputs (created in float32, then
    cast), the output, and the float64 copies of the inputs and the reference answer. nvfp4:
    its buffers, the scales' draw, and the decoded values (DECODE_BYTES each) in their place."""
    shapes = wl.buffer_shapes()
    *inputs, output = (math.prod(shape) for shape in shapes.values())
    if wl.is_nvfp4:
        count = lambda *names: sum(math.prod(shapes[name]) for name in names)  # noqa: E731
        return (wl.min_bytes + count("B_scale", "x_scale") * SCALE_DRAW_BYTES
                + count("B", "x") * fp4.PER_BYTE * DECODE_BYTES + output * 8)
    return (sum(inputs) * (4 + DTYPE_BYTES[wl.dtype] + 8)
            + output * (DTYPE_BYTES[wl.out_dtype] + 8))


def require_memory(wl: Workload) -> None:
    """Refuse, before anything is allocated, a workload whose check would not fit in the
    GPU's free memory."""
    free, total = _torch().cuda.mem_get_info()
    needed = bytes_needed(wl)
    if needed > free:
        raise UsageError(f"{wl.label()} needs {needed / 2**30:.1f} GiB of GPU memory to check "
                         f"(its buffers and their float64 copies); the GPU has "
                         f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB")


FP8_SCALE_RANGE = (0.5, 2.0)  # fp8's per-tensor scales: float32, uniform in this range


def random_inputs(wl: Workload, seed: int = 0) -> list:
    """Standard-normal inputs (never zeros) on the GPU, in the workload's input dtype (fp8:
    rounded to e4m3, and its scales as FP8_SCALE_RANGE draws them); nvfp4's codes and scales as
    `nvfp4_inputs` draws them."""
    torch = _torch()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if wl.is_nvfp4:
        return nvfp4_inputs(wl, gen, "cuda")
    shapes = [tuple(int(d) for d in t.shape) for t in wl.tensors()[:-1]]
    dense = [
        torch.randn(s, generator=gen, device="cuda", dtype=torch.float32).to(torch_dtype(wl.dtype))
        for s in shapes[:2]
    ]
    low, high = FP8_SCALE_RANGE
    scales = [torch.rand(s, generator=gen, device="cuda") * (high - low) + low for s in shapes[2:]]
    return dense + scales


def nvfp4_inputs(wl: Workload, gen, device) -> list:
    """nvfp4's inputs [B, B_scale, x, x_scale] from torch generator `gen` on `device`: codes as
    uniformly random bytes, so every e2m1 code occurs in both nibbles, and scales 2^u (see
    SCALE_EXPONENTS) rounded to e4m3, which keep y finite and far from float16's overflow for K
    up to 64k: y's elements have an rms of about 6 sqrt(K), 1.6k at K = 64k (float16: 65504)."""
    torch = _torch()
    shapes, dtypes = wl.buffer_shapes(), wl.buffer_dtypes()
    low, high = SCALE_EXPONENTS

    def draw(name):
        if dtypes[name] == fp4.CODE_BYTES:
            return torch.randint(0, 256, shapes[name], generator=gen, device=device,
                                 dtype=torch.uint8)
        exponent = torch.rand(shapes[name], generator=gen, device=device) * (high - low) + low
        return torch.exp2(exponent).to(torch_dtype(fp4.SCALE_DTYPE))

    return [draw(name) for name in list(shapes)[:-1]]


@functools.cache
def _values(dtype, device):
    """fp4.VALUES as a tensor of `dtype` on `device`, made once: a decode inside a timed call
    copies nothing from the host."""
    return _torch().tensor(fp4.VALUES, dtype=dtype, device=device)


def dequantize(codes, scales, dtype):
    """nvfp4's values in torch dtype `dtype`: packed codes (..., K/2) uint8, the lower element in
    the low nibble, times their e4m3 scales (..., K/16), one per 16 elements, as (..., K)."""
    torch = _torch()
    table = _values(dtype, codes.device)
    values = torch.stack((table[(codes & 15).long()], table[(codes >> 4).long()]), dim=-1)
    blocks = values.view(*codes.shape[:-1], -1, fp4.BLOCK)
    blocks.mul_(scales.to(dtype).unsqueeze(-1))
    return blocks.view(*codes.shape[:-1], -1)


def block_dequantize(values, scales, block_rows: int, dtype):
    """fp8's block-scaled values (R x C) in torch dtype `dtype`, each times its block's scale
    (scales: ceil(R / block_rows) x ceil(C / FP8_BLOCK); A's blocks are 1 row, B's FP8_BLOCK):
    the multiply in `dtype`, by broadcasting where the blocks divide the values, else with
    the scales repeated out to every element (a last block shorter than the others)."""
    rows, cols = values.shape
    if rows % block_rows == 0 and cols % FP8_BLOCK == 0:
        blocks = values.to(dtype).view(rows // block_rows, block_rows, cols // FP8_BLOCK,
                                       FP8_BLOCK)
        return (blocks * scales.to(dtype)[:, None, :, None]).view(rows, cols)
    spread = scales.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)
    return values.to(dtype) * spread[:, :cols].to(dtype)


def operands(wl: Workload, inputs: list, dtype) -> list:
    """The op's two dense operands (GEMM: A, B; GEMV: B, x) in torch dtype `dtype`: the inputs
    converted (fp8's times their scales), or nvfp4's codes dequantized with their scales."""
    if wl.is_nvfp4:
        codes_b, scales_b, codes_x, scales_x = inputs
        return [dequantize(codes_b, scales_b, dtype), dequantize(codes_x, scales_x, dtype)]
    if wl.block_scaled:  # A's per row per 128 K, B's (N x K) per 128 x 128 block
        a, b, scale_a, scale_b = inputs
        return [block_dequantize(a, scale_a, 1, dtype),
                block_dequantize(b, scale_b, FP8_BLOCK, dtype)]
    if wl.is_fp8:  # a scale per tensor, or per row of A and of B (N x K)
        a, b, scale_a, scale_b = inputs
        return [a.to(dtype) * scale_a.to(dtype).view(-1, 1),
                b.to(dtype) * scale_b.to(dtype).view(-1, 1)]
    return [t.to(dtype) for t in inputs]


def poisoned_output(wl: Workload):
    """The output buffer, filled with NaN so that an element nobody wrote fails the check."""
    torch = _torch()
    shape = tuple(int(d) for d in wl.tensors()[-1].shape)
    return torch.full(shape, float("nan"), device="cuda", dtype=torch_dtype(wl.out_dtype))


def reference(wl: Workload, inputs: list):
    """The exact answer, computed in float64 where the inputs are (the GPU)."""
    torch = _torch()
    a, b = operands(wl, inputs, torch.float64)
    if wl.op == "gemm":
        return a @ (b if wl.layout == "nn" else b.T)
    if wl.op == "gemv":
        return a @ b
    return torch.bmm(a, b.unsqueeze(-1)).squeeze(-1)


def relative_error(out, ref) -> float:
    """||out - ref||_F / ||ref||_F; infinite when anything is NaN or infinite."""
    torch = _torch()
    out = out.to(torch.float64)
    if not bool(torch.isfinite(out).all()):
        return math.inf
    return float(torch.linalg.norm(out - ref) / torch.linalg.norm(ref))


def largest_scaled_error(wl: Workload, inputs: list, ref, out) -> float:
    """fp8's error measure with scales per tensor (issue 52): the largest of each output's
    error against `ref`, over sqrt(K) rms(A) rms(B) times the two scales."""
    a, b, scale_a, scale_b = inputs[:4]
    scale = (wl.dims["K"] ** 0.5 * a.float().pow(2).mean().sqrt()
             * b.float().pow(2).mean().sqrt() * scale_a * scale_b)
    return float(((out.double() - ref).abs() / scale.double()).max())


# -- what gets measured ------------------------------------------------------------------------


def tvm_runner(executable, wl: Workload, inputs: list, out) -> Callable[[], object]:
    """A no-argument launch of the built TVM function on `inputs`, writing `out`."""
    import tvm_ffi  # lazy: no TVM at measure's top, so workers load torch before TVM

    func = executable["main"]

    def run():
        with tvm_ffi.use_torch_stream():
            func(*inputs, out)
        return out

    return run


WIDENING = {("float16", "float32"), ("bfloat16", "float32")}  # torch's mm/bmm out_dtype=
TORCH_CALLS = {"gemm": "mm", "gemv": "mv", "batched_gemv": "bmm"}
DEQUANTIZED = "float16"  # what nvfp4's baselines multiply: every value times its scale is exact
BLOCK_DEQUANTIZED = "bfloat16"  # what block-scaled fp8's dequantizing baseline multiplies
SCALED_MM_FORMS = {"row": "rowwise scales, ", "block": "block scales 1x128 and 128x128, "}


def dense_dtype(wl: Workload) -> str:
    """The dtype torch multiplies `wl`'s operands in: the input dtype, or nvfp4's DEQUANTIZED."""
    return DEQUANTIZED if wl.is_nvfp4 else wl.dtype


def torch_call(wl: Workload, fast_accum: bool = False) -> str:
    """The torch call that multiplies `wl`'s dense operands: one that writes the workload's
    output dtype, as the TVM kernels do. 16-bit inputs with a float32 output use cuBLAS's own
    float32 epilogue (`out_dtype=torch.float32`); fp8 takes `torch._scaled_mm`, which scales
    and writes any of them (with `fast_accum`, adding in the tensor cores' own accumulator, as
    v8 does, not moved to a float32 sum every few K steps); any other pair of dtypes has no
    such call, so the result is cast by a second kernel, and the name says so."""
    if wl.is_fp8:
        form = SCALED_MM_FORMS.get(wl.scales, "")
        return (f"torch._scaled_mm({form}out_dtype={wl.out_dtype}"
                f"{', use_fast_accum=True' if fast_accum else ''})")
    call, dtype = TORCH_CALLS[wl.op], dense_dtype(wl)
    if wl.out_dtype == dtype:
        return f"torch.{call}"
    if (dtype, wl.out_dtype) in WIDENING:
        return f"torch.{'bmm' if wl.op == 'batched_gemv' else 'mm'}(out_dtype={wl.out_dtype})"
    return f"torch.{call} + cast to {wl.out_dtype}"


def cublas_call(wl: Workload, fast_accum: bool = False) -> str:
    """Which torch call times cuBLAS for `wl` (torch_call); nvfp4's multiplies B and x decoded
    before it is timed, and says so."""
    call = torch_call(wl, fast_accum)
    return f"{call} on {DEQUANTIZED} B and x (dequantized beforehand)" if wl.is_nvfp4 else call


def dequantized_gemm(wl: Workload) -> Workload:
    """The bfloat16 GEMM that block-scaled fp8's dequantizing baseline multiplies."""
    return Workload("gemm", wl.shape, BLOCK_DEQUANTIZED, wl.out_dtype, wl.layout)


def dequantizing_call(wl: Workload) -> str:
    """What `dequantizing_runner` times for an nvfp4 or a block-scaled fp8 `wl`."""
    if wl.block_scaled:
        return (f"dequantize A and B to {BLOCK_DEQUANTIZED} with their block scales, then "
                f"{torch_call(dequantized_gemm(wl))}")
    return f"dequantize B and x to {DEQUANTIZED}, then {torch_call(wl)}"


def cublas_runner(wl: Workload, inputs: list, tf32: bool = False,
                  fast_accum: bool = False) -> Callable[[], object]:
    """torch's own call for the op (cuBLAS mm / mv / bmm / _scaled_mm; see cublas_call), on
    `inputs` (nvfp4's dequantized here, before any launch)."""
    torch = _torch()
    out = torch_dtype(wl.out_dtype)
    if wl.is_fp8:  # rowwise: A's scales as a column (M x 1), B's as a row (1 x N)
        a, b, scale_a, scale_b = inputs
        if wl.rowwise:
            scale_a, scale_b = scale_a.view(-1, 1), scale_b.view(1, -1)
        if wl.block_scaled:  # operands made ready once, outside the timed call
            m = a.shape[0]
            a, scale_a, scale_b = cublas_block_operands(a, scale_a, scale_b)
            return lambda: torch._scaled_mm(a, b.T, scale_a, scale_b, out_dtype=out)[:m]
        return lambda: torch._scaled_mm(a, b.T, scale_a, scale_b, out_dtype=out,
                                        use_fast_accum=fast_accum)
    a, b = operands(wl, inputs, torch_dtype(DEQUANTIZED)) if wl.is_nvfp4 else inputs
    widen = {"out_dtype": out} if (dense_dtype(wl), wl.out_dtype) in WIDENING else {}
    if wl.op == "gemm":
        rhs = b if wl.layout == "nn" else b.T
        multiply = lambda: torch.mm(a, rhs, **widen)  # noqa: E731
    elif wl.op == "gemv":
        column = b.unsqueeze(-1)
        multiply = (lambda: torch.mm(a, column, **widen).squeeze(-1)) if widen else \
            (lambda: torch.mv(a, b))
    else:
        column = b.unsqueeze(-1)
        multiply = lambda: torch.bmm(a, column, **widen).squeeze(-1)  # noqa: E731

    def run():
        torch.backends.cuda.matmul.allow_tf32 = tf32
        return multiply().to(out)  # no kernel where the dtype is already `out`

    return run


CUBLAS_BLOCK_K = 4 * FP8_BLOCK  # K of cuBLAS's block scales: whole groups of 4 K blocks


def cublas_block_scales(K: int, scale_a, scale_b) -> tuple:
    """Block scales as cuBLAS's DeepSeek recipe takes them through torch._scaled_mm (CUDA 12.9
    on): A's M x K/128 and B's (as the K x N operand B^T) K/128 x N/128, both stored outer
    dimension first (column-major). Refused where K is not whole CUBLAS_BLOCK_K: torch 2.11
    then answers wrongly (K = 640 on an H200: relative error 0.54), refuses the scales padded
    to 4 K blocks, or refuses A's rows (K not a multiple of 16)."""
    if K % CUBLAS_BLOCK_K:
        raise UsageError(f"torch._scaled_mm's block scales (cuBLAS) take K in whole multiples "
                         f"of {CUBLAS_BLOCK_K} ({CUBLAS_BLOCK_K // FP8_BLOCK} K blocks), not "
                         f"K={K}")
    return scale_a.t().contiguous().t(), scale_b.contiguous().t()


CUBLAS_BLOCK_ROWS = 4  # cuBLAS's block-scaled GEMM takes A in whole groups of 4 rows


def cublas_block_operands(a, scale_a, scale_b) -> tuple:
    """A (M x K) and the block scales (A's M x K/128, B's N/128 x K/128) as cuBLAS's
    block-scaled GEMM takes them through torch._scaled_mm: the scales laid out by
    cublas_block_scales, and where M is not whole CUBLAS_BLOCK_ROWS, which cuBLAS refuses
    (CUBLAS_STATUS_NOT_SUPPORTED; torch 2.11, CUDA 13, H200), A and its scales padded to them
    with zero rows (the product's rows past M are then padding)."""
    torch = _torch()
    (m, k), pad = a.shape, -a.shape[0] % CUBLAS_BLOCK_ROWS
    if pad:
        padded = torch.zeros((m + pad, k), dtype=a.dtype, device=a.device)
        padded[:m] = a
        a = padded
        scale_a = torch.cat([scale_a, scale_a.new_ones((pad, scale_a.shape[1]))])
    return (a, *cublas_block_scales(k, scale_a, scale_b))


def cublas_block_scaled_mm(a, b, scale_a, scale_b, out_dtype, out=None):
    """torch._scaled_mm's block-scaled form on A (M x K) and B (N x K, taken as its transpose)
    with their block scales, A and the scales made ready by cublas_block_operands in the call
    (as a layer calling it pays for that), into `out` where given; the padding rows cut off."""
    m = a.shape[0]
    a, scale_a, scale_b = cublas_block_operands(a, scale_a, scale_b)
    if a.shape[0] == m:
        return _torch()._scaled_mm(a, b.T, scale_a, scale_b, out_dtype=out_dtype, out=out)
    y = _torch()._scaled_mm(a, b.T, scale_a, scale_b, out_dtype=out_dtype)[:m]
    return y if out is None else out.copy_(y)


def dequantizing_runner(wl: Workload, inputs: list) -> Callable[[], object]:
    """What a user without a fused kernel runs, both steps in every launch: nvfp4's B and x
    dequantized to DEQUANTIZED, then torch's call (cublas_runner); block-scaled fp8's A and B
    times their block scales in BLOCK_DEQUANTIZED, then torch's bfloat16 GEMM."""
    if wl.block_scaled:
        dense, dtype = dequantized_gemm(wl), torch_dtype(BLOCK_DEQUANTIZED)
        return lambda: cublas_runner(dense, operands(wl, inputs, dtype))()
    return lambda: cublas_runner(wl, inputs)()


def check(wl: Workload, run: Callable[[], object], inputs: list, tolerance: float) -> dict:
    """Run once and compare with the float64 reference. Returns the fields of a measurement
    record: status ("ok" or "failed", with the error), rel_error, tolerance."""
    torch = _torch()
    out = run()
    torch.cuda.synchronize()
    if out.dtype != torch_dtype(wl.out_dtype):  # like for like: every kernel writes wl's dtype
        return {"status": "failed", "error": f"writes {out.dtype}, not {wl.out_dtype}"}
    err = relative_error(out, reference(wl, inputs))
    result = {"rel_error": err if math.isfinite(err) else None, "tolerance": tolerance}
    if not err <= tolerance:
        return {**result, "status": "failed", "error": f"relative error {err:.3g} > {tolerance:g}"}
    return {**result, "status": "ok"}


def check_and_time(
    wl: Workload, run: Callable[[], object], inputs: list, tolerance: float, flush: str,
    budget_ms: float = BUDGET_MS, cutoff_ms: float | None = None,
) -> dict:
    """`check`, and only a correct kernel is then timed (time_kernel's cutoff_ms). Returns the
    fields of a measurement record: status, rel_error, tolerance, timing (a Timing)."""
    result = check(wl, run, inputs, tolerance)
    if result["status"] != "ok":
        return result
    timing = time_kernel(run, flush=flush, budget_ms=budget_ms, cutoff_ms=cutoff_ms)
    return {**result, "timing": timing}


class WrongResult(KernelFailed):
    """A search candidate that ran and failed its check against float64; the message says how."""


def evaluate_artifact(wl: Workload, flush: str, artifact_path: str,
                      best_ms: float | None = None) -> float:
    """A search candidate, built and exported by a builder: check it against float64 on random
    inputs, then time it with this module's harness (a short budget; CUTOFF_SAMPLES only where
    it is SLOWER_THAN_BEST times `best_ms`, the search's best so far). Returns the median in
    seconds; a wrong result raises WrongResult."""
    import tvm  # lazy: no TVM at measure's top, so workers load torch before TVM

    executable = tvm.runtime.load_module(artifact_path)
    inputs = random_inputs(wl)
    runner = tvm_runner(executable, wl, inputs, poisoned_output(wl))
    result = check_and_time(wl, runner, inputs, tolerance(wl), flush, SEARCH_BUDGET_MS,
                            cutoff_ms=None if best_ms is None else SLOWER_THAN_BEST * best_ms)
    if result["status"] != "ok":
        raise WrongResult(result["error"])
    return result["timing"].median_ms * 1e-3


def read_bandwidth_gbps(nbytes: int = 1 << 30, flush: str = "read") -> tuple[float, Timing]:
    """A sum over `nbytes` of float32 on the device, counting bytes read: the rate a kernel that
    reads its inputs once and writes next to nothing (a GEMV) can reach."""
    torch = _torch()
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    timing = time_kernel(src.sum, flush=flush)
    return nbytes / (timing.median_ms * 1e-3) / 1e9, timing


def copy_bandwidth_gbps(nbytes: int = 1 << 30, flush: str = "read") -> tuple[float, Timing]:
    """Device-to-device copy of `nbytes`, counting bytes read plus bytes written."""
    torch = _torch()
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    timing = time_kernel(lambda: dst.copy_(src), flush=flush)
    return 2 * nbytes / (timing.median_ms * 1e-3) / 1e9, timing


def gemm_tflops(wl: Workload, flush: str = "read") -> tuple[float, Timing]:
    """The rate cuBLAS reaches on the GEMM `wl` (TF32 off), timed by `time_kernel` like every
    kernel: the compute ceiling a run reads its GEMMs against."""
    timing = time_kernel(cublas_runner(wl, random_inputs(wl)), flush=flush)
    return wl.flops / (timing.median_ms * 1e-3) / 1e12, timing
