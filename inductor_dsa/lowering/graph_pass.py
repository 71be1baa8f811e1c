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

import contextlib
import dataclasses
import functools
import hashlib
import operator
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from ..patterns.algebra import Reject, as_expr
from ..patterns.attention import NotCandidate, read_attention
from ..patterns.attention import render as render_attention
from ..patterns.indexer import IndexerForm, Term, read_logits, render
from ..patterns.interp import HANDLERS, SHAPE_OPS, Interpreter, packet
from ..patterns.paged import read_paged, render_paged
from . import report
from .attention import AttentionReplacement, op_dtype
from .paged import PagedReplacement
from .replace import Replacement, TopkSpec

aten = torch.ops.aten
PATTERN_TOPK = "indexer_topk"
PATTERN_LOGITS = "indexer_logits"
PATTERN_PAGED_TOPK = "paged_indexer_topk"
PATTERN_PAGED_LOGITS = "paged_indexer_logits"
PATTERN_TP_TOPK = "indexer_topk_all_reduce"
PATTERN_ATTENTION = "sparse_attention"
_CONTRACTIONS = (aten.bmm, aten.mm)
_GATHERS = (aten.index, aten.gather, aten.index_select)
_SEARCH = 48  # nodes walked when looking for a product near an anchor


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=4)
def source_hash(root: str = _PACKAGE) -> str:
    """sha256 of every source file that decides what the pass does (patterns, lowering,
    kernels, ops, fallback, checks), plus torch's version."""
    h = hashlib.sha256(torch.__version__.encode())
    for sub in ("patterns", "lowering", "kernels", "."):
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


# ---- splice -------------------------------------------------------------------------------------
def _trace(fn, args):
    from torch._inductor.pattern_matcher import fwd_only
    vals = [a.meta["val"] for a in args]
    fake_mode = torch._guards.detect_fake_mode(vals)
    ctx = fake_mode if fake_mode is not None else contextlib.nullcontext()
    with ctx:
        return fwd_only(fn, vals)


def _splice(graph: fx.Graph, anchor: fx.Node, gm: fx.GraphModule, args):
    env = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for ph, a in zip(placeholders, args):
        env[ph] = a
    bad = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "call_function")]
    if bad:
        raise Reject(f"replacement produced a {bad[0].op} node")
    outs = None
    stack = anchor.meta.get("stack_trace")
    with graph.inserting_before(anchor):
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                outs = fx.node.map_arg(n.args[0], lambda x: env[x])
                continue
            new = graph.node_copy(n, lambda x: env[x])
            if stack and "stack_trace" not in new.meta:
                new.meta["stack_trace"] = stack
            env[n] = new
    return outs


# ---- matching -----------------------------------------------------------------------------------
@dataclass
class Plan:
    """A proven match, traced and ready to splice: analysis done, graph not touched yet.
    ``pre`` (tensor-parallel form): the local logits, spliced first."""
    anchor: fx.Node
    gm: fx.GraphModule
    args: list
    swap: report.Swap
    pre: Optional["Plan"] = None


def _plan_topk(graph, node) -> Optional[Plan]:
    args = list(node.args) + [None] * (5 - len(node.args))
    x, k = args[0], args[1] if args[1] is not None else node.kwargs.get("k")
    dim = args[2] if args[2] is not None else node.kwargs.get("dim", -1)
    largest = args[3] if args[3] is not None else node.kwargs.get("largest", True)
    if not largest:
        raise Reject("topk(largest=False) selects the smallest scores")
    uses = set()
    for u in node.users:
        if u.op == "call_function" and u.target is operator.getitem and u.args[1] in (0, 1):
            uses.add(u.args[1])
        else:
            raise Reject(f"the top-k result is used whole by {u.name}")
    if not uses:
        return None
    interp = Interpreter(graph)
    tv = interp.ev(x)
    form = read_logits(tv, interp, key_dim=dim % len(tv.dims))
    spec = TopkSpec(k, 0 in uses, 1 in uses)
    kval = k.meta.get("val") if isinstance(k, fx.Node) else k
    used = " and ".join(w for i, w in ((0, "values"), (1, "indices")) if i in uses)
    if form.collective is not None:
        return _plan_topk_tp(graph, node, form, interp, spec, (as_expr(kval), used))
    note = "the logits are also used elsewhere: they stay computed there" if len(x.users) > 1 else ""
    key = read_paged(interp, form)
    pattern = PATTERN_TOPK if key is None else PATTERN_PAGED_TOPK
    repl = (Replacement(form, interp.A, spec, graph) if key is None
            else PagedReplacement(form, interp.A, key, spec, graph))
    repl.specialize()
    gm = _trace(repl, repl.args())
    region = render(form, interp.A, pattern, (as_expr(kval), used))
    swap = report.Swap(pattern, f"torch.ops.inductor_dsa.{pattern}", _stack(node),
                       region if key is None else render_paged(region, key), note)
    return Plan(node, gm, repl.args(), swap)


def _plan_topk_tp(graph, node, form: IndexerForm, interp, spec: TopkSpec, topk_info) -> Plan:
    """Tensor-parallel indexer: mask(all_reduce_sum(local head-sum)) -> topk.

    The all_reduce input (this rank's partial scores) becomes ``indexer_logits`` over all keys,
    in its own layout and dtype; the collective and its wait stay exactly as they were; the top-k
    of the masked reduced scores becomes ``logits_topk`` over the mask's per-row ranges.
    """
    if read_paged(interp, form) is not None:
        raise Reject("a paged (byte cache) key summed across ranks: not supported")
    A = interp.A
    coll = form.collective
    local_node, local_dims = coll.x.origin, A.flat_dims(coll.x.origin_dims)
    reduced = Term(coll.origin, A.flat_dims(coll.origin_dims), coll.origin.meta["val"].dtype)
    every = {A.find(a) for a in form.rows + form.keys}
    key_dim = None
    for i, d in enumerate(local_dims):
        if tuple(A.find(a) for a in d) == tuple(A.find(a) for a in form.keys):
            key_dim = i
    for dims in (local_dims, reduced.dims):
        flat = [A.find(a) for d in dims for a in d]
        if len(flat) != len(set(flat)) or set(flat) != every:
            raise Reject("the all_reduce input is not indexed by exactly the rows and keys of the scores")
    if key_dim is None:
        raise Reject("the all_reduce input has no dim made of exactly the key index")
    local = dataclasses.replace(form, out_dims=local_dims, key_dim=key_dim,
                                out_dtype=local_node.meta["val"].dtype, fill=None, ranges=None,
                                mask_leaves=(), additive=False, collective=None, key_symbol=None)
    repl_l = Replacement(local, A, None, graph)
    repl_t = Replacement(form, A, spec, graph, scores=reduced)
    repl_l.specialize()
    repl_t.specialize()
    pre = Plan(local_node, _trace(repl_l, repl_l.args()), repl_l.args(), None)
    swap = report.Swap(PATTERN_TP_TOPK, "torch.ops.inductor_dsa.indexer_logits + all_reduce (kept) + "
                       "torch.ops.inductor_dsa.logits_topk", _stack(node),
                       render(form, A, PATTERN_TP_TOPK, topk_info))
    return Plan(node, _trace(repl_t, repl_t.args()), repl_t.args(), swap, pre)


def _plan_logits(graph, node) -> Plan:
    interp = Interpreter(graph)
    tv = interp.ev(node)
    if tv.dtype is None or not tv.dtype.is_floating_point:
        raise Reject("not a floating-point tensor")
    form = read_logits(tv, interp, key_dim=None)
    if form.collective is not None:
        raise Reject("logits summed across ranks: the local head-sum before the all_reduce is the match")
    key = read_paged(interp, form)
    pattern = PATTERN_LOGITS if key is None else PATTERN_PAGED_LOGITS
    repl = (Replacement(form, interp.A, None, graph) if key is None
            else PagedReplacement(form, interp.A, key, None, graph))
    repl.specialize()
    gm = _trace(repl, repl.args())
    region = render(form, interp.A, pattern)
    swap = report.Swap(pattern, f"torch.ops.inductor_dsa.{pattern}", _stack(node),
                       region if key is None else render_paged(region, key))
    return Plan(node, gm, repl.args(), swap)


def _output_chain_end(node):
    """The last node of the single-user chain of layout ops and casts after ``node`` (slices,
    expands and repeats stay with the user: they change which values exist)."""
    while len(node.users) == 1:
        (u,) = node.users
        if (u.op != "call_function" or packet(u) not in SHAPE_OPS or u.args[0] is not node
                or packet(u) in (aten.slice, aten.expand, aten.repeat)):
            break
        node = u
    return node


def _plan_attention(graph, node) -> Plan:
    interp = Interpreter(graph, max_depth=24)
    anchor = _output_chain_end(node)
    tv = interp.ev(anchor)
    form = read_attention(tv, interp)
    repl = AttentionReplacement(form, interp.A, graph)
    repl.specialize()
    gm = _trace(repl, repl.args())
    swap = report.Swap(PATTERN_ATTENTION, "torch.ops.inductor_dsa.sparse_attention", _stack(node),
                       render_attention(form, interp.A, op_dtype(form)))
    return Plan(anchor, gm, repl.args(), swap)


def _apply(graph, plan: Plan) -> None:
    if plan.pre is not None:
        _apply(graph, plan.pre)
    node = plan.anchor
    outs = _splice(graph, node, plan.gm, plan.args)
    if _is(node, aten.topk):  # (values, indices) replace the getitems
        outs = list(outs)
        for u in list(node.users):
            u.replace_all_uses_with(outs[u.args[1]])
            graph.erase_node(u)
        graph.erase_node(node)
    else:
        node.replace_all_uses_with(outs)
    graph.eliminate_dead_code()


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
        plan, why = _try(_plan_topk, graph, node)
        if plan is not None:
            _apply(graph, plan)
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
        if packet(node) not in HANDLERS:
            continue
        if any(_is(d, aten.topk) for d in _downstream(node, 16)):
            continue  # a top-k chain that did not match stays untouched as a whole
        plan, why = _try(_plan_logits, graph, node)
        if plan is not None:
            _apply(graph, plan)
            report.record_swap(comp, plan.swap)
            swaps += 1
        else:
            reasons[node] = why
    # 3. sparse attention: outputs P @ gathered rows, last first
    for node in reversed(list(graph.nodes)):
        if node._erased or not _is(node, *_CONTRACTIONS) or not _upstream_has_product(node, 16, _GATHERS):
            continue
        plan, why = _try(_plan_attention, graph, node)
        if plan is not None:
            _apply(graph, plan)
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
