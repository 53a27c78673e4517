"""The tensor-core rungs' parts: the bfloat16 intrinsics that v6 derives from TVM's float16 ones
(read off their IR, then off the lowered kernel they produce), and the preconditions v6 and v7
share."""

import pytest
import tvm
import tvm_ffi
from tvm.ir import Call, PrimType, StringImm
from tvm.s_tir import TensorIntrin

import kernel_facts as kf
import schedules
from schedules import ScheduleNotApplicable, Workload
from schedules.tensorcore import intrinsics, require_tensor_core_gemm
from tuning.build import cuda_target


def _found(func, kind) -> list:
    """Every node of type `kind` in `func`'s IR."""
    nodes = []
    tvm_ffi.structural_walk(func, (kind, nodes.append))
    return nodes


def _ldmatrix_dtypes(func) -> list[str]:
    """The own dtype of each ldmatrix call in `func`."""
    return [str(call.ty) for call in _found(func, Call)
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "tirx.ptx_legacy.ldmatrix"]


@pytest.mark.parametrize("b_transposed", [False, True])
def test_bfloat16_intrinsics_have_no_float16_left(b_transposed):
    names = intrinsics("bfloat16", b_transposed)
    for key, operand_dtypes in (("load_a", {"bfloat16"}), ("load_b", {"bfloat16"}),
                                ("compute", {"bfloat16", "float32"})):
        assert "bf16" in names[key]
        intrin = TensorIntrin.get(names[key])
        for func in (intrin.desc, intrin.impl):
            buffers = {str(ty.dtype) for ty in _found(func, tvm.tirx.buffer.BufferType)}
            assert buffers == operand_dtypes, (names[key], buffers)
            assert PrimType("float16") not in _found(func, PrimType)
            assert "float16" not in {str(call.ty) for call in _found(func, Call)}
    # what the codegen reads to emit ldmatrix (.trans) instead of a scalar loop
    for key in ("load_a", "load_b"):
        assert _ldmatrix_dtypes(TensorIntrin.get(names[key]).impl) == ["bfloat16"]
    mma_types = {s.value for s in _found(TensorIntrin.get(names["compute"]).impl, StringImm)}
    assert "bf16" in mma_types and "fp16" not in mma_types


def test_float16_intrinsics_are_tvms_own_and_left_as_they_were():
    intrinsics("bfloat16", False)  # derived from them, which must not change them
    names = intrinsics("float16", False)
    assert names["load_a"] == "mma_ldmatrix_f16_a_dyn" and names["compute"] == "mma_f16f16f32"
    assert _ldmatrix_dtypes(TensorIntrin.get(names["load_a"]).impl) == ["float16"]
    mma_types = {s.value for s in _found(TensorIntrin.get(names["compute"]).impl, StringImm)}
    assert "fp16" in mma_types and "bf16" not in mma_types


@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_bfloat16_v6_loads_with_ldmatrix_and_multiplies_bf16(layout, lowered):
    kernel = kf.kernel(lowered("v6", Workload("gemm", (256, 256, 256), "bfloat16", layout=layout)))
    mmas = kf.calls(kernel, "ptx_legacy.mma")
    assert mmas and {kf.words(c) for c in mmas} == {("m16n8k16", "row", "col", "bf16", "bf16", "fp32")}
    loads = kf.calls(kernel, "ptx_legacy.ldmatrix")
    assert loads and {(str(c.ty), kf.ints(c)[1], kf.words(c)) for c in loads} == {("bfloat16", 4, (".b16",))}
    # A is M x K: loaded as it is; B is transposed on the way in where it is K x N (nn)
    transposed = {(kf.pointers(c)[0].split("_")[0], bool(kf.ints(c)[0])) for c in loads}
    assert transposed == {("A", False), ("B", layout == "nn")}


TENSOR_CORE_RUNGS = {"v6": {}, "v7": {"block_n": 64}}  # v7's N tile narrowed for the huge-M case
REFUSALS = [  # (workload, arch, what each rung says after its name)
    (Workload("gemm", (256, 256, 256)), "sm_90", "multiplies float16 or bfloat16 on tensor cores, "
     "not float32"),
    (Workload("gemm", (256, 256, 256), "float16", "float16"), "sm_90",
     "writes the float32 accumulators; use --out-dtype float32"),
    (Workload("gemm", (128 * 65536, 128, 64), "float16"), "sm_90",
     "binds M/block_m=65536 to blockIdx.y, which CUDA limits to 65535"),
    (Workload("gemm", (256, 256, 256), "float16"), "sm_75", "uses .*, which needs sm_"),
]


@pytest.mark.parametrize("rung", TENSOR_CORE_RUNGS)
@pytest.mark.parametrize("wl, arch, reason", REFUSALS)
def test_tensor_core_rungs_refuse_in_their_own_name(rung, wl, arch, reason):
    with pytest.raises(ScheduleNotApplicable, match=f"^{rung} {reason}"):
        schedules.get("gemm", rung).apply(wl, cuda_target(arch), **TENSOR_CORE_RUNGS[rung])


def test_sm_80_is_enough_for_v6_but_not_v7():
    wl = Workload("gemm", (256, 256, 256), "float16")
    with cuda_target("sm_80"):
        require_tensor_core_gemm("v6", wl, (128, 128, 64), 80, "mma.sync")  # refuses nothing
        with pytest.raises(ScheduleNotApplicable, match="^v7 uses wgmma, which needs sm_90 or later"):
            require_tensor_core_gemm("v7", wl, (128, 256, 64), 90, "wgmma")
