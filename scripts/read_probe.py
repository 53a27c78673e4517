"""How fast can a kernel that only reads N bytes go, in this project's harness? (issue 23)

The read-bandwidth ceiling of a run (tuning.measure.read_bandwidth_gbps) is a sum over 1 GiB;
the nvfp4 seed's shapes move 33-132 MB, where a launch's ramp-up and tail weigh more. For each
size, this times the ceiling's own float32 sum, then a plain Triton read swept over block sizes
and warps (one program per BLOCK int32 words: vector loads, a sum, one word written), all with
time_kernel's L2 flush and CUDA events.
Usage, on the GPU machine: python scripts/read_probe.py [MB ...]  (default: 1073.7 132.2 66.1 33.1)
"""

import sys

import torch
import triton
import triton.language as tl

from tuning.measure import read_bandwidth_gbps, time_kernel


@triton.jit
def read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + pid, tl.sum(v))


def fastest_read_us(n_words: int) -> tuple[float, int, int]:
    """The best median time of read_kernel over n_words int32 words, with its BLOCK and warps."""
    x = torch.randint(0, 1 << 20, (n_words,), dtype=torch.int32, device="cuda")
    best = None
    for block in (1024, 2048, 4096, 8192, 16384):
        for warps in (4, 8, 16):
            grid = triton.cdiv(n_words, block)
            out = torch.empty(grid, dtype=torch.int32, device="cuda")
            us = time_kernel(lambda: read_kernel[(grid,)](x, out, n_words, BLOCK=block,
                                                          num_warps=warps)).median_ms * 1e3
            best = min(best or (us, block, warps), (us, block, warps))
    return best


for mb in map(float, sys.argv[1:] or ("1073.7", "132.2", "66.1", "33.1")):
    nbytes = int(mb * 1e6) // 4 * 4
    gbps, timing = read_bandwidth_gbps(nbytes)
    us, block, warps = fastest_read_us(nbytes // 4)
    print(f"{mb} MB: float32 sum (the run's read ceiling) {timing.median_ms * 1e3:.1f} us = "
          f"{gbps:.0f} GB/s; Triton read best {us:.1f} us (BLOCK {block}, {warps} warps) = "
          f"{nbytes / us / 1e3:.0f} GB/s", flush=True)
