"""The runner's command line on a machine without a GPU: bad input gives one line and exit 2;
good input lowers, builds, prints, and says plainly that it skipped the run."""

import json
import re

import pytest

import runner
from tuning import measure


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(measure, "gpu_present", lambda: False)


def run(capsys, *argv):
    code = runner.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--schedule", "v9"], "error: unknown schedule 'v9' for gemm; valid: naive, v1, v2, v3"),
        (["--op", "conv"], "error: unknown op 'conv'; valid ops: gemm, gemv, batched_gemv"),
        (["--shape", "1024x512"], "error: gemm takes a shape MxNxK of 3 integers"),
        (["--shape", "10x2x"], "error: malformed shape '10x2x'"),
        (["--shape", "0x512x2048"], "error: dimensions must be positive, got M=0"),
        (["--shape", "8x-8x8"], "error: dimensions must be positive, got N=-8"),
        (["--dtype", "float64"], "error: unknown dtype 'float64'; valid: float32, float16, bfloat16"),
        (["--layout", "tt"], "error: unknown layout 'tt' for gemm; valid: nn, nt"),
        (["--preset", "nope"], "error: unknown preset 'nope'; valid: gemm-seed"),
        (["--preset", "gemv-1024", "--op", "gemm"], "error: preset gemv-1024 is a gemv workload"),
        (["--arch", "hopper"], "error: malformed --arch 'hopper'"),
        (["--diff", "v2", "v9"], "error: unknown schedule 'v9' for gemm"),
        (["--op", "gemv", "--shape", "64x1001", "--diff", "naive", "allreduce"],
         "error: K=1001 is not a multiple of the 8-element vector"),
        (["--schedule", "v5:split=4"], "error: v5 has no knob 'split'; knobs: block_m, block_n"),
        (["--schedule", "v5:split_k=four"], "error: knob split_k of v5 is an integer, not 'four'"),
        (["--diff", "v5", "seed_template:vectorize=1"],
         "error: knob vectorize of seed_template is true or false, not '1'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv, "--no-ir")
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_argparse_errors_also_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        runner.main(["--no-such-flag"])
    assert exc.value.code == 2


def test_list_shows_every_op_its_rungs_and_the_presets(capsys):
    code, out, _ = run(capsys, "--list")
    assert code == 0
    for text in ("gemm:", "v3", "tile_k=8", "gemv:", "allreduce", "(baseline)", "bgemv-l8"):
        assert text in out


def test_default_run_prints_ir_builds_and_skips_the_gpu_part(capsys, tmp_path):
    results = tmp_path / "results.jsonl"
    code, out, _ = run(capsys, "--schedule", "v3", "--results", str(results))
    assert code == 0
    assert "A_shared = T.alloc_shared((128,))" in out  # the lowered TVMScript
    assert "v3: built: grid (x,y,z) 64x32x1, block (x,y,z) 16x16x1, shared bytes 1024" in out
    assert "no GPU here" in out and "skipped the correctness check and timing" in out
    assert not results.exists()


def test_no_ir_and_show_cuda(capsys):
    code, out, _ = run(capsys, "--schedule", "v1", "--no-ir", "--show-cuda")
    assert code == 0 and "T.prim_func" not in out and "__global__ void" in out


def test_all_carries_on_past_a_rung_that_does_not_apply(capsys):
    code, out, _ = run(capsys, "--op", "gemv", "--shape", "64x1001", "--schedule", "all", "--no-ir")
    assert code == 0
    assert "splitk: built" in out
    assert "allreduce: skipped: K=1001 is not a multiple of the 8-element vector" in out


def test_a_failing_build_is_reported_and_the_run_goes_on(capsys, monkeypatch):
    from schedules import registry

    def broken(sch, wl):
        """A rung whose build fails."""
        raise RuntimeError("CUDA codegen exploded\nsecond line")

    monkeypatch.setitem(registry._REGISTRY["gemm"], "v2", registry.ScheduleEntry("gemm", "v2", broken))
    code, out, _ = run(capsys, "--schedule", "all", "--no-ir")
    assert code == 0
    assert "v2: build failed: CUDA codegen exploded\n" in out and "second line" not in out
    assert "v3: built" in out and "dlight: built" in out


def test_dlight_failing_inside_tvm_is_a_build_failure(capsys):
    # dlight's GEMV rule raises inside TVM on a batched GEMV with ragged rows.
    code, out, _ = run(capsys, "--op", "batched_gemv", "--shape", "3x1001x1000", "--schedule", "all", "--no-ir")
    assert code == 0 and "multirow: built" in out
    assert "dlight: build failed: 'FloorDiv' object has no attribute 'value'" in out


def test_diff_shows_ir_changes_and_a_structural_summary(capsys):
    code, out, _ = run(capsys, "--diff", "v2", "v3", "--show-cuda")
    assert code == 0
    assert "--- v2 (lowered)" in out and "+++ v3 (lowered)" in out
    assert "+        A_shared = T.alloc_shared((128,))" in out
    assert "--- v2.cu" in out and "+    __syncthreads();" in out
    assert re.search(r"\| shared bytes\s+\| 0\s+\| 1024\s+\|", out)
    assert re.search(r"\| __syncthreads\s+\| 0\s+\| 2\s+\|", out)


def test_report_renders_and_survives_a_corrupt_line(capsys, tmp_path):
    from tests.test_records_and_report import seed_run

    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in seed_run()) + "\nnot json\n")
    before = results.read_text()
    out_md = tmp_path / "r" / "seed.md"
    code, out, err = run(capsys, "--report", str(out_md), "--results", str(results))
    assert code == 0 and f"wrote {out_md}" in out
    assert f"{results}:7: not valid JSON" in err and results.read_text() == before
    assert "| v3 " in out_md.read_text()


def test_report_of_an_empty_results_file_is_exit_2(capsys, tmp_path):
    code, _, err = run(capsys, "--report", str(tmp_path / "x.md"), "--results", str(tmp_path / "none.jsonl"))
    assert code == 2 and err.startswith("error: no measurements in")


def test_runner_warns_about_a_corrupt_results_line_and_keeps_it(capsys, tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text("{broken\n")
    code, _, err = run(capsys, "--schedule", "v1", "--no-ir", "--results", str(results))
    assert code == 0 and f"{results}:1: not valid JSON" in err and "kept as it is" in err
    assert results.read_text() == "{broken\n"


def test_knobs_from_the_command_line_diff_and_record_like_a_rung(capsys):
    code, out, _ = run(capsys, "--diff", "v5", "v5:split_k=4,thread_n=8")
    assert code == 0 and "+++ v5:split_k=4,thread_n=8 (lowered)" in out
    assert "+    C_rf = T.decl_buffer((2097152,)" in out  # the float32 partials of the 4 K slices
    assert re.search(r"\| kernels\s+\| 1\s+\| 2\s+\|", out)
    code, out, _ = run(capsys, "--schedule", "v5:split_k=3", "--no-ir")
    assert code == 0 and "v5:split_k=3: skipped: v5 splits K=2048 into 3 slices" in out
