"""Import a TVM module that parses TVMScript as it loads (`tvm.s_tir.tensor_intrin`: about 500
`T.prim_func`s), without the cost that Python's `inspect` adds to each parse.

TVMScript's `T.prim_func` calls `inspect.stack()`, which looks up the module of every frame on
the stack. While a module is being imported, some of those frames are the import machinery's
(`<frozen importlib._bootstrap>`), which belong to no module file, and `inspect.getmodule`
scans all of `sys.modules` again for each of them, on every call: ~35,000 scans of ~2,000
modules for `tvm.s_tir.tensor_intrin.cuda`, 25-35 s of its 30-40 s on a two-core machine (more
under pytest, whose stacks are deeper and whose sys.modules is larger). `import_module` answers
those frames' look-ups from the first scan's answer for the length of the import: the same
answer, since no module's file is named `<...>`, and the same IR; the import takes ~5 s.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from types import ModuleType

_PATCHING = threading.Lock()  # one import at a time swaps inspect.getmodule


def import_module(name: str) -> ModuleType:
    """importlib.import_module(name), with `inspect.getmodule`'s answer for a frame whose file
    is a pseudo-file (`<frozen ...>`, `<string>`) looked up once per file name."""
    if name in sys.modules:
        return sys.modules[name]
    with _PATCHING:
        original = inspect.getmodule
        answers: dict[str, ModuleType | None] = {}

        def getmodule(obj, _filename=None):
            if _filename and _filename.startswith("<") and inspect.isframe(obj):
                if _filename not in answers:
                    answers[_filename] = original(obj, _filename)
                return answers[_filename]
            return original(obj, _filename)

        inspect.getmodule = getmodule
        try:
            return importlib.import_module(name)
        finally:
            inspect.getmodule = original
