"""Taking a kernel out of the project: `compile` makes it a torch operator in this process, and
`export` (`runner.py --export DIR`) writes it for another one to load.

    from schedules import Workload
    from tuning.export import compile
    gemv = compile(Workload("gemv", (4096, 4096), "float16"), "blockreduce")
    y = gemv(weight, x)  # torch tensors on the GPU; checked against float64 on the first call

A schedule is named as the runner names it (`v5k:k_slices=8`, `best`, `metaschedule`,
`autotvm:<template>`; see tuning/explore.py's `resolve`) and built for the GPU here, or without
one for `arch`. The kernel itself is tuning/loader.py's `Kernel`, a `torch.library` custom
operator; an export directory holds that loader as load.py, beside the kernel's CUDA source, the
shared library TVM's runtime loads, and kernel.json: the workload, schedule, knobs, GPU, TVM
version and measured time, which the loader checks before it runs anything.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
from datetime import datetime, timezone
from typing import Callable

from facts.record import Record
from schedules.errors import BuildFailed, KernelFailed, ScheduleNotApplicable, UsageError
from schedules.workloads import Workload

from . import bench, build, loader, measure, records
from .explore import SearchResults, Settings, build_schedule, first_line, refusal, resolve
from .staging import staged


def _gpu() -> dict | None:
    """The GPU the kernel is built for and measured on (loader.gpu_here); None without one."""
    return loader.gpu_here() if measure.gpu_present() else None


def _built_here(wl: Workload, name: str, found: SearchResults, gpu: dict | None, arch: str,
                warn: Callable[[str], None]):
    """The schedule `name` resolves to for `wl`, and its build for `gpu` (without one, for
    `arch`), as (schedule, Built, target); a schedule that cannot run `wl` is refused as the
    runner refuses one the user named, with the values of their knobs that would apply; nvfp4
    is refused: a loader.Kernel takes two dense tensors, and nvfp4's B and x come as four."""
    if wl.is_nvfp4:
        raise UsageError(f"{wl.label()}: nvfp4 kernels cannot be exported or compiled yet (the "
                         "operator takes two dense inputs, and nvfp4 has four: B and x's codes "
                         "and their scales)")
    schedule = resolve(wl, name, found, warn)
    here = f"sm_{gpu['compute_capability'].replace('.', '')}" if gpu else arch
    target = build.cuda_target(here)
    try:
        return schedule, build_schedule(schedule, wl, target), target
    except ScheduleNotApplicable as e:
        raise refusal(schedule, wl, target, e) from None


def _tensor_specs(wl: Workload) -> list[dict]:
    """Each buffer of `wl` as the loader checks a tensor against it: inputs, then the output."""
    dtypes = wl.buffer_dtypes()
    return [{"name": name, "shape": list(shape), "dtype": dtypes[name]}
            for name, shape in wl.buffer_shapes().items()]


def _measured(record: Record | None, gpu: dict | None) -> str:
    """kernel.json's words on the time it gives."""
    if record:
        timing = record.timing
        return f"median of {timing.samples} launches on {record.gpu}: {timing.method}"
    if gpu is None:
        return "not measured: built on a machine without a GPU"
    return "not measured"


def manifest(wl: Workload, schedule, target, gpu: dict | None,
             record: Record | None = None) -> dict:
    """What kernel.json says of a kernel (and what `Kernel` checks inputs against): the workload,
    the schedule and its knobs, the arch it was built for and the compute capability it runs
    on, the GPU and TVM it was built with, and the measurement `record` of it (none: null)."""
    arch = str(target.attrs["arch"])
    major, minor = re.fullmatch(r"sm_(\d+)(\d)[af]?", arch).groups()
    *inputs, output = _tensor_specs(wl)
    return {
        "label": wl.label(),
        **wl.record_fields(),
        "schedule": schedule.name, "kind": schedule.kind, "knobs": schedule.defaults,
        "inputs": inputs, "output": output,
        "arch": arch, "compute_capability": f"{major}.{minor}",
        "gpu": gpu["name"] if gpu else None,
        **loader.versions_here(),
        "time_ms": record.timing.median_ms if record else None,
        "measured": _measured(record, gpu),
        "timing": record.timing.to_json() if record else None,
        "rel_error": record.rel_error if record else None,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _checked_on_first_use(wl: Workload, name: str) -> Callable[[loader.Kernel], None]:
    """The check `compile` runs before a kernel's first launch, as the runner checks a rung:
    random inputs, a NaN-poisoned output, the float64 reference; a wrong kernel is KernelFailed."""

    def check(kernel: loader.Kernel) -> None:
        inputs, out = measure.random_inputs(wl), measure.poisoned_output(wl)
        result = measure.check(wl, lambda: kernel.launch(inputs, out), inputs,
                               measure.tolerance(wl))
        if result["status"] != "ok":
            raise KernelFailed(f"{name} on {wl.label()}: {result['error']}")

    return check


def compile(workload: Workload, schedule: str = "best", *, check: bool = True,
            found: SearchResults | None = None, arch: str = "sm_90",
            warn: Callable[[str], None] = print) -> loader.Kernel:
    """The kernel of `schedule` for `workload` as a torch operator (loader.Kernel): built for the
    GPU here (without one, for `arch`: it then traces under torch.compile but cannot run), and,
    unless `check` is False, checked against float64 before its first launch. `found` says
    where the searches that `best`, `metaschedule` and `autotvm:` read left their results;
    `warn` gets the line saying what `best` chose and why."""
    gpu = _gpu()
    chosen, built, target = _built_here(workload, schedule, found or SearchResults(), gpu, arch,
                                        warn)
    first = _checked_on_first_use(workload, chosen.name) if check else None
    return loader.Kernel(built.executable, manifest(workload, chosen, target, gpu), first)


def refuse_unusable_directory(directory: str) -> None:
    """An export goes into a new or empty directory only: nothing there is ever overwritten."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UsageError(f"export directory {directory} is a file: name a new or empty directory")
    if os.path.isdir(directory) and os.listdir(directory):
        raise UsageError(f"export directory {directory} exists and is not empty: name a new or "
                         "empty directory (nothing was written)")


def _measure(wl: Workload, schedule, built: build.Built, settings: Settings) -> Record:
    """Check and time the kernel as the runner does a rung (the record appended to
    settings.results); a kernel that fails its check is KernelFailed, and is not exported."""
    measure.require_memory(wl)
    run = bench.Run(flush=settings.flush)
    record = bench.measure_tvm(run, wl, schedule.name, schedule.kind, schedule.defaults,
                               built.executable, structure=built.structure,
                               resources=built.resources)
    records.append(settings.results, record)
    if record.status != "ok":
        raise KernelFailed(f"{schedule.name}: {record.error or 'failed'}; nothing exported")
    return record


def _cannot_export(directory: str, error: OSError) -> UsageError:
    """The one-line refusal of an export directory that the file system does not let us make."""
    return UsageError(f"cannot export into {directory}: {error.strerror}")


def _write(directory: str, built: build.Built, written: dict) -> None:
    """The export's files, written into a fresh directory beside `directory` and then renamed to
    it, so that a failure leaves nothing behind and nothing that was there is overwritten."""
    refused = functools.partial(_cannot_export, directory)
    with staged(directory, ".export-", mode=0o755, refused=refused) as staging:
        with open(os.path.join(staging, loader.SOURCE), "w") as f:
            f.write(built.source)
        try:
            built.executable.export_library(os.path.join(staging, loader.LIBRARY))
        except Exception as e:  # noqa: BLE001  TVM's or the linker's failure, whatever its type
            raise BuildFailed(f"could not write {loader.LIBRARY}: {first_line(e)}") from e
        shutil.copyfile(loader.__file__, os.path.join(staging, loader.LOADER))
        with open(os.path.join(staging, loader.MANIFEST), "w") as f:
            json.dump(written, f, indent=2)
            f.write("\n")


def export(wl: Workload, name: str, directory: str, found: SearchResults, settings: Settings,
           say: Callable[[str], None] = print, warn: Callable[[str], None] = print) -> dict:
    """`runner.py --export DIR`: build the kernel of `name` for `wl` (see `compile`), check and
    time it on a GPU, and write it into `directory` (new or empty): kernel.cu, kernel.so,
    load.py and kernel.json. Returns what kernel.json says."""
    refuse_unusable_directory(directory)
    gpu = _gpu()
    chosen, built, target = _built_here(wl, name, found, gpu, settings.arch, warn)
    say(f"{chosen.name}: built: {built.describe()}")
    record = _measure(wl, chosen, built, settings) if gpu else None
    written = manifest(wl, chosen, target, gpu, record)
    _write(directory, built, written)
    files = ", ".join((loader.SOURCE, loader.LIBRARY, loader.LOADER, loader.MANIFEST))
    say(f"exported {chosen.name} ({wl.label()}, {written['arch']}) to {directory}: {files}; "
        + (f"{written['time_ms']:.4f} ms" if record else written["measured"]))
    return written
