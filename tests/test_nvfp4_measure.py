"""Measuring nvfp4 workloads, on the CPU: the decode, the random inputs, the float64 reference,
the memory a check needs, the baselines' wiring, the read-bandwidth ceiling and its column."""

import numpy as np
import pytest
import torch

from facts.record import Record
from reporting.render import latest_runs, plot_roofline, render, table_rows
from schedules import Workload, fp4
from tests.test_records_and_report import ceiling, measurement
from tuning import bench, measure

FINITE_SCALE_BYTES = [b for b in range(256) if b & 0x7F != 0x7F]  # e4m3's NaN: S.1111.111
FACTS = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580", "arch": "sm_90"}


def cpu_inputs(wl, seed=0):
    return measure.nvfp4_inputs(wl, torch.Generator().manual_seed(seed), "cpu")


def expected_values(codes: np.ndarray, scale_bytes: np.ndarray) -> np.ndarray:
    """What (..., K/2) codes and their (..., K/16) scale bytes hold, element by element from
    the format's definition: element k is nibble k % 2 of byte k // 2, times scale k // 16."""
    k = np.arange(codes.shape[-1] * fp4.PER_BYTE)
    nibbles = (codes[..., k // fp4.PER_BYTE] >> (4 * (k % fp4.PER_BYTE))) & 15
    scales = np.vectorize(fp4.e4m3_value)(scale_bytes)
    return np.array(fp4.VALUES)[nibbles] * scales[..., k // fp4.BLOCK]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_dequantize_gives_every_code_in_both_nibbles_times_every_finite_scale(dtype):
    rows = len(FINITE_SCALE_BYTES)
    codes = torch.arange(256, dtype=torch.uint8).repeat(rows, 1)  # every pair of codes, per row
    blocks = 256 * fp4.PER_BYTE // fp4.BLOCK
    # row r, block b: the scale byte r + b along the finite ones, so each row's blocks differ
    # and block 0 of the rows goes through every finite scale
    picks = (np.arange(rows)[:, None] + np.arange(blocks)) % rows
    scale_bytes = np.array(FINITE_SCALE_BYTES, dtype=np.uint8)[picks]
    scales = torch.from_numpy(scale_bytes).view(torch.float8_e4m3fn)
    decoded = measure.dequantize(codes, scales, dtype)
    assert decoded.dtype == dtype and decoded.shape == (rows, 512)
    # float16 holds every value times every scale exactly: both compare equal to float64
    np.testing.assert_array_equal(decoded.to(torch.float64).numpy(),
                                  expected_values(codes.numpy(), scale_bytes))


def test_the_inputs_draw_every_code_and_finite_scales_in_the_workloads_buffers():
    wl = Workload("batched_gemv", (3, 5, 64), "nvfp4")
    inputs = cpu_inputs(wl)
    names = list(wl.buffer_shapes())[:-1]
    assert [tuple(t.shape) for t in inputs] == [wl.buffer_shapes()[n] for n in names]
    assert [str(t.dtype) for t in inputs] == [f"torch.{wl.buffer_dtypes()[n]}" for n in names]
    for codes in inputs[0], inputs[2]:
        assert set((codes & 15).unique().tolist()) == set(range(16))
        assert set((codes >> 4).unique().tolist()) == set(range(16))
    low, high = (2.0 ** e for e in measure.SCALE_EXPONENTS)
    for scales in inputs[1], inputs[3]:
        values = scales.to(torch.float64)
        assert bool(torch.isfinite(values).all()) and len(values.unique()) > 1
        assert low <= float(values.min()) and float(values.max()) <= high
    assert all(torch.equal(a, b) for a, b in zip(inputs, cpu_inputs(wl)))  # seeded


def test_the_inputs_keep_y_far_from_float16_overflow_at_k_64k():
    wl = Workload("gemv", (64, 65536), "nvfp4")
    y = measure.reference(wl, cpu_inputs(wl))
    assert bool(torch.isfinite(y).all())
    assert float(y.abs().max()) < torch.finfo(torch.float16).max / 4


@pytest.mark.parametrize("wl", [Workload("gemv", (5, 32), "nvfp4"),
                                Workload("batched_gemv", (3, 5, 48), "nvfp4")])
def test_the_reference_is_numpys_matvec_of_the_decoded_values(wl):
    inputs = cpu_inputs(wl, seed=1)
    b_codes, b_scales, x_codes, x_scales = (
        t.view(torch.uint8).numpy() if t.dtype == torch.float8_e4m3fn else t.numpy()
        for t in inputs)
    b, x = expected_values(b_codes, b_scales), expected_values(x_codes, x_scales)
    expected = np.einsum("...nk,...k->...n", b, x)
    ref = measure.reference(wl, inputs)
    assert ref.dtype == torch.float64 and ref.shape == wl.buffer_shapes()["y"]
    np.testing.assert_allclose(ref.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_bytes_needed_counts_the_buffers_and_the_float64_decode():
    wl = Workload("batched_gemv", (3, 5, 64), "nvfp4")
    decoded = 3 * 5 * 64 + 3 * 64  # B's and x's elements
    held = wl.min_bytes + 8 * decoded + 8 * 3 * 5  # buffers, float64 B and x, float64 answer
    assert held <= measure.bytes_needed(wl) <= held + 16 * decoded
    twice = Workload("batched_gemv", (3, 5, 128), "nvfp4")  # grows with the decoded elements
    assert measure.bytes_needed(twice) - measure.bytes_needed(wl) >= 8 * decoded


def test_tolerance_is_nvfp4s_or_the_outputs_if_that_rounds_more():
    assert measure.tolerance(Workload("gemv", (16, 64), "nvfp4")) == measure.TOLERANCE["float16"]
    assert measure.tolerance(Workload("gemv", (16, 64), "nvfp4", "float32")) == 1e-3


@pytest.mark.parametrize("wl, call", [
    (Workload("gemv", (16, 64), "nvfp4"), "torch.mv"),
    (Workload("batched_gemv", (2, 16, 64), "nvfp4"), "torch.bmm"),
    (Workload("batched_gemv", (2, 16, 64), "nvfp4", "float32"), "torch.bmm(out_dtype=float32)"),
])
def test_the_baselines_name_the_dequantized_call(wl, call):
    assert measure.cublas_call(wl) == f"{call} on float16 B and x (dequantized beforehand)"
    assert measure.dequantizing_call(wl) == f"dequantize B and x to float16, then {call}"


def fake_time_kernel(run, flush="read", **_):
    run()
    return measure.Timing(0.05, 0.04, 0.06, 10, measure.timing_method(flush))


@pytest.fixture
def on_the_cpu(monkeypatch):
    """bench's measurements with the CPU standing in for the GPU, and a fake timer."""
    monkeypatch.setattr(measure, "random_inputs", lambda wl, seed=0: cpu_inputs(wl, seed))
    monkeypatch.setattr(measure, "time_kernel", fake_time_kernel)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return bench.Run(facts=FACTS)


@pytest.mark.parametrize("wl, multiply", [
    (Workload("gemv", (7, 64), "nvfp4"), "mv"),
    (Workload("batched_gemv", (3, 7, 64), "nvfp4"), "bmm"),
])  # float16 outputs only: torch's bmm has no CPU kernel for out_dtype=float32
def test_the_nvfp4_baselines_are_checked_against_float64_and_timed(on_the_cpu, wl, multiply):
    cublas, dequant = bench.measure_baselines(on_the_cpu, wl)
    assert (cublas.schedule, dequant.schedule) == ("cublas", f"torch-dequant-{multiply}")
    for record in cublas, dequant:
        assert record.kind == "baseline" and record.status == "ok", record.error
        assert record.rel_error < record.tolerance and record.timing.median_ms == 0.05
        assert record.dtype == "nvfp4" and record.out_dtype == wl.out_dtype
    assert cublas.params["call"] == measure.cublas_call(wl)
    assert dequant.params == {"call": measure.dequantizing_call(wl)}


def test_cublas_decodes_before_its_launches_and_the_dequantizing_baseline_in_each():
    wl = Workload("gemv", (7, 64), "nvfp4")
    inputs = cpu_inputs(wl)
    cublas, dequantizing = (make(wl, inputs) for make in (measure.cublas_runner,
                                                           measure.dequantizing_runner))
    before = cublas()
    assert torch.equal(dequantizing(), before) and before.dtype == torch.float16
    inputs[2].zero_()  # x's codes all 0.0: only a decode inside the launch sees it
    assert torch.equal(cublas(), before) and not bool(dequantizing().any())


def test_a_baseline_that_multiplies_the_wrong_values_fails_its_check(on_the_cpu, monkeypatch):
    wl = Workload("batched_gemv", (3, 7, 64), "nvfp4")
    right = measure.operands

    def x_reversed_but_in_the_reference(wl, inputs, dtype):
        b, x = right(wl, inputs, dtype)
        return [b, x] if dtype == torch.float64 else [b, x.flip(-1)]

    monkeypatch.setattr(measure, "operands", x_reversed_but_in_the_reference)
    cublas, dequant = bench.measure_baselines(on_the_cpu, wl)
    assert cublas.status == dequant.status == "failed"
    assert cublas.error.startswith("relative error") and cublas.timing is None


def test_the_read_ceiling_is_a_record_of_the_run(monkeypatch):
    timing = measure.Timing(0.4, 0.39, 0.41, 200, measure.timing_method("write"))
    asked = []
    monkeypatch.setattr(measure, "read_bandwidth_gbps",
                        lambda nbytes, flush: asked.append((nbytes, flush)) or (2700.0, timing))
    run = bench.Run(flush="write", facts=FACTS)
    record = bench.measure_read(run)
    assert asked == [(1 << 30, "write")]
    assert (record.schedule, record.kind, record.op, record.status) == (
        "device-read", "ceiling", "read", "ok")
    assert record.read_gbps == 2700.0 and record.params == {"bytes": 1 << 30}
    assert record.run_id == run.run_id and record.timing.median_ms == 0.4


@pytest.mark.parametrize("wl, measured", [
    (Workload("gemm", (64, 64, 64)), ["copy", "compute float32"]),
    (Workload("gemv", (64, 64), "float16"), ["copy", "read", "compute float16"]),
    (Workload("batched_gemv", (2, 64, 64), "nvfp4"), ["copy", "read"]),  # no GEMM takes nvfp4
])
def test_a_run_measures_the_read_ceiling_for_gemvs_and_no_compute_ceiling_for_nvfp4(
        monkeypatch, wl, measured):
    done = []
    monkeypatch.setattr(bench, "measure_copy", lambda run: done.append("copy") or {})
    monkeypatch.setattr(bench, "measure_read", lambda run: done.append("read") or {})
    monkeypatch.setattr(bench, "measure_compute",
                        lambda run, dtype: done.append(f"compute {dtype}") or {})
    assert len(bench.measure_ceilings(bench.Run(facts=FACTS), wl)) == len(measured)
    assert done == measured


SHAPE = (3, 7168, 2048)


def nvfp4_run(*ceilings):
    """An nvfp4 batched GEMV's run as the records hold it: a rung, the two baselines, and
    `ceilings`."""
    fields = {"op": "batched_gemv", "shape": SHAPE, "dtype": "nvfp4", "out_dtype": "float16"}
    return [measurement("blockreduce", 0.010, **fields),
            measurement("cublas", 0.030, kind="baseline", **fields),
            measurement("torch-dequant-bmm", 0.080, kind="baseline", **fields), *ceilings]


def test_the_read_bandwidth_gets_its_column_and_header_where_the_run_measured_it(tmp_path):
    read = ceiling(op="read", schedule="device-read", copy_gbps=None, read_gbps=2500.0)
    text = render(nvfp4_run(ceiling(), read), "t", figure_prefix=str(tmp_path / "t"))
    assert "% of read BW" in text and "device read bandwidth in the same run: 2500 GB/s" in text
    assert "device copy bandwidth in the same run: 3000 GB/s" in text
    assert "nvfp4: uniformly random bytes of codes" in text
    (run,) = latest_runs([Record.of(r) for r in nvfp4_run(ceiling(), read)])
    row = table_rows(run)[0]
    gbps = Workload("batched_gemv", SHAPE, "nvfp4").min_bytes / 10e-6 / 1e9
    assert list(row)[list(row).index("% of copy BW") + 1] == "% of read BW"
    assert row["% of read BW"] == f"{100 * gbps / 2500:.1f}%"
    # no compute ceiling for nvfp4: the roofline is still drawn, and says so
    assert (tmp_path / "t-roofline.png").read_bytes().startswith(b"\x89PNG")
    assert "*Not measured in these runs, so not drawn: the compute ceiling for nvfp4.*" in text
    assert {kernel for _, kernel, _ in plot_roofline([run], "t", str(tmp_path / "r.png"))} == {
        "blockreduce", "cublas", "torch-dequant-bmm"}


def test_a_run_without_a_read_ceiling_has_no_read_column():
    other_run = ceiling("r0", op="read", schedule="device-read", copy_gbps=None, read_gbps=2500.0)
    text = render(nvfp4_run(ceiling(), other_run), "t")  # another run's ceiling is not borrowed
    assert "% of copy BW" in text and "% of read BW" not in text
    assert "read bandwidth" not in text


def test_export_refuses_nvfp4_in_one_line(monkeypatch, tmp_path):
    from schedules.errors import UsageError
    from tuning import export
    from tuning.explore import SearchResults, Settings

    monkeypatch.setattr(measure, "gpu_present", lambda: False)
    wl = Workload("batched_gemv", (2, 64, 64), "nvfp4")
    with pytest.raises(UsageError, match=r"^batched_gemv 2x64x64 nvfp4->float16 nt: nvfp4 "
                       r"kernels cannot be exported") as refused:
        export.export(wl, "blockreduce", str(tmp_path / "out"), SearchResults(),
                      Settings(results=str(tmp_path / "r.jsonl")), say=lambda _: None)
    assert "\n" not in str(refused.value) and not (tmp_path / "out").exists()
    with pytest.raises(UsageError, match="cannot be exported or compiled"):
        export.compile(wl, "blockreduce")
