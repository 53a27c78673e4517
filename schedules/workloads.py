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

GEMM also takes fp8 (`float8_e4m3fn`) inputs, as Hopper's wgmma and torch._scaled_mm do: B stored
N x K (layout nt), float32 scales, the product written in bfloat16 by default. Its `scales` are
one per tensor ("tensor", the default), one per row of A and one per row of B ("row",
_scaled_mm's rowwise form: a scale per token and per output feature), or one per row of A per
128 K and one per 128x128 block of B ("block", DeepSeek-V3's and DeepGEMM's: each 128-K block's
partial product times its two scales; a last, shorter block of K or N takes its own):

    A        (M, K) e4m3
    B        (N, K) e4m3
    A_scale  (1,) float32              "row": (M,)    "block": (M, ceil(K/128))
    B_scale  (1,) float32              "row": (N,)    "block": (ceil(N/128), ceil(K/128))
    C        (M, N)                    C = (A @ B^T) * A_scale[0] * B_scale[0]
                                       "row": C[m, n] = (A @ B^T)[m, n] * A_scale[m] * B_scale[n]
                                       "block": C[m, n] = sum_kb A_scale[m, kb] B_scale[n/128, kb]
                                                  sum_{k in block kb} A[m, k] B[n, k]

GEMV and batched GEMV also take `nvfp4` inputs (schedules/fp4.py), the batched-GEMV seed's
format, and write float16 by default. B and x then come as packed codes with their scales:

    B        (L, N, K/2) uint8         two e2m1 codes per byte, the lower element in the low nibble
    B_scale  (L, N, K/16) e4m3         one scale per 16 elements of a row
    x        (L, K/2) uint8
    x_scale  (L, K/16) e4m3
    y        (L, N)                    y[l, n] = sum_k B[l, n, k] B_scale[l, n, k/16] x[l, k] x_scale[l, k/16]

(no L for gemv). The seed's competition tensors are the same bytes seen batch-last: its a (M, K/2,
L), sfa (M, K/16, L), b (1, K/2, L), sfb (1, K/16, L) and c (M, 1, L) are, per batch l, our B[l],
B_scale[l], x[l], x_scale[l] and y[l], with its m our N; its A and B (matrices, vectors) are our
B and x.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tvm import te

from . import fp4
from .errors import WorkloadError

ACC_DTYPE = "float32"
DENSE_DTYPES = ("float32", "float16", "bfloat16")  # one element per value: any input or output
FP8 = "float8_e4m3fn"  # GEMM's 8-bit input, scaled per tensor
DTYPES = (*DENSE_DTYPES, FP8, fp4.NAME)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, FP8: 1, fp4.CODE_BYTES: 1}
NVFP4_OUT_DTYPE = "float16"  # the seed's C
FP8_OUT_DTYPE, FP8_LAYOUT = "bfloat16", "nt"  # torch._scaled_mm's usual C, and the B it takes
FP8_SCALES = ("A_scale", "B_scale")  # fp8's scales: float32 buffers, one element or a row's each
FP8_SCALINGS = ("tensor", "row", "block")  # a scale per tensor, per row, or per 128-block
FP8_BLOCK = 128  # "block" scales: A's per row per FP8_BLOCK of K, B's per FP8_BLOCK^2 block
SHAPE_AXES = {"gemm": ("M", "N", "K"), "gemv": ("N", "K"), "batched_gemv": ("L", "N", "K")}
LAYOUTS = {"gemm": ("nn", "nt"), "gemv": ("nt",), "batched_gemv": ("nt",)}
OPS = tuple(SHAPE_AXES)
OUTPUT_NAME = {"gemm": "C", "gemv": "y", "batched_gemv": "y"}
INT32_MAX = 2**31 - 1  # the kernels index buffers with int32
SCALING_LABELS = {"row": " rowwise", "block": " block-scaled"}  # a label's word for fp8's scales


@dataclass(frozen=True)
class Workload:
    """One problem: the op, its shape (see SHAPE_AXES), input/output dtypes, B's layout and
    (fp8) how its scales go: per tensor, per row or per block (FP8_SCALINGS)."""

    op: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    out_dtype: str | None = None
    layout: str | None = None
    scales: str | None = None

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
        # GEMV keeps the input dtype on its output (nvfp4: float16); GEMM writes the float32
        # accumulator (fp8: bfloat16, B N x K).
        default_out = FP8_OUT_DTYPE if self.is_fp8 else ACC_DTYPE if self.op == "gemm" \
            else NVFP4_OUT_DTYPE if self.is_nvfp4 else self.dtype
        object.__setattr__(self, "out_dtype", self.out_dtype or default_out)
        object.__setattr__(self, "layout", self.layout
                           or (FP8_LAYOUT if self.is_fp8 else LAYOUTS[self.op][0]))
        object.__setattr__(self, "scales", self.scales or (FP8_SCALINGS[0] if self.is_fp8 else None))
        for what, value, valid in (("dtype", self.dtype, DTYPES),
                                   ("output dtype", self.out_dtype, DENSE_DTYPES)):
            if value not in valid:
                raise WorkloadError(f"unknown {what} '{value}'; valid: {', '.join(valid)}")
        if self.is_nvfp4:
            self._check_nvfp4()
        if self.is_fp8:
            self._check_fp8()
        elif self.scales is not None:
            raise WorkloadError(f"scales are for {FP8} GEMMs; {self.dtype} takes none, not "
                                f"'{self.scales}'")
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

    def _check_nvfp4(self) -> None:
        """nvfp4 is a GEMV format whose K comes in whole scale blocks of 16."""
        if self.op == "gemm":
            raise WorkloadError(f"{fp4.NAME} inputs are for gemv and batched_gemv; gemm takes "
                                f"{', '.join(DENSE_DTYPES)}")
        K = self.dims["K"]
        if K % fp4.BLOCK:
            raise WorkloadError(f"{fp4.NAME} has one scale per {fp4.BLOCK} elements of K: K={K} "
                                f"is not a multiple of {fp4.BLOCK}")

    def _check_fp8(self) -> None:
        """fp8 is a GEMM input whose B is stored N x K, as wgmma's e4m3 form (which has no
        transposed operands) and torch._scaled_mm take it."""
        if self.op != "gemm":
            raise WorkloadError(f"{FP8} inputs are for gemm; {self.op} takes "
                                f"{', '.join(d for d in DTYPES if d != FP8)}")
        if self.layout != FP8_LAYOUT:
            raise WorkloadError(f"{FP8} GEMM takes B stored N x K (layout {FP8_LAYOUT}), as "
                                f"wgmma's e4m3 form and torch._scaled_mm do, not layout {self.layout}")
        if self.scales not in FP8_SCALINGS:
            raise WorkloadError(f"unknown scales '{self.scales}'; valid: {', '.join(FP8_SCALINGS)}")

    @property
    def is_nvfp4(self) -> bool:
        return self.dtype == fp4.NAME

    @property
    def is_fp8(self) -> bool:
        return self.dtype == FP8

    @property
    def rowwise(self) -> bool:
        """fp8 with a scale per row of A and of B."""
        return self.scales == "row"

    @property
    def block_scaled(self) -> bool:
        """fp8 with a scale per row of A per FP8_BLOCK of K and per FP8_BLOCK^2 block of B."""
        return self.scales == "block"

    @property
    def scale_blocks(self) -> tuple[int, int]:
        """"block" scales: the blocks of N and of K that B's scales come in (the last of each
        may be shorter)."""
        return fp8_blocks(self.dims["N"]), fp8_blocks(self.dims["K"])

    def record_key(self) -> dict:
        """The fields a record of this workload matches on: op, shape, dtypes, layout, and
        "scales": "row" or "block" for fp8 so scaled, else None (which a record without the
        field matches, as every record from before rowwise scales is)."""
        return {"op": self.op, "shape": list(self.shape), "dtype": self.dtype,
                "out_dtype": self.out_dtype, "layout": self.layout,
                "scales": self.scales if self.scales not in (None, FP8_SCALINGS[0]) else None}

    @classmethod
    def from_record(cls, record: dict) -> "Workload":
        """The workload a record names (`record_fields`; records without `scales` are per
        tensor)."""
        return cls(record["op"], tuple(record["shape"]), record["dtype"], record["out_dtype"],
                   record["layout"], record.get("scales"))

    def record_fields(self) -> dict:
        """The workload as its records write it: `record_key` without the fields it leaves
        None."""
        return {k: v for k, v in self.record_key().items() if v is not None}

    def buffer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each buffer's shape by name: the inputs, then the output."""
        d = self.dims
        if self.op == "gemm":
            b = (d["K"], d["N"]) if self.layout == "nn" else (d["N"], d["K"])
            scales = dict(zip(FP8_SCALES, self._scale_shapes())) if self.is_fp8 else {}
            return {"A": (d["M"], d["K"]), "B": b, **scales, "C": (d["M"], d["N"])}
        batch = (d["L"],) if "L" in d else ()
        N, K = d["N"], d["K"]
        if self.is_nvfp4:
            return {"B": (*batch, N, K // fp4.PER_BYTE), "B_scale": (*batch, N, K // fp4.BLOCK),
                    "x": (*batch, K // fp4.PER_BYTE), "x_scale": (*batch, K // fp4.BLOCK),
                    "y": (*batch, N)}
        return {"B": (*batch, N, K), "x": (*batch, K), "y": (*batch, N)}

    def _scale_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """fp8's A_scale and B_scale shapes, as its `scales` go (see the module's table)."""
        if self.rowwise:
            return (self.dims["M"],), (self.dims["N"],)
        if self.block_scaled:
            n_blocks, k_blocks = self.scale_blocks
            return (self.dims["M"], k_blocks), (n_blocks, k_blocks)
        return (1,), (1,)

    def buffer_dtypes(self) -> dict[str, str]:
        """Each buffer's dtype by name, in buffer_shapes' order."""
        names = list(self.buffer_shapes())
        if self.is_nvfp4:
            stored = {"B": fp4.CODE_BYTES, "x": fp4.CODE_BYTES, "B_scale": fp4.SCALE_DTYPE,
                      "x_scale": fp4.SCALE_DTYPE}
            return {name: stored.get(name, self.out_dtype) for name in names}
        scales = dict.fromkeys(FP8_SCALES, ACC_DTYPE) if self.is_fp8 else {}
        return ({name: self.dtype for name in names[:-1]} | scales
                | {names[-1]: self.out_dtype})

    # -- names the schedules use -------------------------------------------------------------
    @property
    def output(self) -> str:
        """Name of the output buffer (and of its block)."""
        return OUTPUT_NAME[self.op]

    @property
    def has_cast(self) -> bool:
        """True when an epilogue block writes the output from the float32 accumulator: casts it
        to the output dtype, or (fp8) scales it."""
        return self.out_dtype != ACC_DTYPE or self.is_fp8

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
        dtypes = self.buffer_dtypes()
        return sum(math.prod(shape) * DTYPE_BYTES[dtypes[name]]
                   for name, shape in self.buffer_shapes().items())

    @property
    def dtypes(self) -> str:
        """The input dtype, and the output's where it differs: float16->float32."""
        return self.dtype if self.out_dtype == self.dtype else f"{self.dtype}->{self.out_dtype}"

    def label(self) -> str:
        scaled = SCALING_LABELS.get(self.scales, "")
        return f"{self.op} {'x'.join(map(str, self.shape))} {self.dtypes} {self.layout}{scaled}"

    # -- the compute definition --------------------------------------------------------------
    def tensors(self) -> list[te.Tensor]:
        """TE placeholders and compute: [inputs..., output]."""
        if self.is_nvfp4:
            return _nvfp4_gemv(self)
        build = {"gemm": _gemm, "gemv": _gemv, "batched_gemv": _batched_gemv}[self.op]
        return build(self)

    def prim_func(self):
        return te.create_prim_func(self.tensors())


def fp8_blocks(extent: int) -> int:
    """The FP8_BLOCK-long blocks that "block" scales cut an extent of N or K into, the last one
    shorter where it does not divide."""
    return -(-extent // FP8_BLOCK)


def _acc(value: te.Tensor | object):
    return value.astype(ACC_DTYPE)


def _with_cast(wl: Workload, shape, body, scale=None) -> te.Tensor:
    """The reduction, plus the epilogue that casts it when the output dtype is not float32,
    and multiplies it by `scale(*indices)` (a float32 expression) where one is given."""
    acc = te.compute(shape, body, name=wl.reduction_block)
    if not wl.has_cast:
        return acc
    scaled = (lambda *idx: acc(*idx) * scale(*idx)) if scale is not None else acc
    return te.compute(shape, lambda *idx: scaled(*idx).astype(wl.out_dtype), name=wl.output)


def _gemm(wl: Workload) -> list[te.Tensor]:
    """C = A @ B (nn) or A @ B^T (nt), float32 accumulation; fp8: times A's and B's scales (per
    tensor, or A's of the row and B's of the column, after the sum; "block": each product
    inside it times the scales of its row's and its column's block of K)."""
    M, N, K = wl.shape
    A = te.placeholder((M, K), wl.dtype, name="A")
    B = te.placeholder((K, N) if wl.layout == "nn" else (N, K), wl.dtype, name="B")
    shapes = wl.buffer_shapes()
    scales = [te.placeholder(shapes[name], ACC_DTYPE, name=name) for name in FP8_SCALES] \
        if wl.is_fp8 else []
    k = te.reduce_axis((0, K), name="k")
    b_at = (lambda kk, j: B[kk, j]) if wl.layout == "nn" else (lambda kk, j: B[j, kk])
    product = lambda i, j: _acc(A[i, k]) * _acc(b_at(k, j))  # noqa: E731
    if wl.block_scaled:  # a 128-K block's products times its two scales: no scale after
        a_scale, b_scale = scales
        return [A, B, *scales, _with_cast(wl, (M, N), lambda i, j: te.sum(
            product(i, j) * (a_scale[i, k // FP8_BLOCK]
                             * b_scale[j // FP8_BLOCK, k // FP8_BLOCK]), axis=k))]
    scale = None if not scales else (lambda i, j: scales[0][i] * scales[1][j]) if wl.rowwise \
        else (lambda i, j: scales[0][0] * scales[1][0])
    C = _with_cast(wl, (M, N), lambda i, j: te.sum(product(i, j), axis=k), scale)
    return [A, B, *scales, C]


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


X_VALUES = "x_value"  # nvfp4: the block that decodes the vector (schedules inline it or stage it)


def _nvfp4_gemv(wl: Workload) -> list[te.Tensor]:
    """y = B x (batched or not) on nvfp4 inputs, float32 accumulation: each element decoded from
    its code (fp4.value) times its block's scale; the vector's values are a stage of their own
    (`x_value`), which a schedule may inline or compute once for all the rows that use them."""
    shapes, dtypes = wl.buffer_shapes(), wl.buffer_dtypes()
    B, B_scale, x, x_scale = (te.placeholder(shapes[n], dtypes[n], name=n)
                              for n in ("B", "B_scale", "x", "x_scale"))

    def element(codes, scales, *at):
        *row, k = at
        code = fp4.code(codes[(*row, k // fp4.PER_BYTE)], k)
        return fp4.value(code) * _acc(scales[(*row, k // fp4.BLOCK)])

    x_value = te.compute((*shapes["x"][:-1], wl.dims["K"]),
                         lambda *at: element(x, x_scale, *at), name=X_VALUES)
    k = te.reduce_axis((0, wl.dims["K"]), name="k")
    body = lambda *out: te.sum(x_value[(*out[:-1], k)] * element(B, B_scale, *out, k),  # noqa: E731
                               axis=k)
    return [B, B_scale, x, x_scale, _with_cast(wl, shapes["y"], body)]


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
