"""Hopper GEMM written whole as a TIRx kernel (v8): TMA loads into a ring of shared stages, one
mbarrier pair per stage, warp specialization and a persistent tile loop, wgmma as in v7.

No s_tir schedule primitive produces TMA, mbarriers or a warp-specialized kernel, so v8 is a
kernel template: `v8_kernel(wl, **knobs)` (the rung's `compute`) writes the whole kernel in TVM
0.27's TIRx (`T.device_entry`, `T.cta_id`, `T.ptx`), with the workload's buffers A, B and C, and
refuses what the template cannot take; the schedule function only checks the target's arch.
It is built with TVM's "tirx" pipeline (tuning/build.py tells such kernels by the TIRX_KERNEL
attribute they carry).

The family, one module per concern:
- geometry: tile, box and arena arithmetic (bytes, K blocks, accumulators, partials);
- cuda: the PTX instructions and inline CUDA helpers, descriptors and tensor maps;
- refusals: what v8 cannot take, each reason in one line;
- heuristic: the knobs v8 picks for a shape (`tma_tiles`);
- knobs: the frozen `Knobs`;
- plan: the frozen `Plan`, every derived quantity, built once from (workload, knobs, SMs)
  and checked by the refusals;
- kernel: the kernel composed of named pieces (producer, K loop, split K, epilogues);
- rung: the registration and the kernel's entry points.

Ragged M, N and K: TMA fills the parts of a box past the tensor's edge with zeros (and still
counts the whole box's bytes), so the main loop has no predicates; the epilogue guards its
stores, or (tma_store) sends C out in boxes that TMA clips at C's edges. What TMA cannot take
is a row stride that is not a whole number of 16 bytes (bf16 K = 4095): the kernel first copies
such an operand into a workspace of rows padded with zeros to 16-byte multiples, every CTA a
share, and after a barrier of the whole grid loads the copy by TMA (`stage_rows`).

swap_ab (nt): the plan is built for the product C^T = B A^T (the workload's N x M x K), so that
B's rows lie on the tile's rows and A's on its columns, which wgmma takes in any multiple of 8;
only the kernel's parameters (the workload's own A, B, scales and C) and C's stores, transposed
from registers, know of the swap.

fp8 (e4m3) inputs (workloads.FP8, layout nt only: fp8 wgmma has no transposed operands): k32
wgmmas on 128-element K blocks (the same 128-byte rows), loaded by TMA as bytes; the kernel
takes the two per-tensor scales after B and multiplies the float32 accumulators by their
product just before C is stored (after split K's sum); rowwise, each by its row's and its
column's; block scales (DeepGEMM's), each K block's sums by the K block's scales of their row
and of their 128-column block as they are promoted into float32 (promote_k = 128).
"""

from .geometry import ELEMENT_BYTES, any_m_partial_bytes, k_block_count, workload_k_blocks
from .heuristic import (MEDIUM_ROWS, MEDIUM_TILES, halves_tile, one_consumer_tile, short_overlap,
                        split_cut_tile, swapped_one_consumer_tile, wave_tile)
from .refusals import workload_refusal
from .rung import v8, v8_kernel, v8_kernel_any_m, v8_refusals

__all__ = ["ELEMENT_BYTES", "MEDIUM_ROWS", "MEDIUM_TILES", "any_m_partial_bytes",
           "halves_tile", "k_block_count", "one_consumer_tile", "short_overlap", "split_cut_tile",
           "swapped_one_consumer_tile", "v8", "v8_kernel", "v8_kernel_any_m", "v8_refusals",
           "wave_tile", "workload_k_blocks", "workload_refusal"]
