"""Tracing a replacement and splicing it into an FX graph in front of an anchor node.

A ``Plan`` is a match that is proven and traced but not applied yet: the replacement (a plain
Python function over graph tensors and SymInts) traced with Inductor's ``fwd_only`` on the fake
values of its arguments. ``apply`` copies the traced nodes in front of the anchor, rewires the
anchor's users and leaves the old subgraph to dead-code elimination.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx as fx

from .reader import packet
from .shapes import Reject

aten = torch.ops.aten


@dataclass
class Plan:
    """A proven match, traced and ready to splice: analysis done, graph not touched yet.
    ``pre`` (tensor-parallel form): the local logits, spliced first."""
    anchor: fx.Node
    gm: fx.GraphModule
    args: list
    swap: object
    pre: Optional["Plan"] = None


class Call:
    """Base of a replacement object: its graph ``tensors`` (terms with ``.node`` and ``.dims``, no
    index repeated within one: a diagonal is rejected) then ``sym_nodes`` are the traced function's
    arguments; ``specialize`` guards the ``static`` size expressions of its form ``f``."""

    def __init__(self, form, atoms, tensors: list, sym_nodes: list):
        for t in tensors:
            if len(set(a for d in t.dims for a in d)) != sum(len(d) for d in t.dims):
                raise Reject(f"{t.node.name} repeats an index (a diagonal), not supported")
        self.f, self.A, self.tensors, self.sym_nodes = form, atoms, tensors, sym_nodes

    def specialize(self):
        """Install the guards the replacement relies on (call once every check has passed)."""
        for e in self.f.static:
            self.A.shapes.specialize(e)

    def args(self):
        return [t.node for t in self.tensors] + self.sym_nodes


def trace(fn, args):
    """``fn`` traced on the fake values of the nodes ``args`` (symbolic sizes stay symbolic)."""
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


def plan(anchor: fx.Node, repl, swap: object, pre: Optional[Plan] = None) -> Plan:
    """The plan of a replacement object (``args()``, callable; ``specialize()`` installs its guards)."""
    repl.specialize()
    args = repl.args()
    return Plan(anchor, trace(repl, args), args, swap, pre)


def apply(graph, plan: Plan) -> None:
    if plan.pre is not None:
        apply(graph, plan.pre)
    node = plan.anchor
    outs = _splice(graph, node, plan.gm, plan.args)
    if node.op == "call_function" and packet(node) is aten.topk:  # (values, indices) replace the getitems
        outs = list(outs)
        for u in list(node.users):
            u.replace_all_uses_with(outs[u.args[1]])
            graph.erase_node(u)
        graph.erase_node(node)
    else:
        node.replace_all_uses_with(outs)
    graph.eliminate_dead_code()
