"""The runner's command line on a machine without a GPU: bad input gives one line and exit 2;
good input lowers, builds, prints, and says plainly that it skipped the run."""

import json
import os
import re
import sys

import pytest

import runner
from schedules import Workload
from tuning import measure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
        (["--shape", "64x48x40", "--diff", "v5", "v7"],
         "error: v7 multiplies float16 or bfloat16 on tensor cores, not float32"),
        (["--schedule", "v5:split=4"], "error: v5 has no knob 'split'; its knobs: block_m, block_n"),
        (["--schedule", "v5k:k_slices=four"],
         "error: knob k_slices of v5k is a size or count of at least 1, not 'four'"),
        (["--diff", "v5", "seed_template:vectorize=1"],
         "error: knob vectorize of seed_template is true or false, not '1'"),
        # knobs out of range, and settings the user named that cannot run: what would work
        (["--schedule", "v5k:k_slices=0"], "error: knob k_slices of v5k is a size or count of at least 1, not 0"),
        (["--schedule", "v5k:k_slices=-4"], "error: knob k_slices of v5k is a size or count of at least 1, not -4"),
        (["--schedule", "v4:thread_n=0"], "error: knob thread_n of v4 is a size or count of at least 1"),
        (["--schedule", "v3:tile_x=0"], "error: knob tile_x of v3 is a size or count of at least 1"),
        (["--schedule", "v5:thread_m=3"], "error: v5:thread_m=3: v5 cuts block_m=64 into register tiles "
         "of thread_m=3: not a whole number of them; thread_m values that apply here: 4, 8"),
        (["--schedule", "v4:block_m=62"], "error: v4:block_m=62: v4 cuts block_m=62 into register tiles "
         "of thread_m=4"),
        (["--op", "gemv", "--schedule", "splitk:tile_k=x"],
         "error: knob tile_k of splitk is a size or count of at least 1 (or none), not 'x'"),
        (["--schedule", "v7"], "error: v7 multiplies float16 or bfloat16 on tensor cores, not float32"),
        (["--schedule", "v7", "--dtype", "float16", "--shape", "256x256x256", "--arch", "sm_80"],
         "error: v7 uses wgmma (built for sm_90a), which needs sm_90 or later, not sm_80"),
        (["--schedule", "v6", "--dtype", "float16", "--shape", "256x256x256", "--arch", "sm_75"],
         "error: v6 uses mma.sync m16n8k16 and cp.async, which needs sm_80 or later, not sm_75"),
        (["--arch", "sm_20"], "error: --arch sm_20 is older than any GPU that CUDA 13 builds for"),
        # knobs set twice or not at all, and TVM's internal checks put in words
        (["--schedule", "v5k:k_slices=8,k_slices=2"],
         "error: v5k:k_slices=8,k_slices=2 sets k_slices more than once"),
        (["--schedule", "v5:"], "error: v5: names no knobs after its ':'"),
        (["--schedule", "v8:,,"], "error: v8:,, names a knob without a name"),
        (["--schedule", "v5k:k_slices=1000000000"], "error: v5k:k_slices=1000000000: v5k cannot be "
         "scheduled with k_slices=1000000000: a size of 32000000000 is past what TVM's int32 "
         "indices reach; k_slices values that apply here: 1, 2, 4, 8"),
        (["--schedule", "v5:block_n=1000000000"], "error: v5:block_n=1000000000: v5 cannot be "
         "built with block_n=1000000000: a size of 64000000000 is past what TVM's int32 indices "
         "reach; block_n values that apply here: 32, 64, 128"),
        # kernels that no GPU could launch, refused at build naming the knob
        (["--schedule", "v3:tile_x=4096"], "error: v3:tile_x=4096: v3's main_kernel would launch "
         "blocks of 65536 threads (4096x16x1), over the 1024 a block can have on sm_90a; tile_x "
         "values that apply here: 1, 2, 4, 8, 16, 32, 64"),
        (["--schedule", "v2:tile_x=64,tile_y=64"], "error: v2:tile_x=64,tile_y=64: v2's "
         "main_kernel would launch blocks of 4096 threads (64x64x1), over the 1024"),
        (["--op", "gemv", "--schedule", "blockreduce:reduce_threads=100000"],
         "error: blockreduce:reduce_threads=100000: blockreduce's main_kernel would launch "
         "blocks of 100000 threads"),
        (["--diff", "v3", "v3:tile_x=4096"], "error: v3:tile_x=4096: v3's main_kernel would "
         "launch blocks of 65536 threads"),
        (["--arch", "sm_999"], "error: unknown --arch sm_999: no GPU of that arch is known here; "
         "known: sm_75, sm_80"),
        (["--schedule", "v5k", "--records", "no-such-records.jsonl"],
         "error: --records no-such-records.jsonl does not exist"),
        # shapes whose buffers int32 indices cannot reach
        (["--shape", "100000x100000x100000"], "error: A would hold 10000000000 elements"),
        (["--diff", "v2", "v3", "--shape", "100000x100000x100000"], "error: A would hold"),
        (["--tune", "metaschedule", "--work-dir", "x", "--tuner", "grid"],
         "error: --tuner picks a template search's tuner"),
        (["--tune", "autotvm:v5", "--records", "r.jsonl", "--ms-space", "tvm"],
         "error: --ms-space is MetaSchedule's design space"),
        # a search holding knobs reads them as --schedule does
        (["--tune", "autotvm:v8:", "--records", "r.jsonl"], "error: v8: names no knobs after"),
        (["--tune", "autotvm:v8:promote_k=none,promote_k=128", "--records", "r.jsonl"],
         "error: v8:promote_k=none,promote_k=128 sets promote_k more than once"),
        (["--tune", "autotvm:v5k:k_slices=0", "--records", "r.jsonl"],
         "error: knob k_slices of v5k is a size or count of at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    quiet = [] if "--diff" in argv else ["--no-ir"]  # a run's flag, which a diff refuses
    code, out, err = run(capsys, *argv, *quiet)
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["--no-such-flag"], "error: unrecognized arguments: --no-such-flag"),
    (["--flush", "sometimes"], "error: argument --flush: invalid choice: 'sometimes'"),
    (["--tune", "metaschedule", "--trials", "abc"],
     "error: argument --trials: invalid int value: 'abc'"),
    (["--diff", "v2"], "error: argument --diff: expected 2 arguments"),
    (["--tune", "metaschedule", "--seed", "-1"],
     "error: argument --seed: expected 0 to 4294967295, not -1"),
    (["--tune", "metaschedule", "--seed", str(2 ** 32)],
     "error: argument --seed: expected 0 to 4294967295, not 4294967296"),
    (["--shape", ""], "error: argument --shape: empty value"),
    (["--export", " "], "error: argument --export: empty value"),
    (["--diff", "v2", ""], "error: argument --diff: empty value"),
])
def test_argparse_errors_are_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and not out
    assert err.startswith(message) and err.endswith("(runner.py --help lists the flags)\n")
    assert err.count("\n") == 1


def test_knobs_are_read_by_their_declared_type(capsys):
    # tile_k's default is None (the rung chooses); a number given for it is a number
    code, out, err = run(capsys, "--op", "gemv", "--schedule", "splitk:tile_k=16", "--no-ir")
    assert code == 0 and "splitk:tile_k=16: built" in out and not err
    code, out, _ = run(capsys, "--op", "gemv", "--diff", "splitk", "splitk:tile_k=16")
    assert code == 0 and "+++ splitk:tile_k=16 (lowered)" in out
    code, out, _ = run(capsys, "--op", "gemv", "--schedule", "splitk:tile_k=none", "--no-ir")
    assert code == 0 and "built" in out


def test_a_report_path_that_is_a_directory_is_one_line(capsys, tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({"op": "gemm", "schedule": "v3"}) + "\n")
    code, _, err = run(capsys, "--report", str(tmp_path), "--results", str(results))
    assert code == 2 and err == f"error: --report {tmp_path} is a directory; name the markdown " \
        "file to write\n"


def test_a_schedule_that_fails_to_build_when_named_is_exit_1(capsys, monkeypatch):
    from schedules import registry

    def broken(sch, wl):
        raise RuntimeError("CUDA codegen exploded\nsecond line")

    monkeypatch.setitem(registry._REGISTRY["gemm"], "v2", registry.ScheduleEntry("gemm", "v2", broken))
    code, _, err = run(capsys, "--schedule", "v2", "--no-ir")
    assert code == 1 and err == "error: v2 failed to build: CUDA codegen exploded\n"
    code, _, err = run(capsys, "--diff", "v2", "v3")
    assert code == 1 and err == "error: v2 failed to build: CUDA codegen exploded\n"


def test_spills_are_flagged(capsys, monkeypatch):
    from tuning import build

    spilling = {"main_kernel": {"registers": 255, "spill_stores": 1362, "spill_loads": 1362}}
    monkeypatch.setattr(build, "nvcc_resources", lambda source, arch: spilling)
    code, out, err = run(capsys, "--schedule", "v3", "--no-ir")
    assert code == 0 and "main_kernel: 255 registers, SPILLS 2724 bytes" in out
    assert err == "warning: v3's main_kernel spills 2724 bytes of registers to local memory\n"


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
    code, out, _ = run(capsys, "--shape", "64x48x40", "--schedule", "all", "--no-ir")
    assert code == 0
    assert "v5t: built" in out
    assert "v7: skipped: v7 multiplies float16 or bfloat16 on tensor cores, not float32" in out


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
    # dlight's GEMV rule raises inside TVM on a batched GEMV with ragged rows (TVM's message,
    # whatever it says, is reported on one line and the run goes on).
    code, out, _ = run(capsys, "--op", "batched_gemv", "--shape", "3x1001x1000", "--schedule", "all", "--no-ir")
    assert code == 0 and "multirow: built" in out
    failure = [line for line in out.splitlines() if line.startswith("dlight: ")]
    assert len(failure) == 1 and failure[0].startswith("dlight: build failed: ")


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
    code, out, _ = run(capsys, "--diff", "v5p", "v5k:k_slices=4,thread_n=8")
    assert code == 0 and "+++ v5k:k_slices=4,thread_n=8 (lowered)" in out
    assert "+    C_rf = T.decl_buffer((2097152,)" in out  # the float32 partials of the 4 K slices
    assert re.search(r"\| kernels\s+\| 1\s+\| 2\s+\|", out)


def test_diff_lines_never_run_together_and_cse_names_follow_their_definitions():
    from tuning import build

    assert build.unified_diff("a\nb", "a\nc", "old", "new").splitlines()[-2:] == ["-b", "+c"]
    old = ("cse_v1: T.let[T.int32] = x * 4\ncse_v2: T.let[T.int32] = cse_v1 + y\n"
           "A[cse_v2] = B[cse_v1]\n")
    new = ("cse_v1: T.let[T.int32] = z * 2\ncse_v2: T.let[T.int32] = x * 4\n"
           "cse_v3: T.let[T.int32] = cse_v2 + y\nA[cse_v3] = B[cse_v2] + C[cse_v1]\n")
    diff = build.unified_diff(build.stable_cse_names(old), build.stable_cse_names(new), "o", "n")
    changed = [line for line in diff.splitlines()[2:] if line[:1] in "+-"]
    # one new subexpression and the line that uses it; the renumbered ones are not changes
    assert len(changed) == 3 and changed[0].startswith("+cse_") and changed[0].endswith("z * 2")


def test_a_diff_between_two_pipelines_is_hunks_not_one_block(capsys):
    code, out, _ = run(capsys, "--diff", "v5p", "v5p:stages=3")
    assert code == 0
    assert "cse_v" not in out and len(re.findall(r"^@@ ", out, re.M)) > 1


def test_without_nvcc_the_build_still_runs_and_says_nothing_of_registers(capsys, monkeypatch):
    import shutil

    from tuning import build

    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert build.nvcc_resources("__global__ void k() {}", "sm_90") is None
    code, out, _ = run(capsys, "--schedule", "v3", "--no-ir")
    assert code == 0 and "v3: built: grid (x,y,z) 64x32x1" in out and "registers" not in out


@pytest.mark.skipif(measure.gpu_present(), reason="this machine has a GPU: the gpu tier runs")
def test_bare_pytest_without_a_gpu_skips_the_gpu_tier_with_the_reason():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           os.path.join(root, "tests", "test_gpu.py"), "-k", "flush"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "3 skipped" in done.stdout and "needs a CUDA GPU" in done.stdout


def test_nvcc_rejecting_a_rungs_cuda_stops_that_rung_only(capsys, monkeypatch):
    from schedules.errors import BuildFailed
    from tuning import build

    def rejects(source, arch):
        raise BuildFailed("nvcc rejected the generated CUDA: ptxas fatal: no")

    monkeypatch.setattr(build, "nvcc_resources", rejects)
    code, out, _ = run(capsys, "--schedule", "all", "--no-ir")
    assert code == 0 and "v3: build failed: nvcc rejected the generated CUDA: ptxas fatal" in out
    assert "dlight: build failed: nvcc rejected" in out  # the run went on to the last schedule
    code, _, err = run(capsys, "--schedule", "v3", "--no-ir")
    assert code == 1 and err == "error: v3 failed to build: nvcc rejected the generated CUDA: " \
        "ptxas fatal: no\n"


def test_a_shape_that_would_not_fit_the_gpu_is_refused_before_anything_is_allocated(
        capsys, monkeypatch, tmp_path):
    from types import SimpleNamespace


    free, total = 2 * 2**30, 80 * 2**30
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(mem_get_info=lambda: (free, total)))
    monkeypatch.setattr(measure, "gpu_present", lambda: True)
    monkeypatch.setattr(measure, "_torch", lambda: fake_torch)
    results = tmp_path / "r.jsonl"
    code, out, err = run(capsys, "--shape", "16384x16384x16384", "--schedule", "v5",
                         "--no-ir", "--results", str(results))
    assert code == 2 and not results.exists() and out == ""
    assert err == ("error: gemm 16384x16384x16384 float32 nn needs 11.0 GiB of GPU memory to "
                   "check (its buffers and their float64 copies); the GPU has 2.0 GiB free of "
                   "80.0 GiB\n")
    # a shape that fits is not refused by the check
    assert measure.bytes_needed(Workload("gemm", (1024, 512, 2048))) < free


V8 = ["--schedules", "v8"]


@pytest.mark.parametrize("script, argv, code, said", [
    ("ab_knobs.py", ["--shape", "0x64x64", *V8], 2,
     "error: dimensions must be positive, got M=0\n"),
    ("ab_knobs.py", ["--shape", "64x64x64", "--dtype", "float33", *V8], 2,
     "error: unknown dtype 'float33'"),
    pytest.param("ab_knobs.py", ["--shape", "64x64x64", *V8], 1,
                 "ab_knobs.py times kernels: it needs a CUDA GPU",
                 marks=pytest.mark.skipif(measure.gpu_present(), reason="a GPU is here")),
    ("clock_probe.py", ["--shape", "0x64x64", *V8], 2,
     "error: dimensions must be positive, got M=0\n"),
    pytest.param("clock_probe.py", ["--shape", "64x64x64", *V8], 2, "error: no GPU here",
                 marks=pytest.mark.skipif(measure.gpu_present(), reason="a GPU is here")),
    ("sweep_suite.py", ["--suite", "wide-bf16", "--tokens", "3", *V8], 2,
     "error: suite wide-bf16 has no shape at M = 3\n"),
    ("sweep_suite.py", ["--suite", "wide-fp32", "--rows", "7", "0", *V8], 2,
     "error: --rows takes positive M\n"),
    pytest.param("sweep_suite.py", ["--suite", "wide-bf16", "--tokens", "300", *V8], 1,
                 "sweep_suite.py times kernels: it needs a CUDA GPU",
                 marks=pytest.mark.skipif(measure.gpu_present(), reason="a GPU is here")),
    ("compile_call_cost.py", ["--shape", "0x64x64"], 2,
     "error: dimensions must be positive, got M=0\n"),
    ("compile_call_cost.py", ["--shape", "16x4096"], 2,
     "error: gemm takes a shape MxNxK of 3 integers, got (16, 4096)\n"),
    ("compile_call_cost.py", ["--shape", "1x2x3x4"], 2,
     "error: gemm takes a shape MxNxK of 3 integers, got (1, 2, 3, 4)\n"),
    ("compile_call_cost.py", ["--dtype", "float32"], 2,
     "error: linear layers take float16 or bfloat16, not float32\n"),
    ("compile_call_cost.py", ["--json", ROOT], 2, f"error: --json {ROOT} is a directory\n"),
    ("compile_call_cost.py", ["--json", "/proc/x.json"], 2,
     "error: cannot write --json /proc/x.json: "),
    ("compile_call_cost.py", ["--calls", "0"], 2, "error: --calls and --rounds are at least 1"),
    ("compile_call_cost.py", ["--kernel", "v9"], 2, "error: no candidate v9 for 4096x4096 "
                                                    "bfloat16 at M = 16; its candidates: v8:"),
    pytest.param("compile_call_cost.py", [], 1,
                 "compile_call_cost.py times calls: it needs a CUDA GPU",
                 marks=pytest.mark.skipif(measure.gpu_present(), reason="a GPU is here")),
])
def test_the_gpu_scripts_refuse_bad_input_and_a_machine_without_a_gpu_in_one_line(
        script, argv, code, said):
    import subprocess

    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), *argv],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == code
    assert (done.stderr + done.stdout).startswith(said) and "Traceback" not in done.stderr


def test_the_call_cost_script_says_in_one_line_what_stopped_a_run(capsys, monkeypatch):
    """A kernel that did not build (or is wrong: KernelFailed) ends the run in one line, exit
    1, not a traceback; a subject that raised with no message still gets its row."""
    import importlib.util

    from schedules.errors import BuildFailed

    spec = importlib.util.spec_from_file_location(
        "compile_call_cost", os.path.join(ROOT, "scripts", "compile_call_cost.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def failed(*args):
        raise BuildFailed("v8 did not compile")

    monkeypatch.setattr(script.loader, "gpu_here", lambda: {"compute_capability": "9.0"})
    monkeypatch.setattr(script, "run_all", failed)
    assert script.main(["--shape", "16x64x64"]) == 1
    assert capsys.readouterr().err == "error: v8 did not compile\n"

    def silent(x):
        raise RuntimeError()

    assert script.measured("kernel", silent, "eager", None, 1, 1, 1) == {
        "subject": "kernel", "mode": "eager", "error": "RuntimeError"}


def test_the_sweep_moves_a_suites_layers_to_other_rows_and_layouts():
    """--rows: each distinct N x K of the suite once at each M asked for, in --layout's layout,
    dtype and models kept (shapes a rule was not read off, to check it on)."""
    import importlib.util

    from schedules import suites

    spec = importlib.util.spec_from_file_location(
        "sweep_suite", os.path.join(ROOT, "scripts", "sweep_suite.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    suite = suites.get("wide-fp32")
    layers = {e.workload.shape[1:] for e in suite.entries}
    moved = script.at_rows(suite, [1, 300], "nn")
    assert sorted(e.workload.shape for e in moved.entries) == sorted(
        (m, n, k) for m in (1, 300) for n, k in layers)
    assert {(e.workload.layout, e.workload.dtype) for e in moved.entries} == {("nn", "float32")}
    assert all(e.models and e.origin.endswith(f"moved to M = {e.workload.dims['M']}")
               for e in moved.entries)


def results_of_the_seed_run(tmp_path):
    """A results file of the seed ladder's run, and its text, to see that nothing rewrote it."""
    from tests.test_records_and_report import seed_run

    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in seed_run()) + "\n")
    return results, results.read_text()


@pytest.mark.parametrize("where, says", [
    ("/proc/x.md", "error: cannot write --report /proc/x.md: "),
    ("{tmp}/a-file/x.md", "error: cannot write --report {tmp}/a-file/x.md: {tmp}/a-file is a file, "
     "not a directory"),
    ("{tmp}/a-file/deeper/x.md", "error: cannot write --report {tmp}/a-file/deeper/x.md: "
     "{tmp}/a-file is a file"),
])
def test_a_report_that_cannot_be_written_is_refused_before_any_work(capsys, tmp_path, where,
                                                                      says):
    results, before = results_of_the_seed_run(tmp_path)
    (tmp_path / "a-file").write_text("x")
    listing = sorted(os.listdir(tmp_path))
    code, out, err = run(capsys, "--report", where.format(tmp=tmp_path), "--results", str(results))
    assert code == 2 and err.startswith(says.format(tmp=tmp_path)) and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == listing and results.read_text() == before


def test_a_report_whose_rendering_fails_leaves_nothing_behind(capsys, tmp_path, monkeypatch):
    from reporting import render
    from schedules.errors import RecordsError

    def broken(*args, **kwargs):
        raise RecordsError("the renderer gave up")

    monkeypatch.setattr(render, "render", broken)
    results, _ = results_of_the_seed_run(tmp_path)
    code, _, err = run(capsys, "--report", str(tmp_path / "new" / "r.md"), "--results", str(results))
    assert code == 2 and err == "error: the renderer gave up\n"
    assert sorted(os.listdir(tmp_path)) == ["results.jsonl"]


def test_notes_that_are_not_text_are_one_line(capsys, tmp_path):
    results, _ = results_of_the_seed_run(tmp_path)
    notes = tmp_path / "notes.md"
    notes.write_bytes(b"# notes\n\xd0\x00\xff binary")
    code, _, err = run(capsys, "--report", str(tmp_path / "r.md"), "--results", str(results),
                       "--notes", str(notes))
    assert code == 2 and err == f"error: cannot read --notes {notes}: not UTF-8 text (byte 8)\n"
    assert not (tmp_path / "r.md").exists()


@pytest.mark.parametrize("flags, says", [
    (["--work-dir", "/proc/ms"], "error: cannot write --work-dir /proc/ms: "),
    (["--work-dir", "{tmp}/a-file"], "error: --work-dir {tmp}/a-file is not a directory"),
    (["--work-dir", "{tmp}/ms", "--results", "/proc/r.jsonl"],
     "error: cannot write --results /proc/r.jsonl: "),
    (["--work-dir", "{tmp}/ms", "--results", "{tmp}"], "error: --results {tmp} is a directory"),
])
def test_a_search_that_could_not_write_its_results_is_refused_before_it_runs(
        capsys, tmp_path, monkeypatch, flags, says):
    from tuning import search

    monkeypatch.setattr(search, "run", lambda *a, **k: pytest.fail("the search ran"))
    (tmp_path / "a-file").write_text("x")
    code, _, err = run(capsys, "--tune", "metaschedule", "--target", "llvm", "--shape",
                       "64x64x64", *(f.format(tmp=tmp_path) for f in flags))
    assert code == 2 and err.startswith(says.format(tmp=tmp_path)) and err.count("\n") == 1
    assert not (tmp_path / "ms").exists()


def test_a_template_search_whose_records_cannot_be_written_is_refused(capsys, tmp_path):
    (tmp_path / "a-file").write_text("x")
    code, _, err = run(capsys, "--tune", "autotvm:v5", "--records", str(tmp_path / "a-file" / "r"))
    assert code == 2 and err == (f"error: cannot write --records {tmp_path}/a-file/r: "
                                 f"{tmp_path}/a-file is a file, not a directory\n")


def test_a_grid_whose_count_wrapped_past_int32_is_refused_not_built(capsys):
    """M just under 2^31: v1's tiles along M number more than int32 holds, and the grid's count
    wrapped negative (it was reported built)."""
    code, _, err = run(capsys, "--shape", "2147483647x1x1", "--schedule", "v1", "--no-ir")
    assert code == 2 and err == (
        "error: v1's main_kernel would launch a grid of -67108864x1x1 blocks: blockIdx.x "
        "-67108864 < 1 (a count past int32 wraps below 1)\n")


def test_a_kernel_over_the_targets_shared_memory_or_registers_is_refused():
    from schedules import Workload, get
    from tuning import build

    hopper, ampere = build.cuda_target("sm_90"), build.cuda_target("sm_80")  # 227, 163 KB
    wl = Workload("gemm", (4096, 4096, 4096), "float16", layout="nt")
    lowered = build.lower(get("gemm", "v8").for_workload(wl).apply(wl, hopper), hopper)
    assert build.launch_refusal(lowered, hopper) is None
    assert build.launch_refusal(lowered, ampere) == (
        "main_kernel would need 230464 bytes of shared memory per block, over the 166912 a block "
        "can have on sm_80")
    assert build.register_refusal(lowered, {"main_kernel": {"registers": 168}}, hopper) is None
    assert build.register_refusal(lowered, {"main_kernel": {"registers": 171}}, hopper) == (
        "main_kernel would need 171 registers x 384 threads = 65664 per block, over the 65536 "
        "a block has on sm_90a")
    # a cluster's two CTAs are two blocks of 384 threads, not one of 768
    clustered = build.lower(get("gemm", "v8").apply(wl, hopper, cluster_m=2), hopper)
    assert build.launch_dims(build._kernels(clustered)[0])[1] == {"threadIdx.x": 384}
    assert build.register_refusal(clustered, {"main_kernel": {"registers": 168}}, hopper) is None


def test_a_report_names_and_skips_a_record_without_a_gpu_and_renders_the_rest(capsys, tmp_path):
    results, _ = results_of_the_seed_run(tmp_path)
    lines = results.read_text().splitlines()
    no_gpu = json.loads(lines[1])
    del no_gpu["gpu"]
    results.write_text("\n".join([lines[0], json.dumps(no_gpu), *lines[2:]]) + "\n")
    code, out, err = run(capsys, "--report", str(tmp_path / "r.md"), "--results", str(results))
    assert code == 0 and err == f"warning: {results}:2: no 'gpu' field; skipped\n"
    assert "| v3 " in (tmp_path / "r.md").read_text()


def test_a_report_of_records_that_all_fail_their_checks_is_one_line(capsys, tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text('{"op": "conv", "schedule": "v3"}\nnot json\n')
    code, _, err = run(capsys, "--report", str(tmp_path / "r.md"), "--results", str(results))
    assert code == 2 and err == (f"error: no measurements in {results}: 2 lines skipped, the "
                                 f"first {results}:1: no 'kind' field\n")
