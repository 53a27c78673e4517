"""The TileLang seed's Triton GEMV (`_gemv_naive`), as a baseline: one program per output row,
the whole of K in one block. Batched GEMV runs the same kernel with the batch on program axis 1.
Import only where triton is installed (the GPU machine)."""

from __future__ import annotations

import triton
import triton.language as tl

from schedules.workloads import Workload


@triton.jit
def _gemv_naive(x_ptr, A_ptr, y_ptr, N, K, BLOCK_SIZE_K: tl.constexpr):
    # The seed's kernel, plus the batch offset (program axis 1; 0 for plain GEMV).
    batch = tl.program_id(1)
    A_ptr += batch * N * K
    x_ptr += batch * K
    y_ptr += batch * N
    n = tl.program_id(0)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    mask = offs_k < K
    a_ptrs = A_ptr + n * K + offs_k
    a_vals = tl.load(a_ptrs, mask=mask, other=0.0)
    x_vals = tl.load(x_ptr + offs_k, mask=mask, other=0.0)
    dot = tl.sum(a_vals * x_vals, axis=0)
    tl.store(y_ptr + n, dot)


def runner(wl: Workload, inputs: list, out):
    """A no-argument launch of the seed's kernel on (B, x) writing `out`."""
    matrix, vector = inputs
    batch, (n, k) = wl.dims.get("L", 1), matrix.shape[-2:]
    block_k = triton.next_power_of_2(k)

    def run():
        _gemv_naive[(n, batch)](vector, matrix, out, n, k, BLOCK_SIZE_K=block_k)
        return out

    return run
