"""Suites of real shapes (schedules/suites.py), running them (tuning/suite.py) and their report
(reporting/shapes.py), on a machine without a GPU: shapes derived from model configs, the
command line's refusals, the builds, the GPU run's records (with the GPU's parts faked), and
the report from synthetic records."""

import functools
import json
import math
import os
import re

import pytest

from facts.record import Record
from reporting import shapes
from schedules import suites
from schedules.workloads import Workload
from tuning import measure
from tuning import suite as suite_run
from tests.test_cli import no_gpu, run  # noqa: F401  (no_gpu: an autouse fixture)



def shapes_of(name):
    return {(e.workload.shape, e.workload.dtype): e for e in suites.SUITES[name].entries}


# -- the suites as data ------------------------------------------------------------------------

def test_layer_shapes_derive_from_the_model_configs():
    found = {(s.layer, s.models): (s.n, s.k) for s in suites.layer_shapes()}
    llama = ("Llama-3-8B", "Mistral-7B-v0.1")  # the same GEMMs: one entry names both
    assert found[("qkv_proj", llama)] == (6144, 4096)  # (32 + 2*8) * 128
    assert found[("o_proj", llama)] == (4096, 4096)
    assert found[("gate_up_proj", llama)] == (28672, 4096)
    assert found[("down_proj", llama)] == (4096, 14336)
    assert found[("qkv_proj", ("Qwen2-7B",))] == (4608, 3584)  # (28 + 2*4) * 128
    assert found[("gate_up_proj", ("Qwen2-7B",))] == (37888, 3584)
    assert found[("down_proj", ("Qwen2-7B",))] == (3584, 18944)
    assert len(found) == 8 and suites.QWEN2_7B.head_dim == suites.LLAMA_3_8B.head_dim == 128


def test_the_suites_carry_those_shapes_with_their_models_and_layers():
    gemms = shapes_of("llm-bf16")
    qkv = gemms[((16, 6144, 4096), "bfloat16")]
    assert qkv.models == ("Llama-3-8B", "Mistral-7B-v0.1") and qkv.layer == "qkv_proj"
    assert "(heads + 2 kv_heads) x head_dim = 6144" in qkv.origin
    assert gemms[((4096, 37888, 3584), "bfloat16")].models == ("Qwen2-7B",)
    assert {e.workload.shape[0] for e in gemms.values()} == {16, 128, 1000, 4096}
    assert len(gemms) == 8 * 4
    gemvs = shapes_of("llm-gemv")
    assert gemvs[((37888, 3584), "float16")].layer == "gate_up_proj"
    assert gemvs[((4096, 4095), "bfloat16")].aligned == (4096, 4096)


def test_wide_shapes_take_head_dim_and_vocab_from_the_configs():
    found = {(s.layer, s.models): (s.n, s.k) for s in suites.WIDE_SHAPES}
    assert found[("qkv_proj", ("Gemma-2-2B",))] == (4096, 2304)  # (8 + 2*4) * 256
    assert found[("o_proj", ("Gemma-2-2B",))] == (2304, 2048)  # K = 8 heads x 256
    assert found[("o_proj", ("Mistral-Nemo-12B",))] == (5120, 4096)  # K = 32 heads x 128
    assert found[("lm_head", ("Qwen2.5-14B",))] == (152064, 5120)
    assert found[("o_proj", ("Llama-3.2-3B", "Phi-3-mini-4k"))] == (3072, 3072)


def test_wide_suites_write_what_models_write_at_ms_between_the_llm_suites():
    wide = suites.SUITES["wide-bf16"].entries
    assert {(e.workload.dtype, e.workload.out_dtype, e.workload.layout) for e in wide} == \
        {("bfloat16", "bfloat16", "nt")}
    assert {e.workload.shape[0] for e in wide} == set(suites.WIDE_TOKENS)
    ragged = suites.SUITES["ragged-16bit"].entries
    assert all(e.workload.out_dtype == e.workload.dtype for e in ragged)
    assert any(e.workload.shape[2] * 2 % 16 for e in ragged)  # a K TMA cannot load
    assert any(e.workload.shape[1] % 2 for e in ragged)  # an odd N (a vocabulary)
    assert any(e.workload.layout == "nn" for e in ragged)


@pytest.mark.parametrize("name", list(suites.SUITES))
def test_every_entry_is_a_valid_workload_of_the_suites_op_and_none_is_there_twice(name):
    suite = suites.SUITES[name]
    seen = [e.workload for e in suite.entries]
    assert len(set(seen)) == len(seen)
    for wl in seen:
        assert wl.op == suite.op
        assert Workload(wl.op, wl.shape, wl.dtype, wl.out_dtype, wl.layout) == wl  # validates
    for entry in suite.entries:
        if entry.aligned:  # a ragged form's neighbour is in the suite, in the same dtype
            assert (entry.aligned, entry.workload.dtype) in shapes_of(name)
            assert entry.tags()["aligned"] == list(entry.aligned)


def test_the_llm_suites_are_the_layouts_and_dtypes_the_rungs_write():
    assert {(e.workload.dtype, e.workload.out_dtype, e.workload.layout)
            for e in suites.SUITES["llm-bf16"].entries} == {("bfloat16", "float32", "nt")}
    assert {e.workload.dtype for e in suites.SUITES["llm-gemv"].entries} == {"float16", "bfloat16"}
    assert {(e.workload.dtype, e.workload.layout)
            for e in suites.SUITES["fp32-ragged"].entries} == {("float32", "nn")}
    fp8 = suites.SUITES["llm-fp8"].entries  # the bf16 suite's shapes, as torch._scaled_mm takes them
    assert {(e.workload.dtype, e.workload.out_dtype, e.workload.layout) for e in fp8} == \
        {("float8_e4m3fn", "bfloat16", "nt")}
    assert [e.workload.shape for e in fp8] == [e.workload.shape for e in suites.SUITES["llm-bf16"].entries]
    assert all(e.origin for s in suites.SUITES.values() for e in s.entries)


def test_suites_run_their_ladder_from_its_first_rung_and_the_baselines():
    gemm, gemv = suites.SUITES["llm-bf16"], suites.SUITES["llm-gemv"]
    assert gemm.schedule_names() == ["v4", "v5", "v5p", "v5k", "v5t", "v6", "v7", "v8", "skinny",
                                     "dlight"]
    assert gemv.schedule_names("all") == ["splitk_vec", "allreduce", "multirow", "blockreduce",
                                          "rowalign", "dlight"]
    assert gemm.schedule_names("v7") == ["v7", "dlight"]
    assert gemm.schedule_names("v5k:k_slices=4") == ["v5k:k_slices=4", "dlight"]
    assert gemm.schedule_names("dlight") == ["dlight"]
    assert gemm.left_out.startswith("naive, v1, v2, v3, because ")
    fp8 = suites.SUITES["llm-fp8"]
    assert fp8.schedule_names() == ["v8", "skinny", "dlight"]  # skinny: up to 16 rows
    assert fp8.left_out.endswith("because the CUDA-core rungs take seconds per launch on these "
                                 "shapes in fp8, and v5t, v6 and v7 take no fp8")
    with pytest.raises(suites.UsageError, match="--schedule v3 is not one of them"):
        gemm.schedule_names("v3")


# -- the command line --------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--suite", "x"], "error: unknown suite 'x'; valid: llm-bf16, llm-fp8, llm-gemv, fp32-ragged, wide-bf16, "
     "wide-fp8, ragged-16bit, wide-fp32\n"),
    (["--suite", "x", "--list"], "error: unknown suite 'x'; valid: "),
    (["--suite", "llm-bf16", "--shape", "16x16x16"],
     "error: --suite runs the suite's own shapes and schedules; it does not take --shape\n"),
    (["--suite", "llm-bf16", "--preset", "gemm-seed"], "error: --suite runs the suite's own "),
    (["--suite", "llm-bf16", "--diff", "v4", "v5"], "error: --suite runs the suite's own shapes "
     "and schedules; it does not take --diff\n"),
    (["--suite", "llm-bf16", "--tune", "metaschedule", "--work-dir", "w"],
     "error: --suite runs the suite's own shapes and schedules; it does not take --tune, "
     "--work-dir\n"),
    (["--suite", "llm-gemv", "--schedule", "v7"], "error: suite llm-gemv runs splitk_vec, "),
    (["--suite", "llm-bf16", "--schedule", "v5k:k_slices=0"],
     "error: knob k_slices of v5k is a size or count of at least 1, not 0\n"),
])
def test_bad_suite_requests_are_one_line_exit_2_and_write_nothing(capsys, tmp_path, argv, message):
    results = tmp_path / "results.jsonl"
    writes = [] if "--list" in argv else ["--results", str(results)]  # a listing refuses it
    code, out, err = run(capsys, *argv, *writes)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1
    assert not out and list(tmp_path.iterdir()) == []


def test_list_shows_the_suites_and_a_suite_its_shapes(capsys):
    code, out, _ = run(capsys, "--list")
    assert code == 0 and "suites (" in out
    for name in suites.SUITES:
        assert f"  {name} " in out
    code, out, _ = run(capsys, "--suite", "llm-gemv", "--list")
    assert code == 0 and out.startswith("suite llm-gemv: ")
    assert "not run: naive, splitk, because" in out
    assert "gemv 3584x18943 bfloat16 nt" in out and "aligned neighbour 3584x18944" in out


TINY = suites.Suite("tiny", "Two small GEMMs", "gemm", "v4", (
    suites.Entry(Workload("gemm", (128, 128, 128)), ("Test-1B",), "square", "a small square"),
    suites.Entry(Workload("gemm", (64, 64, 64), "bfloat16", "float32", "nt"), (), "bf16",
                 "what v5t refuses"),
))


def test_without_a_gpu_a_suite_builds_every_pair_in_workers_and_says_so_per_shape(
        capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(suites.SUITES, "tiny", TINY)
    results = tmp_path / "results.jsonl"
    code, out, err = run(capsys, "--suite", "tiny", "--schedule", "v5t", "--results", str(results))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == ("suite tiny: 2 shapes x 2 schedules (v5t, dlight): building 4 kernels "
                        "for sm_90 in 2 worker processes")
    pace = r" \(\d+\.\d shapes/min(, ETA [\d a-z]+)?\)"  # a line per finished shape, counted
    assert re.fullmatch(r"\[1/2\] gemm 128x128x128 float32 nn \[Test-1B: square\]: built v5t, "
                        r"dlight" + pace, lines[1]), lines[1]
    assert re.fullmatch(re.escape(
        "[2/2] gemm 64x64x64 bfloat16->float32 nt [-: bf16]: built dlight; v5t refused: v5t "
        "copies A element by element with cp.async, which moves 4 bytes at least: float32 "
        "only, not bfloat16") + pace, lines[2]), lines[2]
    assert re.fullmatch(r"built 3 of 4 kernels in \d+ s", lines[3])
    assert lines[4].startswith("no GPU here: built suite tiny for sm_90")
    assert not results.exists()


def test_a_suite_run_builds_each_shapes_own_more_schedules_once(monkeypatch, tmp_path):
    """`more` (sweep_suite.py --portfolio) adds a shape's own names after the run's, each
    built once however often named."""
    from tuning.explore import Settings

    jobs_built = []

    def build_all(jobs, workers):
        jobs_built.extend((job.wl.shape[0], job.schedule) for job in jobs)
        return (suite_run.Prepared("skipped", error="-") for _ in jobs)

    monkeypatch.setattr(suite_run, "build_all", build_all)
    said = []
    more = {128: ["v5", "v5t"], 64: []}
    suite_run.run_suite(TINY, ["v5t"], Settings(results=str(tmp_path / "r.jsonl")), said.append,
                        said.append, workers=1, more=lambda wl: more[wl.shape[0]])
    assert jobs_built == [(128, "v5t"), (128, "v5"), (64, "v5t")]
    assert said[0].startswith("suite tiny: 2 shapes x 1 schedules (v5t) and more per shape: "
                              "building 3 kernels")


class _GpuRun:
    """A GPU's run as far as run_suite reads it before it measures."""

    facts = {"arch": "sm_90", "gpu": "a GPU", "driver": "1"}
    run_id = "run"


@pytest.mark.parametrize("refused_on", [(128, 64), (64,)])
def test_a_named_schedule_that_refuses_every_shape_ends_the_run_before_measuring(
        capsys, monkeypatch, tmp_path, refused_on):
    """As a run of one shape refuses it: one line, exit status 2, nothing measured (a suite ran
    on and measured the baselines alone, exit status 0). Refused on some shapes, it measures."""
    measured = []
    monkeypatch.setitem(suites.SUITES, "tiny", TINY)
    monkeypatch.setattr(suite_run, "_gpu_run", lambda flush: _GpuRun())
    monkeypatch.setattr(suite_run, "build_all", lambda jobs, workers: (
        suite_run.Prepared("skipped", error=f"no {job.wl.shape[0]}")
        if job.schedule == "v5t" and job.wl.shape[0] in refused_on
        else suite_run.Prepared("built") for job in jobs))
    monkeypatch.setattr(suite_run, "_measure", lambda *args: measured.append(args) or [])
    code, _, err = run(capsys, "--suite", "tiny", "--schedule", "v5t",
                       "--results", str(tmp_path / "r.jsonl"))
    if refused_on == (64,):
        assert code == 0 and len(measured) == 1, err
        return
    assert code == 2 and not measured
    assert err == ("error: --schedule v5t refused every shape of suite tiny, so nothing was "
                   "measured; the first: no 128\n")


def test_a_worker_that_times_out_or_dies_is_a_build_failure_not_a_crash():
    from tvm.support.popen_pool import MapResult, StatusKind

    timed_out = suite_run._prepared(MapResult(StatusKind.TIMEOUT, TimeoutError()))
    died = suite_run._prepared(MapResult(StatusKind.EXCEPTION, ChildProcessError(
        "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: worker died")))
    assert timed_out == suite_run.Prepared("build_failed", error="build timed out after 300 s")
    assert died.status == "build_failed" and died.error == "RuntimeError: worker died"
    line = suite_run.shape_line(TINY.entries[0], ["v4", "v5"], [timed_out, died])
    assert line == ("gemm 128x128x128 float32 nn [Test-1B: square]: nothing built; v4 failed to "
                    "build: build timed out after 300 s; v5 failed to build: RuntimeError: "
                    "worker died")


# -- the GPU run, with the GPU's parts faked ----------------------------------------------------

FACTS = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "arch": "sm_90"}


def timing(ms):
    return {"median_ms": ms, "min_ms": ms, "max_ms": ms, "samples": 10, "method": "CUDA events"}


def test_on_a_gpu_every_record_of_a_suite_run_is_one_run_tagged_and_appended_as_measured(
        capsys, monkeypatch, tmp_path):
    import tvm

    from tuning import bench

    results = tmp_path / "results.jsonl"
    built = suite_run.Prepared("built", structure={"kernels": 1}, resources={}, artifact="k.tar")
    refused = suite_run.Prepared("skipped", error="v5t copies A ...: float32 only")
    appended_before = []  # how many records the file held as each kernel was timed

    def measure_tvm(run, wl, schedule, kind, params, executable, **extra):
        appended_before.append(len(results.read_text().splitlines()) if results.exists() else 0)
        return run.record(wl, schedule, kind, params, status="ok", timing=timing(1.0), **extra)

    def measure_baselines(run, wl):
        return [run.record(wl, "cublas", "baseline", {"call": "torch.mm"}, status="ok",
                           timing=timing(0.9))]

    def measure_copy(run):
        return run.record(None, "device-copy", "ceiling", {}, op="copy", status="ok",
                          copy_gbps=3000.0)

    monkeypatch.setattr(measure, "gpu_present", lambda: True)
    monkeypatch.setattr(bench, "Run", functools.partial(bench.Run, facts=FACTS))
    monkeypatch.setattr(bench, "measure_tvm", measure_tvm)
    monkeypatch.setattr(bench, "measure_baselines", measure_baselines)
    monkeypatch.setattr(bench, "measure_copy", measure_copy)
    monkeypatch.setattr(tvm.runtime, "load_module", lambda path: object())
    monkeypatch.setattr(suite_run, "build_all", lambda jobs, workers: (
        p for p in [built, built, refused, built]))  # 128^3: v5t, dlight; 64^3 bf16: the same
    monkeypatch.setitem(suites.SUITES, "tiny", TINY)
    code, out, err = run(capsys, "--suite", "tiny", "--schedule", "v5t", "--results", str(results))
    assert code == 0, err
    written = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["shape"][0] if "shape" in r else None, r["schedule"], r["status"])
            for r in written] == [(128, "v5t", "ok"), (128, "dlight", "ok"), (128, "cublas", "ok"),
                                  (64, "v5t", "skipped"), (64, "dlight", "ok"),
                                  (64, "cublas", "ok"), (None, "device-copy", "ok")]
    assert appended_before == [0, 1, 4]  # each record written before the next is measured
    assert len({r["run_id"] for r in written}) == 1 and all(r["suite"] == "tiny" for r in written)
    assert [(r["model"], r["layer"]) for r in written[:6]] == [("Test-1B", "square")] * 3 + \
        [("-", "bf16")] * 3
    assert written[3]["error"] == "v5t copies A ...: float32 only"
    assert "gemm 128x128x128 float32 nn: best rung v5t 1.0000 ms, cuBLAS 0.9000 ms: 90.0% of " \
        "cuBLAS; not ranked: -" in out
    assert "| square | 128x128x128 nn" in out  # the suite's table at the end
    assert "| Test-1B |" in out  # its models, in the long columns printed after it
    # and its report, from those records
    report = tmp_path / "tiny.md"
    code, out, err = run(capsys, "--report", str(report), "--results", str(results), "--title", "T")
    assert code == 0 and not err and report.read_text().startswith("# T\n")
    assert "## Suite `tiny` on NVIDIA H100 80GB HBM3" in report.read_text()
    assert (tmp_path / "tiny-tiny.png").read_bytes()[:4] == b"\x89PNG"


# -- the report, from synthetic records --------------------------------------------------------

def record(schedule, ms=None, shape=(16, 6144, 4096), kind="rung", status="ok", run_id="r1",
           dtype="bfloat16", op="gemm", suite="llm-bf16", **extra):
    gemm = op == "gemm"
    found = {
        "run_id": run_id, "date": "2026-11-24T10:00:00+00:00", "schedule": schedule, "kind": kind,
        "params": {"call": "torch.mm(out_dtype=float32)"} if schedule == "cublas" else {},
        "flush": "read", "tvm": "0.27.0.post1", "op": op, "shape": list(shape), "dtype": dtype,
        "out_dtype": "float32" if gemm else dtype, "layout": "nt", "status": status,
        "suite": suite, "model": "Llama-3-8B, Mistral-7B-v0.1", "layer": "qkv_proj", **FACTS,
    }
    if ms is not None:
        found["timing"] = timing(ms)
    return {**found, **extra}


def gemm_shape(shape, v6, v7, cublas, dlight=None):
    """One shape's run: v5t skipped, v6 and v7 (None: failed its check), dlight, cuBLAS."""
    return [record("v5t", shape=shape, status="skipped"),
            record("v6", v6, shape=shape),
            record("v7", v7, shape=shape, status="ok" if v7 else "failed"),
            record("dlight", dlight, shape=shape, kind="baseline",
                   status="ok" if dlight else "build_failed"),
            record("cublas", cublas, shape=shape, kind="baseline"),
            record("cublas-tf32", cublas / 4, shape=shape, kind="baseline")]


def test_the_report_ranks_the_best_correct_rung_against_cublas_and_takes_geomeans(tmp_path):
    records = (gemm_shape((16, 6144, 4096), v6=0.2, v7=0.1, cublas=0.1, dlight=0.4)
               + gemm_shape((128, 6144, 4096), v6=0.4, v7=None, cublas=0.1)  # v7 failed: v6
               + [record("v6", 0.05, shape=(1000, 6144, 4096), status="failed"),
                  record("cublas", 0.1, shape=(1000, 6144, 4096), kind="baseline")]
               + [record("device-copy", None, kind="ceiling", op="copy", copy_gbps=3000.0,
                         shape=())])
    runs = shapes.sections([Record.of(r) for r in records])[("llm-bf16", FACTS["gpu"])]
    rows = [shapes.shape_row(run) for run in runs]
    assert [(r["best rung"], r["time"], r["% of cuBLAS"]) for r in rows] == [
        ("v7", "0.1000 ms", "100.0%"), ("v6", "0.4000 ms", "25.0%"), ("none correct", "-", "-")]
    assert rows[0]["dlight %"] == "25.0%" and rows[1]["dlight %"] == "-"
    assert rows[1]["rungs correct"] == "1/3"
    assert rows[1]["not ranked"] == "v5t (skipped), v7 (failed)"
    assert rows[0]["cuBLAS"] == "0.1000 ms"  # plain cuBLAS, never the cublas-tf32 row
    mean, = shapes.geomean_rows(runs)
    assert mean["best: in mean"] == "2" and mean["shapes"] == "3"
    assert mean["best: geomean"] == f"{math.sqrt(100 * 25):.1f}%" == "50.0%"
    assert mean["dlight: geomean"] == "25.0%"
    prefix = tmp_path / "suite"
    text = shapes.render(records, title="LLM shapes", notes="By hand.", figure_prefix=str(prefix))
    assert text.startswith("# LLM shapes\n") and "- GPU: **NVIDIA H100 80GB HBM3**" in text
    assert "- Timing: CUDA events" in text and "TVM 0.27.0.post1" in text
    assert "device copy bandwidth in the same run: 3000 GB/s" in text
    assert "Rungs: v5t, v6, v7; baselines: dlight, cublas (torch.mm(out_dtype=float32))." in text
    assert "Not run: naive, v1, v2, v3, because" in text
    assert "![% of cuBLAS per shape, llm-bf16](suite-llm-bf16.png)" in text
    assert (tmp_path / "suite-llm-bf16.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert text.count("![roofline") == 1 and (tmp_path / "suite-roofline.png").exists()
    # the headline (a line per suite) and the conclusion open the report
    first_screen = text.splitlines()[:40]
    assert [c.strip() for c in first_screen[4].split("|")[1:-1]] == [
        "llm-bf16", "3", "v7 (1), v6 (1)", "50.0%", "25.0%", "8.8%"]  # of 3000 GB/s: 16.9, 4.6%
    assert first_screen[8] == "By hand."
    # the long columns are in the appendix, the tables within 120 characters
    body, appendix = text.split("## Appendix")
    assert "not ranked" not in body and "v5t (skipped), v7 (failed)" in appendix
    assert max(len(line) for line in body.splitlines() if line.startswith("|")) <= 120


def test_ragged_gemvs_are_set_next_to_their_aligned_neighbours():
    def gemv(shape, best, cublas, **extra):
        return [record("blockreduce", best, shape=shape, op="gemv", dtype="float16",
                       suite="llm-gemv", **extra),
                record("cublas", cublas, shape=shape, op="gemv", dtype="float16",
                       suite="llm-gemv", kind="baseline", **extra)]

    records = (gemv((4096, 4096), 0.010, 0.012) + gemv((4096, 4095), 0.015, 0.018,
                                                         aligned=[4096, 4096])
               + gemv((3584, 3583), 0.02, 0.02, aligned=[3584, 3584]))  # neighbour not measured
    rows = shapes.ragged_rows(shapes.sections([Record.of(r) for r in records])[("llm-gemv", FACTS["gpu"])])
    assert [(r["ragged"], r["time"], r["time (aligned)"], r["ratio"],
             r["cuBLAS ratio"]) for r in rows] == [
        ("4096x4095 nt", "15.00 us", "10.00 us", "1.50x", "1.50x"),
        ("3584x3583 nt", "20.00 us", "-", "-", "-")]
    assert rows[1]["best (aligned)"] == "not measured"
    assert "Ragged shapes next to their aligned neighbours" in shapes.suite_tables([Record.of(r) for r in records])


def test_a_report_of_mixed_records_is_the_suites_and_says_what_it_left_out(capsys, tmp_path):
    results = tmp_path / "results.jsonl"
    lines = gemm_shape((16, 6144, 4096), v6=0.2, v7=0.1, cublas=0.1)
    lines.append({**record("v3", 1.0, shape=(1024, 512, 2048), dtype="float32"), "suite": None})
    results.write_text("".join(json.dumps(r) + "\n" for r in lines))
    code, out, err = run(capsys, "--report", str(tmp_path / "r.md"), "--results", str(results))
    assert code == 0 and err.startswith("warning: 1 records of ") and "not from suite runs" in err
    text = (tmp_path / "r.md").read_text()
    assert "## Suite `llm-bf16`" in text and "1024x512x2048" not in text


def test_a_suite_of_many_shapes_is_drawn_by_m_one_point_per_shape():
    """wide-bf16's committed run (192 shapes, more than MOST_BARS): one point per shape with a
    correct rung at its M, and a line through each M's geometric mean of % of cuBLAS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tuning import records

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "reports",
                        "h100-shapes.jsonl.gz")
    committed = [Record.of(r) for r in records.load(path).records]
    runs = next(runs for (name, _), runs in shapes.sections(committed).items()
                if name == "wide-bf16")
    assert len(runs) > shapes.MOST_BARS
    fig, ax = plt.subplots()
    handles = shapes._draw_by_m(ax, runs)
    points = handles[0].get_offsets()
    percents = {(shapes.workload_of(run[0]).dims["M"],
                 shapes.percent_of_cublas(run, shapes.best_rung(run))) for run in runs}
    assert len(points) == len(runs) and {tuple(p) for p in points} == percents
    (line,) = ax.get_lines()
    ms = sorted({m for m, _ in percents})
    assert list(line.get_xdata()) == ms
    assert list(line.get_ydata()) == pytest.approx(
        [shapes.geomean([p for m2, p in percents if m2 == m]) for m in ms])
    plt.close(fig)
