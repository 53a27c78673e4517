"""The command line's promises, on invocations drawn by hypothesis rather than written out.

Whatever the flags, values, shapes, knobs, paths (there or not, files, directories, places that
cannot be written) and records files (with bad fields or lines): the exit status is 0, 1, 2 or
130; on 1 and 2 stderr is one line, `error: ...`; nothing raises out of `runner.main` (no
traceback); no file that was there before changes; and a run that fails leaves nothing behind.

Bounded for the CPU tier: a few dozen cheap invocations (listings, reports, the teaching rungs
lowered with --no-ir; searches stubbed, as only their refusals up front are drawn). A longer
run on demand: PROMISES_EXAMPLES=2000 python3 -m pytest -p no:xdist tests/test_promises.py
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the generated cases need hypothesis: "
                                 "pip install -e .[test]")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import runner  # noqa: E402
import schedules  # noqa: E402
from tests.test_records_and_report import seed_run  # noqa: E402
from tuning import measure, search  # noqa: E402

EXAMPLES = int(os.environ.get("PROMISES_EXAMPLES", "0"))  # 0: each test's own small number


def bounded(examples: int):
    """Hypothesis settings of `examples` cases (PROMISES_EXAMPLES overrides), with no deadline
    per case (a build takes seconds on a loaded machine) and no example database in the tree."""
    return settings(max_examples=EXAMPLES or examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def no_gpu_and_no_search(monkeypatch):
    """No GPU, as on the CPU tier; a search that passes its checks returns at once, with no
    device that measured it (so nothing is recorded): only its refusals are under test."""
    monkeypatch.setattr(measure, "gpu_present", lambda: False)
    monkeypatch.setattr(search, "run", lambda *args, **kwargs: {"schedule": "x", "device": None})


# ---- the places a path can point at, made fresh in each case's own directory

PLACES = ("new file", "new file in new dirs", "existing text file", "existing binary file",
          "existing directory", "under a file", "in /proc", "empty", "good records",
          "bad records")


def mostly(*usual, rest=PLACES):
    """A draw of `usual` four times in five (so that many cases get past the refusals), else
    of `rest`."""
    return st.integers(0, 4).flatmap(
        lambda n: st.sampled_from(rest) if n == 0 else st.sampled_from(usual))


def make_place(root: str, kind: str, name: str, records_text: str) -> str:
    """A path of `kind` under `root` (creating what must be there before the run)."""
    path = os.path.join(root, name)
    if kind == "new file":
        return path
    if kind == "new file in new dirs":
        return os.path.join(root, "new", "deeper", name)
    if kind == "existing text file":
        with open(path, "w") as f:
            f.write("# some notes\n")
        return path
    if kind == "existing binary file":
        with open(path, "wb") as f:
            f.write(b"\x7fELF\x00\xd0\xff" * 20)
        return path
    if kind == "existing directory":
        os.makedirs(path, exist_ok=True)
        return path
    if kind == "under a file":
        with open(os.path.join(root, "a-file"), "w") as f:
            f.write("x")
        return os.path.join(root, "a-file", name)
    if kind == "in /proc":
        return os.path.join("/proc", name)
    if kind == "empty":
        return ""
    with open(path, "w") as f:  # good or bad records
        f.write(records_text)
    return path


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
FIELDS = ("op", "shape", "dtype", "out_dtype", "layout", "schedule", "kind", "status", "gpu",
          "run_id", "date", "timing", "params", "resources", "structure", "flush", "driver",
          "tvm", "rel_error", "error")


@st.composite
def records_text(draw) -> str:
    """The seed ladder's run as JSON lines, some records with a field set to any JSON value or
    taken out, and maybe a line that is not JSON at all."""
    lines = []
    for record in seed_run():
        for field in draw(st.lists(st.sampled_from(FIELDS), max_size=2)):
            if draw(st.booleans()):
                record.pop(field, None)
            else:
                record[field] = draw(JSON)
        lines.append(json.dumps(record))
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), draw(st.text(max_size=20)).replace("\n", " "))
    return "\n".join(lines) + "\n"


def snapshot(root: str) -> dict[str, bytes]:
    """Every file and directory under `root`, with its bytes (None for a directory)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            found[os.path.join(folder, name)] = None
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                found[os.path.join(folder, name)] = f.read()
    return found


def holds_its_promises(argv: list[str], root: str, output: str | None = None) -> None:
    """Run the command line on `argv` in-process, in `root` (an exception out of main is a
    traceback), and check its promises against what `root` held before; a run that succeeds
    may write `output` (a report over an older one)."""
    before = snapshot(root)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(root), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = runner.main(argv)  # relative paths (the default --results too) land in root
    said = err.getvalue()
    assert code in (0, 1, 2, 130), (argv, code, said)
    assert "Traceback" not in said
    after = snapshot(root)
    changed = [path for path, content in before.items() if after.get(path, content) != content
               or path not in after]
    if code == 0:
        changed = [path for path in changed if path != output]
    assert not changed, (argv, changed)
    assert not [path for path in after if ".report-" in path], argv  # no staging left
    if code in (1, 2):
        assert said.startswith("error: ") and said.count("\n") == 1, (argv, said)
        assert set(after) == set(before), (argv, set(after) - set(before))


@given(report=mostly("new file", "new file in new dirs", "existing text file"),
       results=mostly("good records", "bad records"),
       notes=mostly(None, "existing text file", rest=PLACES),
       title=st.sampled_from((None, "", "A title")),
       text=records_text())
@bounded(40)
def test_reports_keep_the_promises(report, results, notes, title, text):
    with tempfile.TemporaryDirectory() as root:
        written = make_place(root, report, "r.md", text)
        argv = ["--report", written, "--results", make_place(root, results, "results.jsonl", text)]
        if notes is not None:
            argv += ["--notes", make_place(root, notes, "notes.md", text)]
        if title is not None:
            argv += ["--title", title]
        holds_its_promises(argv, root, output=written)


CHEAP_RUNGS = {"gemm": ("naive", "v1", "v2", "v3", "skinny"), "gemv": ("naive", "splitk", "allreduce"),
               "batched_gemv": ("launches", "naive")}
KNOBS = ("threads", "tile_x", "tile_y", "tile_k", "reduce_threads", "k_slices", "bogus", "")
KNOB_VALUES = mostly("1", "8", "64", rest=("0", "-4", "4096", "1000000000", "true", "none", "x",
                                           ""))
DIMENSION = mostly(1, 7, 16, 64, 100, rest=(0, -8, 3_000_000))


@st.composite
def schedule_name(draw, op: str) -> str:
    """A cheap rung of `op` (or a name that is none), with knobs that may be any of the rungs'
    knobs or none, set once, twice or to nonsense."""
    name = draw(mostly(*CHEAP_RUNGS.get(op, ("naive",)), rest=("v99",)))
    own = tuple(schedules.get(op, name).knob_types) if name in CHEAP_RUNGS.get(op, ()) else ()
    knobs = draw(st.lists(st.tuples(mostly(*own, rest=KNOBS) if own else st.sampled_from(KNOBS),
                                    KNOB_VALUES), max_size=2)
                 if draw(st.booleans()) else st.just([]))
    if knobs or draw(mostly(False, rest=(True,))):  # a ':' with no knobs after it, too
        return name + ":" + ",".join(f"{k}={v}" for k, v in knobs)
    return name


@st.composite
def run_argv(draw, root: str) -> list[str]:
    """An exploration run, a diff or an export of cheap rungs, on a drawn workload and arch."""
    op = draw(mostly("gemm", "gemv", "batched_gemv", rest=("conv",)))
    argv = ["--op", op, "--results", os.path.join(root, "results.jsonl")]
    if draw(st.booleans()):
        rank = {"gemm": 3, "batched_gemv": 3}.get(op, 2)
        dims = draw(st.lists(DIMENSION, min_size=rank, max_size=rank)
                    if draw(mostly(True, rest=(False,))) else
                    st.lists(DIMENSION, min_size=1, max_size=4))
        argv += ["--shape", "x".join(map(str, dims))]
    for flag, values in (("--dtype", mostly("float32", "float16", rest=("int4", ""))),
                         ("--layout", mostly("nn", "nt", rest=("tt",))),
                         ("--arch", mostly("sm_80", "sm_90", "nvidia/nvidia-h100",
                                           rest=("sm_20", "sm_999", "hopper")))):
        if draw(st.integers(0, 3)) == 0:
            argv += [flag, draw(values)]
    mode = draw(st.sampled_from(("schedule", "schedule", "diff", "export")))
    if mode == "diff":
        argv += ["--diff", draw(schedule_name(op)), draw(schedule_name(op))]
    else:
        argv += ["--schedule", draw(schedule_name(op))]
    if mode == "schedule":
        argv += ["--no-ir"]  # a flag of runs only: a diff or an export refuses it
    if mode == "export":
        argv += ["--export", make_place(root, draw(mostly("new file")), "kernel", "")]
    return argv


@pytest.mark.slow
@given(data=st.data())
@bounded(30)
def test_runs_of_cheap_rungs_keep_the_promises(data):
    with tempfile.TemporaryDirectory() as root:
        holds_its_promises(data.draw(run_argv(root)), root)


@given(work_dir=st.sampled_from(PLACES), results=st.sampled_from(PLACES),
       search_name=st.sampled_from(("metaschedule", "autotvm:v5", "autotvm:naive", "nope",
                                    "autotvm:v5:block_m=32", "autotvm:v5:", "autotvm:v5:x=1",
                                    "autotvm:v5:block_m=8,block_m=16", "autotvm:v5:block_m=0")),
       trials=st.sampled_from(("4", "0", "-1", "abc")),
       seed=st.sampled_from(("0", "-1", str(2 ** 32), "12", "x")),
       target=st.sampled_from(("llvm", "cuda", "vulkan")))
@bounded(40)
def test_searches_refuse_what_they_could_not_write_before_they_run(
        work_dir, results, search_name, trials, seed, target):
    with tempfile.TemporaryDirectory() as root:
        argv = ["--tune", search_name, "--shape", "64x64x64", "--trials", trials, "--seed", seed,
                "--target", target,
                "--results", make_place(root, results, "results.jsonl", "")]
        place = make_place(root, work_dir, "state", "")
        argv += ["--work-dir" if search_name == "metaschedule" else "--records", place]
        holds_its_promises(argv, root)


FLAGS = ("--schedule", "--diff", "--report", "--list", "--tune", "--suite", "--op", "--shape",
         "--preset", "--dtype", "--out-dtype", "--layout", "--no-ir", "--arch", "--flush",
         "--trials", "--seed", "--target", "--device", "--title", "--bogus", "-x")
WORDS = ("", "v3", "all", "gemm", "llm-bf16", "nope", "1x2x3", "gemm-seed", "-1", "abc", "read")


@given(argv=st.lists(st.sampled_from(FLAGS) | st.sampled_from(WORDS), max_size=5))
@bounded(60)
def test_any_words_on_the_command_line_keep_the_promises(argv):
    if not {"--report", "--tune"} & set(argv) and "--list" not in argv:
        argv = argv + ["--list"]  # a listing, not a build: cheap, and still every flag's check
    with tempfile.TemporaryDirectory() as root:
        holds_its_promises(argv + ["--results", os.path.join(root, "results.jsonl")], root)
