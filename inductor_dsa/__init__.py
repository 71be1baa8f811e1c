"""inductor_dsa: fused DeepSeek-V4 sparse-attention (DSA) kernels for torch.compile.

Public API: ``indexer_logits``, ``indexer_topk`` (see ``inductor_dsa.indexer``), the paged
(decode) forms ``paged_indexer_logits``, ``paged_indexer_topk``, ``paged_gather`` (see
``inductor_dsa.paged``), the oracles in ``inductor_dsa.reference`` and formats in ``inductor_dsa.formats``.
"""
from . import formats, reference
from .indexer import indexer_logits, indexer_topk
from .paged import paged_gather, paged_indexer_logits, paged_indexer_topk

__all__ = ["formats", "reference", "indexer_logits", "indexer_topk", "paged_indexer_logits",
           "paged_indexer_topk", "paged_gather"]
__version__ = "0.1.0"
