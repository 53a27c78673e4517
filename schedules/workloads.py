"""What to compute: workloads and their TE compute definitions.

A Workload is a frozen value (op, shape, dtypes, layout) that validates itself. Its
`prim_func()` is the declarative TE definition turned into a TensorIR PrimFunc, the input of
every schedule. Accumulation is always float32; inputs and output take their own dtypes.

    gemm          C[M, N] = A[M, K] @ B           layout nn: B is K x N; nt: B is N x K (C = A @ B^T)
    gemv          y[N] = B[N, K] @ x[K]           B row-major N x K (the TileLang seed's layout)
                                                  summed as x[k] * B[n, k], the vector read first
                                                  as in the seed (and as dlight's GEMV rule expects)
    batched_gemv  y[L, N] = B[L, N, K] @ x[L, K]  L independent pairs, batch outermost, all row-major

When the output dtype differs from the float32 accumulator, the reduction writes `<out>_acc`
and an elementwise block casts it into the output; schedules keep that accumulator in registers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tvm import te

from .errors import WorkloadError

ACC_DTYPE = "float32"
DTYPES = ("float32", "float16", "bfloat16")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
SHAPE_AXES = {"gemm": ("M", "N", "K"), "gemv": ("N", "K"), "batched_gemv": ("L", "N", "K")}
LAYOUTS = {"gemm": ("nn", "nt"), "gemv": ("nt",), "batched_gemv": ("nt",)}
OPS = tuple(SHAPE_AXES)
OUTPUT_NAME = {"gemm": "C", "gemv": "y", "batched_gemv": "y"}
INT32_MAX = 2**31 - 1  # the kernels index buffers with int32


@dataclass(frozen=True)
class Workload:
    """One problem: the op, its shape (see SHAPE_AXES), input/output dtypes and B's layout."""

    op: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    out_dtype: str | None = None
    layout: str | None = None

    def __post_init__(self):
        if self.op not in OPS:
            raise WorkloadError(f"unknown op '{self.op}'; valid ops: {', '.join(OPS)}")
        axes = SHAPE_AXES[self.op]
        if len(self.shape) != len(axes) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in self.shape
        ):
            raise WorkloadError(
                f"{self.op} takes a shape {'x'.join(axes)} of {len(axes)} integers, got {self.shape}"
            )
        bad = [f"{a}={d}" for a, d in zip(axes, self.shape) if d <= 0]
        if bad:
            raise WorkloadError(f"dimensions must be positive, got {', '.join(bad)}")
        # GEMV keeps the input dtype on its output; GEMM writes the float32 accumulator.
        default_out = self.dtype if self.op != "gemm" else ACC_DTYPE
        object.__setattr__(self, "out_dtype", self.out_dtype or default_out)
        object.__setattr__(self, "layout", self.layout or LAYOUTS[self.op][0])
        for what, value in (("dtype", self.dtype), ("output dtype", self.out_dtype)):
            if value not in DTYPES:
                raise WorkloadError(f"unknown {what} '{value}'; valid: {', '.join(DTYPES)}")
        if self.layout not in LAYOUTS[self.op]:
            raise WorkloadError(
                f"unknown layout '{self.layout}' for {self.op}; valid: {', '.join(LAYOUTS[self.op])}"
            )
        for name, shape in self.buffer_shapes().items():
            elements = math.prod(shape)
            if elements > INT32_MAX:
                raise WorkloadError(
                    f"{name} would hold {elements} elements ({'x'.join(map(str, shape))}), more "
                    f"than int32 indices reach ({INT32_MAX}); split the problem")

    def buffer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each buffer's shape by name: the inputs, then the output."""
        d = self.dims
        if self.op == "gemm":
            b = (d["K"], d["N"]) if self.layout == "nn" else (d["N"], d["K"])
            return {"A": (d["M"], d["K"]), "B": b, "C": (d["M"], d["N"])}
        batch = (d["L"],) if "L" in d else ()
        return {"B": (*batch, d["N"], d["K"]), "x": (*batch, d["K"]), "y": (*batch, d["N"])}

    # -- names the schedules use -------------------------------------------------------------
    @property
    def output(self) -> str:
        """Name of the output buffer (and of its block)."""
        return OUTPUT_NAME[self.op]

    @property
    def has_cast(self) -> bool:
        """True when an epilogue block casts the float32 accumulator to the output dtype."""
        return self.out_dtype != ACC_DTYPE

    @property
    def reduction_block(self) -> str:
        """Name of the block that does the multiply-accumulate."""
        return self.output + "_acc" if self.has_cast else self.output

    @property
    def dims(self) -> dict[str, int]:
        return dict(zip(SHAPE_AXES[self.op], self.shape))

    # -- accounting --------------------------------------------------------------------------
    @property
    def flops(self) -> int:
        """Multiply-adds counted as two operations."""
        prod = 1
        for d in self.shape:
            prod *= d
        return 2 * prod

    @property
    def min_bytes(self) -> int:
        """Bytes moved if every input is read once and the output written once."""
        *inputs, output = (math.prod(shape) for shape in self.buffer_shapes().values())
        return sum(inputs) * DTYPE_BYTES[self.dtype] + output * DTYPE_BYTES[self.out_dtype]

    @property
    def dtypes(self) -> str:
        """The input dtype, and the output's where it differs: float16->float32."""
        return self.dtype if self.out_dtype == self.dtype else f"{self.dtype}->{self.out_dtype}"

    def label(self) -> str:
        return f"{self.op} {'x'.join(map(str, self.shape))} {self.dtypes} {self.layout}"

    # -- the compute definition --------------------------------------------------------------
    def tensors(self) -> list[te.Tensor]:
        """TE placeholders and compute: [inputs..., output]."""
        build = {"gemm": _gemm, "gemv": _gemv, "batched_gemv": _batched_gemv}[self.op]
        return build(self)

    def prim_func(self):
        return te.create_prim_func(self.tensors())


def _acc(value: te.Tensor | object):
    return value.astype(ACC_DTYPE)


def _with_cast(wl: Workload, shape, body) -> te.Tensor:
    """The reduction, plus the cast epilogue when the output dtype is not float32."""
    acc = te.compute(shape, body, name=wl.reduction_block)
    if not wl.has_cast:
        return acc
    return te.compute(shape, lambda *idx: acc(*idx).astype(wl.out_dtype), name=wl.output)


def _gemm(wl: Workload) -> list[te.Tensor]:
    """C = A @ B (nn) or A @ B^T (nt), float32 accumulation."""
    M, N, K = wl.shape
    A = te.placeholder((M, K), wl.dtype, name="A")
    B = te.placeholder((K, N) if wl.layout == "nn" else (N, K), wl.dtype, name="B")
    k = te.reduce_axis((0, K), name="k")
    b_at = (lambda kk, j: B[kk, j]) if wl.layout == "nn" else (lambda kk, j: B[j, kk])
    C = _with_cast(wl, (M, N), lambda i, j: te.sum(_acc(A[i, k]) * _acc(b_at(k, j)), axis=k))
    return [A, B, C]


def _gemv(wl: Workload) -> list[te.Tensor]:
    """y = B x with B stored N x K row-major, float32 accumulation."""
    N, K = wl.shape
    B = te.placeholder((N, K), wl.dtype, name="B")
    x = te.placeholder((K,), wl.dtype, name="x")
    k = te.reduce_axis((0, K), name="k")
    y = _with_cast(wl, (N,), lambda n: te.sum(_acc(x[k]) * _acc(B[n, k]), axis=k))
    return [B, x, y]


def _batched_gemv(wl: Workload) -> list[te.Tensor]:
    """y[l] = B[l] x[l] for L pairs; B is L x N x K, x is L x K, y is L x N, all row-major."""
    L, N, K = wl.shape
    B = te.placeholder((L, N, K), wl.dtype, name="B")
    x = te.placeholder((L, K), wl.dtype, name="x")
    k = te.reduce_axis((0, K), name="k")
    y = _with_cast(wl, (L, N), lambda b, n: te.sum(_acc(x[b, k]) * _acc(B[b, n, k]), axis=k))
    return [B, x, y]


def parse_shape(text: str, op: str) -> tuple[int, ...]:
    """'1024x512x2048' -> (1024, 512, 2048); a clear WorkloadError for anything else."""
    axes = SHAPE_AXES.get(op)
    if axes is None:
        raise WorkloadError(f"unknown op '{op}'; valid ops: {', '.join(OPS)}")
    if not re.fullmatch(r"\s*-?\d+(\s*x\s*-?\d+)*\s*", text or ""):
        raise WorkloadError(
            f"malformed shape '{text}': expected {'x'.join(axes)} as integers, e.g. "
            f"{'x'.join(str(d) for d in DEFAULT_SHAPES[op])}"
        )
    return tuple(int(p) for p in text.split("x"))


# The seeds' problems. GEMM: the blog's M=1024, N=512, K=2048. GEMV: the TileLang tutorial's
# N=K=1024 and the batched write-up's three benchmark shapes (k, m, l) -> (L, N=m, K=k).
DEFAULT_SHAPES = {"gemm": (1024, 512, 2048), "gemv": (1024, 1024), "batched_gemv": (8, 4096, 7168)}
DEFAULT_DTYPES = {"gemm": "float32", "gemv": "float16", "batched_gemv": "float16"}
PRESETS = {
    "gemm-seed": Workload("gemm", (1024, 512, 2048), "float32"),
    "gemv-1024": Workload("gemv", (1024, 1024), "float16"),
    "gemv-7168x16384": Workload("gemv", (7168, 16384), "float16"),
    "bgemv-l1": Workload("batched_gemv", (1, 7168, 16384), "float16"),
    "bgemv-l8": Workload("batched_gemv", (8, 4096, 7168), "float16"),
    "bgemv-l4": Workload("batched_gemv", (4, 7168, 2048), "float16"),
}
