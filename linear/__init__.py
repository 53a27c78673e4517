"""Linear layers a model can use: any M, the kernel of M's bucket chosen by measurement and
cached on disk, called at F.linear's cost (see module.py)."""

from .buckets import Bucket, buckets_from_edges, buckets_from_text
from .cache import Cache
from .candidates import LayerShape
from .module import Linear, export, prepare, replace_linears

__all__ = ["Bucket", "Cache", "LayerShape", "Linear", "buckets_from_edges", "buckets_from_text",
           "export", "prepare", "replace_linears"]
