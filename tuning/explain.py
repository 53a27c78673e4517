"""Explain the difference between two schedules: which IR change moved which count (issue 53).

Three layers, each usable alone:

- The instruction mix (no GPU): a built kernel's CUDA compiled to a cubin by nvcc, disassembled
  by nvdisasm or cuobjdump (on PATH, or from the `nvidia-cuda-nvdisasm` pip package of the
  `test` extra), its instructions counted by CLASSES; `sass_diff` compares two listings with
  registers, addresses and immediates made comparable. The counts are static (instructions in
  the binary, not executed), which is what a schedule changes directly.
- Counters (a GPU and Nsight Compute): `profile` runs `ncu` on one launch of a built kernel after
  warm-up launches (flush "none": L2 warm) and once more with ncu flushing the caches before
  every replay pass (flush "read": L2 clean, as the timing's default flush), collecting METRICS
  and the warp stall reasons; `record_counters` appends them to COUNTERS as records keyed as
  timings are (workload, schedule, params, GPU, TVM, flush), status "counted".
- `explain`: the IR diff, the instruction-mix delta, registers and shared memory, and where
  counters are recorded the counters that changed most; then one sentence per large change,
  naming the counter and the IR hunk it most plausibly follows from (RULES).

Record counters on a GPU machine (the second form launches the kernel under ncu, which the first
does for you):

    python3 -m tuning.explain record --preset gemm-seed naive v1 v2 v3
    python3 -m tuning.explain launch --op gemm --shape 1024x512x2048 --dtype float32 \\
        --out-dtype float32 --layout nn --schedule v3
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

import tvm
from tabulate import tabulate

import facts
from facts.counters import (LARGE, METRICS, Change, Metric, changes, counter_changes,
                            fmt_count)
from facts.record import Record
from schedules import PRESETS, parse_shape
from schedules.errors import BuildFailed, ExplorerError, ScheduleNotApplicable, UsageError
from schedules.workloads import DEFAULT_DTYPES, Workload

from . import bench, build, explore, measure, records

COUNTERS = os.path.join("reports", "counters.jsonl")  # where recorded counters go by default

# ---------------------------------------------------------------- the instruction mix (SASS)

# Instruction classes, by the opcode before its first '.', in the order tables print them.
CLASSES = (
    ("tensor (HMMA/HGMMA)", {"HMMA", "HGMMA", "IMMA", "IGMMA", "QGMMA", "BMMA"}),
    ("fp32 (FFMA/FADD/FMUL)", {"FFMA", "FADD", "FMUL", "FFMA2", "FADD2", "FMUL2"}),
    ("global loads (LDG/LDGSTS/TMA)", {"LDG", "LDGSTS", "UTMALDG", "UBLKCP", "UTMAPF"}),
    ("shared (LDS/STS/LDSM)", {"LDS", "STS", "LDSM", "STSM", "ATOMS"}),
    ("sync (BAR/SYNCS)", {"BAR", "SYNCS", "DEPBAR", "LDGDEPBAR", "MEMBAR", "WARPGROUP",
                          "ARRIVES"}),
    ("shuffles (SHFL)", {"SHFL"}),
)
OTHERS = "others"
# nvdisasm's and cuobjdump's instruction lines: /*0040*/  [@!P0] OPCODE operands ;
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
KERNEL = re.compile(r"^\s*(?:\.text\.(\w+):|Function : (\w+))")
# What differs between two builds of the same code: register numbers, addresses, labels.
NORMALISE = ((re.compile(r"\bU?R\d+\b"), lambda m: re.sub(r"\d+", "", m.group(0))),
             (re.compile(r"\bU?P\d\b"), lambda m: m.group(0)[:-1]),
             (re.compile(r"\b0x[0-9a-f]+\b"), lambda m: "0x_"),
             (re.compile(r"\.L_x_\d+"), lambda m: ".L_x"))
DISASSEMBLERS = (("nvdisasm", "nvidia-cuda-nvdisasm", ["-c"]),
                 ("cuobjdump", "nvidia-cuda-cuobjdump", ["-sass"]))
NO_DISASSEMBLER = ("the instruction mix needs nvdisasm or cuobjdump: put one on PATH, or "
                   "`pip install nvidia-cuda-nvdisasm` (in the test extra)")


def _packaged(tool: str, package: str) -> str | None:
    """The `tool` binary that the pip package `package` installed (nvidia/cu13/bin/<tool>),
    where it is installed: NVIDIA's wheels do not put it on PATH."""
    try:
        files = importlib.metadata.files(package) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [str(f.locate()) for f in files if f.name == tool]
    return next((path for path in found if os.access(path, os.X_OK)), None)


def disassembler() -> list[str] | None:
    """The command that prints a cubin's SASS: nvdisasm (on PATH, else from its pip package),
    else cuobjdump likewise; None where there is neither."""
    for tool, package, flags in DISASSEMBLERS:
        path = shutil.which(tool) or _packaged(tool, package)
        if path:
            return [path, *flags]
    return None


def sass(source: str, arch: str) -> dict[str, list[str]] | None:
    """The SASS of each kernel of a CUDA `source` compiled by nvcc for `arch` (sm_90 as sm_90a,
    as build.nvcc_resources compiles it): {kernel: [instruction, ...]}, each instruction as
    the disassembler prints it without its address. None without nvcc or a disassembler."""
    nvcc, command = shutil.which("nvcc"), disassembler()
    if nvcc is None or command is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "kernel.cu"), os.path.join(tmp, "kernel.cubin")
        with open(src, "w") as f:
            f.write(source)
        _checked_run([nvcc, "-cubin", f"-arch={build.with_arch_features(arch)}", "-o", cubin,
                      src], "nvcc")
        return listing(_checked_run([*command, cubin], os.path.basename(command[0])))


def _checked_run(command: list[str], what: str) -> str:
    """`command`'s stdout; its failure a BuildFailed with its last line of stderr."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        raise BuildFailed(f"{what} failed: " + (said[-1] if said else
                                                f"exit status {done.returncode}"))
    return done.stdout


def listing(text: str) -> dict[str, list[str]]:
    """A disassembly (nvdisasm -c or cuobjdump -sass) as {kernel: [instruction, ...]}, in the
    order the disassembler printed them."""
    kernels: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if name := KERNEL.match(line):
            current = kernels.setdefault(name.group(1) or name.group(2), [])
        elif (instruction := INSTRUCTION.match(line)) and current is not None:
            current.append(instruction.group(1))
    return kernels


def opcode(instruction: str) -> str:
    """An instruction's opcode without its predicate and modifiers: 'HMMA' of
    '@!P0 HMMA.16816.F32 R4, R8, R12, R4'."""
    words = instruction.split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def instruction_class(op: str) -> str:
    """The class of CLASSES an opcode belongs to, else OTHERS."""
    return next((name for name, ops in CLASSES if op in ops), OTHERS)


def instruction_mix(kernels: dict[str, list[str]]) -> dict[str, int]:
    """Instructions per class over all kernels, every class of CLASSES present (zeros too), then
    OTHERS and the total."""
    mix = {name: 0 for name, _ in CLASSES} | {OTHERS: 0}
    for instructions in kernels.values():
        for instruction in instructions:
            mix[instruction_class(opcode(instruction))] += 1
    return mix | {"total": sum(mix.values())}


def normalised(instruction: str) -> str:
    """An instruction with register numbers, predicates' numbers, immediates and labels
    replaced by placeholders, so that the same code built twice reads the same."""
    for pattern, replace in NORMALISE:
        instruction = pattern.sub(replace, instruction)
    return instruction


def sass_diff(old: dict[str, list[str]], new: dict[str, list[str]], old_name: str,
              new_name: str) -> str:
    """A unified diff of two SASS listings, kernel after kernel, normalised (`normalised`)."""
    text = lambda kernels: "".join(  # noqa: E731
        f"{name}:\n" + "".join(f"  {normalised(i)}\n" for i in instructions)
        for name, instructions in sorted(kernels.items()))
    return build.unified_diff(text(old), text(new), f"{old_name}.sass", f"{new_name}.sass")


# ---------------------------------------------------------------- counters (Nsight Compute)

# Warp stall reasons: cycles a warp waits per issued instruction, by reason (WarpStateStats).
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio")
STALLS = r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
TOP_STALLS = 3
# What ncu's two runs of a launch are recorded as: the flush each stands for, and ncu's
# --cache-control that gives it (none: the warm-up launches leave L2 warm; all: ncu flushes
# the caches before every replay pass, so every pass of the launch starts from a clean L2).
CACHE_CONTROL = {"none": "none", "read": "all"}


class ProfilerFailed(ExplorerError):
    """ncu missing, refused the counters, or could not profile the kernel: nothing recorded."""

    exit_status = 1


def ncu_command(ncu: str, flush: str, launch: list[str]) -> list[str]:
    """ncu on the launch between cudaProfilerStart and Stop of `launch` (a command line), with
    the caches as `flush` asks (CACHE_CONTROL), METRICS and the stall reasons, as CSV of its
    raw page in base units (ns, bytes)."""
    metrics = ",".join([m.ncu for m in METRICS] + [STALLS])
    return [ncu, "--profile-from-start", "off", "--cache-control", CACHE_CONTROL[flush],
            "--metrics", metrics, "--csv", "--page", "raw", "--print-units", "base", *launch]


# ncu's words for what goes wrong, and the line that says it here.
NCU_FAILURES = (
    (re.compile(r"ERR_NVGPUCTRPERM"), "ncu may not read the GPU's performance counters "
     "(ERR_NVGPUCTRPERM): run as root, or allow it (NVreg_RestrictProfilingToAdminUsers=0)"),
    (re.compile(r"Failed to find metric[^\n]*?(\S+)\s*$", re.M),
     "ncu on this GPU has no metric {0}"),
    (re.compile(r"No kernels were profiled"), "ncu profiled no kernel of the launch (it "
     "could not replay it, or the launch ran none)"),
    (re.compile(r"==ERROR== ([^\n]+)"), "ncu: {0}"),
)


def ncu_failure(output: str) -> str | None:
    """The one line that says why ncu gave no counters, from its output; None where it says no
    error."""
    for pattern, line in NCU_FAILURES:
        if found := pattern.search(output):
            return line.format(*found.groups())
    return None


def _number(text: str) -> float | None:
    """A value of ncu's CSV ('1,048,576', '93.5', 'n/a') as a number; None where it is none."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_raw_csv(text: str) -> list[dict]:
    """ncu's `--csv --page raw` output (anything before its header line, such as ==PROF== lines,
    skipped) as one dict per profiled kernel: 'Kernel Name', and each metric column by its ncu
    name, a number or None. Its second line, the units, is dropped: --print-units base fixes
    them (METRICS' units)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    header, _units, *rows = csv.reader(lines[start:])
    metrics = [i for i, name in enumerate(header) if "__" in name]
    return [{"Kernel Name": row[header.index("Kernel Name")]}
            | {header[i]: _number(row[i]) for i in metrics}
            for row in rows if len(row) == len(header)]


def _column(metric: Metric, row: dict) -> float | None:
    """A metric's value in a parsed row; a regex metric's the largest of its columns."""
    if not metric.ncu.startswith("regex:"):
        return row.get(metric.ncu)
    pattern = re.compile(metric.ncu[len("regex:"):])
    values = [v for name, v in row.items() if pattern.fullmatch(name) and v is not None]
    return max(values, default=None)


def _combined(metric: Metric, rows: list[dict]) -> float | None:
    """A metric over the kernels of one call, combined as the metric says."""
    values = [(_column(metric, row), row.get("gpu__time_duration.sum") or 0) for row in rows]
    values = [(v, ns) for v, ns in values if v is not None]
    if not values:
        return None
    if metric.combine == "sum":
        return sum(v for v, _ in values)
    if metric.combine == "max":
        return max(v for v, _ in values)
    total = sum(ns for _, ns in values)
    return sum(v * ns for v, ns in values) / total if total else values[0][0]


def counters_of(rows: list[dict]) -> dict:
    """The counters of one call (its kernels' rows): each of METRICS by its key, and `stalls`,
    the TOP_STALLS largest stall reasons (cycles per issued instruction, by duration over the
    kernels; 'selected', issuing, is no stall)."""
    counters = {m.key: _combined(m, rows) for m in METRICS}
    reasons = {STALL.fullmatch(name).group(1) for row in rows for name in row
               if STALL.fullmatch(name)} - {"selected"}
    stalls = {reason: _combined(Metric(reason, f"smsp__average_warps_issue_stalled_{reason}"
                                       "_per_issue_active.ratio", "", "weighted", ""), rows)
              for reason in reasons}
    top = sorted((r for r in stalls if stalls[r] is not None), key=lambda r: -stalls[r])
    return counters | {"stalls": {r: stalls[r] for r in top[:TOP_STALLS]}}


def workload_flags(wl: Workload) -> list[str]:
    """The flags of this module's command line that name `wl`, every field written out."""
    return ["--op", wl.op, "--shape", "x".join(map(str, wl.shape)), "--dtype", wl.dtype,
            "--out-dtype", wl.out_dtype, "--layout", wl.layout]


def launch_command(wl: Workload, schedule: str, module: str | None = None) -> list[str]:
    """The command line that launches `schedule` on `wl` for ncu (this module's `launch`),
    loading its build from `module` where one is given."""
    return [sys.executable, "-m", "tuning.explain", "launch", *workload_flags(wl),
            "--schedule", schedule, *(["--module", module] if module else [])]


WARM_UP_CALLS = 2


def built_for_this_gpu(wl: Workload, schedule: str):
    """`schedule` (as --schedule names it) built for `wl` on this machine's GPU."""
    made = explore.resolve(wl, schedule, explore.SearchResults())
    target = build.cuda_target(measure.device_facts()["arch"])
    return build.build(made.apply(wl, target), target)


def exported_build(wl: Workload, schedule: str) -> str:
    """`schedule` built for `wl` on this GPU and exported (build.exported): what ncu's launches
    of it load, so that its two profiles build it once."""
    return build.exported(built_for_this_gpu(wl, schedule), "counted")


def launch(wl: Workload, schedule: str, module: str | None = None) -> None:
    """Load `schedule`'s build from `module` (or build it for this GPU), launch it
    WARM_UP_CALLS times on random inputs, then once between cudaProfilerStart and Stop: the one
    launch ncu (--profile-from-start off) profiles."""
    import torch  # lazy: only a GPU's profiled launch needs torch

    executable = tvm.runtime.load_module(module) if module else built_for_this_gpu(wl, schedule)
    run = measure.tvm_runner(executable, wl, measure.random_inputs(wl, 0),
                             measure.poisoned_output(wl))
    for _ in range(WARM_UP_CALLS):
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def ncu_path() -> str:
    """Where ncu is; a ProfilerFailed where it is not on PATH."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise ProfilerFailed("ncu (Nsight Compute) is not on PATH: counters need it")
    return ncu


def profile(wl: Workload, schedule: str, flush: str, module: str | None = None) -> dict:
    """The counters (counters_of) of one launch of `schedule` on `wl` (its build loaded from
    `module`, where given), with L2 as `flush` says (CACHE_CONTROL); a ProfilerFailed, in one
    line, where ncu is missing or gives none."""
    done = subprocess.run(ncu_command(ncu_path(), flush, launch_command(wl, schedule, module)),
                          capture_output=True, text=True)
    rows = parse_raw_csv(done.stdout)
    failure = ncu_failure(done.stdout + "\n" + done.stderr)
    if failure or done.returncode != 0 or not rows:
        said = [line for line in done.stderr.splitlines() if line.strip()]
        raise ProfilerFailed(f"{schedule}: " + (failure or (said[-1] if said else
                             f"ncu exited with status {done.returncode} and no counters")))
    return counters_of(rows)


def counters_problem(record) -> str | None:
    """What is wrong with a counters record: a measurement record's fields (records'
    measurement_problem) and a `counters` dict of numbers (or null) with its `stalls`."""
    if problem := records.measurement_problem(record):
        return problem
    counters = record.get("counters")
    if not isinstance(counters, dict) or not isinstance(counters.get("stalls"), dict):
        return "a counters record without its counters and stalls"
    bad = [k for k, v in counters.items() if k != "stalls" and v is not None
           and (isinstance(v, bool) or not isinstance(v, (int, float)))]
    return f"counter {bad[0]} is not a number" if bad else None


def record_counters(wl: Workload, names: list[str], path: str = COUNTERS,
                    say: Callable[[str], None] = print) -> list[Record]:
    """Profile each schedule of `names` on `wl` warm and flushed (profile; built once, here,
    for both) and append a record of each to `path`, keyed as bench.Run keys timings, status
    'counted'. Every launch is profiled before anything is written: a failure records
    nothing."""
    ncu_path()
    facts.check_writable(path, "--counters")
    profiled = []
    for name in names:
        schedule = explore.resolve(wl, name, explore.SearchResults(), say)
        module = exported_build(wl, name)
        try:
            for flush in CACHE_CONTROL:
                say(f"{name}: ncu on one launch "
                    f"({'L2 warm' if flush == 'none' else 'L2 flushed'})")
                profiled.append((schedule, flush, profile(wl, name, flush, module)))
        finally:
            shutil.rmtree(os.path.dirname(module), ignore_errors=True)
    made, gpu_facts = [], measure.device_facts()
    for schedule, flush, counters in profiled:
        record = bench.Run(flush=flush, facts=gpu_facts).record(wl, schedule.name, schedule.kind,
                                               schedule.defaults, status="counted",
                                               counters=counters)
        records.append(path, record)
        made.append(record)
    say(f"{len(made)} counter records appended to {path}")
    return made


def recorded(path: str, wl: Workload, schedule, warn: Callable[[str], None]) -> dict[str, dict]:
    """The latest counters recorded in `path` for `schedule` (name and params) on `wl` with
    this TVM, by flush ('none', 'read'); lines that fail counters_problem go to `warn`
    (records.load_and_warn)."""
    same = {**wl.record_key(), "schedule": schedule.name, "params": schedule.defaults,
            "tvm": tvm.__version__}
    found = records.load_and_warn(path, warn, check=counters_problem)
    latest = {}
    for record in sorted(found, key=lambda r: r["date"]):
        if all(record.get(k) == v for k, v in same.items()):
            latest[record["flush"]] = record
    return latest


# ---------------------------------------------------------------- explaining a pair

@dataclass(frozen=True)
class Hunk:
    """One hunk of a unified diff: its header, and its removed and added lines."""

    header: str
    removed: tuple[str, ...]
    added: tuple[str, ...]


def hunks(diff: str) -> list[Hunk]:
    """The hunks of a unified diff, in order."""
    found, header, removed, added = [], None, [], []
    for line in diff.splitlines():
        if line.startswith("@@"):
            if header:
                found.append(Hunk(header, tuple(removed), tuple(added)))
            header, removed, added = line, [], []
        elif header and line.startswith("-") and not line.startswith("---"):
            removed.append(line[1:])
        elif header and line.startswith("+") and not line.startswith("+++"):
            added.append(line[1:])
    return found + ([Hunk(header, tuple(removed), tuple(added))] if header else [])


@dataclass(frozen=True)
class Rule:
    """An IR feature (a pattern of TVMScript lines) that a hunk adds or removes, and the
    counters it moves: {counter: +1 or -1}, the direction where the hunk adds the feature (the
    other where it removes it)."""

    feature: str
    pattern: re.Pattern
    moves: dict


# The documented rule table: which IR change plausibly moves which count. A counter is a key of
# METRICS, or an instruction class of CLASSES (the static mix).
RULES = (
    Rule("a shared-memory allocation", re.compile(r'scope="shared|"shared(\.dyn)?"'),
         {"dram_read_bytes": -1, "dram_pct": -1, "l2_hit_pct": +1, "l2_bytes": -1,
          "shared (LDS/STS/LDSM)": +1, "global loads (LDG/LDGSTS/TMA)": -1,
          "shared bytes": +1, "static_shared_bytes": +1, "dynamic_shared_bytes": +1}),
    Rule("tensor-core mma (mma.sync / wgmma / ldmatrix)",
         re.compile(r"mma|ldmatrix|wgmma", re.I),
         {"tensor (HMMA/HGMMA)": +1, "tensor_pipe_pct": +1, "fp32 (FFMA/FADD/FMUL)": -1,
          "fma_pipe_pct": -1, "duration_ns": -1}),
    Rule("vector accesses (x4 / x8 lanes, 16-byte loads)",
         re.compile(r"x[48]\b|T\.Ramp|uint4|float4|\.vectorized|T\.vectorized"),
         {"global loads (LDG/LDGSTS/TMA)": -1, "dram_pct": +1, "duration_ns": -1,
          "inst_executed": -1}),
    Rule("an async copy pipeline (cp.async / TMA)",
         re.compile(r"cp_async|ptx_cp_async|cp\.async|tma|commit_group|wait_group"),
         {"global loads (LDG/LDGSTS/TMA)": +1, "sync (BAR/SYNCS)": +1, "duration_ns": -1}),
    Rule("warp shuffles", re.compile(r"shuffle|shfl", re.I),
         {"shuffles (SHFL)": +1, "sync (BAR/SYNCS)": -1, "shared (LDS/STS/LDSM)": -1,
          "bank_conflicts_ld": -1, "bank_conflicts_st": -1}),
    Rule("a barrier (tvm_storage_sync / __syncthreads)",
         re.compile(r"storage_sync|syncthreads|mbarrier|barrier"),
         {"sync (BAR/SYNCS)": +1}),
    Rule("a register tile (local accumulators)", re.compile(r'scope="local"|"local"'),
         {"registers": +1, "fp32 (FFMA/FADD/FMUL)": +1, "dram_read_bytes": -1}),
    Rule("an unrolled loop", re.compile(r"T\.unroll|unroll"),
         {"fp32 (FFMA/FADD/FMUL)": +1, "tensor (HMMA/HGMMA)": +1, "registers": +1}),
    Rule("a new thread binding (threadIdx / blockIdx)",
         re.compile(r"threadIdx|blockIdx|launch_thread"),
         {"occupancy_pct": +1, "l2_hit_pct": +1, "dram_read_bytes": -1, "duration_ns": -1,
          "registers": +1, "inst_executed": -1}),
)


def _weight(rule: Rule, hunk: Hunk, direction: int) -> int:
    """How many lines of `hunk` show `rule`'s feature moving the way that gives `direction`
    (added lines for the rule's own direction, removed lines for the other)."""
    lines = hunk.added if direction > 0 else hunk.removed
    return sum(1 for line in lines if rule.pattern.search(line))


def likely_hunk(change: Change, found: list[Hunk]) -> tuple[Rule, Hunk] | None:
    """The rule and hunk that most plausibly explain `change`: of the rules that move its
    count, the hunk with the most lines adding (or, for the opposite move, removing) the rule's
    feature; None where no hunk shows any."""
    scored = [(_weight(rule, hunk, change.direction * rule.moves[change.name]), -i, rule, hunk)
              for rule in RULES if change.name in rule.moves
              for i, hunk in enumerate(found)]
    best = max(scored, key=lambda s: s[:2], default=None)
    return (best[2], best[3]) if best and best[0] else None


def sentences(counts: list[Change], found: list[Hunk]) -> list[str]:
    """One sentence per LARGE change of `counts`, naming the count and the IR hunk it most
    plausibly follows from (likely_hunk), or saying that no rule ties it to one."""
    said = []
    for change in (c for c in counts if abs(c.relative) >= LARGE):
        why = likely_hunk(change, found)
        if why is None:
            said.append(f"{change.words()}: no rule of the table ties it to a hunk of the IR "
                        "diff.")
            continue
        rule, hunk = why
        verb = "adds" if change.direction * rule.moves[change.name] > 0 else "removes"
        said.append(f"{change.words()}: follows from the hunk {hunk.header.strip()}, which "
                    f"{verb} {rule.feature}.")
    return said


def static_counts(built: build.Built, mix: dict | None) -> dict:
    """What a build says without a GPU: the instruction mix, registers (most of any kernel) and
    shared memory per block."""
    registers = max((u.get("registers", 0) for u in (built.resources or {}).values()),
                    default=None)
    counts = dict(mix or {})
    if registers is not None:
        counts["registers"] = registers
    return counts | {"shared bytes": built.structure["shared bytes"]}


def _table(rows: list[list], headers: list[str]) -> str:
    return tabulate(rows, headers=headers, tablefmt="github")


def _built(wl: Workload, name: str, found, target, warn):
    """The schedule `name` (as --schedule reads it) and its build; refused as a schedule the
    user named is (explore.refusal)."""
    schedule = explore.resolve(wl, name, found, warn)
    try:
        return schedule, explore.build_schedule(schedule, wl, target)
    except ScheduleNotApplicable as e:
        raise explore.refusal(schedule, wl, target, e) from None


def explain(wl: Workload, old: str, new: str, found, arch: str, say: Callable[[str], None],
            warn: Callable[[str], None], *, show_sass: bool = False,
            counters: str = COUNTERS) -> None:
    """--explain OLD NEW: the IR diff, the static counts (instruction mix, registers, shared
    memory) side by side with their delta, SASS diff with `show_sass`, the recorded counters
    that changed (warm L2 and flushed), and one sentence per large change (sentences). On a
    GPU, counters not yet recorded are profiled and recorded first (record_counters); without
    one, a line says they need a GPU."""
    target = build.cuda_target(arch)
    (a_schedule, a), (b_schedule, b) = (_built(wl, name, found, target, warn)
                                        for name in (old, new))
    diff = build.unified_diff(*(build.stable_cse_names(build.ir_text(x.lowered)) for x in (a, b)),
                              f"{old} (lowered)", f"{new} (lowered)")
    say(diff)
    listings = [sass(x.source, arch) for x in (a, b)]
    if show_sass and None not in listings:
        say(sass_diff(*listings, old, new))
    counts = [static_counts(x, instruction_mix(s) if s else None) for x, s in zip((a, b), listings)]
    say(f"Static counts of {wl.label()}, {target.attrs['arch']}:")
    say(_table([[k, v, counts[1].get(k), fmt_count(counts[1].get(k, 0) - v)]
                for k, v in counts[0].items()], ["", old, new, "delta"]))
    if None in listings:
        say(NO_DISASSEMBLER if shutil.which("nvcc") else "the instruction mix needs nvcc on PATH")
    found_counters = [recorded(counters, wl, s, warn) for s in (a_schedule, b_schedule)]
    if not all(found_counters) and measure.gpu_present():
        for name, have in zip((old, new), found_counters):
            if not have:
                record_counters(wl, [name], counters, say)
        found_counters = [recorded(counters, wl, s, warn) for s in (a_schedule, b_schedule)]
    all_changes = changes(counts[0], counts[1])
    if all(found_counters):
        for flush in CACHE_CONTROL:
            hardware = counter_changes(*(f[flush]["counters"] for f in found_counters),
                                       wl.min_bytes)
            say(f"Counters that changed most ({facts.FLUSHES[flush]} before the launch; "
                f"{found_counters[0][flush]['gpu']}):")
            say(_table([[c.name, fmt_count(c.old), fmt_count(c.new), fmt_count(c.new - c.old),
                         "new" if math.isinf(c.relative) else f"{c.relative:+.0%}"]
                        for c in hardware[:10]], ["counter", old, new, "delta", "relative"]))
            say("stalls: " + "; ".join(f"{name}: {f[flush]['counters']['stalls']}"
                                       for name, f in zip((old, new), found_counters)))
        all_changes = counter_changes(found_counters[0]["read"]["counters"],
                                      found_counters[1]["read"]["counters"],
                                      wl.min_bytes) + all_changes
    else:
        say(f"the counters need a GPU: none recorded for both {old} and {new} on {wl.label()} "
            f"in {counters} (on a GPU machine: python3 -m tuning.explain record "
            f"{' '.join(workload_flags(wl))} {old} {new})")
    say("Why:")
    for sentence in sentences(all_changes, hunks(diff)) or ["no count changed by 10% or more."]:
        say(f"- {sentence}")


# ---------------------------------------------------------------- python3 -m tuning.explain

def _parser() -> argparse.ArgumentParser:
    """`record` (profile schedules and record their counters) and `launch` (one launch, for
    ncu), each over a workload given as runner.py's flags give it."""
    parser = argparse.ArgumentParser(prog="python3 -m tuning.explain",
                                     description=__doc__.split("\n\n")[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    for mode, schedule in (("record", "schedules"), ("launch", "--schedule")):
        sub = modes.add_parser(mode)
        sub.add_argument("--preset")
        sub.add_argument("--op", default="gemm")
        sub.add_argument("--shape")
        sub.add_argument("--dtype")
        sub.add_argument("--out-dtype")
        sub.add_argument("--layout")
        if mode == "record":
            sub.add_argument("--counters", default=COUNTERS,
                             help=f"JSONL counters file (default {COUNTERS})")
            sub.add_argument(schedule, nargs="+")
        else:
            sub.add_argument(schedule, required=True)
            sub.add_argument("--module", help="the schedule's build, exported (a tar)")
    return parser


def workload_of(args: argparse.Namespace) -> Workload:
    """The workload of the flags: a preset (its dtype unless --dtype), else --op and --shape."""
    if args.preset:
        if args.preset not in PRESETS:
            raise UsageError(f"unknown preset '{args.preset}'; valid: {', '.join(PRESETS)}")
        preset = PRESETS[args.preset]
        return Workload(preset.op, preset.shape, args.dtype or preset.dtype, args.out_dtype,
                        args.layout)
    if not args.shape:
        raise UsageError("give --preset or --shape")
    return Workload(args.op, parse_shape(args.shape, args.op),
                    args.dtype or DEFAULT_DTYPES.get(args.op), args.out_dtype, args.layout)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        wl = workload_of(args)
        if args.mode == "launch":
            launch(wl, args.schedule, args.module)
        else:
            record_counters(wl, args.schedules, args.counters)
    except ExplorerError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
