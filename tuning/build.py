"""Scheduled module -> lowered kernels -> built module, and what can be read off them.

Nothing here needs a GPU: lowering and CUDA code generation run anywhere; `nvcc_resources`
compiles the generated source with a local nvcc when there is one.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import tvm
from tvm.s_tir.stmt import SBlock
from tvm.support.tar import tar
from tvm.target import Target
from tvm.tirx import stmt as S

from facts import spilled_bytes
from schedules import common
from schedules.common import TIRX_KERNEL
from schedules.errors import BuildFailed, ScheduleNotApplicable, UsageError

from . import lowering

def with_arch_features(arch: str) -> str:
    """Hopper's own instructions (wgmma, v7's) assemble only for sm_90a, which runs on every
    sm_90 GPU: build for it there."""
    return arch + "a" if arch == "sm_90" else arch


def cuda_target(arch: str = "sm_90") -> Target:
    """The CUDA target of an `arch` GPU with its real per-block limits: the shared memory a
    block can opt into (227 KB on sm_90, not the portable 48 KB that TVM's tags say, so that
    MetaSchedule's VerifyGPUCode keeps what the rungs use), 64K registers, 1024 threads. It is
    the same with or without the GPU here, so the IR printed on a laptop is the IR that runs."""
    return Target({"kind": "cuda", "arch": with_arch_features(arch),
                   "max_num_threads": 1024, "max_threads_per_block": 1024,
                   "thread_warp_size": 32,
                   "max_shared_memory_per_block": common.shared_bytes_per_block(arch),
                   "registers_per_block": common.REGISTERS_PER_BLOCK})


def arch_of(name: str) -> str:
    """The arch that --arch names: sm_<major><minor> as it is, or a TVM CUDA target tag (a
    GPU's name, e.g. nvidia/nvidia-h100) as that GPU's arch."""
    if re.fullmatch(r"sm_\d+[af]?", name):
        return name
    tag = tvm.target.list_tags().get(name)
    if tag is None or tag.kind.name != "cuda":
        raise UsageError(f"malformed --arch '{name}': expected sm_<major><minor> (e.g. sm_90) "
                         "or a TVM CUDA tag (e.g. nvidia/nvidia-h100)")
    return str(tag.attrs["arch"]).rstrip("af")


def _allocated_scopes(mod: tvm.IRModule) -> set[str]:
    """The storage scopes of the buffers that a block (scheduled) or an AllocBuffer statement
    (lowered) of the module allocates."""
    allocated = [buffer for block in lowering.find(mod, SBlock) for buffer in block.alloc_buffers]
    allocated += [alloc.buffer for alloc in lowering.find(mod, S.AllocBuffer)]
    return {buffer.scope() for buffer in allocated}


def has_warp_fragments(mod: tvm.IRModule) -> bool:
    """Whether a module keeps tensor-core (ldmatrix / mma.sync) fragments in `warp` scope. Their
    CUDA code generation looks up fragment layouts that TVM's tensor intrinsics
    (tvm.s_tir.tensor_intrin.cuda) register when imported."""
    return "warp" in _allocated_scopes(mod)


def has_wmma_fragments(mod: tvm.IRModule) -> bool:
    """Whether a module keeps wmma fragments (`wmma.matrix_a`, ...: MetaSchedule's tensor-core
    candidates)."""
    return any(scope.startswith("wmma.") for scope in _allocated_scopes(mod))


def static_shared_bytes(lowered: tvm.IRModule) -> int:
    """The most static shared memory (scope `shared`, not `shared.dyn`) a lowered kernel of
    the module allocates."""
    allocated = tvm.s_tir.analysis.calculate_allocated_bytes(lowered)
    return max((int(per_scope.get("shared", 0)) for per_scope in allocated.values()), default=0)


def with_dynamic_shared(mod: tvm.IRModule, target: Target) -> tuple[tvm.IRModule, tvm.IRModule]:
    """(`mod`, its lowered kernels), with its static shared buffers moved to dynamic shared
    memory when, lowered, they pass the 48 KB per block that CUDA allows static arrays
    (MetaSchedule's cache_read tiles can, now that the target allows 227 KB): TVM merges them
    into one dynamic buffer and its runtime opts the kernel into that much at launch. Unchanged
    otherwise, and for a TIRx kernel, which allocates its own; lowered again only if moved."""
    lowered = _lowered(mod, target)
    if is_tirx_kernel(mod) or static_shared_bytes(lowered) <= common.PORTABLE_SHARED_BYTES:
        return mod, lowered
    sch = tvm.s_tir.Schedule(mod)
    for name in [gv.name_hint for gv, _ in mod.functions_items()]:
        sch.work_on(name)
        for block in lowering.find(sch.mod[name], SBlock):
            for index, written in enumerate(block.writes):
                if written.source.scope() == "shared":
                    sch.set_scope(sch.get_sblock(block.name_hint, name), index, "shared.dyn")
    return sch.mod, _lowered(sch.mod, target)


def _has_async_pipeline(mod: tvm.IRModule) -> bool:
    """Whether a loop of the module is software-pipelined with an async stage (cp.async)."""
    return any("software_pipeline_async_stages" in loop.annotations
               for loop in lowering.find(mod, S.For))


def pass_config(mod: tvm.IRModule) -> dict:
    """Global->shared copies in a software pipeline's async stage become cp.async (sm_80+).

    TVM 0.27 then fails in one of two ways, depending on the kernel: InjectPTXAsyncCopy cannot
    lower a copy into a shared buffer that StorageRewrite retyped as vectors (float32x4, as in
    v5's CUDA-core tiles), and LowerWarpMemory needs StorageRewrite for tensor-core `warp`
    fragments. So StorageRewrite is skipped for async pipelines without warp fragments.

    It is skipped for wmma fragments too: StorageRewrite merges a candidate's float16 and
    float32 shared tiles into one buffer, and LowerIntrin then refuses the float32 pointer that
    wmma's store takes into it (7 of 8 tensor-core candidates of a float16 GEMM failed so)."""
    config = {"tirx.use_async_copy": True}
    if _has_async_pipeline(mod) and not has_warp_fragments(mod) or has_wmma_fragments(mod):
        config["tirx.disable_storage_rewrite"] = True
    return config


TIRX_PIPELINE = "tirx"  # TVM's pipeline for TIRx kernels: LowerTIRx first, then the usual passes


def is_tirx_kernel(mod: tvm.IRModule) -> bool:
    """Whether the module is a TIRx kernel written whole (v8: T.device_entry, T.cta_id, T.ptx),
    which its compute marks with the TIRX_KERNEL attribute. The default (s_tir) pipeline, and
    the project's built on it, cannot lower one: it sees the kernel's thread and block ids as
    undefined variables."""
    return any(fn.attrs is not None and TIRX_KERNEL in fn.attrs
               for _, fn in mod.functions_items() if isinstance(fn, tvm.tirx.PrimFunc))


def pipeline_of(mod: tvm.IRModule) -> tuple[str, dict]:
    """The TIR pipeline that lowers `mod` and its pass configuration: TVM's "tirx" one, with
    none, for a TIRx kernel; the project's (lowering.PIPELINE, pass_config) for the others."""
    if is_tirx_kernel(mod):
        return TIRX_PIPELINE, {}
    return lowering.PIPELINE, pass_config(mod)


def lower(mod: tvm.IRModule, target: Target) -> tvm.IRModule:
    """The device kernels exactly as `build` lowers them (TVM's default pipeline, then the
    project's rewrite in lowering.py, or the tirx pipeline for a TIRx kernel; up to code
    generation), without the host-side argument checking; shared tiles over 48 KB in dynamic
    shared memory (with_dynamic_shared)."""
    return with_dynamic_shared(mod, target)[1]


def _lowered(mod: tvm.IRModule, target: Target) -> tvm.IRModule:
    bound = tvm.tirx.transform.BindTarget(target.with_host(Target("llvm")))(mod)
    name, config = pipeline_of(mod)
    pipeline, _, _ = tvm.tirx.get_tir_pipeline(name)
    with tvm.transform.PassContext(config=config):
        lowered = pipeline(bound)
    kernels = {
        gv: fn
        for gv, fn in lowered.functions_items()
        if fn.attrs is not None and fn.attrs.get("target").kind.name == target.kind.name
    }
    return tvm.IRModule(kernels)


def _named_kernels(lowered: tvm.IRModule) -> list[tuple[str, tvm.tirx.PrimFunc]]:
    """The lowered kernels with their names, in name order."""
    return [(gv.name_hint, fn) for gv, fn in sorted(lowered.functions_items(),
                                                    key=lambda item: item[0].name_hint)]


def _kernels(lowered: tvm.IRModule) -> list[tvm.tirx.PrimFunc]:
    """The lowered kernels, in name order."""
    return [fn for _, fn in _named_kernels(lowered)]


def ir_text(lowered: tvm.IRModule) -> str:
    """TVMScript of the lowered kernels, one after another, in name order."""
    return "\n".join(fn.script() for fn in _kernels(lowered))


def build(mod: tvm.IRModule, target: Target):
    """Compile for `target`: CUDA source always, a loadable binary when a GPU is present.
    Shared tiles over 48 KB go to dynamic shared memory (with_dynamic_shared)."""
    return _compiled(with_dynamic_shared(mod, target)[0], target)


def _compiled(mod: tvm.IRModule, target: Target):
    name, config = pipeline_of(mod)
    with tvm.transform.PassContext(config=config):
        return tvm.compile(mod, target=target, tir_pipeline=name)


def build_artifact(job: tuple[tvm.IRModule, Target]) -> str:
    """Build one search candidate and export it as a tar that a runner (local or over RPC)
    loads; returns its path. Runs in a builder's worker process: it needs only tvm."""
    mod, target = job
    return exported(build(mod, target), "candidate")


def exported(executable, name: str) -> str:
    """A built module as `<name>.tar` in a new temporary directory, which
    tvm.runtime.load_module loads in another process (or over RPC); returns its path."""
    path = os.path.join(tempfile.mkdtemp(prefix=f"{name}-"), f"{name}.tar")
    executable.export_library(path, fcompile=tar)
    return path


def cuda_source(executable) -> str:
    return "\n".join(m.inspect_source() for m in executable.mod.imports)


@dataclass(frozen=True)
class Built:
    """A scheduled module, lowered and compiled, with what can be read off it."""

    lowered: tvm.IRModule
    executable: object
    source: str
    structure: dict  # KernelSummary.row()
    resources: dict | None  # nvcc --resource-usage per kernel; None without nvcc

    @property
    def spills(self) -> dict[str, int]:
        return spilled_bytes(self.resources)

    def describe(self) -> str:
        """One line: launch shape, shared memory, barriers, loop depth; registers and spills,
        a spill flagged in capitals (it costs local-memory traffic in the inner loop)."""
        text = ", ".join(f"{k} {v}" for k, v in self.structure.items())
        for kernel, usage in (self.resources or {}).items():
            spilled = self.spills.get(kernel)
            text += (f"; {kernel}: {usage.get('registers', '?')} registers, "
                     + (f"SPILLS {spilled} bytes" if spilled else "no spills")
                     + f", {usage.get('stack_bytes', 0)} stack bytes")
        return text


class Unlaunchable(ScheduleNotApplicable):
    """A kernel that builds but that no GPU of the target could launch: a block of more
    threads, shared memory or registers than the target gives one, or a grid past CUDA's."""


def lower_and_build(mod: tvm.IRModule, target: Target) -> Built:
    """Lower, compile and inspect a scheduled module; nvcc rejecting the CUDA is a failure, and
    a kernel over the target's launch limits is refused (Unlaunchable): its launch shape and
    shared memory before it is compiled, its registers once nvcc has counted them."""
    mod, lowered = with_dynamic_shared(mod, target)
    _refuse(launch_refusal(lowered, target))
    executable = _compiled(mod, target)
    source = cuda_source(executable)
    resources = nvcc_resources(source, target.attrs["arch"])
    _refuse(register_refusal(lowered, resources, target))
    return Built(lowered, executable, source, summarize(lowered, source).row(), resources)


def _refuse(reason: str | None) -> None:
    if reason:
        raise Unlaunchable(reason)


def launch_dims(kernel: tvm.tirx.PrimFunc) -> tuple[dict, dict]:
    """A lowered kernel's launch: ({blockIdx.*: extent}, {threadIdx.*: extent}), each tag's
    first binding; an extent is a number, or the text of an expression of a size given at
    each call. Other tags (a cluster's clusterCtaIdx, a CTA's rank in its cluster) are
    neither."""
    grid, block = {}, {}
    for launch in (attr for attr in lowering.find(kernel.body, S.AttrStmt)
                   if attr.attr_key == "thread_extent"):
        tag, extent = launch.node.thread_tag, launch.value
        kind = {"blockIdx": grid, "threadIdx": block}.get(tag.split(".")[0])
        if kind is not None:
            kind.setdefault(tag, int(extent) if isinstance(extent, tvm.tirx.IntImm) else str(extent))
    return grid, block


def _dims(extents: dict, axes: str) -> str:
    """Extents along x, y, z as '4096x16x1'."""
    return "x".join(str(extents.get(f"{axes}.{a}", 1)) for a in "xyz")


def _threads(block: dict) -> int:
    """Threads per block of a launch's block extents (its numbers: a block is never sized at
    the call)."""
    return math.prod(extent for extent in block.values() if isinstance(extent, int))


GRID_LIMITS = {"blockIdx.x": 2 ** 31 - 1, "blockIdx.y": common.MAX_GRID_YZ,
               "blockIdx.z": common.MAX_GRID_YZ}  # CUDA's, on every GPU since Kepler


def launch_refusal(lowered: tvm.IRModule, target: Target) -> str | None:
    """Why a lowered kernel could not be launched on `target`, in one phrase: more threads per
    block than its max_num_threads, a grid dimension (where it is a number) past CUDA's or
    below 1 (a count that wrapped past int32), more shared memory than its
    max_shared_memory_per_block, or static shared arrays past the 48 KB CUDA allows them; None
    where every kernel fits."""
    arch, threads_limit = target.attrs["arch"], int(target.attrs["max_num_threads"])
    shared_limit = int(target.attrs["max_shared_memory_per_block"])
    allocated = tvm.s_tir.analysis.calculate_allocated_bytes(lowered)
    for name, kernel in _named_kernels(lowered):
        grid, block = launch_dims(kernel)
        if _threads(block) > threads_limit:
            return (f"{name} would launch blocks of {_threads(block)} threads "
                    f"({_dims(block, 'threadIdx')}), over the {threads_limit} a block can have "
                    f"on {arch}")
        counted = {tag: extent for tag, extent in grid.items() if isinstance(extent, int)}
        over = [f"{tag} {extent} < 1 (a count past int32 wraps below 1)" for tag, extent in
                counted.items() if extent < 1]
        over += [f"{tag} {extent} > {GRID_LIMITS[tag]}" for tag, extent in counted.items()
                 if extent > GRID_LIMITS.get(tag, extent)]
        if over:
            return f"{name} would launch a grid of {_dims(grid, 'blockIdx')} blocks: {over[0]}"
        scopes = {scope: int(size) for scope, size in allocated.get(name, {}).items()}
        shared = sum(size for scope, size in scopes.items() if scope.startswith("shared"))
        if shared > shared_limit:
            return (f"{name} would need {shared} bytes of shared memory per block, over the "
                    f"{shared_limit} a block can have on {arch}")
        if scopes.get("shared", 0) > common.PORTABLE_SHARED_BYTES:
            return (f"{name} would need {scopes['shared']} bytes of static shared memory, over "
                    f"the {common.PORTABLE_SHARED_BYTES} CUDA allows static arrays")
    return None


def register_refusal(lowered: tvm.IRModule, resources: dict | None,
                     target: Target) -> str | None:
    """Why a kernel's registers (nvcc's count per thread, times its threads per block) could
    not be launched on `target` (its registers_per_block); None where they fit or nvcc did
    not count them."""
    limit = int(target.attrs["registers_per_block"])
    for name, kernel in _named_kernels(lowered):
        per_thread = (resources or {}).get(name, {}).get("registers", 0)
        threads = _threads(launch_dims(kernel)[1])
        if per_thread * threads > limit:
            return (f"{name} would need {per_thread} registers x {threads} threads = "
                    f"{per_thread * threads} per block, over the {limit} a block has on "
                    f"{target.attrs['arch']}")
    return None


@dataclass(frozen=True)
class KernelSummary:
    """The structural facts a reader compares between two rungs."""

    kernels: int
    grid: dict  # blockIdx.* -> extent (of the first kernel that binds it; str where symbolic)
    block: dict  # threadIdx.* -> extent
    shared_bytes: int
    syncthreads: int
    loop_depth: int

    def row(self) -> dict:
        dims = lambda d, axes: "x".join(str(d.get(a, 1)) for a in axes)  # noqa: E731
        return {
            "grid (x,y,z)": dims(self.grid, ("blockIdx.x", "blockIdx.y", "blockIdx.z")),
            "block (x,y,z)": dims(self.block, ("threadIdx.x", "threadIdx.y", "threadIdx.z")),
            "shared bytes": self.shared_bytes,
            "__syncthreads": self.syncthreads,
            "loop depth": self.loop_depth,
            "kernels": self.kernels,
        }


def summarize(lowered: tvm.IRModule, source: str) -> KernelSummary:
    """The structural facts of the lowered kernels (read off their IR) and their CUDA source
    (barriers)."""
    grid, block = {}, {}
    for fn in _kernels(lowered):
        for found, first in zip(launch_dims(fn), (grid, block)):
            for tag, extent in found.items():
                first.setdefault(tag, extent)
    allocated = tvm.s_tir.analysis.calculate_allocated_bytes(lowered)
    shared = sum(
        int(size)
        for per_scope in allocated.values()
        for scope, size in per_scope.items()
        if scope.startswith("shared")
    )
    return KernelSummary(
        kernels=len(lowered.functions),
        grid=grid,
        block=block,
        shared_bytes=shared,
        syncthreads=source.count("__syncthreads()"),
        loop_depth=_loop_depth(lowered),
    )


def _loop_depth(root) -> int:
    """Deepest nest of `for` loops in `root`: each loop counts, also those that TVMScript prints
    as one `T.grid` line."""
    return max((1 + _loop_depth(loop.body) for loop in lowering.find(root, S.For, outermost=True)),
               default=0)


CSE_NAME = re.compile(r"\bcse_v\d+\b")
CSE_DEFINITION = re.compile(r"^\s*(cse_v\d+): T\.let\[[^\]]*\] = (.*)$")


def stable_cse_names(script: str) -> str:
    """TVMScript with TVM's common-subexpression names (cse_v1, cse_v2, ... numbered in the
    order the pass met them) replaced by names made from what each one stands for (cse_ plus
    a hash of its definition): one new subexpression no longer renumbers all later ones, so a
    diff shows only the lines that really changed."""
    stable: dict[str, str] = {}

    def rename(text: str) -> str:
        return CSE_NAME.sub(lambda m: stable.get(m.group(0), m.group(0)), text)

    lines = []
    for line in script.splitlines(keepends=True):
        definition = CSE_DEFINITION.match(line)
        if definition:
            name, value = definition.groups()
            digest = hashlib.sha1(rename(value).encode()).hexdigest()[:6]
            stable[name] = f"cse_{digest}"
        lines.append(rename(line))
    return "".join(lines)


def unified_diff(old: str, new: str, old_name: str, new_name: str) -> str:
    """A unified diff of two texts, each ended with a newline so that a last line never runs
    into the next hunk line."""
    old, new = (text if text.endswith("\n") or not text else text + "\n" for text in (old, new))
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True), old_name, new_name))


def nvcc_resources(source: str, arch: str) -> dict | None:
    """Compile `source` with the local nvcc to a cubin and read registers, shared memory,
    stack and spills per kernel from --resource-usage, and whether ptxas serialized its wgmmas
    (a wgmma's accumulators read before a wait that ptxas can tell covers it). None when nvcc
    is not on PATH."""
    report = ptxas_report(source, arch)
    return None if report is None else _parse_resource_usage(report)


def ptxas_report(source: str, arch: str) -> str | None:
    """What nvcc and ptxas print compiling `source` to a cubin for `arch` with --resource-usage
    (its counts, and its remarks such as setmaxnreg ignored); None when nvcc is not on PATH;
    BuildFailed, with nvcc's errors, where nvcc rejects the source."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.cu")
        with open(src, "w") as f:
            f.write(source)
        done = subprocess.run(
            [nvcc, "-cubin", f"-arch={with_arch_features(arch)}", "--resource-usage", "-o", src + ".cubin", src],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        errors = [line for line in said if "error" in line or "fatal" in line]
        raise BuildFailed("nvcc rejected the generated CUDA: "
                          + "; ".join(errors or said[-1:] or [f"exit status {done.returncode}"]))
    return done.stdout + done.stderr


def _parse_resource_usage(report: str) -> dict:
    kernels = {}
    current = None
    for line in report.splitlines():
        serialized = re.search(r"wgmma.mma_async instructions are serialized.* function '(\w+)'",
                               line)
        if serialized:
            kernels.setdefault(serialized.group(1), {})["wgmma_serialized"] = True
            continue
        name = re.search(r"Compiling entry function '(\w+)'", line) or re.search(
            r"Function properties for (\w+)", line
        )
        if name:
            current = kernels.setdefault(name.group(1), {})
            current.setdefault("wgmma_serialized", False)
            continue
        if current is None:
            continue
        for key, pattern in (
            ("registers", r"Used (\d+) registers"),
            ("shared_bytes", r"(\d+) bytes smem"),
            ("stack_bytes", r"(\d+) bytes stack frame"),
            ("spill_stores", r"(\d+) bytes spill stores"),
            ("spill_loads", r"(\d+) bytes spill loads"),
        ):
            found = re.search(pattern, line)
            if found:
                current[key] = int(found.group(1))
    return kernels
