"""The installed command, `tvm-explorer` (cli/), and runner.py's flat flags mapped onto it:
each mode takes its own flags only, --help costs no TVM import, a closed pipe ends quietly."""

import os
import re
import shlex
import subprocess
import sys

import pytest

import cli
import runner
from tuning import measure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A value for each flag and each mode's positional arguments, so that the flag parses.
VALUES = {"--op": "gemm", "--shape": "64x64x64", "--preset": "gemm-seed", "--dtype": "float16",
          "--out-dtype": "float32", "--layout": "nn", "--scales": "row", "--schedule": "v3",
          "--arch": "sm_90",
          "--flush": "read", "--results": "r.jsonl", "--trials": "4", "--work-dir": "w",
          "--ms-space": "tvm", "--records": "r.jsonl", "--tuner": "grid", "--seed": "1",
          "--target": "llvm", "--rpc-tracker": "h:1", "--rpc-key": "k", "--device": "H100",
          "--title": "t", "--notes": "n.md", "--counters": "c.jsonl", "--suite": "llm-bf16", "--layer": "64x64",
          "--max-tokens": "16", "--edges": "1,2,17", "--diff": "v2 v3", "--explain": "v2 v3", "--tune": "metaschedule",
          "--report": "x.md", "--export": "out"}
POSITIONAL = {"diff": ["v2", "v3"], "explain": ["v2", "v3"], "tune": ["metaschedule"],
              "suite": ["llm-bf16"], "report": ["x.md"], "export": ["out"]}
SWITCHES = {flag for flag, kwargs in cli.FLAGS.items() if kwargs.get("action") == "store_true"}


def spelled(flag: str) -> list[str]:
    """`flag` with a value it parses with (none for a switch)."""
    return [flag] if flag in SWITCHES | {"--list"} else [flag, *VALUES[flag].split()]


def foreign_pairs():
    """Every (mode, flag of another mode) pair: the CPU tier tries each."""
    every = [*cli.FLAGS, *cli.MODE_FLAGS]
    return [(mode, flag) for mode, spec in cli.MODES.items() for flag in every
            if flag not in spec.flags and not (mode == "linear" and flag == "--shape")]


@pytest.mark.parametrize("mode, flag", foreign_pairs())
def test_every_mode_refuses_every_other_modes_flag_in_one_line(capsys, mode, flag):
    code = cli.main([mode, *POSITIONAL.get(mode, []), *spelled(flag)])
    out, err = capsys.readouterr()
    assert code == 2 and not out
    assert err == f"error: tvm-explorer {mode} {cli.MODES[mode].doc}; it does not take {flag}\n"


def readme_commands() -> list[list[str]]:
    """Every `python runner.py ...` command line in the README, as its arguments."""
    with open(os.path.join(ROOT, "README.md")) as f:
        found = re.findall(r"python3? runner\.py ([^#`\n]*)", f.read())
    return [shlex.split(line) for line in dict.fromkeys(found)]


def test_the_readme_has_runner_commands_to_check():
    assert len(readme_commands()) >= 20


@pytest.mark.parametrize("argv", readme_commands(), ids=" ".join)
def test_every_runner_command_of_the_readme_maps_onto_a_subcommand(argv):
    """Parsed as its subcommand with nothing refused, and every flag given still set."""
    mode, sub_argv, said_as = runner.to_subcommand(argv)
    args = cli.parse(mode, sub_argv, "runner.py", said_as, runner.HINT)
    assert args.mode == (cli.MODE_FLAGS.get(said_as) or "run")
    for flag in (cli.flag_name(t) for t in argv):
        if flag in cli.FLAGS and flag not in SWITCHES:
            dest = cli.FLAGS[flag].get("dest", flag[2:].replace("-", "_"))
            assert getattr(args, dest) is not None, flag


@pytest.mark.parametrize("flat, mode, positional", [
    (["--schedule", "v3"], "run", {}),
    (["--diff", "v2", "v3"], "diff", {"diff": ["v2", "v3"]}),
    (["--tune=metaschedule", "--work-dir", "w"], "tune", {"tune": "metaschedule"}),
    (["--suite", "llm-bf16", "--list"], "list", {"suite": "llm-bf16"}),
    (["--schedule", "v3", "--export", "out"], "export", {"export": "out"}),
    (["--report", "x.md"], "report", {"report": "x.md"}),
])
def test_the_flat_flag_that_names_a_mode_becomes_its_subcommand(flat, mode, positional):
    args = cli.parse(*runner.to_subcommand(flat)[:2], "runner.py", "x", runner.HINT)
    assert args.mode == mode
    assert {k: getattr(args, k) for k in positional} == positional


def test_runner_refuses_a_flag_of_another_mode_that_it_once_ignored(capsys):
    assert runner.main(["--schedule", "v3", "--trials", "5", "--tuner", "grid"]) == 2
    assert capsys.readouterr().err == ("error: --schedule runs one workload's schedules; it does "
                                       "not take --trials, --tuner\n")


def python(code: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *(["-c", code] if code else []), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, **kwargs)


@pytest.mark.parametrize("argv", [["--help"], ["tune", "--help"], ["run", "--bogus"],
                                  ["suite", "x", "--shape", "1x1x1"], ["--version"]])
def test_help_and_refusals_import_neither_tvm_nor_torch(argv):
    """What makes --help take 0.3 s, not 3: nothing heavy is imported before a mode runs."""
    done = python("import sys, cli\ntry:\n    cli.main(sys.argv[1:])\nexcept SystemExit:\n"
                  "    pass\nprint(sorted({m.split('.')[0] for m in sys.modules} & "
                  "{'tvm', 'torch', 'schedules', 'tuning'}))", *argv)
    assert done.stdout.splitlines()[-1] == "[]", done.stderr


@pytest.mark.parametrize("argv", [["--version"], ["--version", "run"]])
def test_version_names_the_distribution(capsys, argv):
    """Before a mode too (it said '--version goes after the mode', where the mode refuses it)."""
    assert cli.main(argv) == 0
    assert re.fullmatch(r"tvm-explorer (\d+\.\d+\.\d+.*|unknown \(not installed\))\n",
                        capsys.readouterr().out)


def test_a_closed_pipe_ends_quietly():
    """`runner.py --list | head -3`: three lines, no BrokenPipeError traceback."""
    done = subprocess.run(f"{shlex.quote(sys.executable)} runner.py --list | head -3", shell=True,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert len(done.stdout.splitlines()) == 3
    assert done.stderr == ""


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(measure, "gpu_present", lambda: False)


def test_quiet_keeps_warnings_and_errors_only(capsys, no_gpu, tmp_path):
    assert cli.main(["run", "--schedule", "v1", "-q", "--results", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out == ""


def test_verbose_says_what_the_flags_became(capsys):
    """runner.py's flat flags, as the subcommand and settings they mapped onto."""
    assert runner.main(["--suite", "llm-bf16", "--list", "-v"]) == 0
    assert "list: {" in capsys.readouterr().out.splitlines()[0]
    assert runner.main(["--suite", "llm-bf16", "--list"]) == 0
    assert "list: {" not in capsys.readouterr().out


def test_json_keeps_stdout_for_the_records(capsys, no_gpu, tmp_path):
    """Without a GPU a run records nothing: stdout stays empty, the lines go to stderr."""
    assert cli.main(["run", "--schedule", "v1", "--no-ir", "--json",
                     "--results", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "v1: built:" in err


@pytest.mark.slow
def test_json_puts_a_searchs_summary_record_alone_on_stdout(capsys, tmp_path):
    """A MetaSchedule search on this CPU records its summary: that record, as JSON, is the
    whole of stdout; the progress lines went to stderr."""
    import json

    assert cli.main(["tune", "metaschedule", "--target", "llvm", "--shape", "32x32x32",
                     "--trials", "2", "--work-dir", str(tmp_path / "ms"), "--json",
                     "--results", str(tmp_path / "r.jsonl")]) == 0
    out, err = capsys.readouterr()
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert record["kind"] == "search" and record["trials"] == 2
    assert "MetaSchedule (TVM's rules)" in err


@pytest.mark.parametrize("argv, code, message", [
    (["linear", "--shape", "4096x4096", "--dtype", "bfloat16"], 1,
     "error: linear layers choose their kernels by measuring them on a CUDA GPU, and torch sees "
     "none here\n"),
    (["linear"], 2, "error: linear needs at least one --shape NxK (out_features x in_features)\n"),
    (["linear", "--shape", "64x64", "--dtype", "float32"], 2,
     "error: linear layers run in float16 or bfloat16, not float32\n"),
    (["linear", "--shape", "64x64x64"], 2, "error: gemv takes a shape NxK of 2 integers"),
    (["linear", "--shape", "64x64", "--edges", "1,x"], 2,
     "error: --edges takes the buckets' first Ms as whole numbers separated by commas"),
    (["linear", "--shape", "64x64", "--edges", "1,17,2"], 2,
     "error: bucket edges start at 1 and increase, not [1, 17, 2]\n"),
    (["linear", "--shape", "64x64", "--max-tokens", "0"], 2,
     "error: --max-tokens is a whole number of rows, at least 1, not 0\n"),
])
def test_linear_needs_a_gpu_and_good_shapes_and_says_so_in_one_line(capsys, argv, code, message):
    assert cli.main(argv) == code
    out, err = capsys.readouterr()
    assert err.startswith(message) and err.count("\n") == 1 and not out


def test_linear_tunes_the_buckets_its_edges_name(monkeypatch):
    """--edges reaches the portfolio as buckets (the default's without it)."""
    import linear

    asked = []
    monkeypatch.setattr(linear.portfolio, "prepare",
                        lambda layers, buckets, *args, **kwargs: asked.append(buckets) or {})
    assert cli.main(["linear", "--shape", "64x32", "--edges", "1,2,3,17"]) == 0
    assert cli.main(["linear", "--shape", "64x32"]) == 0
    assert asked == [linear.buckets_from_edges((1, 2, 3, 17)), linear.buckets_from_edges()]


@pytest.mark.parametrize("mode", sorted(cli.MODES))
def test_every_modes_help_prints_its_usage(mode, capsys):
    """--help of each mode, those taking two schedules too (a tuple metavar on a positional
    was a traceback in argparse's help and its 'required' message)."""
    with pytest.raises(SystemExit) as done:
        cli.main([mode, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: tvm-explorer {mode}")


@pytest.mark.parametrize("argv", [["diff"], ["diff", "v2"], ["explain", "v2"]])
def test_a_mode_missing_its_two_schedules_says_so_in_one_line(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the following arguments are required: SCHEDULE") \
        and err.count("\n") == 1
