"""v8 (schedules/v8/): the TIRx kernel builds, and nvcc compiles it for sm_90a, on aligned,
ragged and decode-sized shapes; its CUDA has what the rung's docstring claims; it refuses what
TMA and its tiles cannot take; tuning/build.py lowers it with the tirx pipeline."""

import os
import re
import shutil
import subprocess
import tempfile

import pytest

import schedules
from schedules import ScheduleNotApplicable, Workload
from schedules.v8.cuda import SETTLE
from schedules.v8.geometry import box_bytes
from schedules.workloads import FP8
from tuning import build

needs_nvcc = pytest.mark.skipif(not shutil.which("nvcc"),
                                reason="nvcc is not on PATH: the generated CUDA is not compiled")


def gemm(shape, dtype="float16", out_dtype=None, layout="nn"):
    return Workload("gemm", shape, dtype, out_dtype, layout)


BUILDS = [
    gemm((4096, 4096, 4096), "float16", "float16", "nt"),  # aligned, 16-bit C
    gemm((4096, 4096, 4096), "bfloat16", layout="nn"),
    gemm((1000, 1000, 1000), "bfloat16", "bfloat16", "nt"),  # ragged M, N, K
    gemm((100, 304, 40), "float16", "float16", "nn"),  # all ragged; K shorter than a block
    gemm((16, 6144, 4096), "bfloat16", layout="nt"),  # decode: 64-row tiles split along N
    gemm((1, 256, 64), "float16", "float16", "nn"),
    gemm((37, 200, 72), "float16", layout="nn"),
    gemm((128, 4096, 4096), "bfloat16", "bfloat16", "nt"),  # split K (the heuristic's 2)
    gemm((4096, 4096, 4096), FP8, layout="nt"),  # fp8, bfloat16 C
    gemm((1000, 1000, 1008), FP8, "float32", "nt"),  # fp8, ragged M and N, split K
    gemm((16, 6144, 4096), FP8, "float16", "nt"),  # fp8 decode batch
    gemm((1000, 4608, 3584), "bfloat16", layout="nt"),  # one wave of 256x144 tiles
]


@needs_nvcc
@pytest.mark.parametrize("wl", BUILDS, ids=Workload.label)
def test_v8_builds_and_nvcc_compiles_it_without_spills(wl, compiled):
    _, source, summary = compiled("v8", wl)
    (usage,) = build.nvcc_resources(source, "sm_90").values()
    assert usage["registers"] <= 168 and not usage.get("spill_stores") and not usage.get("stack_bytes")
    assert summary.block == {"threadIdx.x": 384} and summary.kernels == 1


@needs_nvcc
@pytest.mark.parametrize("knobs, wgmma", [({"block_m": 64, "block_n": 64}, "m64n32k16"),
                                          ({"block_m": 128, "block_n": 80}, "m64n80k16"),
                                          ({"block_m": 256, "block_n": 176}, "m64n176k16")])
def test_v8_takes_b_in_widths_of_16_columns_in_nt(knobs, wgmma, compiled):
    """nt loads B's rows whole, so a consumer's share of block_n need only be whole 16-column
    pieces of C (how the epilogue stores it), not nn's 64-column boxes."""
    _, source, _ = compiled("v8", gemm((300, 520, 272), "bfloat16", "bfloat16", "nt"), **knobs)
    assert f"wgmma.mma_async.sync.aligned.{wgmma}.f32.bf16.bf16" in source
    (usage,) = build.nvcc_resources(source, "sm_90").values()
    assert not usage.get("spill_stores")


def test_v8_cuda_is_a_persistent_warp_specialized_tma_kernel(compiled):
    wl = gemm((4096, 4096, 4096), "float16", "float16", "nt")
    _, source, summary = compiled("v8", wl)
    assert summary.grid == {"blockIdx.x": 132}  # one CTA per SM ...
    assert "for (int j = 0; j < 4; ++j)" in source  # ... each walking 4 of the 512 tiles
    assert "((j * 132) + ((int)blockIdx.x)) < 512" in source
    # the ring, tma_store's four boxes of 64 rows of 128 bytes, the barriers
    assert summary.shared_bytes == 4 * (128 + 256) * 128 + 1024 + 4 * 64 * 128 + 2 * 4 * 8
    assert ("(const __grid_constant__ CUtensorMap A_map, const __grid_constant__ CUtensorMap B_map, "
            "const __grid_constant__ CUtensorMap C_map)") in source
    for instruction in ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
                        "mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx", "mbarrier.init",
                        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16",
                        "setmaxnreg.dec.sync.aligned.u32 40", "setmaxnreg.inc.sync.aligned.u32 232",
                        "prefetch.tensormap"):
        assert instruction in source, instruction
    # the accumulators pass through SETTLE after the last wait, and C is converted from them
    body = source[source.index("__global__ void"):]
    assert body.index(f"{SETTLE[0]}(acc_ptr[0])") > body.index("wait_group_sync_aligned_0()")
    assert body.index("v8_stage_pair_float16(") > body.index(f"{SETTLE[0]}(acc_ptr[127])")


def test_v8_on_fp8_takes_the_scales_and_multiplies_by_their_product_before_storing_c(compiled):
    """fp8: TMA loads bytes in 128-element boxes, wgmma's e4m3 k32 form, the scales as the
    kernel's parameters after B, their product applied to each accumulator once, after the
    last wait and before the stores."""
    _, source, _ = compiled("v8", gemm((4096, 4096, 4096), FP8, layout="nt"))
    assert "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3" in source
    assert "float* __restrict__ A_scale_ptr" in source and "float* __restrict__ B_scale_ptr" in source
    body = source[source.index("__global__ void"):]
    assert body.count("float scale = (A_scale_ptr[0] * B_scale_ptr[0]);") == 1
    assert body.count("* scale);") == 128  # each of a consumer thread's accumulators
    assert body.index(f"{SETTLE[0]}(acc_ptr[127])") < body.index("* scale);") \
        < body.index("v8_stage_pair_bfloat16(")


def test_v8_takes_no_scales_where_the_inputs_are_16_bit(compiled):
    _, source, _ = compiled("v8", gemm((4096, 4096, 4096), "float16", "float16", "nt"))
    assert "scale_ptr" not in source and "float scale" not in source


def test_v8_splits_64_row_tiles_along_n_between_its_consumers(compiled):
    _, source, summary = compiled("v8", gemm((16, 6144, 4096), "bfloat16", layout="nt"))
    assert summary.grid == {"blockIdx.x": 96}  # 48 tiles of 64x128 in 2 K slices: the heuristic's
    assert "m64n64k16.f32.bf16.bf16" in source


def test_v8_stores_whole_sectors_of_c_where_its_rows_allow(compiled):
    """float32 C, N even: a thread's two neighbouring columns in one 8-byte store. 16-bit C, N a
    multiple of 4: neighbouring threads swap a pair (a shuffle every lane makes) and each stores
    4 columns in 8 bytes. Else element by element, each guarded."""
    def body(wl):
        return compiled("v8", wl)[1].split("__global__")[-1]

    fp32 = body(gemm((64, 256, 64), "bfloat16", "float32", "nt"))
    assert "v8_store_pair((&(C_ptr[" in fp32 and "C_ptr[" not in fp32.replace("(&(C_ptr[", "")
    quads = compiled("v8", gemm((64, 256, 64), "bfloat16", "bfloat16", "nt"))[1]
    assert "__shfl_xor_sync(0xffffffffu, mine, 1)" in quads and "__floats2bfloat162_rn(a0, a1)" in quads
    kernel = quads.split("__global__")[-1]
    assert "v8_store_quad_bfloat16((&(C_ptr[" in kernel and "if (" not in kernel.split("v8_settle")[-1]
    for ragged in (gemm((64, 255, 64), "bfloat16", "bfloat16", "nt"),
                   gemm((64, 254, 64), "float16", "float16", "nt")):
        scalar = body(ragged)
        assert "v8_store" not in scalar and "acc_ptr[1])" in scalar


def test_v8_stores_c_through_shared_boxes_by_tma_with_tma_store(compiled):
    """4096^3, float32 C: each consumer fills its 8 boxes of 64 rows x 32 columns in turn, two
    boxes taking turns: the first thread waits until at most one store still reads shared
    memory, the warpgroup meets at its own barrier (2 or 3), fills the box, fences it for the
    async proxy, meets again, and the first thread sends it by TMA. C is not written by any
    thread; before the kernel ends the first thread waits for every store. tma_store=False
    stores from the registers."""
    wl = gemm((4096, 4096, 4096), "bfloat16", "float32", "nt")
    body = compiled("v8", wl)[1].split("__global__")[-1]
    assert "C_ptr" not in body
    sends = body.count("cp_async_bulk_tensor_s2g_async_bulk_tensor_2d_global_shared__cta_bulk_group(")
    assert sends == 8 and body.count("cp_async_bulk_commit_group_async_bulk_commit_group()") == 8
    assert body.count("cp_async_bulk_wait_group_async_bulk_wait_group_read_1()") == 8
    assert body.count("v8_stage_pair_float32(") == 8 * 8  # a thread's 4 x 2 pairs per box
    barrier = "tvm_builtin_ptx_bar_sync_count_sync(((uint)((((int)threadIdx.x) >> 7) + 1)), (uint)128)"
    assert body.count(barrier) == 16
    at = 0
    for step in ("wait_group_read_1()", barrier, "v8_stage_pair_float32(",
                 "fence_proxy_proxy_async_shared__cta()", barrier, "_s2g_", "commit_group()"):
        at = body.index(step, at)  # each after the one before
    assert body.rindex("cp_async_bulk_wait_group_async_bulk_wait_group_0()") > body.rindex("_s2g_")
    plain = compiled("v8", wl, tma_store=False)[1].split("__global__")[-1]
    assert "_s2g_" not in plain and "v8_store_pair((&(C_ptr[" in plain


@pytest.mark.parametrize("block_m, block_n, out_dtype, span", [
    (128, 256, "float32", 128), (128, 256, "bfloat16", 128), (128, 80, "float32", 64),
    (128, 80, "bfloat16", 32), (64, 64, "bfloat16", 64), (256, 144, "float32", 64)])
def test_tma_store_boxes_have_the_widest_swizzle_that_divides_a_consumers_columns(
        block_m, block_n, out_dtype, span, compiled):
    """A consumer's columns (block_n, or half of it with 64-row tiles) go out in boxes whose
    rows are the widest swizzle span that divides their bytes; the kernel writes a box as
    TMA swizzles that span (16-byte chunk number xor bits 7 and up of the offset)."""
    assert box_bytes(block_m, block_n, out_dtype) == span
    wl = gemm((1000, 1000, 1000), "bfloat16", out_dtype, "nt")
    source = compiled("v8", wl, block_m=block_m, block_n=block_n, tma_store=True)[1]
    assert f") >> 7) & {span // 16 - 1}) << 4)" in source


def test_v8_splits_k_over_ctas_that_add_their_partials_through_a_workspace(compiled):
    """128x4096x4096 bf16: 32 tiles of 128x128 in 4 K slices (16 K blocks each) on 128 CTAs;
    each slice's consumers stash their partial tile, the count tells the last, which gathers
    the other three, rearms the counter and stores C. Without a split, none of it."""
    _, source, summary = compiled("v8", gemm((128, 4096, 4096), "bfloat16", layout="nt"),
                                  block_m=128, block_n=128, split_k=4)
    assert summary.grid == {"blockIdx.x": 128}
    tag = "128x4096x4096_128x128x4_0"  # shape, tile, slices, whole tiles before the split ones
    body = source[source.index("__global__ void"):]
    assert f"__device__ float4 v8_partials_{tag}[{128 * 16 * 256}];" in source  # 128 units
    assert f"__device__ unsigned v8_arrivals_{tag}[32];" in source
    assert body.count(f"v8_stash_{tag}(") == 16 and body.count(f"v8_gather_{tag}(") == 16
    assert "int k0 = (((((int)blockIdx.x) & 3) * 1024) + (kt * 64));" in body  # the slice's K
    stash, count = body.index(f"v8_stash_{tag}("), body.index(f"v8_arrive_{tag}(")
    last = body.index("if (arrived_ptr[0] == (uint)3)")
    assert stash < body.index("tvm_builtin_cuda_thread_fence()") < count < last
    assert last < body.index(f"v8_gather_{tag}(") < body.index(f"v8_rearm_{tag}(") \
        < body.index("C_ptr[")
    assert body.count("tvm_builtin_ptx_bar_sync_count_sync((uint)1, (uint)256)") == 2
    _, plain, _ = compiled("v8", gemm((128, 4096, 4096), "bfloat16", layout="nt"), split_k=1)
    assert "v8_partials" not in plain and "bar_sync_count" not in plain


def test_v8_splits_only_the_tiles_of_the_last_wave_with_split_tail(compiled):
    """1000x4608x3584: 144 tiles of 128x256 on 132 SMs. The first 132 units are whole tiles;
    the last 12 tiles come in 8 K slices each (7 K blocks), 96 more units, so the second round
    is an eighth of a tile long. Only those have partials and counters."""
    wl = gemm((1000, 4608, 3584), "bfloat16", layout="nt")
    _, source, summary = compiled("v8", wl, block_m=128, block_n=256, split_k=8, split_tail=True)
    assert summary.grid == {"blockIdx.x": 132}
    tag = "1000x4608x3584_128x256x8_132"
    assert f"__device__ float4 v8_partials_{tag}[{96 * 32 * 256}];" in source
    assert f"__device__ unsigned v8_arrivals_{tag}[12];" in source
    body = source[source.index("__global__ void"):]
    assert "for (int j = 0; j < 2; ++j)" in body  # 228 units: two rounds
    # a unit past the whole tiles is a slice: tile 132 + (unit - 132) / 8, 7 K blocks from
    # 7 x ((unit - 132) mod 8); a whole tile's K blocks are all 56
    assert "(((((j * 132) + ((int)blockIdx.x)) - 132) >> 3) + 132)" in body
    assert "((j < 1) ? 56 : 7)" in body.replace("((j_1 < 1) ? 56 : 7)", "((j < 1) ? 56 : 7)")
    assert "if ((turn < 1) || (arrived_ptr[0] == (uint)7))" in body  # the consumers' loop
    # 132 tiles exactly: no partial wave, so split_tail leaves the kernel as it was
    whole_waves = gemm((1536, 2816, 512), "bfloat16", layout="nt")
    assert compiled("v8", whole_waves, split_k=2, split_tail=True)[1] == compiled("v8", whole_waves)[1]


NVDISASM = shutil.which("nvdisasm")


@needs_nvcc
@pytest.mark.skipif(not NVDISASM, reason="nvdisasm is not on PATH (pip: nvidia-cuda-nvdisasm)")
def test_16_bit_c_is_converted_after_the_last_wgmma_finished(compiled):
    """The SASS: every float -> 16-bit conversion comes after the final wait for the wgmmas
    (WARPGROUP.DEPBAR.LE gsb0, 0x0). Without SETTLE, ptxas hoists them above it (16-bit C was
    wrong on an H100 by about sqrt(64/K))."""
    _, source, _ = compiled("v8", BUILDS[0])
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = os.path.join(tmp, "k.cu"), os.path.join(tmp, "k.cubin")
        with open(cu, "w") as f:
            f.write(source)
        subprocess.run(["nvcc", "-cubin", "-arch=sm_90a", "-o", cubin, cu], check=True,
                       capture_output=True)
        sass = subprocess.run([NVDISASM, "-c", cubin], check=True, capture_output=True,
                              text=True).stdout.splitlines()
    final_wait = max(i for i, line in enumerate(sass) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in line)
    conversions = [i for i, line in enumerate(sass) if re.search(r"\bF2FP?\.", line)]
    assert conversions and min(conversions) > final_wait


@needs_nvcc
def test_v8_clusters_of_two_ctas_share_a_by_multicast(compiled):
    """cluster_n=2: CTAs in pairs (a cluster launch, cluster_ctarank), each loading its half of
    A's box (64 of 128 rows) by one multicast TMA into both CTAs' stage; the empty barriers
    count one thread per consumer warpgroup and CTA (4), each freeing the stage in the CTA of
    its rank (mapa), predicated in its asm, not behind a branch in the K loop; the pair meets at
    a cluster barrier after the barriers' init, and each producer waits until every stage is
    freed before its CTA ends. cluster_n=1 has none of it, and frees stages with one thread per
    warpgroup (2). nvcc compiles both."""
    wl = gemm((4096, 4096, 4096), "bfloat16", "float32", "nt")
    clustered, plain = compiled("v8", wl, cluster_n=2)[1], compiled("v8", wl)[1]
    body = clustered.split("__global__")[-1]
    assert body.count("v8_tma_load_multicast(") == 1 and "(ushort)3)" in body
    assert "tvm_builtin_cluster_ctaid_x()) * 8192)" in body  # the rank's 64 rows of A
    assert body.count("(&(empty_ptr[0]))), (uint)4);") == 1 and body.count("v8_free_stage(") == 2
    assert "& 127) < 2))" in body and "& 127) < 2) {" not in body  # a predicate, not a branch
    assert body.index("v8_cluster_sync();") < body.index("setmaxnreg")
    tail = body[body.rindex("v8_tma_load_multicast("):body.index("setmaxnreg_inc")]
    assert "for (int i = 0; i < 4; ++i)" in tail and "mbarrier_wait((&(empty_ptr[" in tail
    kernel = plain.split("__global__")[-1]
    assert "multicast" not in kernel and "cluster_sync" not in kernel and "cluster_ctaid" not in kernel
    assert kernel.count("(&(empty_ptr[0]))), (uint)2);") == 1
    for source in (clustered, plain):
        (usage,) = build.nvcc_resources(source, "sm_90").values()
        assert usage["registers"] <= 168 and not usage.get("spill_stores")


@needs_nvcc
def test_v8_pingpong_consumers_take_turns_at_whole_tiles(compiled):
    """pingpong: each consumer multiplies whole 128x192 tiles (two m64n192 wgmmas a k step),
    every other unit of the CTA from its own first (the ring's position starts at
    consumer * 64 K blocks and skips the other's 64); one thread frees a stage (the empty
    barriers count 1); a consumer waits its turn (bar.sync 4 or 5, both warpgroups' 256
    threads) before a unit's K loop but the CTA's first, and gives the turn on (bar.arrive) after
    its last wgmmas are issued, before it waits for them, where the CTA has a next unit. The
    default consumers share each tile and take no turns. nvcc compiles it without spills."""
    wl = gemm((4096, 4096, 4096), "bfloat16", "bfloat16", "nt")
    source = compiled("v8", wl, block_n=192, stages=4, pingpong=True)[1]
    body = source.split("__global__")[-1]
    consumers = body[body.index("setmaxnreg_inc"):]
    assert "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16" in source
    assert consumers.count("m64n192k16_f32_bf16_bf16_1_1_0_0(acc_ptr[") == 8  # 4 k steps, 2 m64
    assert "(&(empty_ptr[0]))), (uint)1);" in body
    assert "used_ptr[0] = (((((int)threadIdx.x) >> 7) * 64) - 64);" in consumers
    assert "used_ptr[0] = (used_ptr[0] + 128);" in consumers
    wait = consumers.index("bar_sync_count_sync(((uint)((((int)threadIdx.x) >> 7) + 3)), (uint)256)")
    give = consumers.index("bar_arrive_arrive(((uint)(6 - (((int)threadIdx.x) >> 7))), (uint)256)")
    loop = consumers.index("for (int kt_1 = 0;")  # the consumers' K loop
    assert wait < loop < give < consumers.index("wait_group_sync_aligned_0()")
    assert "1 < ((turn * 2) + (((int)threadIdx.x) >> 7))" in consumers  # not the CTA's first
    plain = compiled("v8", wl)[1].split("__global__")[-1]
    assert "bar_arrive" not in plain and "(&(empty_ptr[0]))), (uint)2);" in plain
    (usage,) = build.nvcc_resources(source, "sm_90").values()
    assert not usage.get("spill_stores") and not usage.get("stack_bytes")


@pytest.mark.parametrize("wl, knobs, reason", [
    (gemm((256, 256, 256), "float32"), {}, "v8 multiplies float16, bfloat16 or float8_e4m3fn on tensor cores, not float32"),
    (gemm((256, 256, 100), FP8, layout="nt"), {}, "v8 loads A with TMA, which takes rows of whole "
                                                    "16-byte multiples: K=100 float8_e4m3fn rows "
                                                    "are 100 bytes"),
    (gemm((256, 256, 256), FP8, layout="nt"), {"split_k": 3}, "splits K=256 into 1 to 2 slices"),
    (gemm((256, 256, 100)), {}, "v8 loads A with TMA, which takes rows of whole 16-byte multiples: "
                                "K=100 float16 rows are 200 bytes"),
    (gemm((64, 100, 64), layout="nn"), {}, "v8 loads B with TMA, which takes rows of whole 16-byte "
                                           "multiples: N=100 float16 rows are 200 bytes"),
    (gemm((256, 256, 256)), {"block_m": 96}, "block_m=96 is not 64, 128 or 256"),
    (gemm((256, 256, 256)), {"block_n": 320}, "block_n=320 with block_m=128 does not split so"),
    (gemm((256, 256, 256)), {"block_n": 144}, "a multiple of 64 columns (B in 64-column boxes)"),
    (gemm((256, 256, 256), layout="nt"), {"block_n": 136}, "a multiple of 16 columns (C stored 16 "
                                                            "at a time), at most 256: block_n=136"),
    (gemm((256, 256, 256)), {"block_m": 64, "block_n": 192}, "block_n=192 with block_m=64"),
    (gemm((256, 256, 256)), {"block_m": 256, "block_n": 256},
     "each consumer thread 256 accumulators; at most 192 fit (block_n=192 does)"),
    (gemm((256, 256, 256)), {"block_n": 256, "stages": 5}, "needs 246784 bytes of shared memory"),
    (gemm((256, 256, 256), layout="nt"), {"block_m": 256, "block_n": 192, "stages": 4, "tma_store": True},
     "v8 with 4 stages of 256x192 tiles and the boxes of tma_store needs 263168 bytes"),
    (gemm((256, 250, 256), "float16", "float32", "nt"), {"tma_store": True},
     "v8's tma_store stores C with TMA, which takes rows of whole 16-byte multiples: N=250 "
     "float32 rows are 1000 bytes (tma_store=False stores them from registers)"),
    (gemm((256, 256, 256)), {"split_k": 5}, "splits K=256 into 1 to 4 slices of whole 128-byte "
                                            "K blocks, not split_k=5"),
    (gemm((8192, 8192, 8192)), {"split_k": 8}, "split_k=8 over 2048 tiles of 128x256 keeps "
                                               "2048 MB of partials; at most 256 MB"),
    (gemm((256, 256, 256)), {"split_tail": True}, "split_tail splits the last wave's tiles into "
                                                  "split_k slices: it needs split_k > 1"),
    (gemm((256, 256, 256)), {"cluster_n": 2, "split_k": 2}, "v8's clusters are 2 CTAs whose whole "
                                                             "tiles lie side by side along N"),
    (gemm((256, 256, 256)), {"cluster_n": 4}, "not cluster_m=1, cluster_n=4"),
    (gemm((256, 256, 256)), {"cluster_m": 2, "cluster_n": 2}, "not cluster_m=2, cluster_n=2"),
    (gemm((256, 256, 256)), {"cluster_m": 2, "block_n": 64},
     "not cluster_m=2, cluster_n=1 with split_k=1, block_n=64"),  # nn: one 64-column box
    (gemm((256, 256, 256)), {"pingpong": True, "block_n": 256},
     "128x256 tile gives each consumer thread 256 accumulators (pingpong: each consumer takes "
     "the whole tile); at most 192 fit (block_n=192 does)"),
    (gemm((256, 256, 256)), {"pingpong": True, "block_n": 128, "split_k": 2},
     "v8's pingpong consumers take turns at whole tiles: not with split_k=2"),
], ids=lambda x: x.label() if isinstance(x, Workload) else str(x)[:40])
def test_v8_refuses_what_tma_and_its_tiles_cannot_take(wl, knobs, reason, target):
    with pytest.raises(ScheduleNotApplicable, match=re.escape(reason)):
        schedules.get("gemm", "v8").apply(wl, target, **knobs)


def test_v8_needs_sm_90():
    with pytest.raises(ScheduleNotApplicable, match="^v8 uses TMA, mbarriers and wgmma .* not sm_80"):
        schedules.get("gemm", "v8").apply(gemm((256, 256, 256)), build.cuda_target("sm_80"))


def test_only_tirx_kernels_take_the_tirx_pipeline(target):
    v8 = schedules.get("gemm", "v8").apply(gemm((256, 256, 256), "bfloat16", layout="nt"), target)
    v5p = schedules.get("gemm", "v5p").apply(gemm((256, 256, 256), "float32"), target)
    assert build.pipeline_of(v8) == ("tirx", {})
    assert build.pipeline_of(v5p) == ("explorer", build.pass_config(v5p))
