#!/usr/bin/env python3
"""The old flat command line, mapped onto `tvm-explorer`'s subcommands (cli/).

    python runner.py --schedule v3              # tvm-explorer run --schedule v3
    python runner.py --diff v2 v3               # tvm-explorer diff v2 v3
    python runner.py --explain v2 v3            # tvm-explorer explain v2 v3
    python runner.py --report reports/x.md      # tvm-explorer report reports/x.md
    python runner.py --list                     # tvm-explorer list
    python runner.py --suite llm-bf16 [--list]  # tvm-explorer suite llm-bf16 (list --suite ...)
    python runner.py --tune metaschedule --trials 256 --work-dir ms-gemm   # tvm-explorer tune ...
    python runner.py --export DIR --schedule blockreduce                   # tvm-explorer export DIR

The flag that names a mode becomes the subcommand, its values its positional arguments, and
every other flag goes to that subcommand as it is: a flag of another mode is refused in one line.
"""

from __future__ import annotations

import sys

import cli

PROG = "runner.py"
HINT = f"{PROG} --help lists the flags"
# The mode flags in the order that decides between them: --export takes a --schedule, and
# --suite with --list lists the suite.
PRIORITY = ("--export", "--suite", "--diff", "--explain", "--tune", "--report", "--list")
NARGS = {"--diff": 2, "--explain": 2, "--list": 0}  # the others take one value
EPILOG = ("the other modes: --list, --diff OLD NEW, --explain OLD NEW, --tune SEARCH, "
          "--suite NAME, --report PATH, --export DIR; each with --help lists its flags (as the "
          "installed command's subcommands do: tvm-explorer --help)")


def mode_flag(argv: list[str]) -> tuple[str | None, int]:
    """The mode flag that decides the subcommand, and where it is in `argv` (None, -1: run)."""
    names = [cli.flag_name(token) for token in argv]
    for flag in PRIORITY:
        if flag in names:
            return flag, names.index(flag)
    return None, -1


def mode_values(flag: str, argv: list[str], at: int) -> tuple[list[str], int]:
    """The values of the mode flag at `argv[at]` (`--tune=x` or `--tune x`) and how many tokens
    they and the flag take; too few values or an empty one are refused as argparse would."""
    token, want = argv[at], NARGS.get(flag, 1)
    if "=" in token:
        values, used = [token.split("=", 1)[1]], 1
    else:
        values = list(argv[at + 1:at + 1 + want])
        used = 1 + len(values)
    if len(values) < want or any(v.startswith("-") and v != "-" for v in values):
        expected = "one argument" if want == 1 else f"{want} arguments"
        raise cli.Refused(f"argument {flag}: expected {expected} ({HINT})")
    if any(not v.strip() for v in values):
        raise cli.Refused(f"argument {flag}: empty value ({HINT})")
    return values, used


def to_subcommand(argv: list[str]) -> tuple[str, list[str], str]:
    """The flat `argv` as (mode, that mode's argv, how the refusal names the mode)."""
    flag, at = mode_flag(argv)
    if flag is None:
        return "run", argv, "--schedule"
    values, used = mode_values(flag, argv, at)
    rest = argv[:at] + argv[at + used:]
    if flag == "--suite" and "--list" in rest:
        rest.remove("--list")
        return "list", ["--suite", *values, *rest], "--list"
    return cli.MODE_FLAGS[flag], values + rest, flag


def main(argv: list[str] | None = None) -> int:
    """The flat command line `argv`, run as its subcommand: the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        mode, sub_argv, said_as = to_subcommand(argv)
        args = cli.parse(mode, sub_argv, f"{PROG} {said_as if mode != 'run' else ''}".strip(),
                         said_as, HINT, EPILOG if mode == "run" else None)
    except cli.Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    return cli.main(parsed=args)


if __name__ == "__main__":
    sys.exit(main())
