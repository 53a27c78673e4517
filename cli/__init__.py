"""The installed command, `tvm-explorer`: one subcommand per mode, each with its own flags.

    tvm-explorer run --schedule v3                 # lower, print IR, build, check, time, record
    tvm-explorer list [--suite NAME]               # schedules, presets, suites; a suite's shapes
    tvm-explorer diff v2 v3                        # what changed between two schedules' IR
    tvm-explorer explain v2 v3                     # ... and why: instruction mix, counters
    tvm-explorer tune metaschedule --work-dir ms   # a search (or autotvm:<template> --records R)
    tvm-explorer suite llm-bf16                    # real models' shapes: rungs, dlight, cuBLAS
    tvm-explorer report reports/x.md               # markdown from the results file
    tvm-explorer export DIR --schedule blockreduce # a kernel, its CUDA and a loader, written out
    tvm-explorer linear --shape 4096x4096 --dtype bfloat16   # tune and cache linear layers' kernels
    tvm-explorer linear --shape 4096x4096 --rpc-tracker host1:9190 --rpc-key h100   # on a farm

This package imports only the standard library at its top: `--help` and a refused flag cost no
TVM or torch import (the handlers in cli/commands.py import what their mode needs). `runner.py`
maps the old flat flags onto these subcommands (runner.to_subcommand).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from importlib import metadata

from . import commands
from .base import DEFAULT_SCHEDULE, Refused

PROG = "tvm-explorer"
DEFAULT_RESULTS = os.path.join("reports", "results.jsonl")
SEED_LIMIT = 2 ** 32  # numpy's and TVM's random engines take seeds in [0, 2^32)
LOGGERS = ("cli", "schedules", "tuning", "linear", "reporting", "tvm_explorer")  # the project's


class Parser(argparse.ArgumentParser):
    """argparse, with its errors raised as Refused: one line and exit 2 like every other
    refusal, not the usage dump and SystemExit that argparse prints by default. `hint` names
    where the flags are listed."""

    hint = f"{PROG} --help lists the subcommands"

    def error(self, message: str):
        raise Refused(f"{message} ({self.hint})")


def seed(text: str) -> int:
    """--seed: an integer the search's random engines take, in [0, 2^32)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, not '{text}'") from None
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"expected 0 to {SEED_LIMIT - 1}, not {value}")
    return value


WORKLOAD_HELP = {
    "--op": dict(help="gemm, gemv or batched_gemv (default: gemm, or the preset's)"),
    "--shape": dict(help="e.g. 1024x512x2048 (MxNxK for gemm, NxK for gemv, LxNxK)"),
    "--preset": dict(help="a named workload from the seeds (see list)"),
    "--dtype": dict(help="input dtype: float32, float16 or bfloat16; gemm also float8_e4m3fn "
                    "(layout nt, a float32 scale per tensor, bfloat16 output by default); gemv "
                    "and batched_gemv also nvfp4 (4-bit e2m1 codes, an e4m3 scale per 16 "
                    "elements; float16 output by default)"),
    "--out-dtype": dict(help="output dtype (gemm default float32, fp8 gemm bfloat16, gemv the "
                        "input's)"),
    "--layout": dict(help="gemm: nn (B is KxN) or nt (B is NxK)"),
    "--scales": dict(choices=["tensor", "row", "block"], help="fp8 gemm: a float32 scale per "
                     "tensor (default), per row of A and of B (row: torch._scaled_mm's rowwise "
                     "form), or per row of A per 128 K and per 128x128 block of B (block: "
                     "DeepSeek-V3's and DeepGEMM's)"),
}

# Every flag of every mode, defined once; MODES says which mode takes which.
FLAGS = {
    "--schedule": dict(help="schedule name, with knobs as v5k:k_slices=4,thread_n=8 (a rung's "
                       "other knobs as its shape heuristic picks them), 'best' (the fastest that "
                       "the records of this GPU know for the workload, else the fastest of a "
                       "portfolio measured here, or without a GPU a rule's rung), or "
                       f"'all' (default: {DEFAULT_SCHEDULE}); for a suite, the one rung to run "
                       "beside the baselines (default: all of the suite's)"),
    **WORKLOAD_HELP,
    "--no-ir": dict(action="store_true", help="do not print the lowered IR"),
    "--show-cuda": dict(action="store_true", help="print the generated CUDA source"),
    "--arch": dict(default="sm_90", help="the GPU to build for when none is here: its arch "
                   "(sm_90) or its TVM tag (nvidia/nvidia-h100); its real limits come with it"),
    "--flush": dict(choices=("read", "write", "none"), default="read",
                    help="before each timed launch: flush L2 by reading 256 MB (default), by "
                    "writing it (as Triton's and TileLang's do_bench do: dirty lines, 10-12%% "
                    "slower bandwidth-bound rows), or not at all (none: L2 stays warm)"),
    "--results": dict(default=DEFAULT_RESULTS,
                      help=f"JSONL results (default {DEFAULT_RESULTS})"),
    "--trials": dict(type=int, default=64, help="new trials to measure (default 64)"),
    "--work-dir": dict(help="MetaSchedule work dir (database, progress, best schedule)"),
    "--ms-space": dict(help="MetaSchedule's design space: 'tvm' (TVM's rules), 'split-k' "
                       "(those plus splitting K across blocks; the default on CUDA), or rungs' "
                       "knob spaces (e.g. v5k or v7,v8; their own choices measured first)"),
    "--records": dict(help="template-search records (JSONL), read to resume or apply"),
    "--tuner": dict(help="template tuner: grid, random or xgb (default xgb)"),
    "--seed": dict(type=seed, help="seed of the random and xgb tuners and of MetaSchedule's "
                   "search (default 0); given, a MetaSchedule search proposes the same "
                   "candidates each time (on one search thread)"),
    "--target": dict(default="cuda", help="cuda, or llvm (MetaSchedule on the CPU)"),
    "--rpc-tracker": dict(metavar="HOST:PORT", help="measure on the tracker's hosts"),
    "--rpc-key": dict(help="device key the hosts registered with the tracker"),
    "--device": dict(help="without a GPU here: whose template-search records to apply (a GPU "
                     "name as the records say it; default: the records' only one)"),
    "--title": dict(help="report title (default: from the report's file name)"),
    "--notes": dict(metavar="FILE", help="markdown appended to the report as its notes"),
    "--counters": dict(metavar="FILE", help="counters recorded by tuning.explain (JSONL), which "
                       "give each ladder table a why column (default reports/counters.jsonl, "
                       "where it exists)"),
    "--suite": dict(metavar="NAME", help="show this suite's shapes and where each comes from"),
    "--layer": dict(metavar="NxK", action="append", dest="shape",
                    help="a linear layer's weight, out_features x in_features (repeatable)"),
    "--max-tokens": dict(type=int, help="the most rows (tokens) a call takes (default 4096)"),
    "--edges": dict(metavar="M,M,...", help="the buckets' first Ms: one kernel for each bucket "
                    "(default 1,2,17,65,257,1025; a bucket of one M gets kernels built for "
                    "that M)"),
    "--json": dict(action="store_true", help="the run's records on stdout as JSON lines "
                   "(everything else on stderr)"),
}

WORKLOAD = tuple(WORKLOAD_HELP)
FOUND = ("--work-dir", "--records", "--device", "--rpc-tracker", "--rpc-key", "--results")
BUILD = ("--arch", "--flush", "--results")


class Mode:
    """A subcommand: what it does (`doc`, also the sentence that refuses another mode's flag),
    its positional arguments (dest, argparse kwargs) and its flags (names in FLAGS)."""

    def __init__(self, doc: str, flags: tuple[str, ...], positional: tuple = ()):
        self.doc, self.flags, self.positional = doc, tuple(dict.fromkeys(flags)), positional


MODES = {
    "run": Mode("runs one workload's schedules",
                ("--schedule", *WORKLOAD, "--no-ir", "--show-cuda", *BUILD, *FOUND, "--json")),
    "list": Mode("lists the schedules, presets and suites", ("--suite",)),
    "diff": Mode("compares two schedules' IR", (*WORKLOAD, "--show-cuda", "--arch", *FOUND),
                 (("diff", dict(nargs=2, metavar="SCHEDULE",
                                help="two schedules, the old then the new (knobs allowed)")),)),
    "explain": Mode("explains why two schedules differ: IR diff, instruction mix, counters",
                    (*WORKLOAD, "--show-cuda", "--arch", *FOUND),
                    (("explain", dict(nargs=2, metavar="SCHEDULE",
                                      help="two schedules, the old then the new (knobs "
                                           "allowed)")),)),
    "tune": Mode("searches one workload's schedules",
                 (*WORKLOAD, "--trials", "--work-dir", "--ms-space", "--records", "--tuner",
                  "--seed", "--target", "--rpc-tracker", "--rpc-key", *BUILD, "--no-ir",
                  "--show-cuda", "--json"),
                 (("tune", dict(metavar="SEARCH", help="'metaschedule' or 'autotvm:<template>' "
                                "(a schedule with a space)")),)),
    "suite": Mode("runs the suite's own shapes and schedules", ("--schedule", *BUILD, "--json"),
                  (("suite", dict(metavar="NAME", help="a named list of real models' shapes "
                                  "(list shows them)")),)),
    "report": Mode("renders records into markdown",
                   ("--results", "--title", "--notes", "--counters"),
                   (("report", dict(metavar="PATH", help="the markdown file to write")),)),
    "export": Mode("writes one schedule's kernel", ("--schedule", *WORKLOAD, *BUILD, *FOUND),
                   (("export", dict(metavar="DIR", help="a new or empty directory: kernel.cu, "
                                    "kernel.so, load.py and kernel.json")),)),
    "linear": Mode("tunes and caches linear layers' kernels (on a GPU, or a farm's)",
                   ("--layer", "--dtype", "--max-tokens", "--edges", "--rpc-tracker",
                    "--rpc-key", "--json")),
}

# The old flat flags that name a mode (runner.py), and the mode each names.
MODE_FLAGS = {"--diff": "diff", "--explain": "explain", "--tune": "tune", "--suite": "suite",
              "--report": "report", "--export": "export", "--list": "list"}


def flag_name(token: str) -> str | None:
    """The long flag a command-line token spells (`--shape=5` -> `--shape`), else None."""
    return token.split("=", 1)[0] if token.startswith("--") else None


def foreign_flags(mode: str, argv: list[str]) -> list[str]:
    """The flags in `argv` that belong to other modes than `mode`, in the order given."""
    own = {"--help", "--quiet", "--verbose", *MODES[mode].flags}
    if mode == "linear":
        own.add("--shape")  # linear's spelling of --layer
    known = set(FLAGS) | set(MODE_FLAGS)
    return list(dict.fromkeys(f for f in map(flag_name, argv) if f in known and f not in own))


def mode_parser(mode: str, prog: str, hint: str, epilog: str | None = None) -> Parser:
    """The parser of one mode: its positional arguments, its own flags, -q and -v."""
    spec = MODES[mode]
    p = Parser(prog=prog, description=spec.doc[0].upper() + spec.doc[1:] + ".", epilog=epilog)
    p.hint = hint
    for dest, kwargs in spec.positional:
        p.add_argument(dest, **kwargs)
    for flag in spec.flags:
        names = (flag, "--shape") if flag == "--layer" else (flag,)
        p.add_argument(*names, **FLAGS[flag])
    talk = p.add_mutually_exclusive_group()
    talk.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    talk.add_argument("-v", "--verbose", action="store_true", help="also the debug lines")
    return p


def refuse_empty(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A flag given an empty value (--shape "") is refused, not taken as absent (which would
    silently run the default)."""
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if any(isinstance(v, str) and not v.strip()
               for v in (value if isinstance(value, list) else [value])):
            name = "/".join(action.option_strings) or action.dest
            parser.error(f"argument {name}: empty value")


def every_flag_default() -> dict:
    """Each flag's value where a mode does not take it: its default, else None (False for a
    switch), so the handlers read one namespace whatever the mode."""
    values = {}
    for flag, kwargs in FLAGS.items():
        dest = kwargs.get("dest", flag[2:].replace("-", "_"))
        values[dest] = kwargs.get("default", False if kwargs.get("action") == "store_true"
                                  else None)
    positional = {dest: None for spec in MODES.values() for dest, _ in spec.positional}
    return {**values, **positional}


def parse(mode: str, argv: list[str], prog: str, said_as: str, hint: str,
          epilog: str | None = None) -> argparse.Namespace:
    """`argv` as arguments of `mode` (`said_as`: how the user named the mode, for the refusal);
    a flag of another mode is refused in one line before argparse sees it."""
    foreign = foreign_flags(mode, argv)
    if foreign:
        raise Refused(f"{said_as} {MODES[mode].doc}; it does not take {', '.join(foreign)}")
    parser = mode_parser(mode, prog, hint, epilog)
    args = parser.parse_args(argv)
    refuse_empty(parser, args)
    return argparse.Namespace(**{**every_flag_default(), **vars(args), "mode": mode,
                                 "list": mode == "list"})


def top_parser() -> Parser:
    """`tvm-explorer --help` and `--version`: the subcommands, one line each."""
    p = Parser(prog=PROG, description="Lower, build, check and time TVM schedules against "
               "cuBLAS and the GPU's limits; search their knobs; report.",
               epilog=f"{PROG} MODE --help lists a mode's flags.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    p.add_argument("mode", nargs="?", choices=tuple(MODES), metavar="MODE",
                   help="; ".join(f"{name}: {spec.doc}" for name, spec in MODES.items()))
    return p


def version() -> str:
    """The installed distribution's version (no TVM import)."""
    try:
        return metadata.version("tvm-schedule-explorer")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


class StdoutBelow(logging.Filter):
    """Lets through the records under WARNING: those go to stdout, the rest to stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING


@contextlib.contextmanager
def logging_for(args: argparse.Namespace):
    """The project's loggers as the command line prints, for the command's run: info lines on
    stdout as they come (stderr under --json, whose stdout is the records), warnings on stderr,
    message only; -q keeps warnings and errors, -v adds debug lines. TVM's own loggers are left
    alone, and the project's are given back as they were (a caller in the same process, a test
    or a notebook, keeps its own logging)."""
    out = logging.StreamHandler(sys.stderr if args.json else sys.stdout)
    out.addFilter(StdoutBelow())
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.WARNING)
    for handler in (out, err):
        handler.setFormatter(logging.Formatter("%(message)s"))
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    loggers = [logging.getLogger(name) for name in LOGGERS]
    saved = [(logger.handlers[:], logger.level, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers[:], logger.propagate = [out, err], False
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, (handlers, old_level, propagate) in zip(loggers, saved):
            logger.handlers[:], logger.propagate = handlers, propagate
            logger.setLevel(old_level)


def subcommand(argv: list[str]) -> argparse.Namespace | None:
    """`tvm-explorer [--version] MODE ...` parsed; None where it printed the help or version."""
    first = next((i for i, token in enumerate(argv) if not token.startswith("-")), None)
    if first is None or argv[first] not in MODES:
        top = top_parser()
        top.hint = f"{PROG} --help lists the subcommands"
        args = top.parse_args(argv[:first + 1] if first is not None else argv)
        if args.version:
            print(f"{PROG} {version()}")
            return None
        top.print_help()
        return None
    if argv[:first] and set(argv[:first]) <= {"--version", "-h", "--help"}:
        return subcommand(argv[:first])  # the version or the help they ask for, not the mode's
    if argv[:first]:
        raise Refused(f"{' '.join(argv[:first])} goes after the mode ({PROG} --help)")
    mode = argv[first]
    return parse(mode, argv[first + 1:], f"{PROG} {mode}", f"{PROG} {mode}",
                 f"{PROG} {mode} --help lists its flags")


def main(argv: list[str] | None = None,
         parsed: argparse.Namespace | None = None) -> int:
    """Run the command line `argv` (or the namespace runner.py parsed): the exit status, 0, 1
    (a run that could not give what was asked), 2 (bad input) or 130 (interrupted); every
    refusal one line on stderr, never a traceback, nor one for a reader that closed the pipe."""
    args = None
    try:
        args = parsed or subcommand(sys.argv[1:] if argv is None else argv)
        if args is None:
            return 0
        with logging_for(args):
            return commands.dispatch(args)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        if args is None:
            return 130
        print(f"\ninterrupted: everything measured so far is kept in {kept_in(args)}; "
              "run the same command again to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return closed_pipe()
    except Exception as e:  # the project's refusals; anything else is a bug, with its traceback
        errors = sys.modules.get("schedules.errors")
        if errors is None or not isinstance(e, errors.ExplorerError):
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status


def kept_in(args: argparse.Namespace) -> str:
    """Where an interrupted command keeps what it measured, for its interrupt line: for linear,
    the linear cache (with its root where linear.cache is loaded; before, nothing was tuned),
    else the work dir, records or results file."""
    if args.mode != "linear":
        return args.work_dir or args.records or args.results
    cache = sys.modules.get("linear.cache")
    return "the linear cache" + (f" ({cache.default_root()})" if cache else "")


def closed_pipe() -> int:
    """The reader of stdout went away (`| head -3`): stop quietly, as a command killed by
    SIGPIPE would (status 141), with stdout pointed at /dev/null so that the interpreter's
    last flush at exit cannot fail either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141
