"""`Linear`: nn.Linear's drop-in for inference, running the kernel its bucket of M measured
fastest (linear/portfolio.py), at F.linear's call cost.

    model = transformers.AutoModelForCausalLM.from_config(config).cuda().bfloat16()
    linear.replace_linears(model)      # every nn.Linear becomes a Linear sharing its weights
    linear.prepare(model)              # tuned once per (shape, bucket, GPU), then from the cache
    logits = model(input_ids).logits   # eager, torch.compile'd or in a CUDA graph

Eager calls go straight to the kernel (a TVM function call with torch tensors: tvm_ffi takes
torch's current stream). Under torch.compile the layer is one operator,
torch.ops.tvm_explorer.linear, with a fake implementation for any M, so that compiled graphs and
CUDA graphs hold the kernel itself; where the bucket of the traced rows (or every bucket) chose
torch's F.linear, the layer is traced as F.linear, which the compiler handles as stock layers.
"""

from __future__ import annotations

import weakref

import torch

from tuning.loader import BadInput

from .buckets import Bucket, buckets_from_edges
from .cache import Cache, export_entries
from .candidates import LAYER_DTYPES, TORCH, LayerShape
from .portfolio import LayerKernels, prepare as prepare_kernels

DEFAULT_MAX_TOKENS = 4096
_LAYERS: "weakref.WeakValueDictionary[int, Linear]" = weakref.WeakValueDictionary()

_library = torch.library.Library("tvm_explorer", "FRAGMENT")
_library.define("linear(Tensor x, Tensor weight, Tensor? bias, int layer) -> Tensor")


def _linear_cuda(x, weight, bias, layer: int):
    """The operator on CUDA tensors: the layer's own eager call."""
    return _LAYERS[layer].call(x, weight, bias)


def _linear_fake(x, weight, bias, layer: int):
    """The output's shape and dtype for any M, for tracing (fake and meta tensors)."""
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


_library.impl("linear", _linear_cuda, "CUDA")
torch.library.register_fake("tvm_explorer::linear", _linear_fake, lib=_library)


class Linear(torch.nn.Module):
    """y = x W^T + b for x of any leading shape and any number of rows M, inference only. Its
    weight (out_features x in_features) and bias are a state_dict's like nn.Linear's; its
    kernels come from `prepare` (on the first call if not before), one per bucket of M."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=torch.bfloat16, buckets: tuple[Bucket, ...] | None = None,
                 max_tokens: int = DEFAULT_MAX_TOKENS):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(
            torch.empty((out_features, in_features), device=device, dtype=dtype),
            requires_grad=False)
        self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype),
                                       requires_grad=False) if bias else None
        self.buckets = buckets or buckets_from_edges()
        self.max_tokens = max_tokens
        self.kernels = None
        self._key = id(self)  # the operator's handle on this layer
        _LAYERS[self._key] = self

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, **options) -> "Linear":
        """A Linear sharing `linear`'s weight and bias tensors."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    device="meta", dtype=linear.weight.dtype, **options)
        layer.weight = torch.nn.Parameter(linear.weight.detach(), requires_grad=False)
        if linear.bias is not None:
            layer.bias = torch.nn.Parameter(linear.bias.detach(), requires_grad=False)
        return layer

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, buckets="
                + ",".join(b.label().removeprefix("M=") for b in self.buckets))

    @property
    def shape(self) -> LayerShape:
        return LayerShape(self.out_features, self.in_features, str(self.weight.dtype).removeprefix(
            "torch."))

    @property
    def kernels(self) -> LayerKernels | None:
        """The layer's kernels, one per bucket (None until `prepare`)."""
        return self._kernels

    @kernels.setter
    def kernels(self, kernels: LayerKernels | None) -> None:
        """Set the kernels, and what the calls read of them: each bucket's run, the bucket of
        every M below the open bucket's first, and which buckets (all?) run torch's F.linear."""
        self._kernels = kernels
        self._runs = [k.run for k in kernels.kernels] if kernels else None
        self._bucket_of = [kernels.table.index(m) if m else 0
                           for m in range(self.buckets[-1].first)] if kernels else None
        self._torch_runs = [k.candidate.rung == TORCH for k in kernels.kernels] if kernels \
            else None
        self._compiles_as_linear = bool(kernels and all(self._torch_runs))

    def _bucket(self, m: int) -> int:
        """The index of M's bucket (m >= 1; the kernels set)."""
        table = self._bucket_of
        return table[m] if m < len(table) else len(self._runs) - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return self._traced(x)
        return self.call(x, self.weight, self.bias)

    def _traced(self, x: torch.Tensor) -> torch.Tensor:
        """The layer as torch.compile sees it: F.linear where the rows' bucket runs torch's
        (every bucket, or M's where M is fixed at tracing), which the compiler then handles
        as it does stock layers; else the operator, which runs M's kernel at each call."""
        m = x.numel() // self.in_features
        if self._compiles_as_linear or (isinstance(m, int) and self._runs is not None
                                        and self._torch_runs[self._bucket(max(m, 1))]):
            return torch.nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.tvm_explorer.linear(x, self.weight, self.bias, self._key)

    def call(self, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
        """The eager call: check x, pick M's bucket's kernel and run it (bias included). Kept to
        few Python steps: this is the layer's whole cost on the CPU."""
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(f"{self._name()} is for inference: its kernels have no gradient "
                               "(run under torch.no_grad() or torch.inference_mode())")
        k = self.in_features
        if x.shape[-1] != k or x.dtype != weight.dtype or not x.is_cuda \
                or x.get_device() != weight.get_device() or not x.is_contiguous():
            self._refuse(x, weight)
        runs = self._runs or self._prepare_on_first_call()
        m = x.numel() // k
        if m == 0:
            return x.new_empty((*x.shape[:-1], self.out_features))
        run = runs[self._bucket(m)]
        if x.dim() == 2:
            return run(x, weight, bias)
        return run(x.view(m, k), weight, bias).view(*x.shape[:-1], self.out_features)

    def _name(self) -> str:
        return f"Linear({self.in_features}, {self.out_features})"

    def _refuse(self, x: torch.Tensor, weight: torch.Tensor) -> None:
        """One line naming what about x is not what the layer takes."""
        if x.shape[-1] != self.in_features:
            problem = f"has {x.shape[-1]} features (shape {tuple(x.shape)}), not {self.in_features}"
        elif x.dtype != weight.dtype:
            problem = f"is {x.dtype}, not the weight's {weight.dtype}"
        elif not x.is_cuda or x.device != weight.device:
            problem = f"is on {x.device}, not on the weight's {weight.device}"
        else:
            problem = f"has strides {x.stride()}, not contiguous ones: pass x.contiguous()"
        raise BadInput(f"{self._name()}: input x {problem}")

    def _prepare_on_first_call(self) -> list:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{self._name()}: call linear.prepare(model) (or the model once) "
                               "before capturing a CUDA graph: its kernels are measured or loaded "
                               "on the first call")
        prepare(self)
        return self._runs


def replace_linears(model: torch.nn.Module, **options) -> int:
    """Replace every nn.Linear of `model` whose dtype the kernels take (float16, bfloat16) by a
    Linear sharing its weights; returns how many were replaced."""
    replaced = 0
    for name, child in list(model.named_children()):
        if isinstance(child, torch.nn.Linear) and not isinstance(child, Linear) \
                and str(child.weight.dtype).removeprefix("torch.") in LAYER_DTYPES:
            setattr(model, name, Linear.from_linear(child, **options))
            replaced += 1
        else:
            replaced += replace_linears(child, **options)
    return replaced


def prepare(model: torch.nn.Module, cache: Cache | None = None, say=print, warn=print) -> dict:
    """Give every Linear of `model` (or `model` itself) its kernels: each distinct (shape,
    buckets, max_tokens) is tuned or loaded once (portfolio.prepare) and shared. Returns the
    LayerKernels by layer shape."""
    layers = [model] if isinstance(model, Linear) else \
        [m for m in model.modules() if isinstance(m, Linear)]
    for layer in layers:
        if tuple(layer.weight.shape) != (layer.out_features, layer.in_features):
            raise BadInput(f"{layer._name()}: weight has shape {tuple(layer.weight.shape)}, not "
                           f"{(layer.out_features, layer.in_features)}")
    groups: dict[tuple, list[Linear]] = {}
    for layer in layers:
        groups.setdefault((layer.buckets, layer.max_tokens), []).append(layer)
    found = {}
    for (buckets, max_tokens), members in groups.items():
        kernels = prepare_kernels([m.shape for m in members], buckets, max_tokens, cache, say,
                                  warn)
        for member in members:
            member.kernels = kernels[member.shape]
        found.update(kernels)
    return found


def export(model: torch.nn.Module, directory: str) -> int:
    """Write the kernels every Linear of `model` runs (their cache entries: manifest and
    kernel.so) into `directory`, new or empty; `prepare(model, cache=Cache(directory))` in
    another process loads them from there (refusing, in one line each, entries made for
    another GPU, TVM or code version, which it measures again). Returns the entries written."""
    layers = [model] if isinstance(model, Linear) else \
        [m for m in model.modules() if isinstance(m, Linear)]
    unprepared = [layer._name() for layer in layers if layer.kernels is None]
    if unprepared:
        raise BadInput(f"{unprepared[0]} has no kernels yet: call linear.prepare(model) first")
    return export_entries([k.entry for layer in layers for k in layer.kernels.kernels], directory)
