"""Builds the ragged-K GEMV probe (issue 21): scripts/ragged_gemv_probe.cu with rowalign's CUDA
helpers and the kernels TVM builds for rowalign and for the aligned neighbours' best rungs.

Usage (no GPU needed): python scripts/ragged_gemv_probe.py DIR
  writes DIR/rowalign_helpers.cuh and DIR/tvm_kernels.cuh, copies the .cu and its harness, and
  compiles DIR/ragged_gemv_probe for sm_90 with nvcc. On the GPU machine: DIR/ragged_gemv_probe
  (`p`: one launch of each kernel of the first shape, for ncu; `x`: the xstage kernels beside
  TVM's only; `h`: the hoistb kernels beside TVM's only; `s`: the shflb kernels and the plain
  walk beside TVM's only; `P`: the pxstage kernels beside TVM's only).
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

from schedules.gemv import ROW_ALIGNED

HERE = Path(__file__).resolve().parent
# (N, K, rung): each ragged shape's rowalign and its aligned neighbour's best rung in
# reports/h100-shapes.md (llm-gemv, float16).
TVM_KERNELS = [
    (4096, 4095, "rowalign"), (4096, 4096, "blockreduce"),
    (3584, 3583, "rowalign"), (3584, 3584, "allreduce"),
    (4096, 14335, "rowalign"), (4096, 14336, "blockreduce"),
    (3584, 18943, "rowalign"), (3584, 18944, "blockreduce"),
]


def tvm_kernel(n: int, k: int, rung: str) -> tuple[str, str, str]:
    """The kernel TVM builds for the fp16 GEMV n x k with `rung`, renamed, with its grid and block."""
    out = subprocess.run(
        [sys.executable, str(HERE.parent / "runner.py"), "--op", "gemv", "--shape", f"{n}x{k}",
         "--dtype", "float16", "--schedule", rung, "--arch", "sm_90", "--no-ir", "--show-cuda"],
        capture_output=True, text=True, check=True).stdout
    name = f"tvm_{n}x{k}_{rung}"
    start = out.index('extern "C" __global__', out.index('extern "C" __global__') + 1)  # the definition
    source = out[start:out.index("\n}\n", start) + 3].replace('extern "C" ', "")
    grid, block = re.search(r"grid \(x,y,z\) (\d+x\d+x\d+), block \(x,y,z\) (\d+x\d+x\d+)", out).groups()
    dims = lambda text: "dim3(" + text.replace("x", ", ") + ")"  # noqa: E731
    return source.replace("main_kernel", name), name, f"{dims(grid)}, {dims(block)}"


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rowalign_helpers.cuh").write_text(ROW_ALIGNED)
    sources, calls = [], []
    for n, k, rung in TVM_KERNELS:
        source, name, launch = tvm_kernel(n, k, rung)
        sources.append(source)
        ragged = k % 8 != 0
        shape = (n, k) if ragged else (n, k - 1)  # the run of the ragged shape it stands beside
        calls.append(f"  if (n == {shape[0]} && k == {shape[1]}) run_tvm<{n}, {k}>(c, {name}, "
                     f"{launch}, \"TVM {rung}\");")
    (out / "tvm_kernels.cuh").write_text(
        "\n".join(sources) + "\nvoid run_tvm_kernels(Ctx& c, int n, int k) {\n" + "\n".join(calls)
        + "\n}\n")
    for source in ("ragged_gemv_probe.cu", "gemv_probe_harness.cuh"):
        shutil.copy(HERE / source, out / source)
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-lineinfo", "-o",
                    str(out / "ragged_gemv_probe"), str(out / "ragged_gemv_probe.cu")], check=True)
    print(f"built {out / 'ragged_gemv_probe'}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/ragged_gemv_probe.py DIR")
    main(sys.argv[1])
