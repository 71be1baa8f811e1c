"""What the pass swapped (and, in debug mode, what it rejected and why).

Logs go to the ``inductor_dsa`` logger: ``TORCH_LOGS="+inductor_dsa"`` (torch._logging's switch for
any module) shows every swap and every rejection with its reason; ``INDUCTOR_DSA_DEBUG=1`` is the
shortcut that records the rejections in ``report()`` without a log handler.

A compilation served from Inductor's caches (FX graph / AOTAutograd cache hit) does not run the
pass, so every compilation that swapped something stores its swaps next to those caches, under
the hash of the generated code, and a cache hit of that code lists them again.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Optional

from ..kernels import autotune

log = logging.getLogger("inductor_dsa")

MAX_COMPILATIONS = 64
OP_PREFIX = "torch.ops.inductor_dsa."


def debug_enabled() -> bool:
    """Record rejections: ``INDUCTOR_DSA_DEBUG=1``, or the logger at DEBUG (``TORCH_LOGS="+inductor_dsa"``)."""
    return (os.environ.get("INDUCTOR_DSA_DEBUG", "0") not in ("", "0", "false", "False")
            or log.isEnabledFor(logging.DEBUG))


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
    cached: bool = False    # served from Inductor's caches: the swaps are those recorded when it was compiled


class Report(list):
    """A list of ``Compilation`` records, most recent last, and ``kernels``: the config each tuned
    kernel family ran with per shape bucket (kernels/autotune.py); ``str()`` renders both."""
    kernels: list = []

    @property
    def swaps(self):
        return [s for c in self for s in c.swaps]

    @property
    def rejections(self):
        return [r for c in self for r in c.rejections]

    def __str__(self):
        lines = []
        for c in self:
            lines.append(f"[{c.graph}] {len(c.swaps)} swap(s)" + (" (cache hit)" if c.cached else ""))
            lines += ["  " + str(s).replace("\n", "\n  ") for s in c.swaps]
            lines += ["  " + str(r) for r in c.rejections]
        if not lines:
            lines.append("inductor_dsa: no compilation has run the pass yet")
        if self.kernels:
            lines.append("kernel configs:")
            lines += ["  " + str(k).replace("\n", "\n  ") for k in self.kernels]
        return "\n".join(lines)


_lock = threading.Lock()
_history: collections.deque = collections.deque(maxlen=MAX_COMPILATIONS)
_compiling = threading.local()  # .comp: the compilation whose code Inductor generates next
counters: collections.Counter = collections.Counter()  # swaps made by the pass (cache hits not counted)


def begin(graph_name: str) -> Compilation:
    c = Compilation(graph_name)
    with _lock:
        _history.append(c)
    _compiling.comp = c
    return c


def _record_path(code: str) -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    return os.path.join(cache_dir(), "inductor_dsa", hashlib.sha256(code.encode()).hexdigest() + ".json")


def on_output_code(code: str) -> None:
    """Inductor hands every graph's generated code here (``GraphLowering.save_output_code``), on a
    compilation and on a cache hit. After our pass ran: store its swaps under the code's hash.
    Without it (a cache hit): list the swaps stored for this code, if any."""
    comp, _compiling.comp = getattr(_compiling, "comp", None), None
    if OP_PREFIX not in code:
        return
    if comp is not None and not all(s.op.split()[0] in code for s in comp.swaps):
        comp = None  # a pass run whose code was never generated (e.g. graph_only_backend): not this code's
    try:  # bookkeeping for report() only: it must never fail the compilation
        path = _record_path(code)
        if comp is not None:
            if comp.swaps:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), delete=False) as f:
                    json.dump(dict(graph=comp.graph, swaps=[dataclasses.asdict(s) for s in comp.swaps]), f)
                os.replace(f.name, path)
            return
        if not os.path.exists(path):
            return  # ops called by the model code itself, or a cache filled without this record
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError) as e:
        log.warning("inductor_dsa: swap record for cache hits unusable (%s); report() may miss swaps", e)
        return
    c = Compilation(rec["graph"], [Swap(**s) for s in rec["swaps"]], cached=True)
    with _lock:
        _history.append(c)
    for s in c.swaps:
        log.info("(cache hit) %s", s)


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
    log.debug("%s", rej)


def report() -> Report:
    """Compilations since the last ``reset()`` (at most the last 64), with their swaps, and the
    kernel configs used so far (shipped or tuned)."""
    with _lock:
        rep = Report(list(_history))
    rep.kernels = autotune.used()
    return rep


def reset() -> None:
    with _lock:
        _history.clear()
        counters.clear()


def _frames(stack_trace: str):
    """[(file name or None, line, function, code)] of a node's stack trace, outermost first."""
    lines = [l.strip() for l in stack_trace.strip().splitlines() if l.strip()]
    frames = []
    for i, l in enumerate(lines):
        if not l.startswith("File "):
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        code = "" if nxt.startswith("File ") or set(nxt) <= set("^~ ") else nxt
        try:  # File "x.py", line 12, in fn
            fpart, lpart, fnpart = [p.strip() for p in l.split(",", 2)]
            frames.append((os.path.basename(fpart[len("File "):].strip('"')), lpart.split()[-1], fnpart.split()[-1],
                           code))
        except ValueError:
            frames.append((None, None, l, code))
    if not frames and lines:
        frames = [(None, None, lines[-1], "")]
    return frames


def _named(frames):
    """The frames that have a file and a real function name (not <lambda>, <genexpr>, <module>)."""
    return [f for f in frames if f[0] is not None and not f[2].startswith("<")]


def source_line(node) -> str:
    """'file:line in fn: code' of the user frame that produced ``node``; when that frame is a
    lambda (or comprehension) the function it runs in is named too."""
    st: Optional[str] = node.meta.get("stack_trace") if node is not None else None
    frames = _frames(st) if st else []
    if not frames:
        return "<no stack trace>"
    path, line, fn, code = frames[-1]
    where = fn if path is None else f"{path}:{line} in {fn}"
    caller = _named(frames[:-1])
    if fn.startswith("<") and caller:
        where += f" called from {caller[-1][2]}"
    return f"{where}: {code}" if code else where


def graph_label(graph) -> str:
    """'fn (file)': the outermost named user function of the graph (the compiled function or
    module's forward), else the graph module's class name (e.g. "<lambda>")."""
    for n in graph.nodes:
        named = _named(_frames(n.meta.get("stack_trace") or ""))
        if named:
            return f"{named[0][2]} ({named[0][0]})"
    owner = graph.owning_module
    return type(owner).__name__ if owner is not None else "graph"
