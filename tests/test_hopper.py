"""v8 (schedules/v8/): the TIRx kernel builds, and nvcc compiles it for sm_90a, on aligned,
ragged and decode-sized shapes; its CUDA has what the rung's docstring claims; it refuses what
TMA and its tiles cannot take; tuning/build.py lowers it with the tirx pipeline."""

import re
import shutil

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm.script import tirx as T
from tvm.tirx import stmt as S

import kernel_facts as kf
import schedules
from schedules import ScheduleNotApplicable, Workload, v8
from schedules.tensorcore import HOPPER_SHARED_BYTES
from schedules.v8.cuda import SETTLE, descriptor_at, descriptor_base, split_k_helpers
from schedules.v8.geometry import ATOM, box_bytes
from schedules.workloads import FP8
from tuning import build, explain, lowering

needs_nvcc = pytest.mark.skipif(not shutil.which("nvcc"),
                                reason="nvcc is not on PATH: the generated CUDA is not compiled")


def gemm(shape, dtype="float16", out_dtype=None, layout="nn", scales=None):
    return Workload("gemm", shape, dtype, out_dtype, layout, scales)


BUILDS = [
    gemm((4096, 4096, 4096), "float16", "float16", "nt"),  # aligned, 16-bit C
    gemm((4096, 4096, 4096), "bfloat16", layout="nn"),
    gemm((1000, 1000, 1000), "bfloat16", "bfloat16", "nt"),  # ragged M, N, K
    gemm((100, 304, 40), "float16", "float16", "nn"),  # all ragged; K shorter than a block
    gemm((16, 6144, 4096), "bfloat16", layout="nt"),  # decode: swapped, 128x16 tiles split in K
    gemm((1, 256, 64), "float16", "float16", "nn"),
    gemm((37, 200, 72), "float16", layout="nn"),
    gemm((128, 4096, 4096), "bfloat16", "bfloat16", "nt"),  # split K (the heuristic's 2)
    gemm((4096, 4096, 4096), FP8, layout="nt"),  # fp8, bfloat16 C
    gemm((1000, 1000, 1008), FP8, "float32", "nt"),  # fp8, ragged M and N, split K
    gemm((16, 6144, 4096), FP8, "float16", "nt"),  # fp8 decode batch, swapped
    gemm((1000, 4608, 3584), "bfloat16", layout="nt"),  # one wave of 256x144 tiles
]


@needs_nvcc
@pytest.mark.parametrize("wl", BUILDS, ids=Workload.label)
def test_v8_builds_and_nvcc_compiles_it_without_spills(wl, compiled):
    _, source, summary = compiled("v8", wl)
    (usage,) = build.nvcc_resources(source, "sm_90").values()
    assert usage["registers"] <= 168 and not usage.get("spill_stores") and not usage.get("stack_bytes")
    assert summary.block == {"threadIdx.x": 384} and summary.kernels == 1


def _descriptor_reference(address: int, leading: int, stride: int) -> int:
    """wgmma's descriptor of a 128-byte-swizzled operand at shared `address`, field by field
    (PTX ISA 9.7.15.5.1)."""
    return (address >> 4 & 0x3FFF) | (leading >> 4) << 16 | (stride >> 4) << 32 | 1 << 62


@pytest.mark.parametrize("leading", [16, 8192])  # nt's, and nn's 64-column boxes
def test_v8_descriptor_from_a_base_is_the_descriptor_of_base_plus_offset(leading):
    """descriptor_at(descriptor_base(stage), offset) adds offset >> 4 to the address field
    without carrying out of it: for every stage and offset in a Hopper block's shared memory,
    the same descriptor as built from the address stage + offset (run on the CPU)."""
    stages = list(range(0, HOPPER_SHARED_BYTES, 1024))
    offsets = list(range(0, 65536, 16 * 37))
    pairs = [(s, o) for s in stages for o in offsets if s + o < HOPPER_SHARED_BYTES]
    n = len(pairs)

    @T.prim_func
    def describe(address: T.Buffer((n,), "uint32"), offset: T.Buffer((n,), "int32"),
                 out: T.Buffer((n,), "uint64")):
        for i in range(n):
            out[i] = descriptor_at(descriptor_base(address[i], leading), offset[i], ATOM)

    lib = tvm.compile(tvm.IRModule({"main": describe}), target="llvm")
    got = tvm.runtime.tensor(np.zeros(n, "uint64"))
    lib["main"](tvm.runtime.tensor(np.array([s for s, _ in pairs], "uint32")),
                tvm.runtime.tensor(np.array([o for _, o in pairs], "int32")), got)
    expected = [_descriptor_reference(s + o, leading, ATOM) for s, o in pairs]
    assert [int(d) for d in got.numpy()] == expected


@needs_nvcc
@pytest.mark.parametrize("knobs, wgmma", [({"block_m": 64, "block_n": 64}, "m64n32k16"),
                                          ({"block_m": 128, "block_n": 80}, "m64n80k16"),
                                          ({"block_m": 256, "block_n": 176}, "m64n176k16")])
def test_v8_takes_b_in_widths_of_16_columns_in_nt(knobs, wgmma, compiled, lowered):
    """nt loads B's rows whole, so a consumer's share of block_n need only be whole 16-column
    pieces of C (how the epilogue stores it), not nn's 64-column boxes."""
    wl = gemm((300, 520, 272), "bfloat16", "bfloat16", "nt")
    mmas = kf.calls(lowered("v8", wl, **knobs), "ptx.wgmma_bf16_ss")
    assert mmas and {kf.words(c)[3:7] for c in mmas} == {(wgmma, "f32", "bf16", "bf16")}
    (usage,) = build.nvcc_resources(compiled("v8", wl, **knobs)[1], "sm_90").values()
    assert not usage.get("spill_stores")


def _tile_loops(kernel, var: str, tiles: int) -> list:
    """The loops over `var` whose body skips the steps past the last of `tiles` tiles."""
    return [f for f in kf.loop(kernel, var)
            if any(isinstance(i.condition, tvm.tirx.LT) and int(i.condition.b) == tiles
                   for i in lowering.find(f.body, S.IfThenElse, outermost=True))]


def test_v8_cuda_is_a_persistent_warp_specialized_tma_kernel(compiled, lowered):
    wl = gemm((4096, 4096, 4096), "float16", "float16", "nt")
    summary, ir = compiled("v8", wl)[2], lowered("v8", wl)
    kernel = kf.kernel(ir)
    assert summary.grid == {"blockIdx.x": 132}  # one CTA per SM ...
    # ... whose producer (j) and consumers (turn) each walk 4 of the 512 tiles
    assert [int(f.extent) for f in _tile_loops(kernel, "j", 512)] == [4]
    assert [int(f.extent) for f in _tile_loops(kernel, "turn", 512)] == [4]
    # the ring, tma_store's four boxes of 64 rows of 128 bytes, the barriers
    assert summary.shared_bytes == 4 * (128 + 256) * 128 + 1024 + 4 * 64 * 128 + 2 * 4 * 8
    assert kf.params(ir) == ["A_map", "B_map", "C_map"]
    assert {str(p.ty) for p in kernel.params} == {"T.TensorMap()"}
    assert kf.count(kernel, "ptx.cp_async_bulk_tensor_g2s_cluster", "2d", "shared::cluster",
                    "global", "mbarrier::complete_tx::bytes") == 2  # A's box and B's
    assert len(kf.calls(kernel, "cuda.mbarrier_wait")) == 2  # for an empty and a full stage
    assert len(kf.calls(kernel, "ptx.mbarrier_arrive_expect_tx")) == 1
    assert len(kf.calls(kernel, "ptx.mbarrier_init")) == 2 * 4  # full and empty, 4 stages
    assert kf.count(kernel, "ptx.wgmma_f16_ss", "mma_async", "m64n256k16", "f32", "f16") == 4
    assert {(kf.ints(c)[0], kf.words(c)[0]) for c in kf.calls(kernel, "ptx.setmaxnreg")} \
        == {(40, "dec"), (232, "inc")}
    assert kf.count(kernel, "ptx.prefetch", "tensormap") == 3
    # the accumulators pass through SETTLE after the last wait, and C is converted from them
    waited = kf.at(kernel, lambda n: kf.called("ptx.wgmma_wait_group")(n) and kf.ints(n)[0] == 0)
    settles = kf.at(kernel, kf.called(SETTLE[0]))
    stores = kf.at(kernel, kf.called("v8_stage_pair_float16"))
    assert len(waited) == 1 and len(settles) == 128 and stores
    assert waited[0] < min(settles) and max(settles) < min(stores)


def _scaled(kernel) -> tuple[list, list]:
    """The kernel's binds of `scale`, and where in its events the stores that multiply an
    accumulator by it stand."""
    binds = [b for b in lowering.find(kernel, S.Bind) if b.var.name == "scale"]
    scale = [b.var for b in binds]
    multiplied = kf.at(kernel, lambda n: isinstance(n, S.BufferStore) and n.buffer.name == "acc"
                       and isinstance(n.value, tvm.tirx.Mul)
                       and any(n.value.b.same_as(v) for v in scale))
    return binds, multiplied


def test_v8_on_fp8_takes_the_scales_and_multiplies_by_their_product_before_storing_c(lowered):
    """fp8: TMA loads bytes in 128-element boxes, wgmma's e4m3 k32 form, the scales as the
    kernel's parameters, their product applied to each accumulator once, after the last wait
    and before the stores."""
    ir = lowered("v8", gemm((4096, 4096, 4096), FP8, layout="nt"), block_n=256, promote_k=None)
    kernel = kf.kernel(ir)
    assert kf.count(kernel, "ptx.wgmma_fp8_ss", "m64n256k32", "f32", "e4m3") == 4
    assert {"A_scale_ptr", "B_scale_ptr"} <= set(kf.params(ir))
    (bind,), multiplied = _scaled(kernel)
    assert isinstance(bind.value, tvm.tirx.Mul)
    assert {bind.value.a.source.name, bind.value.b.source.name} == {"A_scale", "B_scale"}
    assert len(multiplied) == 128  # each of a consumer thread's accumulators
    settles = kf.at(kernel, kf.called(SETTLE[0]))
    stores = kf.at(kernel, kf.called("v8_stage_pair_bfloat16"))
    assert max(settles) < min(multiplied) and max(multiplied) < min(stores)


def test_v8_rowwise_multiplies_each_accumulator_by_its_rows_and_its_columns_scale(lowered):
    """fp8 with rowwise scales: A_scale and B_scale are M and N long; each accumulator is
    multiplied by an A_scale of its row and a B_scale of its column (indices clamped at C's
    last row and column), not by one product; the per-tensor form reads element 0 of each."""
    wl = Workload("gemm", (300, 520, 1024), FP8, "bfloat16", "nt", "row")
    kernel = kf.kernel(lowered("v8", wl, block_n=128))
    rows, cols = kf.loads_from(kernel, "A_scale"), kf.loads_from(kernel, "B_scale")
    assert rows and cols and _scaled(kernel) == ([], [])
    assert not [t for t in rows + cols if isinstance(t.indices[0], tvm.tirx.IntImm)]
    clamps = {int(m.b) for m in lowering.find(kernel, tvm.tirx.Min)
              if isinstance(m.b, tvm.tirx.IntImm)}
    assert {299, 519} <= clamps  # (an index may be bound to a common subexpression first)
    tensor = kf.kernel(lowered("v8", Workload("gemm", (300, 520, 1024), FP8, "bfloat16", "nt"),
                               block_n=128))
    assert {int(t.indices[0]) for t in kf.loads_from(tensor, "A_scale")} == {0}


def test_v8_takes_no_scales_where_the_inputs_are_16_bit(lowered):
    ir = lowered("v8", gemm((4096, 4096, 4096), "float16", "float16", "nt"))
    assert not [p for p in kf.params(ir) if "scale" in p]
    assert _scaled(kf.kernel(ir)) == ([], [])


def test_v8_splits_64_row_tiles_along_n_between_its_consumers(compiled, lowered):
    wl = gemm((32, 6144, 4096), "bfloat16", layout="nt")  # past the swap's 16 rows
    tile = {"block_n": 128, "split_k": 2}
    assert compiled("v8", wl, **tile)[2].grid == {"blockIdx.x": 96}  # 48 tiles in 2 K slices
    assert kf.count(kf.kernel(lowered("v8", wl, **tile)), "ptx.wgmma_bf16_ss", "m64n64k16",
                    "f32", "bf16") == 4


def _addresses_c(call) -> bool:
    """Whether a store helper's first argument is the address of an element of C."""
    address = call.args[1]
    return (isinstance(address, tvm.ir.Call) and address.op.name == "tirx.address_of"
            and address.args[0].source.name == "C")


def _guarded(kernel, test) -> list:
    """The nodes passing `test` that lie inside an if."""
    return [n for i in lowering.find(kernel, S.IfThenElse)
            for n in lowering.find(i.then_case, (tvm.ir.Call, S.BufferStore)) if test(n)]


def test_v8_stages_rows_tma_cannot_load_before_a_barrier_of_the_grid(lowered):
    """bf16 K = 4095 (8190-byte rows, nt): every thread first copies its share of A's and B's
    rows into workspaces of 4096-element rows (given to the kernel beside A and B), then the
    grid's barrier, then the ring's barriers are set; nn with N odd stages B alone; rows TMA
    can load stage nothing."""
    both = kf.kernel(lowered("v8", gemm((2000, 3000, 4095), "bfloat16", "bfloat16", "nt")))
    order = [kf.name(c) for c in kf.calls(both, "v8_stage_rows_16", "v8_grid_sync",
                                            "ptx.mbarrier_init")]
    assert order[:4] == ["v8_stage_rows_16", "v8_stage_rows_16", "v8_grid_sync",
                         "ptx.mbarrier_init"]
    staged = kf.calls(both, "v8_stage_rows_16")
    assert [kf.pointers(c) for c in staged] == [("A", "A_rows"), ("B", "B_rows")]
    assert [kf.ints(c) for c in staged] == [(2000, 4095, 4096), (3000, 4095, 4096)]
    assert {"A_rows_ptr", "B_rows_ptr"} <= set(kf.params_of(both))
    b_only = kf.kernel(lowered("v8", gemm((1000, 1001, 1024), "float16", "float16", "nn")))
    assert [kf.ints(c) for c in kf.calls(b_only, "v8_stage_rows_16")] == [(1024, 1001, 1008)]
    fp8 = kf.kernel(lowered("v8", gemm((300, 777, 1000), FP8, "bfloat16", "nt")))
    assert [kf.ints(c) for c in kf.calls(fp8, "v8_stage_rows_8")] == [(300, 1000, 1008),
                                                                      (777, 1000, 1008)]
    aligned = kf.kernel(lowered("v8", gemm((2000, 3000, 4096), "bfloat16", "bfloat16", "nt")))
    assert not kf.calls(aligned, "v8_stage_rows_16", "v8_grid_sync")


def test_v8_stores_whole_sectors_of_c_where_its_rows_allow(lowered):
    """float32 C, N even: a thread's two neighbouring columns in one 8-byte store. 16-bit C, N a
    multiple of 4: neighbouring threads swap a pair (a shuffle every lane makes, so no store
    is behind an if) and each stores 4 columns in 8 bytes. Else element by element, those
    that may lie past N guarded."""
    fp32 = kf.kernel(lowered("v8", gemm((64, 256, 64), "bfloat16", "float32", "nt")))
    pairs = kf.calls(fp32, "v8_store_pair")
    assert pairs and all(_addresses_c(c) for c in pairs) and not kf.stores_to(fp32, "C")
    quads = kf.kernel(lowered("v8", gemm((64, 256, 64), "bfloat16", "bfloat16", "nt")))
    stored = kf.calls(quads, "v8_store_quad_bfloat16")
    assert stored and all(_addresses_c(c) for c in stored) and not kf.stores_to(quads, "C")
    assert not _guarded(quads, kf.called("v8_store_quad_bfloat16"))
    for ragged in (gemm((64, 255, 64), "bfloat16", "bfloat16", "nt"),
                   gemm((64, 254, 64), "float16", "float16", "nt")):
        scalar = kf.kernel(lowered("v8", ragged, block_n=128))
        assert not [c for c in kf.calls(scalar) if kf.name(c).startswith("v8_store")]
        stores = kf.stores_to(scalar, "C")  # one per accumulator, those past N guarded
        assert sorted(int(s.value.value.indices[0]) for s in stores) == list(range(32))
        assert _guarded(scalar, lambda n: isinstance(n, S.BufferStore) and n.buffer.name == "C")


def test_v8_stores_c_through_shared_boxes_by_tma_with_tma_store(lowered):
    """4096^3, float32 C: each consumer fills its 8 boxes of 64 rows x 32 columns in turn, two
    boxes taking turns: the first thread waits until at most one store still reads shared
    memory, the warpgroup meets at its own barrier (2 or 3), fills the box, fences it for the
    async proxy, meets again, and the first thread sends it by TMA. C is not written by any
    thread; before the kernel ends the first thread waits for every store. tma_store=False
    stores from the registers."""
    wl = gemm((4096, 4096, 4096), "bfloat16", "float32", "nt")
    kernel = kf.kernel(lowered("v8", wl))
    assert not kf.stores_to(kernel, "C") and not kf.calls(kernel, "v8_store_pair")
    assert kf.count(kernel, "ptx.cp_async_bulk_tensor_s2g", "global", "shared::cta") == 8
    assert len(kf.calls(kernel, "ptx.cp_async_bulk_commit_group")) == 8
    read_1 = lambda n: kf.called("ptx.cp_async_bulk_wait_group", "read")(n) and kf.ints(n) == (1,)  # noqa: E731
    assert len(kf.at(kernel, read_1)) == 8
    assert len(kf.calls(kernel, "v8_stage_pair_float32")) == 8 * 8  # a thread's 4 x 2 pairs a box

    def own_barrier(n):  # the warpgroup's 128 threads, at a barrier its thread index picks
        return (kf.called("ptx.bar_sync_count")(n) and kf.ints(n) == (128,)
                and not isinstance(n.args[0], tvm.tirx.IntImm))

    assert len(kf.at(kernel, own_barrier)) == 16
    steps = (read_1, own_barrier, kf.called("v8_stage_pair_float32"),
             kf.called("ptx.fence_proxy", "async", "shared::cta"), own_barrier,
             kf.called("ptx.cp_async_bulk_tensor_s2g"), kf.called("ptx.cp_async_bulk_commit_group"))
    nodes, at = kf.events(kernel), 0
    for step in steps:  # each after the one before
        at = next(i for i in range(at, len(nodes)) if step(nodes[i]))
    last_wait = kf.at(kernel, lambda n: kf.called("ptx.cp_async_bulk_wait_group")(n)
                      and kf.ints(n) == (0,))
    assert len(last_wait) == 1 and last_wait[0] > max(kf.at(kernel, steps[5]))
    plain = kf.kernel(lowered("v8", wl, tma_store=False))
    assert not kf.calls(plain, "ptx.cp_async_bulk_tensor_s2g")
    assert kf.calls(plain, "v8_store_pair") and all(_addresses_c(c)
                                                   for c in kf.calls(plain, "v8_store_pair"))


def _swizzle_masks(kernel) -> set[int]:
    """The masks of the kernel's `(offset >> 7) & mask` (TMA's swizzle, cuda.swizzled)."""
    return {int(e.b) for e in lowering.find(kernel, tvm.tirx.BitwiseAnd)
            if isinstance(e.a, tvm.tirx.RShift) and isinstance(e.a.b, tvm.tirx.IntImm)
            and int(e.a.b) == 7 and isinstance(e.b, tvm.tirx.IntImm)}


@pytest.mark.parametrize("block_m, block_n, out_dtype, span", [
    (128, 256, "float32", 128), (128, 256, "bfloat16", 128), (128, 80, "float32", 64),
    (128, 80, "bfloat16", 32), (64, 64, "bfloat16", 64), (256, 144, "float32", 64)])
def test_tma_store_boxes_have_the_widest_swizzle_that_divides_a_consumers_columns(
        block_m, block_n, out_dtype, span, lowered):
    """A consumer's columns (block_n, or half of it with 64-row tiles) go out in boxes whose
    rows are the widest swizzle span that divides their bytes; the kernel writes a box as
    TMA swizzles that span (16-byte chunk number xor bits 7 and up of the offset)."""
    assert box_bytes(block_m, block_n, out_dtype) == span
    wl = gemm((1000, 1000, 1000), "bfloat16", out_dtype, "nt")
    kernel = kf.kernel(lowered("v8", wl, block_m=block_m, block_n=block_n, tma_store=True))
    assert span // 16 - 1 in _swizzle_masks(kernel)


def _split_k(kernel, tag: str) -> dict:
    """The calls of each split-K helper of `tag` (stash, gather, arrive, rearm)."""
    return {role: kf.calls(kernel, f"v8_{role}_{tag}")
            for role in ("stash", "gather", "arrive", "rearm")}


def _arrived(count: int):
    """A test of a node: an equality of split K's `arrived` word with `count`."""
    return lambda e: (isinstance(e, tvm.tirx.EQ) and isinstance(e.a, tvm.ir.TensorLoad)
                      and e.a.source.name == "arrived" and int(e.b) == count)


def test_v8_splits_k_over_ctas_that_add_their_partials_through_a_workspace(compiled, lowered):
    """128x4096x4096 bf16: 32 tiles of 128x128 in 4 K slices (16 K blocks each) on 128 CTAs;
    each slice's consumers stash their partial tile, the count tells the last, which gathers
    the other three, rearms the counter and stores C. Without a split, none of it."""
    wl = gemm((128, 4096, 4096), "bfloat16", layout="nt")
    assert compiled("v8", wl, block_m=128, block_n=128, split_k=4)[2].grid == {"blockIdx.x": 128}
    kernel = kf.kernel(lowered("v8", wl, block_m=128, block_n=128, split_k=4))
    tag = "128x4096x4096_128x128x4_0"  # shape, tile, slices, whole tiles before the split ones
    helpers = _split_k(kernel, tag)
    assert {role: len(c) for role, c in helpers.items()} == {"stash": 16, "gather": 16,
                                                             "arrive": 1, "rearm": 1}
    made = split_k_helpers(tag, 128 * 16 * 256, 32)  # 128 units' partials, 32 tiles' counters
    assert {c.args[-1].value for role in made for c in helpers[role]} \
        == {source for _, source in made.values()}
    assert [int(f.extent) for f in kf.loop(kernel, "kt")] == [16, 16]  # a slice's K blocks
    order = [kf.at(kernel, kf.called(f"v8_stash_{tag}"))[0],
             kf.at(kernel, kf.called("cuda.thread_fence"))[0],
             kf.at(kernel, kf.called(f"v8_arrive_{tag}"))[0],
             kf.at(kernel, lambda n: isinstance(n, S.IfThenElse) and _arrived(3)(n.condition))[0],
             kf.at(kernel, kf.called(f"v8_gather_{tag}"))[0],
             kf.at(kernel, kf.called(f"v8_rearm_{tag}"))[0],
             kf.at(kernel, lambda n: kf.called("v8_store_pair")(n) and _addresses_c(n))[0]]
    assert order == sorted(order)
    assert len(kf.at(kernel, lambda n: kf.called("ptx.bar_sync_count")(n)
                     and kf.ints(n) == (1, 256))) == 2
    plain = kf.kernel(lowered("v8", wl, split_k=1))
    assert not any(_split_k(plain, tag).values()) and not kf.calls(plain, "ptx.bar_sync_count")
    assert not [c for c in kf.calls(plain) if kf.name(c).startswith(("v8_stash", "v8_arrive"))]


def test_v8_splits_only_the_tiles_of_the_last_wave_with_split_tail(compiled, lowered):
    """1000x4608x3584: 144 tiles of 128x256 on 132 SMs. The first 132 units are whole tiles;
    the last 12 tiles come in 8 K slices each (7 K blocks), 96 more units, so the second round
    is an eighth of a tile long. Only those have partials and counters."""
    wl = gemm((1000, 4608, 3584), "bfloat16", layout="nt")
    knobs = dict(block_m=128, block_n=256, split_k=8, split_tail=True)
    assert compiled("v8", wl, **knobs)[2].grid == {"blockIdx.x": 132}
    kernel = kf.kernel(lowered("v8", wl, **knobs))
    tag = "1000x4608x3584_128x256x8_132"
    made = split_k_helpers(tag, 96 * 32 * 256, 12)  # 96 slices' partials, 12 tiles' counters
    helpers = _split_k(kernel, tag)
    assert all(helpers.values())
    assert {c.args[-1].value for role in made for c in helpers[role]} \
        == {source for _, source in made.values()}
    # 228 units: two rounds, the first of whole tiles (56 K blocks), the second of slices (7)
    assert sorted(int(f.extent) for f in kf.loop(kernel, "j")) == [2]
    assert sorted(int(f.extent) for f in kf.loop(kernel, "turn")) == [2]
    binds = lowering.find(kernel, S.Bind)
    extents = [next((b.value for b in binds if b.var.same_as(f.extent)), f.extent)
               for f in kf.loop(kernel, "kt")]  # the producer's and the consumers' K loops
    assert len(extents) == 2 and all(isinstance(e, tvm.tirx.Select) for e in extents)
    assert {(int(e.true_value), int(e.false_value)) for e in extents} == {(56, 7)}
    # the consumers store C in the first round, and in the second where the slice came last
    assert [i for i in lowering.find(kernel, S.IfThenElse)
            if isinstance(i.condition, tvm.tirx.Or) and _arrived(7)(i.condition.b)]
    # 132 tiles exactly: no partial wave, so split_tail leaves the kernel as it was
    whole_waves = gemm((1536, 2816, 512), "bfloat16", layout="nt")
    assert compiled("v8", whole_waves, split_k=2, split_tail=True)[1] == compiled("v8", whole_waves)[1]


def test_v8_split_tail_splits_a_last_wave_only_where_its_slices_take_one_wave(compiled):
    """257x4608x3584: 108 tiles of 128x128, all of them a partial wave; split 4 they would make
    432 slices, more than three rounds of the 132 SMs, so split_tail keeps them whole (the
    same kernel as without a split). For any M the choice is made at each call: at 1024 rows
    (288 tiles, 24 in the last wave: 96 slices) the last wave is split, at 129 and 257 rows
    (72 and 108 tiles, 288 and 432 slices) nothing is."""
    from schedules.v8.knobs import Knobs
    from schedules.v8.plan import Plan

    wl = gemm((257, 4608, 3584), "bfloat16", "bfloat16", "nt")
    knobs = {**schedules.get("gemm", "v8").defaults_for(wl), "block_m": 128, "block_n": 128,
             "tma_store": False, "split_k": 4, "split_tail": True}
    unsplit = {**knobs, "split_k": 1, "split_tail": False}
    assert compiled("v8", wl, **knobs)[1] == compiled("v8", wl, **unsplit)[1]
    plan = Plan.build(gemm((1024, 4608, 3584), "bfloat16", "bfloat16", "nt"), Knobs(**knobs),
                      132, most_m=1024)
    assert {m: _at_m(plan.whole, plan.M, m) for m in (129, 257, 1024)} \
        == {129: 72, 257: 108, 1024: 264}


def _at_m(expr, var, m: int) -> int:
    """A symbolic count of v8 for any M, at M = m."""
    analyzer = tvm.sym.Analyzer()
    analyzer.bind(var, tvm.tirx.IntImm("int32", m))
    return int(analyzer.simplify(expr))


@needs_nvcc
def test_16_bit_c_is_converted_after_the_last_wgmma_finished(compiled):
    """The SASS: every float -> 16-bit conversion comes after the final wait for the wgmmas
    (WARPGROUP.DEPBAR.LE gsb0, 0x0). Without SETTLE, ptxas hoists them above it (16-bit C was
    wrong on an H100 by about sqrt(64/K)). Disassembled by explain.sass (nvdisasm from its pip
    package where it is not on PATH)."""
    _, source, _ = compiled("v8", BUILDS[0])
    listed = explain.sass(source, "sm_90")
    assert listed is not None, "no disassembler: pip install nvidia-cuda-nvdisasm"
    (sass,) = listed.values()
    final_wait = max(i for i, line in enumerate(sass) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in line)
    conversions = [i for i, line in enumerate(sass) if re.search(r"\bF2FP?\.", line)]
    assert conversions and min(conversions) > final_wait


def _stage_arrivals(kernel) -> list[int]:
    """How many arrivals free a stage: the counts the `empty` barriers are initialised with."""
    return [kf.ints(c)[0] for c in kf.calls(kernel, "ptx.mbarrier_init")
            if {load.source.name for load in lowering.find(c, tvm.ir.TensorLoad)} == {"empty"}]


def _uses(expr, var_name: str) -> bool:
    return any(v.name == var_name for v in lowering.find(expr, tvm.tirx.Var))


@pytest.mark.parametrize("knobs", [{"block_m": 128, "block_n": 128, "split_k": 2, "stages": 6},
                                   {"pingpong": True, "block_m": 64, "block_n": 96, "split_k": 1,
                                    "stages": 6}])
def test_v8_producer_and_consumers_step_their_ring_position_without_dividing_by_the_stages(
        lowered, knobs):
    """The producer's and the consumers' K loops find each block's stage and its barrier's
    parity by stepping a ring position a block at a time (a select past the last stage), not
    by dividing the K blocks passed by the stage count, a signed division and its correction
    per block between one block's wgmmas (or TMA loads) and the next's. Once per unit
    (pingpong: past the other consumer's blocks) the consumers' position is still divided out."""
    kernel = kf.kernel(lowered("v8", gemm((300, 2048, 2048), "bfloat16", "bfloat16", "nt"),
                               **knobs))
    stages = knobs["stages"]  # not a power of 2, which a division by could fold into shifts
    loops = kf.loop(kernel, "kt")
    consumers = [f for f in loops if kf.calls(f, "ptx.wgmma_bf16_ss")]
    producers = [f for f in loops if kf.calls(f, "ptx.mbarrier_arrive_expect_tx")]
    assert consumers and len(producers) == 1
    for k_loop in consumers + producers:
        divisions = [d for kind in (tvm.tirx.FloorMod, tvm.tirx.FloorDiv)
                     for d in lowering.find(k_loop, kind)
                     if isinstance(d.b, tvm.tirx.IntImm) and int(d.b) in (stages, 2 * stages)]
        assert not divisions
        assert kf.calls(k_loop, "cuda.mbarrier_wait")


@needs_nvcc
@pytest.mark.parametrize("knobs", [{"pingpong": True, "block_m": 64, "block_n": 96, "split_k": 1},
                                   {"swap_ab": True, "block_m": 64, "block_n": 80, "split_k": 1,
                                    "pingpong": True}])
def test_ptxas_applies_v8s_setmaxnreg_and_sees_its_warpgroup_as_uniform(compiled, knobs):
    """Every v8 kernel is launched one CTA an SM (launch bounds (384, 1)), without which ptxas
    ignored setmaxnreg (C7508: "unable to determine register count at entry") on kernels that
    need fewer registers than the launch allows, such as these small tiles at 300 rows; and a
    consumer's warpgroup is read from lane 0 of its warp, so that what depends on it (the ring
    position, the stages' addresses, wgmma's descriptors) can live in uniform registers."""
    source = compiled("v8", gemm((300, 2048, 2048), "bfloat16", "bfloat16", "nt"), **knobs)[1]
    assert "__launch_bounds__(384, 1)" in source
    assert re.search(r"int consumer = \(v8_warpgroup_of_warp\(", source)
    assert "C7508" not in build.ptxas_report(source, "sm_90a")


@needs_nvcc
def test_v8_clusters_of_two_ctas_share_a_by_multicast(compiled, lowered):
    """cluster_n=2: CTAs in pairs (a cluster launch, its rank clusterCtaIdx), each loading its
    half of A's box (64 of 128 rows) by one multicast TMA into both CTAs' stage; the empty
    barriers count one thread per consumer warpgroup and CTA (4), each freeing the stage in
    the CTA of its rank (mapa), predicated in its asm, not behind a branch in the K loop; the
    pair meets at a cluster barrier after the barriers' init, and each producer waits until
    every stage is freed before its CTA ends. cluster_n=1 has none of it, and frees stages
    with one thread per warpgroup (2). nvcc compiles both."""
    wl = gemm((4096, 4096, 4096), "bfloat16", "float32", "nt")
    kernel, plain = kf.kernel(lowered("v8", wl, cluster_n=2)), kf.kernel(lowered("v8", wl))
    assert kf.thread_extents(kernel)["clusterCtaIdx.x"] == 2
    (multicast,) = kf.calls(kernel, "v8_tma_load_multicast")
    dst, _, _, row, _, ctas = multicast.args[1:7]
    assert int(ctas) == 3  # both CTAs of the pair
    assert _uses(dst, "clusterCtaIdx.x") and _uses(row, "clusterCtaIdx.x")  # the rank's rows
    assert _stage_arrivals(kernel) == [4] * 4 and _stage_arrivals(plain) == [2] * 4
    frees = kf.calls(kernel, "v8_free_stage")
    assert len(frees) == 2
    for free in frees:  # a predicate, not a branch
        signals = free.args[3]
        assert not isinstance(signals, tvm.tirx.IntImm)
        assert not [i for i in lowering.find(kernel, S.IfThenElse)
                    if tvm_ffi.structural_equal(i.condition, signals)]
    assert kf.at(kernel, kf.called("v8_cluster_sync"))[0] \
        < kf.at(kernel, kf.called("ptx.setmaxnreg"))[0]
    (drain,) = kf.loop(kernel, "i")  # the producer's wait for every stage to be freed
    assert int(drain.extent) == 4 and kf.calls(drain, "cuda.mbarrier_wait")
    assert kf.at(kernel, lambda n: n.same_as(drain)) > kf.at(kernel, kf.called("v8_tma_load_multicast"))
    assert not kf.calls(plain, "v8_tma_load_multicast") and not kf.calls(plain, "v8_cluster_sync")
    assert not kf.calls(plain, "v8_free_stage")  # alone, each frees in its own CTA: no mapa
    own_frees = kf.calls(plain, "v8_free_own_stage")
    assert len(own_frees) == 2 and all(not isinstance(f.args[2], tvm.tirx.IntImm)
                                       for f in own_frees)
    assert "clusterCtaIdx.x" not in kf.thread_extents(plain)
    for source in (compiled("v8", wl, cluster_n=2)[1], compiled("v8", wl)[1]):
        (usage,) = build.nvcc_resources(source, "sm_90").values()
        assert usage["registers"] <= 168 and not usage.get("spill_stores")


@needs_nvcc
def test_v8_pingpong_consumers_take_turns_at_whole_tiles(compiled, lowered):
    """pingpong: each consumer multiplies whole 128x192 tiles (two m64n192 wgmmas a k step),
    every other unit of the CTA from its own first (the ring's position starts at
    consumer * 64 K blocks and skips the other's 64); one thread frees a stage (the empty
    barriers count 1); a consumer waits its turn (bar.sync 4 or 5, both warpgroups' 256
    threads) before a unit's K loop but the CTA's first, and gives the turn on (bar.arrive) after
    its last wgmmas are issued, before it waits for them, where the CTA has a next unit. The
    default consumers share each tile and take no turns. nvcc compiles it without spills."""
    wl = gemm((4096, 4096, 4096), "bfloat16", "bfloat16", "nt")
    kernel = kf.kernel(lowered("v8", wl, block_n=192, stages=4, pingpong=True))
    assert kf.count(kernel, "ptx.wgmma_bf16_ss", "m64n192k16", "f32", "bf16") == 8  # 4 k steps, 2 m64
    assert _stage_arrivals(kernel) == [1] * 4
    used = kf.stores_to(kernel, "used")
    start = [s for s in used if isinstance(s.value, tvm.tirx.Mul) and int(s.value.b) == 64
             and isinstance(s.value.a, tvm.tirx.Var) and s.value.a.name == "consumer"]
    skip = [s for s in used if isinstance(s.value, tvm.tirx.Add)
            and isinstance(s.value.a, tvm.ir.TensorLoad) and s.value.a.source.name == "used"
            and int(s.value.b) == 128]
    assert len(start) == 1 and len(skip) == 1

    def both_warpgroups(mode):
        return lambda n: kf.called("ptx.bar_" + mode + ("_count" if mode == "sync" else ""))(n) \
            and kf.ints(n) == (256,)

    (wait,), (give,) = kf.at(kernel, both_warpgroups("sync")), kf.at(kernel, both_warpgroups("arrive"))
    loop = kf.at(kernel, lambda n: isinstance(n, S.For) and n.loop_var.name == "kt")[1]  # consumers'
    finished = kf.at(kernel, lambda n: kf.called("ptx.wgmma_wait_group")(n) and kf.ints(n) == (0,))
    assert wait < loop < give < finished[0]
    turn = [i for i in lowering.find(kernel, S.IfThenElse)
            if kf.at(i.then_case, both_warpgroups("sync"))][-1]  # the innermost
    assert isinstance(turn.condition, tvm.tirx.LT) and int(turn.condition.a) == 0  # j > 0
    plain = kf.kernel(lowered("v8", wl))
    assert not kf.calls(plain, "ptx.bar_arrive") and _stage_arrivals(plain) == [2] * 4
    source = compiled("v8", wl, block_n=192, stages=4, pingpong=True)[1]
    (usage,) = build.nvcc_resources(source, "sm_90").values()
    assert not usage.get("spill_stores") and not usage.get("stack_bytes")


@pytest.mark.parametrize("wl, knobs, reason", [
    (gemm((256, 256, 256), "float32"), {}, "v8 multiplies float16, bfloat16 or float8_e4m3fn on tensor cores, not float32"),
    (gemm((256, 256, 100), FP8, layout="nt"), {"cluster_n": 2},
     "v8 copies A and B's rows, which TMA cannot load (float8_e4m3fn, K=100, N=256, nt: not "
     "whole 16-byte multiples), before a barrier of the whole grid, which clusters cannot "
     "promise: cluster_m and cluster_n must be 1, not 1 and 2"),
    (gemm((256, 256, 256), FP8, layout="nt"), {"split_k": 3}, "splits K=256 into 1 to 2 slices"),
    (gemm((64, 100, 64), layout="nn"), {"cluster_m": 2}, "v8 copies B's rows, which TMA cannot "
                                                        "load (float16, K=64, N=100, nn"),
    (gemm((256, 256, 256)), {"block_m": 96}, "block_m=96 is not 64, 128 or 256"),
    (gemm((256, 256, 256)), {"block_n": 320}, "block_n=320 with block_m=128 does not split so"),
    (gemm((256, 256, 256)), {"block_n": 144}, "a multiple of 64 columns (B in 64-column boxes)"),
    (gemm((256, 256, 256), layout="nt"), {"block_n": 136}, "a multiple of 16 columns (C stored 16 "
                                                            "at a time), at most 256: block_n=136"),
    (gemm((256, 256, 256)), {"block_m": 64, "block_n": 192}, "block_n=192 with block_m=64"),
    (gemm((256, 256, 256)), {"block_m": 256, "block_n": 256},
     "each consumer thread 256 accumulators; at most 192 fit (block_n=192 does)"),
    (gemm((256, 256, 256)), {"block_m": 128, "block_n": 256, "stages": 5},
     "needs 246784 bytes of shared memory"),
    (gemm((256, 256, 256), layout="nt"), {"block_m": 256, "block_n": 192, "stages": 4, "tma_store": True},
     "v8 with 4 stages of 256x192 tiles and the boxes of tma_store needs 263168 bytes"),
    (gemm((256, 250, 256), "float16", "float32", "nt"), {"tma_store": True},
     "v8's tma_store stores C with TMA, which takes rows of whole 16-byte multiples: N=250 "
     "float32 rows are 1000 bytes (tma_store=False stores them from registers)"),
    (gemm((256, 256, 256)), {"split_k": 5}, "splits K=256 into 1 to 4 slices of whole 128-byte "
                                            "K blocks, not split_k=5"),
    (gemm((8192, 8192, 8192)), {"split_k": 8}, "split_k=8 over 2048 tiles of 128x256 keeps "
                                               "2048 MB of partials; at most 256 MB"),
    (gemm((256, 256, 256)), {"split_tail": True, "split_k": 1},
     "split_tail splits the last wave's tiles into split_k slices: it needs split_k > 1"),
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
    (gemm((256, 256, 256)), {"swap_ab": True, "tma_store": False},
     "v8's swap_ab multiplies C^T = B A^T, B's rows on the tile's rows, and stores C transposed "
     "from registers: it needs layout nt, not nn"),
    (gemm((256, 256, 256), layout="nt"), {"swap_ab": True, "tma_store": True},
     "it needs tma_store=False, not True"),
    (Workload("gemm", (256, 256, 256), FP8, "bfloat16", "nt", "block"),
     {"swap_ab": True, "tma_store": False, "promote_k": 128},
     "it needs scales per tensor or per row, not block"),
    (gemm((300, 256, 256), layout="nt"), {"swap_ab": True, "tma_store": False, "block_n": 12},
     "a multiple of 8 columns (wgmma's n8, C stored transposed one element at a time), at most "
     "256: block_n=12"),
    (gemm((300, 256, 256), layout="nt"),
     {"swap_ab": True, "tma_store": False, "block_m": 64, "block_n": 8},
     "block_n=8 with block_m=64 does not split so"),
    (gemm((300, 2048, 1024), layout="nt"),
     {"swap_ab": True, "tma_store": False, "block_n": 152, "cluster_m": 2, "split_k": 1},
     "sharing B in halves of whole 8-row swizzle atoms"),
], ids=lambda x: x.label() if isinstance(x, Workload) else str(x)[:40])
def test_v8_refuses_what_tma_and_its_tiles_cannot_take(wl, knobs, reason, target):
    with pytest.raises(ScheduleNotApplicable, match=re.escape(reason)):
        schedules.get("gemm", "v8").apply(wl, target, **knobs)


@needs_nvcc
def test_v8_swap_ab_multiplies_b_rows_on_the_tiles_rows_and_stores_c_transposed(
        target, compiled, lowered):
    """swap_ab: the parameters keep the workload's shapes, but B's rows (N) are the tile's rows
    and A's (M) its columns, in any multiple of 8 (m64n152 wgmmas for 300 tokens in two
    tiles); each operand staged as the kernel multiplies it (B's rows first); C stored
    element by element (its tile goes out transposed: no pair stores), and no spills."""
    wl = gemm((300, 1001, 4095), "bfloat16", "float32", "nt")
    knobs = {"swap_ab": True, "tma_store": False, "block_n": 152}
    script = schedules.get("gemm", "v8").apply(wl, target, **knobs)["main"].script()
    assert ('def main(A: T.Buffer((300, 4095), "bfloat16", align=16), B: T.Buffer((1001, 4095), '
            '"bfloat16", align=16), C: T.Buffer((300, 1001), "float32", align=16)):') in script
    kernel = kf.kernel(lowered("v8", wl, **knobs))
    assert {kf.words(c)[3] for c in kf.calls(kernel, "ptx.wgmma_bf16_ss")} == {"m64n152k16"}
    staged = kf.calls(kernel, "v8_stage_rows_16")
    assert [kf.pointers(c) for c in staged] == [("B", "A_rows"), ("A", "B_rows")]
    assert [kf.ints(c) for c in staged] == [(1001, 4095, 4096), (300, 4095, 4096)]
    assert kf.stores_to(kernel, "C") and not kf.calls(kernel, "v8_store_pair")
    (usage,) = build.nvcc_resources(compiled("v8", wl, **knobs)[1], "sm_90").values()
    assert not usage.get("spill_stores") and not usage.get("stack_bytes")


@needs_nvcc
@pytest.mark.parametrize("wl", [
    Workload("gemm", (64, 28672, 4096), FP8, "bfloat16", "nt"),
    Workload("gemm", (96, 28672, 4096), FP8, "bfloat16", "nt"),
    Workload("gemm", (300, 13020, 4096), FP8, "bfloat16", "nt", "row"),
    Workload("gemm", (300, 28672, 1024), "bfloat16", "bfloat16", "nt"),
], ids=Workload.label)
def test_v8_swapped_defaults_compile_without_spills(wl, compiled):
    """swap_ab's tiles cut to M (80-104 columns, with fp8's promotions; 256 rows on 16-bit)
    compile without spilling: fp8's runs of overlapped promotions spilled on such widths."""
    (usage,) = build.nvcc_resources(compiled("v8", wl, swap_ab=True)[1], "sm_90").values()
    assert not usage.get("spill_stores") and not usage.get("stack_bytes")


def test_v8_for_any_m_refuses_swap_ab():
    """v8 for any M walks M on the tile's rows, so it cannot put M on the columns."""
    from schedules.v8 import v8_kernel_any_m

    wl = gemm((300, 1024, 1024), "bfloat16", "bfloat16", "nt")
    knobs = {**schedules.get("gemm", "v8").defaults_for(wl), "swap_ab": True, "tma_store": False,
             "split_k": 1, "split_tail": False}
    with pytest.raises(ScheduleNotApplicable, match="swap_ab=False, not True"):
        v8_kernel_any_m(wl, **knobs)


def test_v8_needs_sm_90():
    with pytest.raises(ScheduleNotApplicable, match="^v8 uses TMA, mbarriers and wgmma .* not sm_80"):
        schedules.get("gemm", "v8").apply(gemm((256, 256, 256)), build.cuda_target("sm_80"))


def test_only_tirx_kernels_take_the_tirx_pipeline(target):
    v8 = schedules.get("gemm", "v8").apply(gemm((256, 256, 256), "bfloat16", layout="nt"), target)
    v5p = schedules.get("gemm", "v5p").apply(gemm((256, 256, 256), "float32"), target)
    assert build.pipeline_of(v8) == ("tirx", {})
    assert build.pipeline_of(v5p) == ("explorer", build.pass_config(v5p))


def _scale_d(wgmma) -> object:
    """A wgmma call's scale-d operand: whether it adds to its accumulators (the third argument
    after them, past the two descriptors)."""
    first = next(i for i, a in enumerate(wgmma.args)
                 if not (isinstance(a, tvm.ir.TensorLoad) and a.source.name == "acc"))
    return wgmma.args[first + 2]


def test_v8_promote_k_adds_wgmmas_sums_into_float32_sums_every_promote_k_elements(lowered):
    """promote_k=256 on fp8 (two K blocks of 128): a K block whose count reaches two waits for
    every wgmma and adds the accumulators into the float32 sums, inside an if in the K loop; the
    next block's first k step starts wgmma's sums afresh (its scale-d `kt % 2 != 0`), its other
    steps add; after the loop the blocks since the last promotion are added too and the sums
    become the accumulators (the scales then apply as before). Without promote_k: one set of
    accumulators, every wgmma adds, one wait for all after the loop."""
    wl = gemm((4096, 4096, 4096), FP8, layout="nt")
    promoted = kf.kernel(lowered("v8", wl, block_n=128, promote_k=256))
    plain = kf.kernel(lowered("v8", wl, block_n=128, promote_k=None))
    scale_d = [_scale_d(c) for c in kf.calls(promoted, "ptx.wgmma_fp8_ss")]
    assert len(scale_d) == 4 and all(isinstance(s, tvm.tirx.IntImm) for s in scale_d[1:])
    fresh = scale_d[0]
    assert not isinstance(fresh, tvm.tirx.IntImm) and "kt" in kf.variables(fresh)
    assert all(int(_scale_d(c)) == 1 for c in kf.calls(plain, "ptx.wgmma_fp8_ss"))
    assert kf.buffers(promoted)["sums"] == ("local", (64,), "float32")
    assert not kf.stores_to(plain, "sums")
    (k_loop,) = [f for f in kf.loop(promoted, "kt") if kf.calls(f, "ptx.wgmma_fp8_ss")]
    in_the_loop = kf.inside_ifs(k_loop, S.BufferStore)
    assert [s for s in in_the_loop if s.buffer.name == "sums"]
    assert [kf.ints(c) for c in kf.calls(k_loop, "ptx.wgmma_wait_group")] == [(1,), (0,)]
    assert [kf.ints(c) for c in kf.calls(plain, "ptx.wgmma_wait_group")] == [(1,), (0,)]
    last_wait = max(kf.at(promoted, kf.called("ptx.wgmma_wait_group")))
    taken = kf.at(promoted, lambda n: isinstance(n, S.BufferStore) and n.buffer.name == "acc"
                  and isinstance(n.value, tvm.ir.TensorLoad) and n.value.source.name == "sums")
    assert taken and min(taken) > last_wait


def _first_accumulator(wgmma) -> int:
    """The index of the first accumulator register a wgmma call writes."""
    first = next(a for a in wgmma.args if isinstance(a, tvm.ir.TensorLoad)
                 and a.source.name == "acc")
    return int(first.indices[0])


def test_v8_promote_overlap_takes_two_sets_in_turn_and_waits_for_all_once_a_run(lowered):
    """promote_overlap=4 (K = 4096: 32 blocks of 128, 8 whole runs): the accumulators are two
    sets of 64; in the run loop the 4 blocks' wgmmas write the sets in turn, each block waits
    for the block before alone (wait_group 1) and adds that block's set into the float32 sums,
    and the run ends in one wait for all before its last block's set is added: 4 x 64 sums
    stored a run."""
    wl = gemm((4096, 4096, 4096), FP8, layout="nt")
    kernel = kf.kernel(lowered("v8", wl, block_n=128, promote_k=128, promote_overlap=4))
    assert kf.buffers(kernel)["acc"] == ("local", (128,), "float32")
    (run_loop,) = [f for f in kf.loop(kernel, "kr") if kf.calls(f, "ptx.wgmma_fp8_ss")]
    firsts = [_first_accumulator(c) for c in kf.calls(run_loop, "ptx.wgmma_fp8_ss")]
    assert firsts == [0] * 4 + [64] * 4 + [0] * 4 + [64] * 4
    assert [kf.ints(c) for c in kf.calls(run_loop, "ptx.wgmma_wait_group")] == [(1,)] * 4 + [(0,)]
    assert len(kf.stores_to(run_loop, "sums")) == 4 * 64


def test_v8_promote_overlap_takes_the_blocks_after_whole_runs_in_one_shorter_run(lowered):
    """promote_overlap=8 on K = 3968 (31 blocks, a count known as the kernel is built): 3 whole
    runs in the loop over kr, then one run of the 7 blocks left after it, ending in its own
    wait for all; no block promoted alone (the loop over kt for K split is empty)."""
    wl = gemm((1024, 1024, 3968), FP8, layout="nt")
    kernel = kf.kernel(lowered("v8", wl, block_n=128, split_k=1, promote_k=128,
                               promote_overlap=8))
    (runs,) = [f for f in kf.loop(kernel, "kr") if kf.calls(f, "ptx.wgmma_fp8_ss")]
    assert int(runs.extent) == 3
    in_runs = kf.calls(runs, "ptx.wgmma_wait_group")
    after = [kf.ints(c) for c in kf.calls(kernel, "ptx.wgmma_wait_group")
             if not any(c.same_as(d) for d in in_runs)]
    assert [kf.ints(c) for c in in_runs] == [(1,)] * 8 + [(0,)]
    assert after[:8] == [(1,)] * 7 + [(0,)]
    outside = len(kf.calls(kernel, "ptx.wgmma_fp8_ss")) - len(kf.calls(runs, "ptx.wgmma_fp8_ss"))
    assert outside == 7 * 4  # the shorter run's blocks' k steps


def test_v8_promote_halves_promotes_each_half_of_a_block_under_the_others_wgmmas(lowered):
    """promote_halves with runs of 4 (K = 4096: 32 blocks, 8 whole runs) on 128x144 tiles: one
    set of 72 accumulators a consumer; each K block's 4 k steps go out as two groups of m64n72
    wgmmas, into the first 36 accumulators and then the last 36; in a run, every wait but the
    last leaves the newest group in flight (wait_group 1), and the run ends in one wait for
    all: 4 x 72 sums stored a run."""
    wl = gemm((4096, 4096, 4096), FP8, layout="nt")
    kernel = kf.kernel(lowered("v8", wl, block_n=144, split_k=1, promote_k=128,
                               promote_overlap=4, promote_halves=True))
    assert kf.buffers(kernel)["acc"] == ("local", (72,), "float32")
    (run_loop,) = [f for f in kf.loop(kernel, "kr") if kf.calls(f, "ptx.wgmma_fp8_ss")]
    wgmmas = kf.calls(run_loop, "ptx.wgmma_fp8_ss")
    assert {kf.words(c) for c in wgmmas} == {kf.words(wgmmas[0])}
    assert "m64n72k32" in kf.words(wgmmas[0])
    assert [_first_accumulator(c) for c in wgmmas] == ([0] * 4 + [36] * 4) * 4
    assert [kf.ints(c) for c in kf.calls(run_loop, "ptx.wgmma_wait_group")] == [(1,)] * 7 + [(0,)]
    assert len(kf.calls(run_loop, "ptx.wgmma_commit_group")) == 2 * 4
    assert len(kf.stores_to(run_loop, "sums")) == 4 * 72


@pytest.mark.parametrize("wl, knobs", [
    (gemm((4096, 4096, 4096), "bfloat16", "bfloat16", "nt"),
     {"block_n": 256, "split_k": 1, "tma_store": True}),
    (gemm((4096, 4608, 3584), FP8, "bfloat16", "nt", "row"),
     {"block_n": 128, "split_k": 2, "split_tail": True, "promote_overlap": None}),
    (gemm((4096, 4608, 1024), "float16", "float16", "nt"),
     {"block_n": 256, "split_k": 1, "tma_store": False}),
    (gemm((4096, 4606, 1024), "bfloat16", "bfloat16", "nt"),
     {"block_n": 128, "split_k": 1, "tma_store": False}),
], ids=["bf16-boxes", "fp8-rowwise-split-k", "f16-quads", "bf16-registers"])
def test_v8_for_any_m_adds_a_layers_bias_as_it_stores_c(wl, knobs):
    """With a bias (a linear layer's), v8 for any M takes it before C, in C's dtype, and adds
    each accumulator's column's as the epilogue stores it (after fp8's scales and split K's
    gather), whichever epilogue (boxes, quads, registers): one read for each of a consumer
    thread's accumulators, its share of the consumer's half tile, each indexed from the
    thread's origin register (`indexed_from_origin`: the column recomputed at each read had
    doubled split K's time); without one it has no such parameter."""
    knobs = schedules.get("gemm", "v8").defaults_for(wl, {"swap_ab": False, **knobs})
    funcs = {bias: v8.v8_kernel_any_m(wl, bias=bias, **knobs) for bias in (False, True)}
    assert "Bias" not in kf.params_of(funcs[False])
    assert kf.params_of(funcs[True])[-2:] == ["Bias", "C"]
    kernel = kf.kernel(build.lower(tvm.IRModule({"main": funcs[True]}),
                                   build.cuda_target("sm_90")))
    loads = kf.loads_from(kernel, "Bias")
    assert len(loads) == knobs["block_m"] * knobs["block_n"] // (2 * 128)
    assert {str(load.source.dtype) for load in loads} == {wl.out_dtype}
    assert all(indexed_from_origin(kernel, index) for load in loads for index in load.indices)


@pytest.mark.parametrize("wl", [gemm((16, 768, 1024), "bfloat16", "bfloat16", "nt"),
                                gemm((8, 4608, 3584), FP8, "bfloat16", "nt", "row")],
                         ids=lambda wl: wl.label())
def test_v8_swapped_adds_the_bias_of_cs_column_from_its_own_rows(wl):
    """Swapped (the workload's N on the tile's rows, C stored transposed), v8 for a number M
    with a bias (a linear layer's bucket of one M) adds one to each value it stores, read at
    the tile's row: the workload's column (the GPU tier checks the values: every candidate of
    a linear layer's bucket of one M passes its float64 check)."""
    knobs = schedules.get("gemm", "v8").defaults_for(wl)
    assert knobs["swap_ab"]
    kernel = kf.kernel(build.lower(tvm.IRModule({"main": v8.v8_kernel(wl, bias=True, **knobs)}),
                                   build.cuda_target("sm_90")))
    loads, stores = kf.loads_from(kernel, "Bias"), kf.stores_to(kernel, "C")
    assert len(loads) == len(stores) > 0


# What a unit's tile walk reads (the CTA, the turn, the unit and its tile and origin): none of
# it may reach an index of the epilogue, which reads the thread's origin register instead.
TILE_WALK = {"blockIdx.x", "turn", "j", "unit", "tile", "m0", "n0"}


def indexed_from_origin(kernel, index) -> bool:
    """Whether an index in `kernel` reads the thread's origin register (its first row and
    column of the unit) and nothing of the unit's tile walk."""
    reads = kf.depends_on(kernel, index)
    return "origin" in reads and not reads & TILE_WALK


@pytest.mark.parametrize("wl, knobs", [
    (gemm((4096, 4608, 3584), FP8, "bfloat16", "nt"),
     {"block_n": 128, "block_m": 128, "split_k": 3, "tma_store": False}),
    (gemm((4096, 4608, 3584), FP8, "bfloat16", "nt", "row"),
     {"block_n": 256, "block_m": 64, "split_k": 6, "tma_store": False}),
    (gemm((4096, 4606, 1024), "bfloat16", "bfloat16", "nt"),
     {"block_n": 128, "split_k": 1, "tma_store": False}),
], ids=["fp8-split-quads", "fp8-rowwise-split", "bf16-registers"])
def test_v8_for_any_m_indexes_its_epilogue_from_the_threads_origin_register(wl, knobs):
    """v8 for any M: every element of C that the epilogue stores (quads, registers) and every
    rowwise scale it reads (a tensor's one scale aside) is indexed from the thread's origin
    register, set once a unit, and from nothing of the unit's tile walk: substituted into each
    index, that walk (divisions by runtime sizes) had grown a split-K kernel's SASS sixfold
    and its time at 17 rows from about 15 us to 52 (its epilogue's code outgrew the
    instruction cache). v8 for a number M has no such register: its walk folds, and TVM
    proves C's edge checks away from the row and column it sees."""
    knobs = schedules.get("gemm", "v8").defaults_for(
        wl, {"swap_ab": False, "promote_overlap": None,
             "split_tail": knobs["split_k"] > 1, **knobs})
    target = build.cuda_target("sm_90")
    fixed = kf.kernel(build.lower(tvm.IRModule({"main": v8.v8_kernel(wl, **knobs)}), target))
    assert "origin" not in kf.buffers(fixed)
    kernel = kf.kernel(build.lower(tvm.IRModule({"main": v8.v8_kernel_any_m(wl, **knobs)}),
                                   target))
    indices = [index for access in kf.loads_from(kernel, "C") + kf.stores_to(kernel, "C")
               + kf.loads_from(kernel, "A_scale") + kf.loads_from(kernel, "B_scale")
               for index in access.indices if not isinstance(index, tvm.tirx.IntImm)]
    if wl.scales == "row":
        assert kf.loads_from(kernel, "A_scale") and kf.loads_from(kernel, "B_scale")
    assert indices and all(indexed_from_origin(kernel, index) for index in indices)


def test_nvcc_resources_read_ptxas_serializing_a_kernels_wgmmas():
    """ptxas's C7514 line (as it printed it for an overlapped run read across the K loop's back
    edge) marks its kernel; a kernel without it is marked false."""
    usage = build._parse_resource_usage(
        "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
        "serialized due to non wgmma instructions reading accumulator registers of  a wgmma "
        "between start and end of the pipeline stage in the function 'main_kernel'\n"
        "ptxas info    : Compiling entry function 'main_kernel' for 'sm_90a'\n"
        "ptxas info    : Used 168 registers, used 16 barriers, 1024 bytes smem\n"
        "ptxas info    : Compiling entry function 'other' for 'sm_90a'\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 0 bytes smem\n")
    assert usage["main_kernel"]["wgmma_serialized"] is True
    assert usage["main_kernel"]["registers"] == 168
    assert usage["other"]["wgmma_serialized"] is False


@pytest.mark.parametrize("wl, knobs", [
    (gemm((4096, 4096, 4096), FP8, "bfloat16", "nt"), {"block_n": 128, "promote_overlap": 4}),
    (gemm((128, 4608, 4096), FP8, "bfloat16", "nt"),
     {"block_n": 128, "split_k": 3, "promote_overlap": 4}),  # runs of a count known at the call
    (gemm((1000, 1000, 1168), FP8, "float32", "nt"),  # 64x256: two consumers side by side
     {"block_m": 64, "block_n": 256, "promote_overlap": 2}),
    # the heuristic's runs (registered_run), where runs of 8 (or a lone 7) spilled: 12 K
    # blocks, 8, 64-row tiles
    (gemm((4096, 24576, 1536), FP8, "bfloat16", "nt"), {}),
    (gemm((4096, 4096, 1024), FP8, "bfloat16", "nt"), {}),
    (gemm((48, 27648, 5120), FP8, "bfloat16", "nt"), {}),
    (gemm((300, 32064, 3072), FP8, "bfloat16", "nt"), {"block_m": 64, "block_n": 256}),
    (gemm((300, 9728, 896), FP8, "bfloat16", "nt"), {"block_m": 64, "block_n": 256}),
    # by halves of the columns: 128x192 (the runs the heuristic keeps short there; of 2 on 23
    # K blocks), 128x160 on 38 K blocks (runs of 8, and a run of 6 after them), 160 on a lone
    # run of 7
    (gemm((2048, 10240, 8192), FP8, "bfloat16", "nt"), {"promote_halves": True}),
    (gemm((2500, 896, 4864), FP8, "bfloat16", "nt"),
     {"block_n": 160, "split_k": 1, "promote_halves": True}),
    (gemm((700, 9728, 896), FP8, "bfloat16", "nt"), {"promote_halves": True}),
    (gemm((2926, 16112, 2944), FP8, "bfloat16", "nt"), {"promote_halves": True}),  # 23 blocks
], ids=["whole", "split", "64x256", "12-blocks", "8-blocks", "64-row", "64x256-default-runs",
        "64x256-7-blocks", "halves-192", "halves-160", "halves-7-blocks", "halves-192-23-blocks"])
@needs_nvcc
def test_v8_promote_overlap_compiles_without_serialized_wgmmas_or_spills(compiled, wl, knobs):
    """ptxas serializes every wgmma of a kernel that reads a set of accumulators where it
    cannot tell that set's wgmmas done (across the K loop's back edge, or past an `if` around a
    block): overlapped runs must not, nor spill the third set of registers."""
    _, source, _ = compiled("v8", wl, promote_k=128, **knobs)
    (resources,) = build.nvcc_resources(source, "sm_90").values()
    assert not resources["wgmma_serialized"]
    assert resources["spill_stores"] == resources["spill_loads"] == 0


@pytest.mark.parametrize("wl, knobs, words", [
    (gemm((4096, 4096, 4096), "bfloat16", layout="nt"), {"promote_k": 128},
     "bfloat16 wgmma accumulates in float32 already"),
    (gemm((4096, 4096, 4096), FP8, layout="nt"), {"promote_k": 192, "block_n": 128},
     "promote_k=192 is not a positive multiple of 128"),
    (gemm((4096, 4096, 4096), FP8, layout="nt"), {"promote_k": 128, "block_n": 256},
     "2 x 128 registers a consumer thread for a 128x256 tile; at most 192"),
    (gemm((4096, 4096, 4096), FP8, layout="nt"),
     {"promote_k": 128, "block_n": 192, "promote_overlap": 2},
     "two sets of wgmma's sums and the float32 sums, 3 x 96 registers"),
    (gemm((4096, 4096, 4096), FP8, layout="nt"),
     {"promote_k": 256, "block_n": 128, "promote_overlap": 2}, "needs promote_k=128"),
    (gemm((4096, 4096, 4096), FP8, layout="nt"),
     {"promote_k": 128, "block_n": 128, "promote_overlap": 1}, "none (off) or 2 to 8, not 1"),
    (gemm((4096, 4096, 4096), FP8, layout="nt"),
     {"promote_k": 128, "block_n": 128, "promote_overlap": 16}, "none (off) or 2 to 8, not 16"),
    (gemm((4096, 4096, 4096), FP8, layout="nt"),
     {"promote_k": 128, "block_m": 64, "block_n": 128, "promote_overlap": 2, "pingpong": True},
     "(pingpong=False)"),
    (gemm((4096, 4096, 4096), FP8, layout="nt"),
     {"promote_k": 128, "block_n": 192, "promote_halves": True, "promote_overlap": None},
     "it needs promote_overlap (2 to 8), not promote_overlap=none"),
    (gemm((300, 4096, 4096), FP8, layout="nt"),  # swapped: 8-column steps
     {"swap_ab": True, "tma_store": False, "block_n": 152, "promote_k": 128,
      "promote_overlap": 2, "promote_halves": True}, "block_n=152 leaves halves of 76"),
])
def test_v8_refuses_promotion_it_cannot_make_in_one_line(wl, knobs, words):
    with pytest.raises(ScheduleNotApplicable, match=re.escape(words)):
        schedules.get("gemm", "v8").apply(wl, build.cuda_target("sm_90"), **knobs)


@needs_nvcc
def test_v8_with_promote_k_compiles_without_spilling(compiled):
    """The float32 sums double a consumer's accumulators: 128x192 tiles (96 each) still fit
    without spills."""
    _, source, _ = compiled("v8", gemm((4096, 4096, 4096), FP8, layout="nt"), block_n=192,
                            promote_k=128)
    (resources,) = build.nvcc_resources(source, "sm_90").values()
    assert resources["spill_stores"] == resources["spill_loads"] == 0
