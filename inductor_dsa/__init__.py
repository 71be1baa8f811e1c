"""inductor_dsa: fused DeepSeek-V4 sparse-attention (DSA) kernels for torch.compile.

Public API: ``indexer_logits``, ``indexer_topk``, ``logits_topk`` (see ``inductor_dsa.indexer``), the paged
(decode) forms ``paged_indexer_logits``, ``paged_indexer_topk``, ``paged_gather`` (see
``inductor_dsa.paged``), ``sparse_attention`` (see ``inductor_dsa.attention``) and formats in
``inductor_dsa.formats``. The float64 test oracles live in ``inductor_dsa.reference`` (not
imported by the package).
"""
from . import checks, formats
from .attention import sparse_attention
from .indexer import indexer_logits, indexer_topk, logits_topk
from .paged import paged_gather, paged_indexer_logits, paged_indexer_topk

__all__ = ["checks", "formats", "indexer_logits", "indexer_topk", "logits_topk", "paged_indexer_logits",
           "paged_indexer_topk", "paged_gather", "sparse_attention"]
__version__ = "0.1.0"

# torch.compile integration (issue 4): the graph pass and how to turn it on.
from . import lowering, patterns  # noqa: E402
from .lowering import backend, enabled, install, report, uninstall  # noqa: E402

__all__ += ["lowering", "patterns", "backend", "enabled", "install", "uninstall", "report"]
