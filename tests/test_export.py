"""Taking a kernel out (tuning/export.py, tuning/loader.py): `runner.py --export DIR` and its
files, the loader's refusals (another GPU, TVM or tvm-ffi, no GPU, unreadable files), the
refused export directories and flags, and `compile`'s torch operator: its registration, the
shapes and dtypes of its fake implementation, and its one-line refusals of wrong inputs. The GPU
tier at the end runs the operator against float64: eager, on a side stream, inside
torch.compile and inside a CUDA graph, and an exported kernel loaded back by its load.py."""

import contextlib
import io
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from datetime import datetime

import pytest
import torch
import tvm
import tvm_ffi
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import runner
import schedules
from schedules import ScheduleNotApplicable, UnknownSchedule, Workload
from schedules.errors import KernelFailed
from tests.test_cli import run
from tuning import export, loader, measure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEMV = Workload("gemv", (256, 512), "float16")
GEMV_ARGS = ["--op", "gemv", "--shape", "256x512", "--dtype", "float16",
             "--schedule", "blockreduce"]
FILES = {loader.SOURCE, loader.LIBRARY, loader.LOADER, loader.MANIFEST}
H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(measure, "gpu_present", lambda: False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One export of GEMV's blockreduce through the command line, built as on a machine without
    a GPU, into a directory that exists and is empty: (directory, exit status, stdout, stderr)."""
    directory = tmp_path_factory.mktemp("export") / "gemv"
    directory.mkdir()
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        patch.setattr(measure, "gpu_present", lambda: False)
        code = runner.main(GEMV_ARGS + ["--export", str(directory)])
    return directory, code, out.getvalue(), err.getvalue()


@pytest.fixture
def copied(exported, tmp_path):
    """A copy of the export elsewhere, and a way to edit its kernel.json."""
    directory = tmp_path / "copy"
    shutil.copytree(exported[0], directory)

    def edit(**fields):
        path = directory / loader.MANIFEST
        path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))

    return directory, edit


@pytest.fixture(scope="module")
def kernel():
    """`compile`'s operator for GEMV's blockreduce, built as on a machine without a GPU."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure, "gpu_present", lambda: False)
        return export.compile(GEMV, "blockreduce")


# -- the exported files ------------------------------------------------------------------------

def test_export_writes_source_library_loader_and_json(exported):
    directory, code, out, err = exported
    assert code == 0 and err == ""
    assert set(os.listdir(directory)) == FILES
    assert out.splitlines()[-1] == (
        f"exported blockreduce (gemv 256x512 float16 nt, sm_90a) to {directory}: kernel.cu, "
        "kernel.so, load.py, kernel.json; not measured: built on a machine without a GPU")
    source = (directory / loader.SOURCE).read_text()
    kernels = re.findall(r"__global__ void (?:__launch_bounds__\([\d, ]+\) )?(\w+)\(", source)
    library = (directory / loader.LIBRARY).read_bytes()
    assert kernels and library.startswith(b"\x7fELF") and b"__tvm_ffi_main" in library
    assert all(name.encode() in library for name in kernels)  # the kernels TVM's runtime loads
    with open(loader.__file__) as f:
        assert (directory / loader.LOADER).read_text() == f.read()


def test_the_json_says_what_was_built_for_what_and_that_nothing_was_measured(exported):
    written = json.loads((exported[0] / loader.MANIFEST).read_text())
    assert {k: written[k] for k in ("label", "op", "shape", "dtype", "out_dtype", "layout")} == {
        "label": GEMV.label(), "op": "gemv", "shape": [256, 512], "dtype": "float16",
        "out_dtype": "float16", "layout": "nt"}
    assert written["schedule"] == "blockreduce" and written["kind"] == "rung"
    assert written["knobs"] == schedules.get("gemv", "blockreduce").defaults_for(GEMV)
    assert written["inputs"] == [{"name": "B", "shape": [256, 512], "dtype": "float16"},
                                 {"name": "x", "shape": [512], "dtype": "float16"}]
    assert written["output"] == {"name": "y", "shape": [256], "dtype": "float16"}
    assert written["arch"] == "sm_90a" and written["compute_capability"] == "9.0"
    assert written["gpu"] is None
    assert (written["tvm"], written["tvm_ffi"]) == (tvm.__version__, tvm_ffi.__version__)
    assert written["time_ms"] is None and written["timing"] is None
    assert written["measured"] == "not measured: built on a machine without a GPU"
    assert datetime.fromisoformat(written["date"]).tzinfo is not None


def test_load_py_needs_only_torch_and_tvm_and_says_whether_it_loads_here(copied):
    """Copied elsewhere, load.py finds its own files and imports nothing of the project."""
    directory, _ = copied
    probe = ("import runpy, sys; code = runpy.run_path(sys.argv[1])['main'](); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('tuning', 'schedules', 'reporting', 'runner'))); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", probe, str(directory / loader.LOADER)],
                          cwd=directory.parent, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                              if p and os.path.abspath(p) != ROOT)})
    assert done.stdout.splitlines()[-1] == "[]"
    problem = loader.refusal(loader.read_manifest(directory), loader.gpu_here(),
                             loader.versions_here())
    if problem:
        assert done.returncode == 1 and done.stderr == f"error: {problem}\n"
    else:
        assert done.returncode == 0 and "loaded as torch.ops.tvm_explorer." in done.stdout


# -- loading refused ---------------------------------------------------------------------------

@pytest.mark.parametrize("package", ["tvm", "tvm_ffi"])
def test_a_kernel_built_with_another_tvm_is_refused(copied, package):
    directory, edit = copied
    edit(**{package: "0.26.0"})
    here = loader.versions_here()[package]
    with pytest.raises(loader.CannotLoad, match=re.escape(
            f"gemv 256x512 float16 nt was built with {package} 0.26.0, and this Python has "
            f"{package} {here}: export it again with this {package}")):
        loader.load(str(directory))


def test_a_kernel_built_for_another_gpu_is_refused(copied, monkeypatch):
    directory, edit = copied
    monkeypatch.setattr(loader, "gpu_here", lambda: H100)
    edit(arch="sm_80", compute_capability="8.0")
    with pytest.raises(loader.CannotLoad) as refused:
        loader.load(str(directory))
    assert str(refused.value) == (
        "gemv 256x512 float16 nt was built for sm_80 (compute capability 8.0), and this GPU, "
        "NVIDIA H100 80GB HBM3, is compute capability 9.0: export it again on this GPU")


def test_an_sm_90a_kernel_runs_on_hopper_only():
    exported_for_hopper = {"label": "k", "arch": "sm_90a", "compute_capability": "9.0",
                           **loader.versions_here()}
    versions = loader.versions_here()
    assert loader.refusal(exported_for_hopper, H100, versions) is None
    a100 = {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}
    assert "is compute capability 8.0: export it again" in loader.refusal(
        exported_for_hopper, a100, versions)
    assert loader.refusal(exported_for_hopper, None, versions) == (
        "k runs on a CUDA GPU (sm_90a), and torch sees none here")


def test_without_a_gpu_loading_is_refused(copied, monkeypatch):
    monkeypatch.setattr(loader, "gpu_here", lambda: None)
    with pytest.raises(loader.CannotLoad, match="runs on a CUDA GPU \\(sm_90a\\), and torch "
                       "sees none here"):
        loader.load(str(copied[0]))


def test_another_gpu_of_the_same_arch_loads_with_a_warning(copied, monkeypatch):
    directory, edit = copied
    edit(gpu="NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(loader, "gpu_here", lambda: {"name": "NVIDIA H200",
                                                     "compute_capability": "9.0"})
    opened = []
    monkeypatch.setattr(loader.tvm.runtime, "load_module", lambda path: opened.append(path) or {})
    with pytest.warns(UserWarning, match="measured on NVIDIA H100 80GB HBM3, not on this NVIDIA "
                      "H200: its time in kernel.json is that GPU's"):
        loaded = loader.load(str(directory))
    assert opened == [str(directory / loader.LIBRARY)]
    assert loaded.manifest == loader.read_manifest(str(directory))


def test_a_missing_or_corrupt_json_is_one_line(copied):
    directory, _ = copied
    (directory / loader.MANIFEST).write_text("{not json")
    with pytest.raises(loader.CannotLoad, match=f"{re.escape(str(directory))}/kernel.json is not "
                       "JSON"):
        loader.load(str(directory))
    (directory / loader.MANIFEST).unlink()
    with pytest.raises(loader.CannotLoad, match="cannot read .*kernel.json: No such file"):
        loader.load(str(directory))


# -- export refused ----------------------------------------------------------------------------

def test_a_non_empty_export_directory_is_refused_and_kept(capsys, no_gpu, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    code, out, err = run(capsys, *GEMV_ARGS, "--export", str(tmp_path))
    assert code == 2 and out == ""
    assert err == (f"error: export directory {tmp_path} exists and is not empty: name a new or "
                   "empty directory (nothing was written)\n")
    assert os.listdir(tmp_path) == ["notes.txt"] and (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("argv, message", [
    (["--schedule", "all"], "--export writes one kernel: name its schedule (a rung, best, "
     "metaschedule or autotvm:<template>), not all"),
    (["--diff", "v2", "v3"], "--export writes one schedule's kernel; it does not take --diff"),
    (["--list"], "--export writes one schedule's kernel; it does not take --list"),
    (["--report", "r.md"], "--export writes one schedule's kernel; it does not take --report"),
    (["--suite", "llm-gemv"], "--export writes one schedule's kernel; it does not take --suite"),
    (["--tune", "metaschedule", "--work-dir", "ms"],
     "--export writes one schedule's kernel; it does not take --tune"),
    (["--schedule", "v5:thread_m=3"], "v5:thread_m=3: v5 cuts block_m=64 into register tiles of "
     "thread_m=3: not a whole number of them; thread_m values that apply here: 4, 8"),
    (["--schedule", "v9"], "unknown schedule 'v9' for gemm"),
])
def test_bad_export_requests_are_one_line_and_write_nothing(capsys, no_gpu, tmp_path, argv,
                                                            message):
    target = tmp_path / "out"
    code, _, err = run(capsys, *argv, "--export", str(target))
    assert code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1
    assert not target.exists() and os.listdir(tmp_path) == []


def test_an_export_path_that_is_a_file_is_refused(capsys, no_gpu, tmp_path):
    (tmp_path / "f").write_text("mine")
    code, _, err = run(capsys, *GEMV_ARGS, "--export", str(tmp_path / "f"))
    assert code == 2 and err == (f"error: export directory {tmp_path / 'f'} is a file: name a "
                                 "new or empty directory\n")
    assert (tmp_path / "f").read_text() == "mine"


def test_a_failure_while_writing_leaves_nothing_behind(capsys, no_gpu, tmp_path, monkeypatch):
    def refuse(self, path, **kwargs):
        raise RuntimeError("linker exploded\nsecond line")

    monkeypatch.setattr(tvm.runtime.Executable, "export_library", refuse)
    code, _, err = run(capsys, *GEMV_ARGS, "--export", str(tmp_path / "out"))
    assert code == 1 and err == "error: could not write kernel.so: linker exploded\n"
    assert os.listdir(tmp_path) == []  # neither the export nor its staging directory


def test_an_export_below_a_file_is_one_line(capsys, no_gpu, tmp_path):
    (tmp_path / "f").write_text("mine")
    code, _, err = run(capsys, *GEMV_ARGS, "--export", str(tmp_path / "f" / "out"))
    assert code == 2 and err == f"error: cannot export into {tmp_path / 'f' / 'out'}: File exists\n"
    assert os.listdir(tmp_path) == ["f"] and (tmp_path / "f").read_text() == "mine"


# -- compile: the torch operator ---------------------------------------------------------------

def test_compile_registers_a_custom_op_with_the_kernels_schema(kernel):
    op = getattr(torch.ops.tvm_explorer, kernel.name)
    assert kernel.name.startswith("gemv_blockreduce")
    assert str(op.default._schema) == (f"tvm_explorer::{kernel.name}(Tensor first, Tensor second)"
                                       " -> Tensor")
    assert kernel.manifest["schedule"] == "blockreduce" and kernel.manifest["gpu"] is None


def test_each_compiled_kernel_gets_an_operator_of_its_own(kernel, no_gpu):
    again = export.compile(GEMV, "blockreduce", check=False)
    assert again.name != kernel.name and hasattr(torch.ops.tvm_explorer, again.name)


def fake_inputs(wl, **changed):
    """Fake CUDA tensors of wl's inputs (no GPU needed), with some replaced by `changed`."""
    return [changed.get(name) if name in changed else
            torch.empty(shape, dtype=measure.torch_dtype(wl.dtype), device="cuda")
            for name, shape in list(wl.buffer_shapes().items())[:-1]]


@pytest.mark.parametrize("wl, name", [
    (GEMV, "blockreduce"),
    (Workload("gemm", (64, 48, 40), "float16", layout="nt"), "v3"),  # float32 C of fp16 inputs
])
def test_the_fake_implementation_gives_the_outputs_shape_dtype_and_device(wl, name, kernel,
                                                                          no_gpu):
    compiled = kernel if name == "blockreduce" else export.compile(wl, name)
    with FakeTensorMode():
        out = compiled(*fake_inputs(wl))
        assert tuple(out.shape) == wl.buffer_shapes()[wl.output]
        assert out.dtype == measure.torch_dtype(wl.out_dtype) and out.device.type == "cuda"


def test_the_operator_traces_into_a_graph(kernel):
    with FakeTensorMode():
        graph = make_fx(lambda b, x: kernel(b, x) * 2)(*fake_inputs(GEMV))
    assert f"torch.ops.tvm_explorer.{kernel.name}.default(" in graph.code


def wrong_inputs():
    """(name, the inputs a fake mode makes, the one-line refusal)."""
    what = "gemv 256x512 float16 nt: input"
    return [
        ("shape", lambda: fake_inputs(GEMV, x=torch.empty(256, dtype=torch.float16, device="cuda")),
         f"{what} x has shape (256,), not (512,)"),
        ("dtype", lambda: fake_inputs(GEMV, B=torch.empty(256, 512, device="cuda")),
         f"{what} B is torch.float32, not torch.float16"),
        ("device", lambda: fake_inputs(GEMV, B=torch.empty(256, 512, dtype=torch.float16)),
         f"{what} B is on cpu, not on a CUDA device"),
        ("two devices", lambda: fake_inputs(
            GEMV, x=torch.empty(512, dtype=torch.float16, device="cuda:1")),
         f"{what} x is on cuda:1, and the first input on cuda:0"),
        ("strides", lambda: fake_inputs(
            GEMV, B=torch.empty(512, 256, dtype=torch.float16, device="cuda").t()),
         f"{what} B has strides (1, 256), not contiguous ones: pass .contiguous()"),
    ]


@pytest.mark.parametrize("case, make, message", wrong_inputs(), ids=[w[0] for w in wrong_inputs()])
def test_wrong_inputs_are_one_line_while_tracing(kernel, case, make, message):
    with FakeTensorMode(), pytest.raises(loader.BadInput) as refused:
        kernel(*make())
    assert str(refused.value) == message


def test_wrong_inputs_are_one_line_when_called(kernel):
    """Eagerly, before anything launches: CPU tensors are refused by the operator itself."""
    b, x = (torch.zeros(shape, dtype=torch.float16) for shape in ((256, 512), (512,)))
    with pytest.raises(loader.BadInput, match="^gemv 256x512 float16 nt: input B is on cpu, not "
                       "on a CUDA device$"):
        kernel(b, x)


def test_compile_refuses_as_the_runner_does(no_gpu):
    with pytest.raises(UnknownSchedule, match="unknown schedule 'v9' for gemv"):
        export.compile(GEMV, "v9")
    with pytest.raises(ScheduleNotApplicable, match="thread_m values that apply here: 4, 8"):
        export.compile(Workload("gemm", (1024, 512, 2048)), "v5:thread_m=3")


# -- GPU tier ----------------------------------------------------------------------------------

CHECKED = [
    (Workload("gemv", (1001, 1000), "float16"), "blockreduce"),  # ragged rows and K steps
    (Workload("gemm", (1000, 136, 200), "bfloat16", layout="nt"), "v5k"),  # nn.Linear's layout
    (Workload("batched_gemv", (3, 5, 4095), "float16"), "multirow"),
]


def assert_equals_float64(wl, out, inputs):
    err = measure.relative_error(out, measure.reference(wl, inputs))
    assert out.dtype == measure.torch_dtype(wl.out_dtype)
    assert err <= measure.tolerance(wl), f"relative error {err:.3g} > {measure.tolerance(wl):g}"


@pytest.mark.gpu
@pytest.mark.parametrize("wl, name", CHECKED, ids=[f"{n}-{wl.label()}" for wl, n in CHECKED])
def test_the_operator_equals_float64_eager_compiled_and_in_a_cuda_graph(wl, name):
    kernel = export.compile(wl, name)  # checked on its first call
    for seed in (1, 2):
        inputs = measure.random_inputs(wl, seed)
        assert_equals_float64(wl, kernel(*inputs), inputs)
    compiled = torch.compile(lambda a, b: kernel(a, b) * 2, fullgraph=True)
    inputs = measure.random_inputs(wl, 3)
    assert_equals_float64(wl, compiled(*inputs) / 2, inputs)
    static = measure.random_inputs(wl, 4)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel(*static)
    fresh = measure.random_inputs(wl, 5)
    for holder, value in zip(static, fresh):
        holder.copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    assert_equals_float64(wl, out, fresh)
    torch.library.opcheck(kernel.op, measure.random_inputs(wl, 6),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))


@pytest.mark.gpu
def test_the_operator_runs_on_torchs_current_stream():
    """On a side stream that first sleeps, then writes the inputs: a launch on any other stream
    would read them before they are written."""
    wl, name = CHECKED[0]
    kernel = export.compile(wl, name)
    inputs = measure.random_inputs(wl, 1)
    kernel(*inputs)  # first call: its check
    fresh = measure.random_inputs(wl, 2)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        for holder, value in zip(inputs, fresh):
            holder.copy_(value)
        out = kernel(*inputs)
    side.synchronize()
    assert_equals_float64(wl, out, fresh)


@pytest.mark.gpu
def test_an_unchecked_first_call_inside_a_graph_capture_is_refused():
    wl, name = CHECKED[0]
    kernel = export.compile(wl, name)
    inputs = measure.random_inputs(wl, 1)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="call the kernel once before capturing a CUDA graph"):
        with torch.cuda.graph(graph):
            kernel(*inputs)


@pytest.mark.gpu
def test_a_wrong_kernel_fails_its_first_call(monkeypatch):
    wl, name = CHECKED[0]
    kernel = export.compile(wl, name)
    monkeypatch.setattr(kernel, "launch", lambda inputs, out: out)  # writes nothing: NaN stays
    with pytest.raises(KernelFailed, match=f"{name} on {re.escape(wl.label())}: relative error"):
        kernel(*measure.random_inputs(wl, 1))


@pytest.mark.gpu
def test_an_exported_kernel_is_timed_and_loads_back_on_this_gpu(tmp_path, capsys):
    directory, results = tmp_path / "gemv", tmp_path / "results.jsonl"
    assert runner.main(GEMV_ARGS + ["--export", str(directory), "--results", str(results)]) == 0
    written = json.loads((directory / loader.MANIFEST).read_text())
    assert written["gpu"] == torch.cuda.get_device_name() and written["time_ms"] > 0
    assert written["measured"].startswith(f"median of {written['timing']['samples']} launches on")
    recorded = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["timing"]["median_ms"] for r in recorded] == [written["time_ms"]]
    kernel = runpy.run_path(str(directory / loader.LOADER))["load"]()
    inputs = measure.random_inputs(GEMV, 1)
    assert_equals_float64(GEMV, kernel(*inputs), inputs)
