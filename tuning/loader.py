"""A kernel that `runner.py --export DIR` wrote, loaded as a torch operator; needs torch and TVM.

This file is copied into every export directory as load.py, next to the kernel's CUDA source
(kernel.cu), the shared library TVM's runtime loads (kernel.so) and what it was built for and
measured at (kernel.json). In another project, with only torch and TVM installed:

    import runpy
    kernel = runpy.run_path("DIR/load.py")["load"]()  # refuses another GPU or TVM version
    out = kernel(first, second)  # the workload's inputs in its order (GEMM: A, B; GEMV: B, x)

`python DIR/load.py` says whether the kernel loads here. The project's own `compile`
(tuning/export.py) wraps a kernel it has just built in the same `Kernel`.

A `Kernel` is a `torch.library` custom operator (`kernel.op`, also reachable as
torch.ops.tvm_explorer.<kernel.name>): it runs on torch's current CUDA stream, returns a new
output tensor, and has a fake implementation with the output's shape and dtype, so it works
inside torch.compile'd code and CUDA graphs. Inputs of the wrong shape, dtype or device, or
not contiguous, are refused with one line (`BadInput`) before anything runs.
"""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from typing import Callable

import torch
import tvm
import tvm_ffi

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST, LIBRARY, SOURCE, LOADER = "kernel.json", "kernel.so", "kernel.cu", "load.py"
NAMESPACE = "tvm_explorer"  # torch.ops.tvm_explorer.<name>


class CannotLoad(RuntimeError):
    """An export directory whose kernel cannot run here: its files are missing or unreadable, or
    it was built for another GPU or TVM; the message says which and what to do."""


class BadInput(ValueError):
    """A tensor that the kernel cannot take: wrong shape, dtype or device, or not contiguous."""


def read_manifest(directory: str) -> dict:
    """kernel.json of an export directory."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise CannotLoad(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise CannotLoad(f"{path} is not JSON ({e.msg})") from None


def versions_here() -> dict:
    """The versions of the packages a kernel's library is bound to: TVM and its FFI."""
    return {"tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__}


def gpu_here() -> dict | None:
    """The name and compute capability ("9.0") of torch's current CUDA device; None without one."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": props.name, "compute_capability": f"{props.major}.{props.minor}"}


def refusal(manifest: dict, gpu: dict | None, versions: dict) -> str | None:
    """Why the kernel of `manifest` must not run with these package `versions` on `gpu` (as
    `gpu_here` says it), in one line; None where it may."""
    label = manifest["label"]
    for package, here in versions.items():
        if manifest[package] != here:
            return (f"{label} was built with {package} {manifest[package]}, and this Python has "
                    f"{package} {here}: export it again with this {package}")
    if gpu is None:
        return f"{label} runs on a CUDA GPU ({manifest['arch']}), and torch sees none here"
    if gpu["compute_capability"] != manifest["compute_capability"]:
        return (f"{label} was built for {manifest['arch']} (compute capability "
                f"{manifest['compute_capability']}), and this GPU, {gpu['name']}, is compute "
                f"capability {gpu['compute_capability']}: export it again on this GPU")
    return None


def load(directory: str = HERE) -> "Kernel":
    """The kernel of an export directory (by default this file's), as a torch operator; refused
    with `CannotLoad` where `refusal` says so. A GPU of the same architecture but another name
    than the one it was measured on is a warning: the kernel runs, its time in kernel.json is
    that GPU's."""
    manifest = read_manifest(directory)
    gpu = gpu_here()
    problem = refusal(manifest, gpu, versions_here())
    if problem:
        raise CannotLoad(problem)
    if manifest["gpu"] and manifest["gpu"] != gpu["name"]:
        warnings.warn(f"{manifest['label']} was measured on {manifest['gpu']}, not on this "
                      f"{gpu['name']}: its time in {MANIFEST} is that GPU's", stacklevel=2)
    return Kernel(tvm.runtime.load_module(os.path.join(directory, LIBRARY)), manifest)


def _free_op_name(manifest: dict) -> str:
    """A name for the kernel's operator that no operator of this process has yet: its op and
    schedule, then _2, _3 ... for further kernels of the same."""
    base = re.sub(r"\W+", "_", f"{manifest['op']}_{manifest['schedule']}").strip("_").lower()
    namespace = getattr(torch.ops, NAMESPACE)
    name, count = base, 1
    while hasattr(namespace, name):
        count += 1
        name = f"{base}_{count}"
    return name


class Kernel:
    """A built kernel as a torch operator: `kernel(first, second)` returns its output, computed
    on torch's current CUDA stream. `before_first_launch(kernel)`, where given, runs once before
    the first launch (the project's check against float64); until it has passed, the kernel
    cannot be called inside a CUDA graph capture."""

    def __init__(self, module, manifest: dict,
                 before_first_launch: Callable[["Kernel"], None] | None = None):
        self.module = module  # a TVM runtime module or executable, with the kernel as "main"
        self.manifest = manifest
        self.label = manifest["label"]
        self._before_first_launch = before_first_launch
        self._function = None
        self.name = _free_op_name(manifest)
        self.op = torch.library.custom_op(f"{NAMESPACE}::{self.name}", self._run, mutates_args=())
        self.op.register_fake(self._fake)

    def __call__(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        return self.op(first, second)

    def __repr__(self) -> str:
        return (f"<Kernel {self.label}, {self.manifest['schedule']}: "
                f"torch.ops.{NAMESPACE}.{self.name}>")

    def validate(self, tensors: tuple) -> None:
        """Refuse, with one line, inputs the kernel was not built for: each as kernel.json's
        `inputs` say (shape, dtype), contiguous, all on one CUDA device."""
        for tensor, spec in zip(tensors, self.manifest["inputs"]):
            what = f"{self.label}: input {spec['name']}"
            shape, dtype = tuple(spec["shape"]), getattr(torch, spec["dtype"])
            if tuple(tensor.shape) != shape:
                raise BadInput(f"{what} has shape {tuple(tensor.shape)}, not {shape}")
            if tensor.dtype != dtype:
                raise BadInput(f"{what} is {tensor.dtype}, not {dtype}")
            if tensor.device.type != "cuda":
                raise BadInput(f"{what} is on {tensor.device}, not on a CUDA device")
            if tensor.device != tensors[0].device:
                raise BadInput(f"{what} is on {tensor.device}, and the first input on "
                               f"{tensors[0].device}")
            if not tensor.is_contiguous():
                raise BadInput(f"{what} has strides {tensor.stride()}, not contiguous ones: "
                               "pass .contiguous()")

    def _empty_output(self, like: torch.Tensor) -> torch.Tensor:
        output = self.manifest["output"]
        return like.new_empty(tuple(output["shape"]), dtype=getattr(torch, output["dtype"]))

    def _fake(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """The output's shape, dtype and device, for torch.compile's tracing."""
        self.validate((first, second))
        return self._empty_output(first)

    def _run(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """The operator's CUDA implementation: check the inputs, then launch into a new output."""
        self.validate((first, second))
        if self._before_first_launch:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"{self.label}: call the kernel once before capturing a CUDA "
                                   "graph (its first call checks it)")
            self._before_first_launch(self)
            self._before_first_launch = None
        return self.launch((first, second), self._empty_output(first))

    def launch(self, inputs, out: torch.Tensor) -> torch.Tensor:
        """Run the kernel on `inputs` into `out` on torch's current stream, unchecked."""
        if self._function is None:
            self._function = self.module["main"]
        with torch.cuda.device(out.device), tvm_ffi.use_torch_stream():
            self._function(*inputs, out)
        return out


def main() -> int:
    """`python load.py`: load this directory's kernel, or say in one line why it cannot run here."""
    try:
        kernel = load()
    except CannotLoad as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{kernel.label}, {kernel.manifest['schedule']}: loaded as torch.ops.{NAMESPACE}."
          f"{kernel.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
