"""The JSONL store and the markdown report, on recorded measurements (no GPU needed)."""

import dataclasses
import glob
import json
import os

import pytest

import facts
from facts.record import Record, Timing
from reporting.render import render, table_rows
from schedules.errors import RecordsError
from schedules.workloads import Workload
from tuning import bench, records


def typed(records):
    """Records as the renderers' functions take them (render itself takes dicts too)."""
    return [Record.of(r) for r in records]


def measurement(schedule, ms, run_id="r1", date="2026-11-22T10:00:00+00:00", kind="rung",
                status="ok", op="gemm", shape=(1024, 512, 2048), dtype="float32", **extra):
    out_dtype = "float32" if op == "gemm" else dtype
    layout = "nn" if op == "gemm" else "nt"
    record = {
        "run_id": run_id, "date": date, "schedule": schedule, "kind": kind, "params": {},
        "gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "arch": "sm_90",
        "tvm": "0.27.0.post1", "op": op, "shape": list(shape), "dtype": dtype,
        "out_dtype": out_dtype, "layout": layout, "status": status, "rel_error": 1e-7,
    }
    if status == "ok":
        record["timing"] = {"median_ms": ms, "min_ms": ms * 0.9, "max_ms": ms * 1.2, "samples": 100,
                            "method": "CUDA events; L2 flushed"}
    return {**record, **extra}


def test_append_then_load_round_trips(tmp_path):
    path = str(tmp_path / "sub" / "results.jsonl")
    records.append(path, measurement("v3", 0.8))
    records.append(path, measurement("v2", 4.4))
    loaded = records.load(path)
    assert [r["schedule"] for r in loaded.records] == ["v3", "v2"] and not loaded.problems


def test_corrupt_lines_are_named_and_kept(tmp_path):
    path = tmp_path / "results.jsonl"
    good = json.dumps(measurement("v1", 4.0))
    path.write_text(good + "\n{not json\n" + json.dumps({"a": 1}) + "\n" + good + "\n")
    before = path.read_text()
    loaded = records.load(str(path))
    assert len(loaded.records) == 2
    assert loaded.problems[0].startswith(f"{path}:2: not valid JSON")
    assert loaded.problems[1] == f"{path}:3: not a measurement record"
    records.append(str(path), measurement("v3", 0.8))
    after = path.read_text()
    assert after.startswith(before) and len(records.load(str(path)).records) == 3


def test_a_line_cut_short_does_not_swallow_the_next_record(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(measurement("v1", 4.0)) + "\n" + '{"run_id": "r1", "sched')
    records.append(str(path), measurement("v3", 0.8))
    loaded = records.load(str(path))
    assert [r["schedule"] for r in loaded.records] == ["v1", "v3"] and len(loaded.problems) == 1


def test_any_json_lines_file_loads_by_its_own_fields_and_names_each_bad_line(tmp_path):
    path = tmp_path / "progress.jsonl"
    path.write_text('{"trial": 1}\n\n[1, 2]\n{"trial"\n')
    assert list(records.lines(str(path))) == [
        (f"{path}:1", {"trial": 1}, None), (f"{path}:3", [1, 2], None),
        (f"{path}:4", None, "not valid JSON (Expecting ':' delimiter)")]
    loaded = records.load(str(path), required=("trial",), kind="progress line")
    assert loaded.records == [{"trial": 1}]
    assert loaded.problems == [f"{path}:3: not a progress line",
                               f"{path}:4: not valid JSON (Expecting ':' delimiter)"]
    warnings = []
    assert records.load_and_warn(str(path), warnings.append, then="skipped") == []
    assert warnings[0] == f"warning: {path}:1: not a measurement record; skipped"
    assert list(records.lines(str(tmp_path / "none.jsonl"))) == []


def test_a_file_of_another_kind_is_warned_of_in_a_few_lines_not_one_a_line(tmp_path):
    """--counters pointed at a results file of 12,376 lines warned once for each."""
    path = tmp_path / "results.jsonl"
    for lines, named in ((40, records.WARNED_LINES), (records.WARNED_LINES + 1, None)):
        path.write_text('{"trial": 1}\n' * lines)
        warnings = []
        assert records.load_and_warn(str(path), warnings.append, then="skipped") == []
        assert warnings[0] == f"warning: {path}:1: not a measurement record; skipped"
        if named is None:  # one more line is named, not counted
            assert len(warnings) == lines and "more lines" not in warnings[-1]
        else:
            assert len(warnings) == named + 1
            assert warnings[-1] == (f"warning: {lines - named} more lines of {path} fail their "
                                    "checks too (each: skipped)")


def test_a_directory_is_not_a_records_file(tmp_path):
    with pytest.raises(records.RecordsError, match="is not a file"):
        records.load(str(tmp_path))


def seed_run(run_id="r1", date="2026-11-22T10:00:00+00:00"):
    return [
        measurement("naive", 9.0, run_id, date),
        measurement("v1", 4.5, run_id, date),
        measurement("v2", 4.5, run_id, date),
        measurement("v3", 0.9, run_id, date),
        measurement("dlight", 0.15, run_id, date, kind="baseline"),
        measurement("cublas", 0.06, run_id, date, kind="baseline"),
    ]


def test_table_has_the_seed_columns_computed_from_times():
    rows = {r["schedule"]: r for r in table_rows(typed(seed_run()))}
    assert rows["v1"]["vs naive"] == "2.0x" and rows["v1"]["vs previous"] == "2.00x"
    assert rows["v3"]["vs previous"] == "5.00x" and rows["v3"]["vs naive"] == "10.0x"
    assert rows["v3"]["% of cuBLAS"] == "6.7%" and rows["cublas"]["% of cuBLAS"] == "100.0%"
    assert rows["v3"]["TFLOP/s"] == f"{2 * 1024 * 512 * 2048 / 0.9e-3 / 1e12:.2f}"
    assert rows["dlight"]["vs previous"] == "-"  # baselines are not rungs
    assert rows["v3"]["% of peak"] == f"{100 * 2 * 1024 * 512 * 2048 / 0.9e-3 / 1e12 / 66.9:.1f}%"


def test_rows_show_registers_and_shared_memory_of_tvm_kernels():
    run = seed_run()
    run[3] = {**run[3], "resources": {"main_kernel": {"registers": 32}}, "structure": {"shared bytes": 1024}}
    rows = {r["schedule"]: r for r in table_rows(typed(run))}
    assert (rows["v3"]["regs"], rows["v3"]["smem B"]) == ("32", "1024")
    assert (rows["cublas"]["regs"], rows["cublas"]["smem B"]) == ("-", "-")


def test_a_failed_kernel_is_shown_but_never_ranked():
    run = seed_run()
    run[3] = measurement("v3", None, status="failed", error="relative error 0.5 > 1e-05")
    rows = {r["schedule"]: r for r in table_rows(typed(run))}
    assert rows["v3"]["time (ms)"] == "-" and rows["v3"]["vs naive"] == "-"
    assert rows["v3"]["status"].startswith("failed: relative error")
    assert rows["dlight"]["vs previous"] == "-"


def test_gemv_rows_report_bandwidth_against_the_measured_copy():
    shape = (7168, 16384)
    run = [measurement("allreduce", 0.080, op="gemv", shape=shape, dtype="float16"),
           measurement("cublas", 0.090, op="gemv", shape=shape, dtype="float16", kind="baseline")]
    run = [{**m, "copy_gbps": 3000.0} for m in run]
    row = table_rows(typed(run))[0]
    gbps = 2 * (7168 * 16384 + 16384 + 7168) / 80e-6 / 1e9
    assert row["time (us)"] == "80.00" and row["GB/s"] == f"{gbps:.0f}"
    assert row["% of copy BW"] == f"{100 * gbps / 3000:.1f}%"


def test_report_takes_the_latest_run_and_says_where_it_was_measured():
    older = seed_run("old", "2026-11-20T10:00:00+00:00")
    older[3] = measurement("v3", 5.0, "old", "2026-11-20T10:00:00+00:00")
    ceiling = {"run_id": "r1", "date": "2026-11-22T10:00:00+00:00", "kind": "ceiling", "op": "copy",
               "schedule": "device-copy", "copy_gbps": 2950.0}
    text = render(older + seed_run() + [ceiling], title="GEMM seed")
    assert text.startswith("# GEMM seed")
    assert "NVIDIA H100 80GB HBM3" in text and "driver 580.159.04" in text and "TVM 0.27.0.post1" in text
    assert "Timing: CUDA events; L2 flushed" in text and "2026-11-22 10:00:00" in text
    assert "| v3 " in text and "0.900" in text and "5.000" not in text
    assert "2950 GB/s" in text
    assert "fp32 on CUDA cores" in text and "float32 66.9" in text


def test_report_without_measurements_is_an_error():
    with pytest.raises(RecordsError, match="no measurements"):
        render([])


def test_relative_error_is_frobenius_and_nan_is_infinite():
    import torch

    from tuning.measure import relative_error

    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert relative_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert relative_error(torch.tensor([3.0, float("nan")]), ref) == float("inf")


def test_cublas_rows_say_which_call_and_output_dtype_they_timed():
    from schedules import Workload
    from tuning import measure

    wl = lambda dtype, out: Workload("gemm", (64, 64, 64), dtype, out)  # noqa: E731
    assert measure.cublas_call(wl("bfloat16", "float32")) == "torch.mm(out_dtype=float32)"
    assert measure.cublas_call(wl("float16", "float16")) == "torch.mm"
    assert measure.cublas_call(wl("float32", "bfloat16")) == "torch.mm + cast to bfloat16"
    assert measure.cublas_call(Workload("batched_gemv", (2, 8, 8), "float16", "float32")) == \
        "torch.bmm(out_dtype=float32)"
    assert measure.cublas_call(wl("float8_e4m3fn", None)) == "torch._scaled_mm(out_dtype=bfloat16)"
    assert measure.cublas_call(wl("float8_e4m3fn", "float32"), fast_accum=True) == \
        "torch._scaled_mm(out_dtype=float32, use_fast_accum=True)"
    run = seed_run()
    run[5] = {**run[5], "params": {"tf32": False, "call": "torch.mm"}}
    rows = table_rows(typed(run))
    assert rows[5]["schedule"] == "cublas" and rows[5]["call"] == "torch.mm"
    assert rows[5]["% of cuBLAS"] == "100.0%"


def test_fp8_operands_and_reference_carry_the_per_tensor_scales():
    import torch

    from schedules import Workload
    from tuning import measure

    wl = Workload("gemm", (3, 2, 4), "float8_e4m3fn")
    a = torch.tensor([[1.0, -2.0, 0.5, 448.0]] * 3).to(torch.float8_e4m3fn)
    b = torch.tensor([[1.0, 1.0, 2.0, 0.0], [0.25, 0.0, 0.0, 1.0]]).to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.tensor([0.5]), torch.tensor([3.0])
    got = measure.reference(wl, [a, b, scale_a, scale_b])
    assert got.dtype == torch.float64
    assert got.tolist() == [[(1.0 - 2.0 + 1.0) * 1.5, (0.25 + 448.0) * 1.5]] * 3


@pytest.mark.parametrize("fields, says", [
    ({"flush": "write"}, "a 256 MB write, as do_bench's"),
    ({"flush": "none"}, "a GPU sleep (L2 stays warm)"),
    ({"flush_l2": True}, "a 256 MB read"),  # records from before --flush
    ({"flush_l2": False}, "a GPU sleep (L2 stays warm)"),
])
def test_every_run_in_a_report_says_how_l2_was_flushed(fields, says):
    text = render([{**m, **fields} for m in seed_run()], title="t")
    assert f"before each timed launch: {'an L2 flush (' if 'MB' in says else ''}{says}" in text


def test_a_kernel_that_spills_is_flagged_in_the_report():
    run = seed_run()
    run[3] = {**run[3], "resources": {"main_kernel": {"registers": 255, "spill_stores": 1362,
                                                      "spill_loads": 1362}}}
    assert {r["schedule"]: r for r in table_rows(typed(run))}["v3"]["regs"] == "255 (SPILLS 2724 B)"


def ceiling(run_id="r1", **fields):
    """A ceiling record of run `run_id`: the copy bandwidth unless fields say otherwise."""
    return {"run_id": run_id, "date": "2026-11-22T10:00:00+00:00", "kind": "ceiling",
            "op": "copy", "schedule": "device-copy", "status": "ok", "copy_gbps": 3000.0, **fields}


def compute_ceiling(run_id="r1", dtype="float32", tflops=50.0):
    return ceiling(run_id, op="compute", schedule="device-compute", dtype=dtype,
                   params={"size": 8192, "call": "torch.mm"}, copy_gbps=None,
                   compute_tflops=tflops)


def test_one_roofline_per_report_has_every_workload_before_the_sections(tmp_path):
    other = [{**m, "run_id": "r2", "shape": [4096, 4096, 4096]} for m in seed_run()]
    text = render(seed_run() + other + [ceiling(), compute_ceiling()], "t",
                  figure_prefix=str(tmp_path / "new" / "t"))  # a folder not made yet
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["t-roofline.png"]
    assert (tmp_path / "new" / "t-roofline.png").read_bytes().startswith(b"\x89PNG")
    assert text.count("![roofline") == 1
    link = text.index("![roofline of every workload](t-roofline.png)")
    assert link < text.index("## gemm 1024x512x2048") < text.index("## gemm 4096x4096x4096")
    assert "cuBLAS 8192^3 float32, this run: 50 TFLOP/s" in text
    assert "Not measured" not in text  # r1 measured both ceilings; r2 borrows none


def test_a_run_without_a_compute_ceiling_says_so_and_draws_none(tmp_path):
    other_run = compute_ceiling("r0")  # another run's ceiling is never borrowed
    other_dtype = compute_ceiling("r1", dtype="float16")
    text = render(seed_run() + [ceiling(), other_run, other_dtype], "t",
                  figure_prefix=str(tmp_path / "t"))
    assert (tmp_path / "t-roofline.png").exists() and "(t-roofline.png)" in text
    assert "*Not measured in these runs, so not drawn: the compute ceiling for float32.*" in text
    assert "cuBLAS 8192^3" not in text


def test_the_roofline_draws_correct_kernels_only(tmp_path):
    from reporting.render import latest_runs, plot_roofline

    measured = seed_run()
    measured[3] = measurement("v3", None, status="failed", error="relative error 0.5 > 1e-05")
    measured[1] = {**measured[1], "status": "skipped"}
    (run,) = latest_runs(typed(measured + [ceiling(), compute_ceiling()]))
    points = {kernel: tflops for _, kernel, tflops in
              plot_roofline([run], "t", str(tmp_path / "r.png"))}
    assert set(points) == {"naive", "v2", "dlight", "cublas"}
    assert points["cublas"] == pytest.approx(2 * 1024 * 512 * 2048 / 0.06e-3 / 1e12)


def test_measure_compute_records_the_ceiling_the_report_reads(monkeypatch):
    from tuning import measure

    timed = []

    def fake_time_kernel(run, flush="read", **_):
        timed.append(flush)
        return measure.Timing(2.0, 1.9, 2.2, 50, measure.timing_method(flush))

    monkeypatch.setattr(measure, "time_kernel", fake_time_kernel)
    monkeypatch.setattr(measure, "random_inputs", lambda wl, seed=0: [None, None])
    run = bench.Run(flush="write", facts={"gpu": "NVIDIA H100 80GB HBM3", "driver": "580",
                                          "arch": "sm_90"})
    record = bench.measure_compute(run, "bfloat16")
    assert timed == ["write"]
    assert record.compute_tflops == pytest.approx(Workload(
        "gemm", (8192, 8192, 8192), "bfloat16", "float32").flops / 2e-3 / 1e12)
    assert (record.kind, record.op, record.schedule, record.dtype) == (
        "ceiling", "compute", "device-compute", "bfloat16")
    assert record.params == {"size": 8192, "call": "torch.mm(out_dtype=float32)"}
    assert record.run_id == run.run_id and record.status == "ok"
    assert (record.flush, record.schema) == ("write", facts.SCHEMA)
    shape = (4096, 4096, 4096)
    measured = [measurement("v7", 0.5, run.run_id, shape=shape, dtype="bfloat16",
                            out_dtype="float32", date=record.date)]
    text = render(measured + [record], "t")
    assert f"cuBLAS 8192^3 bfloat16, this run: {record.compute_tflops:.0f} TFLOP/s" in text


def test_searches_under_different_shared_memory_limits_are_told_apart():
    """A MetaSchedule search from before the targets had their GPU's limits (48 KB, none
    recorded) and one with them (227 KB) are two rows, named by their limit."""
    from reporting.render import _search_name, latest_searches

    base = {"kind": "search", "gpu": "H100", "op": "gemm", "shape": [8, 8, 8], "dtype": "float32",
            "out_dtype": "float32", "layout": "nn", "schedule": "metaschedule",
            "search": "metaschedule", "tuner": "evolutionary", "rules": "TVM's rules", "seed": 0,
            "date": "2026-11-24"}
    found = next(iter(latest_searches(typed([base, {**base, "shared_kb": 227}])).values()))
    assert sorted(_search_name(r) for r in found) == [
        "metaschedule (TVM's rules)",
        "metaschedule (TVM's rules, 227 KB shared)"]


@pytest.mark.parametrize("field, value, says", [
    ("shape", "big", 'shape "big" is not a list of dimensions'),
    ("op", "conv", "unknown op 'conv'; valid ops: gemm, gemv, batched_gemv"),
    ("shape", [0, 0, 0], "dimensions must be positive, got M=0, N=0, K=0"),
    ("dtype", "int4", "unknown dtype 'int4'; valid: float32"),
    ("gpu", None, "no 'gpu' field"),
    ("kind", "guess", "kind 'guess' is none of rung, tuned, baseline, search, ceiling"),
    ("timing", {"median_ms": "fast"}, 'timing median_ms "fast" is not a positive time'),
    ("flush", "sideways", "flush 'sideways' is none of read, write, none"),
    ("schema", 2, "a schema 2 record without its flush"),  # a KeyError in the render before
    ("schema", 7, "schema 7 is not one this version reads (1 or 2)"),
    ("params", [], "params [] is not dict"),
    ("resources", {"": None}, "resources of kernel '' null are not counts"),  # found by hypothesis
    ("curve", [1, 2], "curve [1, 2] is not a list of [trial, time] points"),
    ("compute_ceiling", {"kind": "ceiling"}, "compute_ceiling: no 'schedule' field"),
    ("timing", {"median_ms": 1.0, "min_ms": 1.0, "max_ms": 1.0, "p99": 2.0},
     'timing {"median_ms": 1.0'),
    ("resources", {"k": {"registers": 168, "wgmma_serialized": 1}},
     "resources of kernel 'k' {\"registers\": 168, \"wgmma_seriali"),
])
def test_a_record_with_a_bad_field_is_named_by_line_and_skipped_and_the_rest_renders(
        tmp_path, field, value, says):
    path = tmp_path / "results.jsonl"
    run = seed_run()
    bad = {**run[1], field: value}
    if value is None:
        del bad[field]
    path.write_text("".join(json.dumps(r) + "\n" for r in [run[0], bad, *run[2:]]))
    loaded = records.load(str(path), check=records.measurement_problem)
    assert len(loaded.problems) == 1 and loaded.problems[0].startswith(f"{path}:2: {says}")
    assert [r["schedule"] for r in loaded.records] == ["naive", "v2", "v3", "dlight", "cublas"]
    assert "| v3 " in render(loaded.records) and "| v1 " not in render(loaded.records)


def test_a_record_with_the_resources_nvcc_reports_passes_its_field_checks():
    """build.nvcc_resources' counts and its wgmma_serialized flag (a bool, not a count) are a
    record's resources as they are written."""
    from tuning import build

    usage = build._parse_resource_usage(
        "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
        "ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
    assert usage["k"]["wgmma_serialized"] is False and usage["k"]["registers"] == 168
    assert records.measurement_problem({**seed_run()[1], "resources": usage}) is None


def test_every_committed_record_passes_its_field_checks():
    import glob
    import os

    committed = glob.glob(os.path.join(os.path.dirname(os.path.dirname(__file__)), "reports",
                                       "*.jsonl"))
    assert committed
    for path in committed:
        assert records.load(path, check=records.measurement_problem).problems == []


def test_a_report_leads_with_its_headline_and_conclusion_on_the_first_screen():
    notes = "**The answer.** v3 is 15 times slower than cuBLAS.\n\nHow it was measured."
    first_screen = render(seed_run() + [ceiling()], "t", notes=notes).splitlines()[:40]
    head = next(n for n, line in enumerate(first_screen) if line.startswith("| workload"))
    cells = [cell.strip() for cell in first_screen[head].split("|")[1:-1]]
    assert cells == ["workload", "best", "time", "% of cuBLAS", "% of limit"]
    assert [cell.strip() for cell in first_screen[head + 2].split("|")[1:-1]] == [
        "gemm 1024x512x2048 float32 nn", "v3", "0.9000 ms", "6.7%", "3.6% of peak"]
    assert first_screen.index("**The answer.** v3 is 15 times slower than cuBLAS.") > head
    assert first_screen.index("**The answer.** v3 is 15 times slower than cuBLAS.") < min(
        n for n, line in enumerate(first_screen) if line.startswith("- GPU"))


def test_notes_that_open_with_a_heading_have_no_conclusion_and_stay_whole():
    text = render(seed_run(), "t", notes="## Runs\n\nFirst.")
    assert text.index("## Notes\n\n## Runs\n\nFirst.") > text.index("## gemm")


def test_detail_tables_drop_empty_columns_and_move_long_ones_to_the_appendix():
    run = [m for m in seed_run() if m["schedule"] != "naive"]  # no naive: vs naive all '-'
    run[0] = {**run[0], "resources": {"k": {"registers": 255, "spill_stores": 8}}}
    body, appendix = render(run, "t").split("## Appendix")
    assert "vs naive" not in body and "vs previous" in body and "| v3 " in body
    assert "regs" not in body and "rel. error" not in body and "SPILLS 8 B" in appendix


@pytest.mark.parametrize("name", ["gemm-seed", "gemm-ladder", "gemv", "nvfp4-gemv", "tuning",
                                  "v8"])
def test_no_detail_table_of_a_committed_report_is_over_120_characters(name):
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "reports", f"h100-{name}")
    body = render(records.load(path + ".jsonl").records, "t").split("## Appendix")[0]
    wide = [line for line in body.splitlines() if line.startswith("|") and len(line) > 120]
    assert not wide and "| cublas" in body


@pytest.mark.parametrize("name", ["v8", "tuning", "gemm-ladder"])  # the three longest
def test_the_longest_committed_reports_hold_their_conclusion_on_the_first_screen(name):
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "reports", f"h100-{name}.md")
    with open(path) as f:
        first_screen = [next(f) for _ in range(40)]
    assert first_screen[2].startswith("| workload") and "**The answer.**" in "".join(first_screen)


def test_a_record_of_the_first_schema_is_read_in_the_current_one():
    """Schema 1 said how L2 was flushed with the bool flush_l2 (or not at all: a read); it is
    read as schema SCHEMA's `flush`, and a current record is read as it is."""
    old = {"op": "gemm", "schedule": "v3", "flush_l2": False}
    assert facts.migrated(old) == {"op": "gemm", "schedule": "v3", "flush": "none",
                                   "schema": facts.SCHEMA}
    assert facts.migrated({"op": "gemm"})["flush"] == "read"
    current = {"op": "gemm", "schedule": "v3", "flush": "write", "schema": facts.SCHEMA}
    assert facts.migrated(current) is current


def test_every_committed_measurement_record_is_of_the_current_schema():
    """The committed records were migrated once (schema 2), and the runs write that schema."""
    paths = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "reports", "*.jsonl")))
    loaded = [records.load(path, check=records.measurement_problem) for path in paths]
    assert paths and not [problem for found in loaded for problem in found.problems]
    assert {r.get("schema") for found in loaded for r in found.records} == {facts.SCHEMA}
    assert not [r for found in loaded for r in found.records if "flush_l2" in r]


def test_a_record_line_reads_as_a_typed_record_in_the_current_schema():
    """facts.record: a schema-1 line (flush_l2) reads with its flush; the timing, the workload
    and fields the type does not name come through."""
    line = {**measurement("v3", 0.9), "flush_l2": False, "note": "by hand"}
    record = Record.from_json(line)
    assert record.flush == "none" and record.schema == facts.SCHEMA
    assert record.timing.median_ms == 0.9 and record.median_ms == 0.9
    assert record.workload.label() == "gemm 1024x512x2048 float32 nn"
    assert record.rest == {"note": "by hand"} and Record.of(record) is record
    assert Record.from_json({**line, "status": "failed"}).median_ms is None


COMMITTED = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "reports", "*.jsonl")))


@pytest.mark.parametrize("path", COMMITTED, ids=os.path.basename)
def test_every_committed_line_is_written_back_as_it_was_read(path):
    """facts.record writes what it reads: each committed line, read as a Record and written as
    a line, reads back as an equal Record, and is the same JSON with its keys sorted."""
    for where, line, problem in records.lines(path):
        assert problem is None, where
        record = Record.from_json(line)
        written = record.json_line()
        assert Record.from_json(json.loads(written)) == record, where
        assert written == json.dumps(line, sort_keys=True), where


RUN_FACTS = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "arch": "sm_90"}
TIMING = {"median_ms": 0.5, "min_ms": 0.4, "max_ms": 0.7, "samples": 100, "method": "events"}
# A record of each kind as the runs build them: whether of a workload, schedule, kind, params,
# and the other fields.
WRITTEN = {
    "rung": (True, "v3", "rung", {"tile": 16},
             dict(status="ok", rel_error=1e-7, tolerance=1e-5, timing=TIMING,
                  structure={"kernels": 1, "grid (x,y,z)": "8x8x1"},
                  resources={"main_kernel": {"registers": 40, "spill_stores": 0}})),
    "failed rung": (True, "v2", "rung", {}, dict(status="failed", rel_error=None,
                                                 error="relative error nan > 1e-05")),
    "tuned": (True, "autotvm:seed_template", "tuned", {"tile": 32},
              dict(status="ok", timing=TIMING, suite="llm-bf16", model="Llama-3-8B",
                   layer="qkv_proj", aligned=[1024, 512, 2048])),
    "baseline": (True, "cublas", "baseline", {"tf32": False, "call": "torch.mm"},
                 dict(status="ok", timing=TIMING)),
    "ceiling": (False, "device-compute", "ceiling", {"size": 8192, "call": "torch.mm"},
                dict(op="compute", dtype="float32", status="ok", compute_tflops=50.0,
                     timing=TIMING)),
    "search": (True, "autotvm:seed_template", "search", {"tile": 32},
               dict(status="ok", search="autotvm", tuner="xgb", seed=0, trials=3, space=64,
                    candidates={"proposed": 3, "refused": 0, "measured": 3},
                    trials_per_min=12.5, curve=[(1, None), (2, 0.7), (3, 0.5)])),
    "metaschedule search": (True, "metaschedule", "search", {"work_dir": "ms"},
                            dict(status="ok", search="metaschedule", tuner="evolutionary",
                                 rules="cuda", seed=1, shared_kb=227, trials=8,
                                 trials_per_min=3.0, curve=[(4, 0.9), (8, 0.5)])),
    "counted": (True, "v3", "rung", {"tile": 16},
                dict(status="counted", counters={"duration_ns": 2.0, "stalls": {"wait": 1.0}})),
}


@pytest.mark.parametrize("kind", WRITTEN)
def test_a_record_the_runs_write_reads_back_equal(tmp_path, kind):
    """Each kind of record bench.Run builds (from a workload's fields, a timing given as its
    JSON object, a curve of tuples, a null field) is appended as a line that reads back as an
    equal Record and passes the checks that a report reads records through."""
    wl, schedule, record_kind, params, fields = WRITTEN[kind]
    run = bench.Run(flush="write", facts=RUN_FACTS)
    made = run.record(Workload("gemm", (1024, 512, 2048)) if wl else None, schedule, record_kind,
                      params, **fields)
    assert made.timing is None or isinstance(made.timing, Timing)
    assert made.schema == facts.SCHEMA and made.rest == {}
    path = str(tmp_path / "results.jsonl")
    records.append(path, made)
    [line] = records.load(path).records
    assert Record.from_json(line) == made and records.measurement_problem(line) is None


def test_a_field_the_record_does_not_name_is_refused_where_the_record_is_built(tmp_path):
    """A misspelt or new field at a call site is a TypeError there, not a key that a records
    file gains unseen (name it on Record first); so is a workload's field given twice."""
    run = bench.Run(facts=RUN_FACTS)
    wl = Workload("gemm", (64, 64, 64))
    path = tmp_path / "results.jsonl"
    with pytest.raises(TypeError, match="median"):
        records.append(str(path), run.record(wl, "v3", "rung", {}, status="ok", median=0.5))
    with pytest.raises(TypeError, match="shape"):
        records.append(str(path), run.record(wl, "v3", "rung", {}, shape=[1, 2, 3]))
    assert not path.exists()


def test_a_record_with_its_compute_ceiling_set_is_written_and_read_back_whole():
    """to_json is from_json's inverse on the renderers' form too: a kernel whose compute
    ceiling with_ceilings has set (a Record in a Record) writes it as a JSON object."""
    ceiling = Record.from_json(compute_ceiling(tflops=60.0))
    kernel = dataclasses.replace(Record.from_json(measurement("v3", 0.9)),
                                 compute_ceiling=ceiling, copy_gbps=3000.0)
    line = json.loads(kernel.json_line())
    assert line["compute_ceiling"]["compute_tflops"] == 60.0
    assert Record.from_json(line) == kernel


SWEEPS = [os.path.join("notebook", "logs", f"h100-sweep-wide-bf16-{ms}-2026-11-26.jsonl.gz")
          for ms in ("48-300", "700-2500")]


def _sweep_summary(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, os.path.join("scripts", "sweep_summary.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_a_sweeps_summary_sets_its_settings_beside_the_best_of_them():
    """The committed wide-bf16 sweeps past decode batches (M = 300 to 2500): v8's default and
    the best of the eight settings per shape, as reports/notes/h100-shapes.md reads them off
    (84.7% and 93.5% of cuBLAS over 96 shapes), and the default's M = 300 (74.9%)."""
    done = _sweep_summary(*SWEEPS, "--tokens", "300", "700", "2500")
    assert done.returncode == 0, done.stderr
    header, _, *rows = done.stdout.splitlines()
    columns = [c.strip() for c in header.strip("|").split("|")]
    table = {cells[0]: dict(zip(columns, cells))
             for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows)}
    assert columns[:4] == ["setting", "M = 300", "M = 700", "M = 2500"]
    assert (table["v8"]["all"], table["v8"]["M = 300"], table["v8"]["shapes"]) == \
        ("84.7%", "74.9%", "96")
    assert (table["best of these"]["all"], table["best of these"]["fastest on"]) == ("93.5%", "-")
    assert sum(int(row["fastest on"]) for name, row in table.items()
               if name != "best of these") >= 96  # every shape has a fastest (ties count twice)


def test_a_sweeps_summary_sets_the_best_without_some_settings_beside_the_best():
    """stop 92's sweep with the swapped one-consumer tile: the best of the portfolio with and
    without it, as its notes read them (93.1% and 92.8% of cuBLAS at 200 rows, 93.1% at 300
    either way)."""
    sweep = os.path.join("notebook", "logs",
                         "h200-sweep-swapped-one-consumer-2026-11-30.jsonl.gz")
    done = _sweep_summary(sweep, "--without", "swap_ab=true,split_k=1,pingpong=true")
    assert done.returncode == 0, done.stderr
    header, _, *rows = done.stdout.splitlines()
    columns = [c.strip() for c in header.strip("|").split("|")]
    table = {cells[0]: dict(zip(columns, cells))
             for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows)}
    with_it = table["best of these"]
    without = table["best without swap_ab=true,split_k=1,pingpong=true"]
    assert (with_it["M = 200"], with_it["M = 300"]) == ("93.1%", "93.1%")
    assert (without["M = 200"], without["M = 300"], without["fastest on"]) == \
        ("92.8%", "93.1%", "-")


def test_a_sweeps_summary_keeps_one_suite_of_a_file_that_holds_two():
    """stop 90's sweep of wide-bf16 and wide-fp8 at 300 rows in one file: 32 shapes each."""
    both = os.path.join("notebook", "logs", "h200-sweep-swap-clusters-300-2026-11-29.jsonl.gz")
    shapes = {}
    for suite in ("wide-bf16", "wide-fp8", None):
        done = _sweep_summary(both, *(("--suite", suite) if suite else ()))
        assert done.returncode == 0, done.stderr
        v8 = next(row for row in done.stdout.splitlines() if row.startswith("| v8 "))
        shapes[suite] = v8.strip("|").split("|")[-1].strip()
    assert shapes == {"wide-bf16": "32", "wide-fp8": "32", None: "64"}


@pytest.mark.parametrize("args, said", [
    (("no-such.jsonl",), "error: no-such.jsonl is not a file"),
    ((SWEEPS[0], "--tokens", "5"), "holds no measured shape at M = 5"),
    ((SWEEPS[0], "--suite", "llm-fp8"), "holds no measured shape of suite llm-fp8"),
])
def test_a_sweeps_summary_refuses_what_it_cannot_read_in_one_line(args, said):
    done = _sweep_summary(*args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, \
        done.stderr


def test_gzipped_records_read_as_the_plain_ones_and_a_bad_one_is_one_line(tmp_path):
    """Records gzipped (as the notebook keeps those over 200 KB) load as the same records; a
    .gz name on a file that is not gzip is one clear line from the summary, no traceback; a
    gzipped file is never appended to (a plain line would leave it unreadable)."""
    import gzip

    plain = os.path.join(tmp_path, "sweep.jsonl")
    with gzip.open(SWEEPS[0], "rt") as f, open(plain, "w") as out:
        out.write(f.read())
    assert records.measurements(SWEEPS[0], print) == records.measurements(plain, print)
    bad = os.path.join(tmp_path, "bad.jsonl.gz")
    with open(bad, "w") as f:
        f.write('{"not": "gzip"}\n')
    done = _sweep_summary(bad)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: cannot read {bad}"), done.stderr
    with pytest.raises(RecordsError, match="is gzipped"):
        records.append(SWEEPS[0], {"kind": "note"})
