"""What the pass swapped (and, with INDUCTOR_DSA_DEBUG=1, what it rejected and why)."""
from __future__ import annotations

import collections
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Optional

log = logging.getLogger("inductor_dsa")

MAX_COMPILATIONS = 64


def debug_enabled() -> bool:
    return os.environ.get("INDUCTOR_DSA_DEBUG", "0") not in ("", "0", "false", "False")


@dataclass
class Swap:
    pattern: str        # e.g. "indexer_topk"
    op: str             # e.g. "torch.ops.inductor_dsa.indexer_topk"
    source: str         # the user's line, from node.meta["stack_trace"]
    region: str = ""    # the rewritten region, normalised (see patterns.indexer.render)
    note: str = ""

    def __str__(self):
        s = f"swapped {self.pattern} -> {self.op} at {self.source}"
        if self.region:
            s += "\n    " + self.region.replace("\n", "\n    ")
        return s + (f"\n    note: {self.note}" if self.note else "")


@dataclass
class Rejection:
    anchor: str         # the node near which a candidate was seen
    source: str
    reason: str

    def __str__(self):
        return f"rejected near {self.anchor} at {self.source}: {self.reason}"


@dataclass
class Compilation:
    graph: str
    swaps: list = field(default_factory=list)
    rejections: list = field(default_factory=list)


class Report(list):
    """A list of ``Compilation`` records, most recent last; ``str()`` renders it."""

    @property
    def swaps(self):
        return [s for c in self for s in c.swaps]

    @property
    def rejections(self):
        return [r for c in self for r in c.rejections]

    def __str__(self):
        lines = []
        for c in self:
            lines.append(f"[{c.graph}] {len(c.swaps)} swap(s)")
            lines += ["  " + str(s).replace("\n", "\n  ") for s in c.swaps]
            lines += ["  " + str(r) for r in c.rejections]
        return "\n".join(lines) if lines else "inductor_dsa: no compilation has run the pass yet"


_lock = threading.Lock()
_history: collections.deque = collections.deque(maxlen=MAX_COMPILATIONS)
counters: collections.Counter = collections.Counter()


def begin(graph_name: str) -> Compilation:
    c = Compilation(graph_name)
    with _lock:
        _history.append(c)
    return c


def record_swap(c: Compilation, swap: Swap) -> None:
    with _lock:
        c.swaps.append(swap)
        counters[swap.pattern] += 1
    log.info("%s", swap)


def record_rejection(c: Compilation, rej: Rejection) -> None:
    if not debug_enabled():
        return
    with _lock:
        c.rejections.append(rej)
    log.info("%s", rej)


def report() -> Report:
    """Compilations since the last ``reset()`` (at most the last 64), with their swaps."""
    with _lock:
        return Report(list(_history))


def reset() -> None:
    with _lock:
        _history.clear()
        counters.clear()


def source_line(node) -> str:
    """'file:line in fn: code' of the user frame that produced ``node``."""
    st: Optional[str] = node.meta.get("stack_trace") if node is not None else None
    if not st:
        return "<no stack trace>"
    lines = [l for l in st.strip().splitlines() if l.strip()]
    loc, code = None, ""
    for i, l in enumerate(lines):
        if l.strip().startswith("File "):
            loc = l.strip()
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            code = "" if nxt.startswith("File ") or set(nxt) <= set("^~ ") else nxt
    if loc is None:
        return lines[-1].strip()
    # File "x.py", line 12, in fn
    try:
        fpart, lpart, fnpart = [p.strip() for p in loc.split(",", 2)]
        path = fpart[len("File "):].strip('"')
        where = f"{os.path.basename(path)}:{lpart.split()[-1]} in {fnpart.split()[-1]}"
    except ValueError:
        where = loc
    return f"{where}: {code}" if code else where
