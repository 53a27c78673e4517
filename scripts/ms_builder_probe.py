"""Where does MetaSchedule's LocalBuilder spend its time on this machine? (issue 5)

Times, in fresh processes, the steps a LocalBuilder worker goes through for one candidate of
the seed GEMM (import tvm, import TVM's tensor intrinsics as default_build does, tvm.compile),
under each CUDA compile mode, then a LocalBuilder batch of 16 candidates per mode.
Usage: python scripts/ms_builder_probe.py [nvrtc|nvcc ...]
"""

import os
import subprocess
import sys
import time

STEPS = r"""
import os, time, sys, faulthandler
faulthandler.dump_traceback_later(60, exit=False)
t = time.time()
def step(name):
    global t
    now = time.time(); print(f"  {name}: {now - t:.2f} s", flush=True); t = now
import tvm; step("import tvm")
import tvm.s_tir.tensor_intrin; step("import tvm.s_tir.tensor_intrin")
from schedules import Workload, get
from tuning.build import cuda_target
wl = Workload("gemm", (1024, 512, 2048), "float32")
target = cuda_target("sm_90")
mod = get("gemm", "v3").apply(wl, target); step("schedule v3")
lib = tvm.compile(mod, target=target); step("tvm.compile (first)")
lib = tvm.compile(get("gemm", "v4").apply(wl, target), target=target); step("tvm.compile (second)")
"""


def batch(mode: str, n: int = 16) -> None:
    from tvm.s_tir import meta_schedule as ms

    from schedules import Workload, get
    from tuning.build import cuda_target

    wl = Workload("gemm", (1024, 512, 2048), "float32")
    target = cuda_target("sm_90")
    mods = [get("gemm", "v4").apply(wl, target, tile_k=k) for k in (8, 16, 32, 64)] * (n // 4)
    builder = ms.builder.LocalBuilder(timeout_sec=300)
    print(f"  LocalBuilder max_workers = {builder.max_workers}", flush=True)
    for attempt in range(2):
        start = time.time()
        results = builder.build([ms.builder.BuilderInput(m, target) for m in mods])
        errors = [r.error_msg.strip().splitlines()[-1] for r in results if r.error_msg]
        print(f"  batch {attempt}: {n} candidates in {time.time() - start:.1f} s, "
              f"{len(errors)} failed {errors[:2]}", flush=True)


def main(modes):
    import importlib.util

    print(f"cpus: os.cpu_count()={os.cpu_count()}, sched_getaffinity={len(os.sched_getaffinity(0))}")
    for name in ("cloudpickle", "psutil", "tornado", "cuda.bindings", "matplotlib", "xgboost"):
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        print(f"  {name}: {'present' if found else 'MISSING'}")
    for mode in modes:
        env = {**os.environ, "TVM_CUDA_COMPILE_MODE": mode}
        print(f"== {mode}: one worker's steps, in a fresh process", flush=True)
        subprocess.run([sys.executable, "-c", STEPS], env=env, check=False)
        print(f"== {mode}: LocalBuilder", flush=True)
        os.environ["TVM_CUDA_COMPILE_MODE"] = mode
        batch(mode)


if __name__ == "__main__":
    main(sys.argv[1:] or ["nvrtc", "nvcc"])
