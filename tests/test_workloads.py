"""Workload validation and the TE compute definitions."""

import re

import pytest

from schedules import PRESETS, Workload, WorkloadError, parse_shape


@pytest.mark.parametrize(
    "op, shape, dtype, layout, message",
    [
        ("gemm", (0, 512, 2048), "float32", None, "M=0"),
        ("gemm", (1024, -1, 2048), "float32", None, "N=-1"),
        ("gemm", (1024, 512), "float32", None, "MxNxK"),
        ("gemv", (1024, 1024, 3), "float16", None, "NxK"),
        ("gemm", (16, 16, 16), "int8", None, "unknown dtype 'int8'"),
        ("gemm", (16, 16, 16), "float32", "tn", "unknown layout 'tn'"),
        ("gemv", (16, 16), "float16", "nn", "unknown layout 'nn' for gemv"),
        ("conv", (16, 16), "float16", None, "unknown op 'conv'"),
        ("gemm", (16.0, 16, 16), "float32", None, "integers"),
    ],
)
def test_bad_workloads_are_refused_with_the_reason(op, shape, dtype, layout, message):
    with pytest.raises(WorkloadError, match=message):
        Workload(op, shape, dtype, layout=layout)


@pytest.mark.parametrize("text", ["", "1024x", "x512", "1024*512*2048", "1kx2", "1024 512 2048"])
def test_malformed_shape_text(text):
    with pytest.raises(WorkloadError, match="malformed shape"):
        parse_shape(text, "gemm")


def test_shape_text_parses_and_negative_is_refused_by_the_workload():
    assert parse_shape("1024x512x2048", "gemm") == (1024, 512, 2048)
    with pytest.raises(WorkloadError, match="K=-8"):
        Workload("gemm", parse_shape("4x4x-8", "gemm"))


def test_defaults_follow_the_op():
    gemm = Workload("gemm", (8, 8, 8), "float16")
    assert (gemm.out_dtype, gemm.layout, gemm.has_cast) == ("float32", "nn", False)
    gemv = Workload("gemv", (8, 8), "float16")
    assert (gemv.out_dtype, gemv.layout, gemv.has_cast) == ("float16", "nt", True)
    assert gemv.reduction_block == "y_acc" and gemv.output == "y"


def test_fp8_gemm_takes_b_n_by_k_and_a_scale_per_tensor():
    wl = Workload("gemm", (64, 32, 48), "float8_e4m3fn")
    assert (wl.out_dtype, wl.layout, wl.has_cast) == ("bfloat16", "nt", True)
    assert wl.buffer_shapes() == {"A": (64, 48), "B": (32, 48), "A_scale": (1,), "B_scale": (1,),
                                  "C": (64, 32)}
    assert wl.buffer_dtypes() == {"A": "float8_e4m3fn", "B": "float8_e4m3fn", "A_scale": "float32",
                                  "B_scale": "float32", "C": "bfloat16"}
    assert _buffer_shapes(wl) == wl.buffer_shapes()  # the compute definition's, in that order
    assert wl.min_bytes == 64 * 48 + 32 * 48 + 2 * 4 + 2 * 64 * 32
    # a float32 C still has its epilogue: the scales are applied there
    assert Workload("gemm", (64, 32, 48), "float8_e4m3fn", "float32").has_cast


def test_rowwise_fp8_takes_a_scale_per_row_of_a_and_of_b_and_records_say_so():
    wl = Workload("gemm", (64, 32, 48), "float8_e4m3fn", scales="row")
    assert wl.rowwise and wl.label() == "gemm 64x32x48 float8_e4m3fn->bfloat16 nt rowwise"
    assert wl.buffer_shapes() == {"A": (64, 48), "B": (32, 48), "A_scale": (64,),
                                  "B_scale": (32,), "C": (64, 32)}
    assert _buffer_shapes(wl) == wl.buffer_shapes()
    assert wl.min_bytes == 64 * 48 + 32 * 48 + (64 + 32) * 4 + 2 * 64 * 32
    tensor = Workload("gemm", (64, 32, 48), "float8_e4m3fn")
    assert tensor.scales == "tensor" and not tensor.rowwise and tensor != wl
    # records: rowwise ones say so; the others keep the fields they always had, and match a
    # record without `scales`, which a rowwise one does not
    assert wl.record_fields()["scales"] == "row" and "scales" not in tensor.record_fields()
    old = {"op": "gemm", "shape": [64, 32, 48], "dtype": "float8_e4m3fn",
           "out_dtype": "bfloat16", "layout": "nt"}
    assert all(old.get(k) == v for k, v in tensor.record_key().items())
    assert not all(old.get(k) == v for k, v in wl.record_key().items())
    with pytest.raises(WorkloadError, match="scales are for float8_e4m3fn GEMMs; float16 takes"):
        Workload("gemm", (64, 32, 48), "float16", scales="row")
    with pytest.raises(WorkloadError, match="unknown scales 'column'; valid: tensor, row, block"):
        Workload("gemm", (64, 32, 48), "float8_e4m3fn", scales="column")


@pytest.mark.parametrize("op, shape, layout, message", [
    ("gemm", (64, 32, 48), "nn", "float8_e4m3fn GEMM takes B stored N x K (layout nt)"),
    ("gemv", (64, 48), None, "float8_e4m3fn inputs are for gemm; gemv takes"),
    ("batched_gemv", (2, 64, 48), None, "float8_e4m3fn inputs are for gemm; batched_gemv takes"),
])
def test_fp8_elsewhere_is_refused_with_the_reason(op, shape, layout, message):
    with pytest.raises(WorkloadError, match=re.escape(message)):
        Workload(op, shape, "float8_e4m3fn", layout=layout)


def test_accounting():
    wl = Workload("gemm", (1024, 512, 2048))
    assert wl.flops == 2 * 1024 * 512 * 2048
    assert wl.min_bytes == 4 * (1024 * 2048 + 2048 * 512 + 1024 * 512)
    big = PRESETS["gemv-7168x16384"]
    assert big.min_bytes == 2 * (7168 * 16384 + 16384 + 7168)  # the seed's 235 MB
    batched = Workload("batched_gemv", (8, 4096, 7168), "float16")
    assert batched.min_bytes == 8 * 2 * (4096 * 7168 + 7168 + 4096)


def _buffer_shapes(wl):
    return {t.op.name: tuple(int(d) for d in t.shape) for t in wl.tensors()}


def test_gemm_layouts_store_b_as_the_seeds_do():
    assert _buffer_shapes(Workload("gemm", (4, 5, 6), layout="nn"))["B"] == (6, 5)
    assert _buffer_shapes(Workload("gemm", (4, 5, 6), layout="nt"))["B"] == (5, 6)


def test_gemv_shapes_and_batch_order():
    assert _buffer_shapes(Workload("gemv", (7, 9), "float16")) == {"B": (7, 9), "x": (9,), "y": (7,)}
    assert _buffer_shapes(Workload("batched_gemv", (3, 7, 9), "float16")) == {
        "B": (3, 7, 9), "x": (3, 9), "y": (3, 7)}


def test_mixed_precision_accumulates_in_float32_and_casts():
    script = Workload("gemm", (16, 16, 16), "bfloat16", "bfloat16").prim_func().script()
    assert 'T.sblock("C_acc")' in script and 'T.sblock("C")' in script
    assert 'T.Cast("float32", A[' in script and 'T.Cast("bfloat16", C_acc[' in script
