"""nvfp4 (schedules/fp4.py): the decode proven exact, the workload's definition right on the CPU,
its refusals, and the IR of the rungs that the batched seed's ladder adds: one launch per batch
(V0) and the bit-operation decode with f16x2 FMAs (its final kernel)."""

import re
import shutil

import ml_dtypes
import numpy as np
import pytest
import tvm

import runner
import schedules
from schedules import Workload, WorkloadError, fp4
from schedules.errors import ScheduleNotApplicable
from tests.test_nvfp4_measure import FINITE_SCALE_BYTES, expected_values
from tuning import build

ALL_CODES = range(16)
E4M3_BYTES = np.arange(256, dtype=np.uint8)


def test_value_table_is_e2m1():
    for code in ALL_CODES:
        sign = -1.0 if code & 8 else 1.0
        exponent, mantissa = (code >> 1) & 3, code & 1
        magnitude = mantissa / 2 if exponent == 0 else (1 + mantissa / 2) * 2.0 ** (exponent - 1)
        assert fp4.VALUES[code] == sign * magnitude


def test_e4m3_values_match_ml_dtypes_on_every_byte():
    theirs = E4M3_BYTES.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    ours = np.array([fp4.e4m3_value(b) for b in E4M3_BYTES])
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    assert np.array_equal(ours[~np.isnan(ours)], theirs[~np.isnan(theirs)])


@pytest.mark.parametrize("position", range(8))
def test_fast_decode_is_exact_for_every_code_in_every_place_of_a_word(position):
    """Every code, in each of the 8 nibbles of a word, next to every other code."""
    for code in ALL_CODES:
        for other in ALL_CODES:
            word = sum(other << (4 * i) for i in range(8) if i != position) | code << (4 * position)
            decoded = fp4.fast_decode(word)
            assert decoded[position] == fp4.VALUES[code]
            assert all(decoded[i] == fp4.VALUES[other] for i in range(8) if i != position)


def test_fast_decode_check_can_fail():
    """A shift off by one nibble no longer decodes: the test above would catch it."""
    bits = ((0x76543210 << 8) & 0xFFFFFFFF)
    wrong = ((bits & fp4.HALF_SIGNS) | ((bits >> 3) & fp4.HALF_MAGNITUDES))
    assert fp4.half_value(wrong & 0xFFFF) / fp4.UNIT != fp4.VALUES[0]


def test_block_products_and_sums_are_exact_in_fp16():
    """What bitdecode computes in fp16: B's value times 2^-14 (fp16 from the decode's bits) times
    x's value, for every pair of codes, and sums of 8 such products at the largest magnitude,
    equal the exact values; then scales times 2^14 are exact in float32, for every pair of
    finite e4m3 scales."""
    b = np.array([np.float16(fp4.half_value(fp4.pair_bits(c, 0) & 0xFFFF)) for c in ALL_CODES])
    x = np.array(fp4.VALUES, dtype=np.float16)
    products = np.multiply.outer(b, x)  # fp16 arithmetic
    exact = np.multiply.outer(np.array(fp4.VALUES), np.array(fp4.VALUES)) * fp4.UNIT
    assert np.array_equal(products.astype(np.float64), exact)
    total = np.float16(0)
    for _ in range(8):  # one lane's 8 products of a block, all 6 * 6
        total = np.float16(total + products[7, 7])
    assert float(total) == 8 * 36 * fp4.UNIT
    scales = np.array([fp4.e4m3_value(s) for s in FINITE_SCALE_BYTES], dtype=np.float32)
    combined = np.multiply.outer(scales, scales) * np.float32(1 / fp4.UNIT)
    exact = np.multiply.outer(scales.astype(np.float64), scales.astype(np.float64)) / fp4.UNIT
    assert np.array_equal(combined.astype(np.float64), exact)


@pytest.mark.parametrize("position", range(8))
def test_integer_decode_is_exact_for_every_code_in_every_place_of_a_word(position):
    """dp4a's decode: for every code in each nibble next to every other code, the positive and
    negative codes' doubled magnitudes (two `prmt` lookups) differ by twice the code's value,
    and x's signed bytes are twice its value."""
    for code in ALL_CODES:
        for other in ALL_CODES:
            word = sum(other << (4 * i) for i in range(8) if i != position) | code << (4 * position)
            for half in range(2):
                positive = fp4.int8s(fp4.magnitude_bytes(word, half, False))
                negative = fp4.int8s(fp4.magnitude_bytes(word, half, True))
                signed = fp4.int8s(fp4.signed_bytes(word, half))
                for i in range(4):
                    doubled = 2 * fp4.VALUES[(word >> (4 * (4 * half + i))) & 15]
                    assert positive[i] - negative[i] == doubled and signed[i] == doubled
                    assert min(positive[i], negative[i]) == 0  # one of the two sums has it


def test_prmt_model_replicates_the_sign_and_its_check_can_fail():
    """The model of `prmt` copies a byte for a selector nibble below 8 and spreads the byte's
    top bit for one of 8 or more; a table with one wrong byte no longer decodes."""
    assert fp4.prmt(0x80FF0100, 0x0C080604, 0x9B32) == 0x00FF80FF  # bytes 2, 3, 3 and 1
    assert fp4.prmt(0x80FF0100, 0x0C080604, 0x7654) == 0x0C080604
    wrong = (fp4.MAGNITUDE_TABLE[0], 0x0C080504)  # 3 doubled as 5
    assert fp4.prmt(*wrong, 0x5) & 0xFF != 2 * fp4.VALUES[5]  # code 5's byte


def test_integer_block_sums_scale_exactly_in_float32():
    """What dp4a computes in float32: a block's integer sum (up to 16 * 12 * 12) times B's
    scale times x's scale / 4, for every pair of finite e4m3 scales, equals the exact value."""
    scales = np.array([fp4.e4m3_value(s) for s in FINITE_SCALE_BYTES], dtype=np.float32)
    for total in (16 * 144, 16 * 144 - 1, -(16 * 144 - 3)):
        got = np.float32(total) * np.multiply.outer(scales, scales * np.float32(0.25))
        exact = total * np.multiply.outer(scales.astype(np.float64), scales.astype(np.float64)) / 4
        assert np.array_equal(got.astype(np.float64), exact)


@pytest.mark.parametrize("wl", [Workload("batched_gemv", (3, 5, 48), "nvfp4"),
                                Workload("gemv", (7, 32), "nvfp4", "float32")],
                         ids=lambda wl: wl.label())
def test_definition_decodes_every_code_and_scale_on_the_cpu(wl):
    """The workload's compute definition, built for the CPU: every code and many scales."""
    rng = np.random.default_rng(0)
    shapes = wl.buffer_shapes()
    arrays = {n: rng.integers(0, 256, shapes[n], dtype=np.uint8) for n in ("B", "x")}
    moderate = [b for b in FINITE_SCALE_BYTES if 2 ** -4 <= abs(fp4.e4m3_value(b)) < 4]  # y finite
    arrays |= {n: rng.choice(moderate, shapes[n]).astype(np.uint8) for n in ("B_scale", "x_scale")}
    assert set(np.unique(arrays["B"] & 15)) == set(ALL_CODES)
    executable = tvm.compile(tvm.IRModule({"main": wl.prim_func()}), target="llvm")
    cpu = tvm.cpu()
    tensors = [tvm.runtime.tensor(arrays[n].view(ml_dtypes.float8_e4m3fn) if "scale" in n
                                  else arrays[n], cpu) for n in ("B", "B_scale", "x", "x_scale")]
    y = tvm.runtime.tensor(np.zeros(shapes["y"], wl.out_dtype), cpu)
    executable["main"](*tensors, y)
    b = expected_values(arrays["B"], arrays["B_scale"])
    x = expected_values(arrays["x"], arrays["x_scale"])
    expected = np.einsum("...nk,...k->...n", b, x)
    assert np.allclose(y.numpy().astype(np.float64), expected, rtol=1e-3, atol=1e-3 * abs(expected).max())


@pytest.mark.parametrize("shape, op, why", [
    ((4, 40), "gemv", "K=40 is not a multiple of 16"),
    ((2, 4, 8), "batched_gemv", "K=8 is not a multiple of 16"),
    ((4, 4, 32), "gemm", "nvfp4 inputs are for gemv and batched_gemv"),
])
def test_workloads_nvfp4_cannot_take_are_refused(shape, op, why):
    with pytest.raises(WorkloadError, match=why):
        Workload(op, shape, "nvfp4")


def test_nvfp4_output_is_float16_and_never_nvfp4():
    assert Workload("gemv", (4, 32), "nvfp4").out_dtype == "float16"
    with pytest.raises(WorkloadError, match="unknown output dtype 'nvfp4'"):
        Workload("gemv", (4, 32), "float16", "nvfp4")


def test_min_bytes_counts_codes_and_scales():
    wl = Workload("batched_gemv", (8, 4096, 7168), "nvfp4")  # the seed's 132.2 MB
    assert wl.min_bytes == 8 * (4096 * 7168 // 2 + 4096 * 7168 // 16 + 7168 // 2 + 7168 // 16
                                + 4096 * 2)
    assert round(wl.min_bytes / 1e6, 1) == 132.2


def test_cli_refuses_a_ragged_block_in_one_line(capsys):
    assert runner.main(["--op", "gemv", "--shape", "64x40", "--dtype", "nvfp4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "K=40 is not a multiple of 16" in err


# -- the rungs' IR --------------------------------------------------------------------------------
SEED = Workload("batched_gemv", (4, 7168, 2048), "nvfp4")
RAGGED = Workload("batched_gemv", (3, 1001, 1008), "nvfp4")
needs_nvcc = pytest.mark.skipif(not shutil.which("nvcc"),
                                reason="nvcc is not on PATH: the generated CUDA is not compiled")


def test_launches_loops_over_the_batches_on_the_host(compiled):
    _, source, summary = compiled("launches", SEED)
    assert summary.grid == {"blockIdx.x": 56} and summary.kernels == 1
    signature = next(line for line in source.splitlines() if "__global__" in line)
    assert re.search(r", int \w+\)", signature)  # the batch, an argument
    _, source, summary = compiled("naive", SEED)
    assert summary.grid == {"blockIdx.x": 56, "blockIdx.y": 4}
    assert not re.search(r", int \w+\)", source)


def test_multirow_decodes_x_once_per_step_for_all_its_rows(compiled):
    ir, _, _ = compiled("multirow", SEED)
    assert "x_value_local = T.alloc_local((32,))" in ir
    assert ir.count("x_value_local[") > 1  # written once, read by each row


def test_bitdecode_is_shifts_masks_and_f16x2_fmas(compiled):
    ir, source, summary = compiled("bitdecode", SEED)
    K = SEED.dims["K"]
    assert summary.block == {"threadIdx.x": 8 * 32}  # the default 8 warps
    assert summary.shared_bytes == K * 2 + K // 16 * 4 and summary.syncthreads == 1  # x decoded, once
    assert source.count("fp4_hfma2(") >= 2 * 8 * 2 and "fma.rn.f16x2" in source  # 2 rows, 2 blocks
    assert "*(uint4*)(bw_ptr" in source and "*(uint4*)(xh_ptr + 0) = *(uint4*)(x_decoded" in source
    assert str(fp4.HALF_MAGNITUDES) in source and str(fp4.HALF_SIGNS) in source
    assert "__nv_cvt_fp4" not in source and "cuda_fp4" not in source  # no conversion library
    assert "tvm_builtin_cuda_warp_reduce_sum_32" in source
    kernel = source.split("main_kernel(")[-1]
    assert kernel.rindex("*(uint4*)(bw_ptr") < kernel.index("fp4_hfma2(")  # every load, then math
    assert "cvt.rn.f16x2.e4m3x2" in source and "ushort* __restrict__ B_scales" in source  # in pairs


def test_dp4a_is_prmt_lookups_and_int8_dot_products(compiled):
    """dp4a at its defaults on K = 2048, one step per lane: 2 chunks of 2 blocks of 2 words,
    each half word a `prmt` and a `dp4a` for its positive codes and again for its negative
    ones (32 of each), and x's word per thread takes 4 `prmt` more; no f16x2 FMA. x sits in
    shared memory as int8s: half of bitdecode's f16x2."""
    _, source, summary = compiled("dp4a", SEED)
    _, _, bitdecode = compiled("bitdecode", SEED)
    K = SEED.dims["K"]
    assert summary.shared_bytes == K + K // 16 * 4 and summary.syncthreads == 1
    assert bitdecode.shared_bytes == 2 * K + K // 16 * 4
    kernel = source.split("main_kernel(")[-1]
    assert kernel.count("fp4_dp4a(") == 2 * 2 * 2 * 2 * 2 and kernel.count("fp4_prmt(") == 32 + 4
    assert "prmt.b32" in source and "__dp4a(" in source and "fp4_hfma2(" not in kernel
    assert str(fp4.CODE_SIGNS) in source and "cvt.rn.f16x2.e4m3x2" in source


def test_bitdecode_loads_the_next_step_before_this_ones_arithmetic(compiled):
    """Two register buffers: the loop issues step g + 1's loads (buffer 1: words 16 on, with
    2 rows and depth 2) before step g's FMAs, and step 0's come before x's decode."""
    _, source, _ = compiled("bitdecode", Workload("batched_gemv", (1, 64, 16384), "nvfp4"), rows=2, depth=2)
    kernel = source.split("main_kernel(")[-1]
    assert "for (int pair_of_steps" in kernel
    assert kernel.index("*(uint4*)(bw_ptr + 0)") < kernel.index("x_words_ptr[")
    assert kernel.index("*(uint4*)(bw_ptr + 16)") < kernel.index("fp4_hfma2(")


def test_bitdecode_decodes_a_long_x_in_slabs(compiled):
    """K beyond one slab of x (512 chunks of 32 codes): the same shared buffers, filled twice,
    with a barrier before each refill and after each fill."""
    from schedules.nvfp4 import SLAB_CHUNKS

    _, _, summary = compiled("bitdecode", Workload("gemv", (37, SLAB_CHUNKS * 32 + 40 * 32), "nvfp4"))
    assert summary.shared_bytes == SLAB_CHUNKS * 32 * 2 + SLAB_CHUNKS * 2 * 4
    assert summary.syncthreads == 2


def test_bitdecode_splits_k_over_warps_and_sums_their_partials_in_shared_memory(compiled):
    """splits=4 of 8 warps: two warps' worth of rows per CTA (so four times the CTAs), each
    row's K over four warps, whose partials meet in shared memory behind one more barrier;
    without splits there is no such buffer."""
    wl = Workload("batched_gemv", (3, 1001, 1008), "nvfp4")
    _, plain_source, plain = compiled("bitdecode", wl)
    _, source, split = compiled("bitdecode", wl, rows=2, splits=4)
    assert plain.grid == {"blockIdx.x": 3 * -(-1001 // 8)} and split.grid == {"blockIdx.x": 3 * -(-1001 // 4)}
    assert split.syncthreads == plain.syncthreads + 1
    assert split.shared_bytes == plain.shared_bytes + 4 * 4 * 4  # a float per split and row
    assert "partials" in source and "partials" not in plain_source
    with pytest.raises(ScheduleNotApplicable, match="splits=3 must divide warps=8"):
        compiled("bitdecode", wl, splits=3)


def test_bitdecode_loads_8_byte_rows_where_k_is_an_odd_number_of_blocks(compiled):
    _, source, _ = compiled("bitdecode", RAGGED)
    assert "*(uint2*)(bw_ptr" in source and "*(uint4*)(bw_ptr" not in source


@needs_nvcc
def test_bitdecode_has_no_branches_in_its_decode(compiled):
    """The decode is branch-free: the only conditional code left guards x's slab and the
    stores."""
    _, source, _ = compiled("bitdecode", SEED)
    resources = build.nvcc_resources(source, "sm_90")
    assert resources and all(r.get("spill_stores", 0) == 0 for r in resources.values())
    kernel = source.split("main_kernel(")[-1]
    assert kernel.count("if (") <= 3


def test_staged_copies_codes_and_scales_and_decodes_x_in_shared_memory(compiled):
    ir, source, summary = compiled("staged", SEED)
    for buffer in ("B_shared", "B_scale_shared", "x_value_shared"):
        assert f"{buffer} = T.alloc_shared(" in ir
    assert summary.syncthreads >= 2 and "cp_async" not in source
    assert "*(uint4*)(B_shared_ptr" in source  # 16-byte cooperative copies of the codes


@pytest.mark.parametrize("name", ["staged", "pipelined"])
def test_the_block_decodes_each_steps_x_once_and_whole(name):
    """The decode of x into shared memory covers the block's whole K step (32 K threads x 32
    values), shared out over all its threads, whichever K thread runs it. (Scheduled in the
    wrong order, it covered one K thread's 32 values: the GPU summed garbage.)"""
    mod = schedules.get(SEED.op, name).apply(SEED, build.cuda_target("sm_90"))
    sch = tvm.s_tir.Schedule(mod)
    loops = sch.get_loops(sch.get_sblock("x_value"))
    step = next(i for i, loop in enumerate(loops) if sch.get(loop).kind == tvm.tirx.ForKind.SERIAL)
    inner = [sch.get(loop) for loop in loops[step + 1:]]
    assert np.prod([int(loop.extent) for loop in inner]) == 32 * 32
    assert [loop.thread_binding.thread_tag for loop in inner if loop.thread_binding is not None] == ["threadIdx.y", "threadIdx.x"]


def test_pipelined_double_buffers_the_copies_with_cp_async(compiled):
    _, source, summary = compiled("pipelined", SEED)
    _, _, one_stage = compiled("staged", SEED)
    assert "cp.async" in source and "cp.async.commit_group" in source
    assert summary.shared_bytes > one_stage.shared_bytes  # two buffers of codes and scales


def test_best_runs_dp4a_on_nvfp4():
    from tuning.explore import rule

    assert rule(SEED)[0] == "dp4a" and rule(Workload("gemv", (64, 32), "nvfp4"))[0] == "dp4a"
    assert rule(Workload("batched_gemv", (4, 7168, 2048), "float16"))[0] != "dp4a"
