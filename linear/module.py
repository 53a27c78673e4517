"""`Linear`: nn.Linear's drop-in for inference, running the kernel its bucket of M measured
fastest (linear/portfolio.py), at F.linear's call cost.

    model = transformers.AutoModelForCausalLM.from_config(config).cuda().bfloat16()
    linear.replace_linears(model)      # every nn.Linear becomes a Linear sharing its weights
    linear.prepare(model)              # tuned once per (shape, bucket, GPU), then from the cache
    logits = model(input_ids).logits   # eager, torch.compile'd or in a CUDA graph

An fp8 layer takes e4m3 activations with their float32 scales, as torch._scaled_mm does: one
per tensor, or one per row of x (..., 1) and of the weight (N x 1, each output feature's):

    layer = linear.Linear.from_float8(weight_fp8, weight_scale, bias)  # scales: the weight's form
    y = layer(x_fp8, x_scale)          # bfloat16 by default, bias added after scaling

Eager calls go straight to the kernel (a TVM function call with torch tensors: tvm_ffi takes
torch's current stream). Under torch.compile the layer is one operator,
torch.ops.tvm_explorer.linear (fp8: linear_fp8), with a fake implementation for any M, so that
compiled graphs and CUDA graphs hold the kernel itself, x checked once, at tracing, wherever it
is one the layer takes (the graph's guards keep it so); where the bucket of the traced rows (or
every bucket) chose torch's F.linear (fp8: torch._scaled_mm), the layer is traced as that call,
which the compiler handles as it does stock layers. Inductor then calls the layer into a buffer
of its own in place of the operator (inductor.py).
"""

from __future__ import annotations

import weakref

import torch

from schedules.errors import UsageError
from schedules.workloads import FP8_BLOCK, fp8_blocks
from tuning.loader import BadInput

from . import farm, inductor
from .buckets import Bucket, layer_buckets, token_count
from .cache import Cache, export_entries
from .candidates import LAYER_DTYPES, TORCH, LayerShape, torch_layer
from .portfolio import LayerKernels, prepare as prepare_kernels

DEFAULT_MAX_TOKENS = 4096
_LAYERS: "weakref.WeakValueDictionary[int, Linear]" = weakref.WeakValueDictionary()

_library = torch.library.Library("tvm_explorer", "FRAGMENT")
_library.define("linear(Tensor x, Tensor weight, Tensor? bias, int layer, bool check=True) "
                "-> Tensor")
_library.define("linear_fp8(Tensor x, Tensor x_scale, Tensor weight, Tensor weight_scale, "
                "Tensor? bias, int layer, bool check=True) -> Tensor")


def _linear_cuda(x, weight, bias, layer: int, check: bool = True):
    """The operator on CUDA tensors: the layer's eager call, its checks of x left out where
    tracing found x good (check=False: Linear._needs_checks)."""
    return _LAYERS[layer].call(x, weight, bias, check)


def _linear_fake(x, weight, bias, layer: int, check: bool = True):
    """The output's shape and dtype for any M, for tracing (fake and meta tensors); on the
    first trace, the operator's lowering for inductor."""
    inductor.register(torch.ops.tvm_explorer.linear.default, _linear_into,
                      lambda layer, dtype: dtype)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_into(x, weight, bias=None, *, layer: int, out):
    """The compiled layer's call where inductor lowered the operator (inductor.py): M's kernel
    into inductor's buffer `out`, x unchecked (as traced, held by the graph's guards)."""
    _LAYERS[layer].call(x, weight, bias, False, out)


def _linear_fp8_cuda(x, x_scale, weight, weight_scale, bias, layer: int, check: bool = True):
    """The fp8 operator on CUDA tensors: the layer's eager call, its checks of x and x_scale
    left out where tracing found them good (check=False)."""
    return _LAYERS[layer].call_fp8(x, x_scale, weight, weight_scale, bias, check)


def _linear_fp8_fake(x, x_scale, weight, weight_scale, bias, layer: int, check: bool = True):
    """The fp8 output's shape and dtype (the layer's out_dtype) for any M, for tracing; on the
    first trace, the operator's lowering for inductor."""
    inductor.register(torch.ops.tvm_explorer.linear_fp8.default, _linear_fp8_into,
                      lambda layer, dtype: _LAYERS[layer].out_dtype)
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=_LAYERS[layer].out_dtype)


def _linear_fp8_into(x, x_scale, weight, weight_scale, bias=None, *, layer: int, out):
    """The compiled fp8 layer's call where inductor lowered the operator: M's kernel into
    `out`, x and x_scale unchecked."""
    _LAYERS[layer].call_fp8(x, x_scale, weight, weight_scale, bias, False, out)


_library.impl("linear", _linear_cuda, "CUDA")
torch.library.register_fake("tvm_explorer::linear", _linear_fake, lib=_library)
_library.impl("linear_fp8", _linear_fp8_cuda, "CUDA")
torch.library.register_fake("tvm_explorer::linear_fp8", _linear_fp8_fake, lib=_library)


class Linear(torch.nn.Module):
    """y = x W^T + b for x of any leading shape and any number of rows M, inference only. Its
    weight (out_features x in_features) and bias are a state_dict's like nn.Linear's; its
    kernels come from `prepare` (on the first call if not before), one per bucket of M.

    dtype float8_e4m3fn makes an fp8 layer (see `from_float8`): its weight is e4m3, with a
    float32 `weight_scale` per tensor (shape ()), or with scales="row" one per output feature
    (out_features x 1), or with scales="block" one per 128 x 128 block (DeepSeek-V3's:
    ceil(out_features / 128) x ceil(in_features / 128)); forward takes (x, x_scale), x in e4m3
    and x_scale float32: one element, or one per row of x (x.shape[:-1] + (1,)), or one per
    row per 128 features (x.shape[:-1] + (ceil(in_features / 128),)). It writes out_dtype
    (bfloat16 by default), its bias in that dtype added after scaling:
    y = (x * x_scale) (W * w_scale)^T + b, each scale over its block. Its sums are promoted into
    float32 as _scaled_mm's default does (block scales applied at each promotion);
    fast_accum=True keeps them in the tensor cores' accumulator, as _scaled_mm's
    use_fast_accum=True (faster, less precise; not with block scales).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=torch.bfloat16, *, buckets: tuple[Bucket | int, ...] | None = None,
                 max_tokens: int = DEFAULT_MAX_TOKENS, scales: str | None = None,
                 out_dtype=None, fast_accum: bool = False):
        super().__init__()
        max_tokens = token_count(max_tokens)
        device = _device(device)
        if not isinstance(bias, bool):
            raise UsageError(f"Linear's bias is True or False (whether the layer adds one), "
                             f"not {bias!r}")
        for name, given in (("dtype", dtype), ("out_dtype", out_dtype)):
            if not isinstance(given, torch.dtype) and (given is not None or name == "dtype"):
                raise UsageError(f"Linear's {name} is a torch.dtype (e.g. torch.bfloat16), "
                                 f"not {given!r}")
        self.in_features, self.out_features = in_features, out_features
        layer = LayerShape(out_features, in_features, _name_of(dtype), scales,
                           out_dtype and _name_of(out_dtype), fast_accum)  # refuses what GEMM won't
        self.is_fp8, self.scales, self.fast_accum = layer.is_fp8, layer.scales, fast_accum
        self._out_dtype = getattr(torch, layer.out_dtype)
        self.weight = _frozen((out_features, in_features), dtype, device)
        self.bias = _frozen((out_features,), self._out_dtype, device) if bias else None
        self.weight_scale = _frozen(layer.weight_scale_shape(), torch.float32, device) \
            if self.is_fp8 else None
        self._scale_width = layer.x_scale_shape(())  # x_scale's last dimension, if it has one
        self.buckets = layer_buckets(buckets)
        self.max_tokens = max_tokens
        self.kernels = None
        self._key = id(self)  # the operator's handle on this layer
        _LAYERS[self._key] = self

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, **options) -> "Linear":
        """A Linear sharing `linear`'s weight and bias tensors."""
        if not isinstance(linear, torch.nn.Linear):
            raise UsageError(f"Linear.from_linear takes a torch.nn.Linear, not "
                             f"{type(linear).__name__}")
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    device="meta", dtype=linear.weight.dtype, **options)
        layer.weight = torch.nn.Parameter(linear.weight.detach(), requires_grad=False)
        if linear.bias is not None:
            layer.bias = torch.nn.Parameter(linear.bias.detach(), requires_grad=False)
        return layer

    @classmethod
    def from_float8(cls, weight: torch.Tensor, weight_scale: torch.Tensor,
                    bias: torch.Tensor | None = None, **options) -> "Linear":
        """An fp8 Linear sharing `weight` (out_features x in_features, float8_e4m3fn), its
        float32 `weight_scale` and `bias` (out_features, in out_dtype: bfloat16 by default).
        The scale's shape says the layer's scales: one element (() or (1,)) per tensor; one per
        output feature (N x 1, as torchao and vLLM keep it, or 1 x N, torch._scaled_mm's
        scale_b) per row, x then taking one scale per row too; one per 128 x 128 block
        (ceil(N / 128) x ceil(K / 128), as DeepSeek-V3's checkpoints keep it) per block, x then
        taking one per row per 128 K. `scales` names the form where a shape fits two (1 x N
        with N the count of 128-blocks of K, N at most 128). One line refuses anything else,
        and a weight_scale that is not contiguous."""
        for name, given in (("weight", weight), ("weight_scale", weight_scale), ("bias", bias)):
            if not isinstance(given, torch.Tensor) and (given is not None or name != "bias"):
                raise BadInput(f"Linear.from_float8: {name} is not a torch.Tensor "
                               f"({type(given).__name__})")
        if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
            raise BadInput(f"Linear.from_float8: weight is {weight.dtype} of shape "
                           f"{tuple(weight.shape)}, not a torch.float8_e4m3fn matrix "
                           "(out_features x in_features)")
        if not weight.is_contiguous():
            raise BadInput(f"Linear.from_float8: weight has strides {weight.stride()}, not "
                           "contiguous ones (out_features rows of in_features): pass "
                           "weight.contiguous()")
        if not weight_scale.is_contiguous():
            raise BadInput(f"Linear.from_float8: weight_scale has strides "
                           f"{weight_scale.stride()}, not contiguous ones: pass "
                           "weight_scale.contiguous()")
        out_features, in_features = weight.shape
        scales = _scaling(weight_scale, out_features, in_features, options.pop("scales", None))
        layer = cls(in_features, out_features, bias is not None, device="meta",
                    dtype=weight.dtype, scales=scales, **options)
        layer.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(
            weight_scale.detach().reshape(layer.weight_scale.shape), requires_grad=False)
        if bias is not None:
            if bias.shape != (out_features,) or bias.dtype != layer.out_dtype:
                raise BadInput(f"Linear.from_float8: bias is {bias.dtype} of shape "
                               f"{tuple(bias.shape)}, not {layer.out_dtype} of shape "
                               f"({out_features},) (the output's dtype)")
            layer.bias = torch.nn.Parameter(bias.detach(), requires_grad=False)
        return layer

    def extra_repr(self) -> str:
        fp8 = f", scales={self.scales}, out_dtype={self.out_dtype}" if self.is_fp8 else ""
        fp8 += ", fast_accum=True" if self.fast_accum else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}{fp8}, buckets="
                + ",".join(b.label().removeprefix("M=") for b in self.buckets))

    @property
    def out_dtype(self) -> torch.dtype:
        """The output's dtype: a 16-bit layer's weight's, an fp8 layer's own (bfloat16 unless
        made otherwise)."""
        return self._out_dtype if self.is_fp8 else self.weight.dtype

    @property
    def shape(self) -> LayerShape:
        """The layer as its kernels see it: a 16-bit layer's dtype is its weight's (which
        model.half() may have changed), an fp8 layer's scales and output are its own."""
        return LayerShape(self.out_features, self.in_features, _name_of(self.weight.dtype),
                          self.scales, _name_of(self.out_dtype) if self.is_fp8 else None,
                          self.fast_accum, self.bias is not None)

    @property
    def kernels(self) -> LayerKernels | None:
        """The layer's kernels, one per bucket (None until `prepare`)."""
        return self._kernels

    @kernels.setter
    def kernels(self, kernels: LayerKernels | None) -> None:
        """Set the kernels, and what the calls read of them: each bucket's run, the bucket of
        every M below the open bucket's first, and which buckets (all?) run torch's call."""
        self._kernels = kernels
        self._runs = [k.run for k in kernels.kernels] if kernels else None
        self._bucket_of = [kernels.table.index(m) if m else 0
                           for m in range(self.buckets[-1].first)] if kernels else None
        self._torch_runs = [k.candidate.rung == TORCH for k in kernels.kernels] if kernels \
            else None
        self._compiles_as_torch = bool(kernels and all(self._torch_runs))

    def _bucket(self, m: int) -> int:
        """The index of M's bucket (m >= 1; the kernels set)."""
        table = self._bucket_of
        return table[m] if m < len(table) else len(self._runs) - 1

    def forward(self, x: torch.Tensor, x_scale: torch.Tensor | None = None) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return self._traced(x, x_scale)
        if self.is_fp8:
            return self.call_fp8(x, x_scale, self.weight, self.weight_scale, self.bias)
        if x_scale is not None:
            raise BadInput(f"{self._name()}: x_scale is for float8_e4m3fn layers "
                           f"(Linear.from_float8); this one takes {self.weight.dtype} x alone")
        return self.call(x, self.weight, self.bias)

    def _traced(self, x: torch.Tensor, x_scale: torch.Tensor | None) -> torch.Tensor:
        """The layer as torch.compile sees it: torch's own call (`torch_layer`: F.linear, or
        fp8's torch._scaled_mm or block-scaled call) where the rows' bucket runs torch's (every
        bucket, or M's where M is fixed at tracing), which the compiler then handles as it does
        stock layers; else the operator, which runs M's kernel at each call (checking x only
        where `_needs_checks`)."""
        m = x.numel() // self.in_features
        as_torch = self._compiles_as_torch or (isinstance(m, int) and self._runs is not None
                                               and self._torch_runs[self._bucket(max(m, 1))])
        if not self.is_fp8:
            return torch.nn.functional.linear(x, self.weight, self.bias) if as_torch else \
                torch.ops.tvm_explorer.linear(x, self.weight, self.bias, self._key,
                                              self._needs_checks(x, x_scale))
        if not as_torch:
            return torch.ops.tvm_explorer.linear_fp8(x, x_scale, self.weight, self.weight_scale,
                                                     self.bias, self._key,
                                                     self._needs_checks(x, x_scale))
        y = torch_layer(self.shape)(x.reshape(-1, self.in_features),
                                    self._rows_scale(x_scale, -1), self.weight,
                                    self.weight_scale, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def _needs_checks(self, x: torch.Tensor, x_scale: torch.Tensor | None) -> bool:
        """Whether the compiled operator must check x (fp8: and x_scale) at each call: where x,
        as traced, is one the eager call would refuse, so that the compiled call refuses it in
        the same line. Elsewhere the graph's guards hold x's dtype, shape, device and
        requires_grad (and grad mode) as traced, and inductor hands custom operators inputs of
        the strides they were traced with (needs_exact_strides, its default), so checking
        again would only cost. Raising here instead would make dynamo run every Linear eagerly
        from then on (it skips the code of a frame whose tracing raised)."""
        weight = self.weight
        return bool(torch.is_grad_enabled() and (x.requires_grad
                                                 or getattr(x_scale, "requires_grad", False))
                    or x.device != weight.device or not x.is_contiguous()
                    or _x_kind_problem(x, weight, self.in_features)
                    or self.is_fp8 and self._scale_problem(x, x_scale))

    def _rows_scale(self, x_scale: torch.Tensor, m: int) -> torch.Tensor:
        """x's scale for x seen as m rows (m x 1 where scales go by rows, m x K blocks by blocks;
        one element as is)."""
        return x_scale.view(m, *self._scale_width) if self._scale_width else x_scale

    def call(self, x: torch.Tensor, weight: torch.Tensor, bias, check: bool = True,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """The eager call: check x, pick M's bucket's kernel and run it (bias included), into
        `out` where given (the compiled call's buffer). Kept to few Python steps: this is the
        layer's whole cost on the CPU. The compiled operator passes check=False where tracing
        found x good (`_needs_checks`)."""
        k = self.in_features
        if check:
            try:
                if x.requires_grad and torch.is_grad_enabled():
                    self._refuse_gradient("x")
                if x.shape[-1] != k or x.dtype != weight.dtype or not x.is_cuda \
                        or x.get_device() != weight.get_device() or not x.is_contiguous():
                    self._refuse(x, weight)
            except (AttributeError, IndexError):  # no tensor, or a 0-d one (free when good)
                self._refuse_not_rows(x)
        runs = self._runs or self._prepare_on_first_call()
        m = x.numel() // k
        if m == 0:
            return x.new_empty((*x.shape[:-1], self.out_features)) if out is None else out
        run = runs[self._bucket(m)]
        if x.dim() == 2:  # no views to make: each costs about a microsecond
            return run(x, weight, bias, out=out)
        rows = None if out is None else out.view(m, self.out_features)
        return run(x.view(m, k), weight, bias, out=rows).view(*x.shape[:-1], self.out_features)

    def call_fp8(self, x: torch.Tensor, x_scale, weight: torch.Tensor, weight_scale: torch.Tensor,
                 bias, check: bool = True, out: torch.Tensor | None = None) -> torch.Tensor:
        """The fp8 eager call: check x and x_scale, pick M's bucket's kernel and run it (scales
        and bias included), into `out` where given; as few Python steps as `call`, and as it,
        check=False from the compiled operator where tracing found x and x_scale good."""
        k = self.in_features
        if check:
            try:
                if torch.is_grad_enabled() and (x.requires_grad
                                                or getattr(x_scale, "requires_grad", False)):
                    self._refuse_gradient("x" if x.requires_grad else "x_scale")
                if not isinstance(x_scale, torch.Tensor) or x.shape[-1] != k \
                        or x.dtype != weight.dtype or not x.is_cuda \
                        or x.get_device() != weight.get_device() or not x.is_contiguous() \
                        or x_scale.dtype != torch.float32 or not self._scale_fits(x, x_scale) \
                        or x_scale.get_device() != x.get_device() or not x_scale.is_contiguous():
                    self._refuse(x, weight, x_scale)
            except (AttributeError, IndexError):  # no tensor, or a 0-d one (free when good)
                self._refuse_not_rows(x)
        runs = self._runs or self._prepare_on_first_call()
        m = x.numel() // k
        if m == 0:
            return x.new_empty((*x.shape[:-1], self.out_features), dtype=self.out_dtype) \
                if out is None else out
        run = runs[self._bucket(m)]
        if x.dim() == 2:
            return run(x, x_scale, weight, weight_scale, bias, out=out)
        rows = None if out is None else out.view(m, self.out_features)
        return run(x.view(m, k), self._rows_scale(x_scale, m), weight, weight_scale, bias,
                   out=rows).view(*x.shape[:-1], self.out_features)

    def _scale_fits(self, x: torch.Tensor, x_scale: torch.Tensor) -> bool:
        """Whether x_scale has the shape the layer's scales take for x: x.shape[:-1] + (1,)
        by rows, x.shape[:-1] + (K blocks,) by blocks, else one element (shape () or (1,))."""
        if self._scale_width:
            return x_scale.shape == (*x.shape[:-1], *self._scale_width)
        return x_scale.dim() <= 1 and x_scale.numel() == 1

    def _name(self) -> str:
        return f"Linear({self.in_features}, {self.out_features})"

    def _refuse_not_rows(self, x) -> None:
        """One line for an x that is not a tensor of rows (a scalar tensor, or no tensor)."""
        if isinstance(x, torch.Tensor):
            raise BadInput(f"{self._name()}: {_x_kind_problem(x, self.weight, self.in_features)}")
        raise BadInput(f"{self._name()}: input x is not a torch.Tensor ({type(x).__name__}): it "
                       f"takes a tensor whose last dimension is the {self.in_features} input "
                       "features")

    def _refuse_gradient(self, tensor: str) -> None:
        raise RuntimeError(f"{self._name()} is for inference: {tensor} requires a gradient, "
                           "which its kernels do not give (run under torch.no_grad() or "
                           "torch.inference_mode())")

    def _refuse(self, x: torch.Tensor, weight: torch.Tensor, x_scale=None) -> None:
        """One line naming what about x (or fp8's x_scale) is not what the layer takes: x's
        features and dtype, then x_scale, then where x lies."""
        problem = _x_kind_problem(x, weight, self.in_features) \
            or (self._scale_problem(x, x_scale) if self.is_fp8 else None) \
            or _x_place_problem(x, weight)
        raise BadInput(f"{self._name()}: {problem}")

    def _scale_problem(self, x: torch.Tensor, x_scale) -> str | None:
        """What about an fp8 layer's x_scale it does not take for x, in words; None where it
        takes it."""
        per = {"row": "one scale per row of x",
               "block": f"one scale per row of x per {FP8_BLOCK} features"}.get(self.scales)
        wanted = (f"torch.float32 of shape {(*x.shape[:-1], *self._scale_width)} ({per})" if per
                  else "torch.float32 of shape () or (1,) (one scale for x)")
        if x_scale is None:
            return f"x_scale is missing: an fp8 layer is called as layer(x, x_scale), {wanted}"
        if not isinstance(x_scale, torch.Tensor):
            return f"x_scale is not a torch.Tensor ({type(x_scale).__name__}): it takes {wanted}"
        if x_scale.dtype != torch.float32 or not self._scale_fits(x, x_scale):
            return f"x_scale is {x_scale.dtype} of shape {tuple(x_scale.shape)}, not {wanted}"
        if x_scale.device != x.device:
            return f"x_scale is on {x_scale.device}, not on x's {x.device}"
        if not x_scale.is_contiguous():
            return (f"x_scale has strides {x_scale.stride()}, not contiguous ones: pass "
                    "x_scale.contiguous()")
        return None

    def _weights_problem(self) -> str | None:
        """What about the weight (and an fp8 layer's weight_scale) is not what the layer was
        made for, in words; None where both are."""
        if tuple(self.weight.shape) != (self.out_features, self.in_features):
            return (f"weight has shape {tuple(self.weight.shape)}, not "
                    f"{(self.out_features, self.in_features)}")
        if not self.is_fp8:
            return None
        wanted, scale = self.shape.weight_scale_shape(), self.weight_scale
        if scale.dtype != torch.float32 or tuple(scale.shape) != wanted:
            return (f"weight_scale is {scale.dtype} of shape {tuple(scale.shape)}, not "
                    f"torch.float32 of shape {wanted}")
        if scale.device != self.weight.device:
            return f"weight_scale is on {scale.device}, not on the weight's {self.weight.device}"
        if not scale.is_contiguous():
            return (f"weight_scale has strides {scale.stride()}, not contiguous ones: pass "
                    "weight_scale.contiguous()")
        if not scale.is_meta and not bool(torch.isfinite(scale).all()):
            return ("weight_scale holds NaN or infinite values: the outputs they scale would be "
                    "NaN or infinite")
        return None

    def _prepare_on_first_call(self) -> list:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{self._name()}: call linear.prepare(model) (or the model once) "
                               "before capturing a CUDA graph: its kernels are measured or loaded "
                               "on the first call")
        prepare(self)
        return self._runs


def _device(device) -> torch.device | None:
    """`device` as torch takes it (None: torch's default), refused in one line where torch
    does not know it or it is a CUDA device that torch does not see."""
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise UsageError(f"Linear's device {device!r} is not one torch knows: "
                         f"{str(e).splitlines()[0]}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"Linear's device {device} is a CUDA GPU, and torch sees none here")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UsageError(f"Linear's device {device} is past the {torch.cuda.device_count()} "
                         "CUDA GPUs torch sees")
    return device


def _refuse_non_module(model, what: str) -> None:
    """One line where `model`, which linear.{what} walks, is not a torch module."""
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"linear.{what} takes a torch.nn.Module (a model or a Linear), not "
                         f"{type(model).__name__}")


def _name_of(dtype) -> str:
    """A torch dtype's name as workloads spell it (torch.bfloat16 -> "bfloat16")."""
    return str(dtype).removeprefix("torch.")


def _frozen(shape: tuple, dtype, device) -> torch.nn.Parameter:
    """An uninitialized parameter that asks for no gradient (the layer is for inference)."""
    return torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype), requires_grad=False)


def _scaling(weight_scale: torch.Tensor, out_features: int, in_features: int,
             asked: str | None = None) -> str:
    """The scales ("tensor", "row" or "block") a float32 weight scale's shape says, or `asked`
    where the shape fits it; else one line. A shape that two forms fit (1 x N, where N is also
    the count of 128-blocks of K and N one block: a row's and a block's) must be asked for."""
    shape = tuple(weight_scale.shape)
    blocks = (fp8_blocks(out_features), fp8_blocks(in_features))
    forms = {"tensor": ((), (1,)), "row": ((out_features, 1), (1, out_features)),
             "block": (blocks,)}
    fits = [form for form, shapes in forms.items() if shape in shapes] \
        if weight_scale.dtype == torch.float32 else []
    if asked in fits or (asked is None and len(fits) == 1):
        return asked or fits[0]
    if asked is None and fits:
        raise BadInput(f"Linear.from_float8: weight_scale of shape {shape} fits scales "
                       f"{' and '.join(fits)}: name one (from_float8(..., scales='{fits[-1]}'))")
    asked_for = f" for scales='{asked}'" if asked else ""
    raise BadInput(f"Linear.from_float8: weight_scale is {weight_scale.dtype} of shape {shape}, "
                   f"not torch.float32 of shape () (a scale per tensor), ({out_features}, 1) "
                   f"(one per output feature) or {blocks} (one per {FP8_BLOCK} x {FP8_BLOCK} "
                   f"block){asked_for}")


def _x_kind_problem(x: torch.Tensor, weight: torch.Tensor, in_features: int) -> str | None:
    """What about x's features or dtype the layer does not take, in words; else None."""
    if x.dim() == 0:
        return f"input x is a 0-d tensor: it takes a tensor whose last dimension is the " \
            f"{in_features} input features"
    if x.shape[-1] != in_features:
        return f"input x has {x.shape[-1]} features (shape {tuple(x.shape)}), not {in_features}"
    if x.dtype != weight.dtype:
        return f"input x is {x.dtype}, not the weight's {weight.dtype}"
    return None


def _x_place_problem(x: torch.Tensor, weight: torch.Tensor) -> str:
    """Where x lies (device, strides) that the layer does not take, in words (the last check:
    one of these is what is left)."""
    if not x.is_cuda:
        return (f"input x is on {x.device}, not on a CUDA GPU, where the layer's kernels run "
                "(the model and x: .cuda())")
    if x.device != weight.device:
        return f"input x is on {x.device}, not on the weight's {weight.device}"
    return f"input x has strides {x.stride()}, not contiguous ones: pass x.contiguous()"


def replace_linears(model: torch.nn.Module, **options) -> int:
    """Replace every nn.Linear of `model` whose dtype the kernels take (float16, bfloat16) by a
    Linear sharing its weights; returns how many were replaced."""
    _refuse_non_module(model, "replace_linears")
    replaced = 0
    for name, child in list(model.named_children()):
        if isinstance(child, torch.nn.Linear) and not isinstance(child, Linear) \
                and _name_of(child.weight.dtype) in LAYER_DTYPES:
            setattr(model, name, Linear.from_linear(child, **options))
            replaced += 1
        else:
            replaced += replace_linears(child, **options)
    return replaced


def prepare(model: torch.nn.Module, cache: Cache | None = None, say=print, warn=print, *,
            rpc_tracker: str | None = None, rpc_key: str | None = None) -> dict:
    """Give every Linear of `model` (or `model` itself) its kernels: each distinct (shape,
    buckets, max_tokens) is tuned or loaded once (portfolio.prepare) and shared. With a farm
    (`rpc_tracker` host:port and `rpc_key`, as searches name one, neither empty), what the
    cache lacks is tuned on the farm's servers (farm.prepare). Returns the LayerKernels by
    layer shape."""
    _refuse_non_module(model, "prepare")
    if (rpc_tracker is None) != (rpc_key is None):
        raise UsageError("a farm is named by both rpc_tracker (its tracker's host:port) and "
                         "rpc_key (the key its servers registered under)")
    if rpc_tracker is not None:
        farm.refuse_empty(rpc_tracker, rpc_key)
    layers = [model] if isinstance(model, Linear) else \
        [m for m in model.modules() if isinstance(m, Linear)]
    for layer in layers:
        problem = layer._weights_problem()
        if problem:
            raise BadInput(f"{layer._name()}: {problem}")
    groups: dict[tuple, list[Linear]] = {}
    for layer in layers:
        groups.setdefault((layer.buckets, layer.max_tokens), []).append(layer)
    found = {}
    for (buckets, max_tokens), members in groups.items():
        shapes = [m.shape for m in members]
        kernels = (farm.prepare(shapes, buckets, max_tokens, rpc_tracker, rpc_key, cache, say,
                                warn) if rpc_tracker is not None else
                   prepare_kernels(shapes, buckets, max_tokens, cache, say, warn))
        for member in members:
            member.kernels = kernels[member.shape]
        found.update(kernels)
    return found


def export(model: torch.nn.Module, directory: str) -> int:
    """Write the kernels every Linear of `model` runs (their cache entries: manifest and
    kernel.so) into `directory`, new or empty; `prepare(model, cache=Cache(directory))` in
    another process loads them from there (refusing, in one line each, entries made for
    another GPU, TVM or code version, which it measures again). Returns the entries written."""
    _refuse_non_module(model, "export")
    layers = [model] if isinstance(model, Linear) else \
        [m for m in model.modules() if isinstance(m, Linear)]
    unprepared = [layer._name() for layer in layers if layer.kernels is None]
    if unprepared:
        raise BadInput(f"{unprepared[0]} has no kernels yet: call linear.prepare(model) first")
    return export_entries([k.entry for layer in layers for k in layer.kernels.kernels], directory)
