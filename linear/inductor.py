"""The layer's operators as inductor compiles them: a call of the layer into a buffer that
inductor allocates, as inductor calls cuBLAS for F.linear (`extern_kernels.mm(..., out=buf)`),
in place of its default for an operator of ours (a call through torch's dispatcher into Python,
which allocates the output there). Where the traced call must check x (check=True) the operator
stays, so that a bad x is refused in the eager call's line.

This is inductor's own lowering API (torch._inductor), which torch does not promise to keep:
where this torch's inductor lacks what it uses, the operators are compiled as before (inductor's
fallback for an operator) and `unavailable` says why. The lowerings are registered on the first
trace of an operator (its fake implementation calls `register`), not at import: importing
inductor takes seconds, which a process that never compiles should not pay."""

from __future__ import annotations

import torch

unavailable: str | None = None  # why the operators are not lowered here (None: they are)
_LOWERED: set[str] = set()  # the operators lowered so far, by name


def register(op: torch._ops.OpOverload, kernel, out_dtype) -> None:
    """Lower `op` (its schema: its tensors, x first and `weight` among them, then `bias`,
    `layer` and `check`) to a call kernel(tensors..., [bias], layer=layer, out=buffer) wherever
    check is False. The buffer is x's rows by the weight's rows, in out_dtype(layer, x's
    dtype). Once per operator; where inductor lacks what this uses, `unavailable` says why and
    nothing changes."""
    global unavailable
    if op.name() in _LOWERED or unavailable:
        return
    try:
        # imported outside any tracing mode: a fake implementation runs under them
        with torch.utils._python_dispatch._disable_current_modes():
            from torch._inductor import ir  # lazy: seconds to import (module docstring)
            from torch._inductor.lowering import (  # lazy, as ir
                fallback_handler, register_lowering)
            from torch._inductor.select_algorithm import extern_kernels  # lazy, as ir
            from torch._inductor.virtualized import V  # lazy, as ir
    except (ImportError, AttributeError) as error:
        unavailable = f"torch {torch.__version__}'s inductor: {error}"
        return
    name = op.name().replace("::", "_")
    setattr(extern_kernels, name, kernel)
    names = [argument.name for argument in op._schema.arguments]
    fallback = fallback_handler(op, add_to_fallback_set=False)

    def extern_call(bound: dict):
        """kernel(tensors..., [bias], layer=, out=) into a buffer of x's rows by the weight's."""
        tensors = [ir.ExternKernel.require_contiguous(bound[n]) for n in names[:-3]]
        if bound["bias"] is not None:
            tensors.append(ir.ExternKernel.require_contiguous(bound["bias"]))
        x, rows = tensors[0], bound["weight"].get_size()[0]
        layout = ir.FixedLayout(x.get_device(), out_dtype(bound["layer"], x.get_dtype()),
                                [*x.get_size()[:-1], rows])
        return ir.TensorBox.create(ir.ExternKernelOut(
            layout=layout, inputs=tensors, python_kernel_name=f"extern_kernels.{name}",
            kwargs={"layer": bound["layer"]}))

    def lowering(*args, **kwargs):
        """The extern call where the traced call is unchecked; else, or where this inductor
        refuses the call, or where it writes C++ (cpp_wrapper, AOTInductor: the call is
        Python), the operator itself."""
        global unavailable
        bound = dict(zip(names, args)) | kwargs
        python = not getattr(V.graph, "cpp_wrapper", False)
        if python and not bound.get("check", True) and not unavailable:
            try:
                return extern_call(bound)
            except Exception as error:  # noqa: BLE001  an inductor unlike this one's: said
                unavailable = f"torch {torch.__version__}'s inductor: {error}"
        return fallback(*args, **kwargs)

    register_lowering(op, type_promotion_kind=None)(lowering)
    _LOWERED.add(op.name())
