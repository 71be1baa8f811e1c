"""The Inductor graph pass: find DSA indexer subgraphs and swap in the fused ops.

Runs as ``torch._inductor.config.joint_custom_pre_pass`` (on inference graphs too), on
the decomposed, functional aten graph, before Inductor's own pattern passes.

1. Every ``aten.topk`` is an anchor: if its input provably is the masked indexer logits
   (``patterns.indexer.read_logits``) the top-k becomes ``inductor_dsa.indexer_topk``. If it is
   the masked ``all_reduce`` sum of this rank's partial logits (tensor-parallel heads), the
   partial logits become ``inductor_dsa.indexer_logits``, the collective stays, and the top-k
   becomes ``inductor_dsa.logits_topk``.
2. Then, downstream of every relu(q.k) that is left, the last node that provably is the
   indexer logits (and does not feed a top-k that was rejected) becomes
   ``inductor_dsa.indexer_logits``.
   In 1 and 2, keys gathered from a paged MXFP4/FP8 cache through a block table
   (``patterns.paged.read_paged``) make it ``paged_indexer_topk`` / ``paged_indexer_logits``.
3. Every bmm/mm with a gather (advanced indexing, gather, index_select) a few nodes upstream
   is a candidate output of sparse attention (``patterns.attention.read_attention``); the
   output, extended through the shape ops and casts that follow it, becomes
   ``inductor_dsa.sparse_attention``.
Everything else is left exactly as it was.
"""
from __future__ import annotations

import functools
import hashlib
import os
from typing import Optional

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from ..patterns import indexer as indexer_pattern
from ..patterns.attention import NotCandidate
from ..symbolic import Reject, packet
from ..symbolic import splice
from . import report
from .attention import plan_attention
from .indexer import plan_logits, plan_topk

aten = torch.ops.aten
_CONTRACTIONS = (aten.bmm, aten.mm)
_GATHERS = (aten.index, aten.gather, aten.index_select)
_SEARCH = 48  # nodes walked when looking for a product near an anchor


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=4)
def source_hash(root: str = _PACKAGE) -> str:
    """sha256 of every source file that decides what the pass does (symbolic, patterns,
    lowering, kernels, ops, fallback, checks, limits), plus torch's version."""
    h = hashlib.sha256(torch.__version__.encode())
    for sub in ("symbolic", "patterns", "lowering", "kernels", "."):
        d = os.path.join(root, sub)
        for name in sorted(os.listdir(d)):
            if name.endswith(".py"):
                with open(os.path.join(d, name), "rb") as f:
                    h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()


class IndexerPass(CustomGraphPass):
    """``CustomGraphPass`` whose uuid hashes our sources, so the FX graph cache stays on."""

    def __call__(self, graph: fx.Graph) -> None:
        run(graph)

    def uuid(self) -> Optional[str]:
        return "inductor_dsa:" + source_hash()


class ChainedPass(CustomGraphPass):
    """Ours, then a pass that was installed before us."""

    def __init__(self, first: CustomGraphPass, then):
        self.first, self.then = first, then

    def __call__(self, graph: fx.Graph) -> None:
        self.first(graph)
        self.then(graph)

    def uuid(self):
        other = self.then.uuid() if hasattr(self.then, "uuid") else None
        return None if other is None else (self.first.uuid(), other)


# ---- helpers ----------------------------------------------------------------------------------
def _is(node, *packets) -> bool:
    return node.op == "call_function" and packet(node) in packets


def _is_relu(node) -> bool:
    if _is(node, aten.relu):
        return True
    if _is(node, aten.clamp_min):
        return node.args[1] == 0
    if _is(node, aten.clamp):
        lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
        hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
        return lo == 0 and hi is None
    return False


def _upstream_has_product(node, limit=_SEARCH, ops=_CONTRACTIONS) -> bool:
    """Breadth-first: is there one of ``ops`` (bmm/mm) among the nearest ``limit`` tensor ancestors?"""
    seen, todo = set(), [node]
    while todo and len(seen) < limit:
        x = todo.pop(0)
        if x in seen:
            continue
        seen.add(x)
        if _is(x, *ops):
            return True
        todo += [i for i in x.all_input_nodes if isinstance(i.meta.get("val"), torch.Tensor)]
    return False


def _downstream(node, limit=_SEARCH):
    seen, todo, out = set(), [node], []
    while todo and len(seen) < limit:
        x = todo.pop(0)
        if x in seen:
            continue
        seen.add(x)
        out.append(x)
        todo += list(x.users)
    return out


def _is_training(graph: fx.Graph) -> bool:
    return any(n.op == "placeholder" and str(n.target).startswith("tangents") for n in graph.nodes)


def _stack(node):
    return report.source_line(node)


# ---- matching -----------------------------------------------------------------------------------
def _strict() -> bool:
    return os.environ.get("INDUCTOR_DSA_STRICT", "0") not in ("", "0")


def _try(planner, graph, node):
    """(plan or None, reason or None). Errors in analysis never reach the user's compile."""
    try:
        return planner(graph, node), None
    except NotCandidate:
        return None, None
    except Reject as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - a bug in a matcher must not break compilation
        if _strict():
            raise
        report.log.warning("inductor_dsa: internal error while matching %s: %r (left unchanged)",
                           node.name, e)
        return None, f"internal error: {e!r}"


def run(graph: fx.Graph) -> int:
    """Apply the pass to ``graph``; returns the number of swaps."""
    comp = report.begin(report.graph_label(graph))
    if _is_training(graph):
        for n in graph.nodes:
            if _is(n, aten.topk) and _upstream_has_product(n):
                report.record_rejection(comp, report.Rejection(
                    n.name, _stack(n), "training (joint forward/backward) graph: the fused ops have no backward"))
        return 0
    swaps = 0
    # 1. top-k anchors
    for node in list(graph.nodes):
        if node._erased or not _is(node, aten.topk):
            continue
        plan, why = _try(plan_topk, graph, node)
        if plan is not None:
            splice.apply(graph, plan)
            report.record_swap(comp, plan.swap)
            swaps += 1
        elif why is not None and _upstream_has_product(node):
            report.record_rejection(comp, report.Rejection(node.name, _stack(node), why))
    # 2. logits anchors downstream of relu(q.k)
    seeds = [n for n in graph.nodes if _is_relu(n) and _upstream_has_product(n.args[0], 8)]
    cands = set()
    for s in seeds:
        cands.update(_downstream(s))
    reasons = {}
    for node in reversed(list(graph.nodes)):
        if node._erased or node not in cands or not node.users or node.op != "call_function":
            continue
        if packet(node) not in indexer_pattern.READS:
            continue
        if any(_is(d, aten.topk) for d in _downstream(node, 16)):
            continue  # a top-k chain that did not match stays untouched as a whole
        plan, why = _try(plan_logits, graph, node)
        if plan is not None:
            splice.apply(graph, plan)
            report.record_swap(comp, plan.swap)
            swaps += 1
        else:
            reasons[node] = why
    # 3. sparse attention: outputs P @ gathered rows, last first
    for node in reversed(list(graph.nodes)):
        if node._erased or not _is(node, *_CONTRACTIONS) or not _upstream_has_product(node, 16, _GATHERS):
            continue
        plan, why = _try(plan_attention, graph, node)
        if plan is not None:
            splice.apply(graph, plan)
            report.record_swap(comp, plan.swap)
            swaps += 1
        elif why is not None:
            report.record_rejection(comp, report.Rejection(node.name, _stack(node), why))
    # 4. debug: relu(q.k) that is still there
    if report.debug_enabled():
        for s in seeds:
            if s._erased:
                continue
            near = [d for d in _downstream(s, 12) if d in reasons and _is(d, aten.sum, aten.bmm, aten.mm)]
            why = reasons[near[0]] if near else next(
                (reasons[d] for d in _downstream(s, 12) if d in reasons), "relu(q.k) is not summed over heads by weights")
            if any(_is(d, aten.topk) for d in _downstream(s, 16)):
                continue  # already reported at its top-k
            report.record_rejection(comp, report.Rejection(s.name, _stack(s), why))
    return swaps
