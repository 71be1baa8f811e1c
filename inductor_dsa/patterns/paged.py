"""The paged decode indexer: the key operand is decoded from a paged byte cache.

``read_logits`` (patterns/indexer.py) proves the weighted-ReLU chain with some key k[b, j, d].
Here we prove that k is exactly the key the paged ops read (docs/semantics.md, "Paged key cache")::

    page  = block_table[b, j // 64],  r = j % 64,  cache bytes of a page row-major
    mxfp4: k[b, j, d] = E2M1[nibble(d % 2) of byte(page, A*r + d // 2)] * 2^(byte(page, 64*A + S*r + d // 32) - 127)
    fp8:   k[b, j, d] = e4m3(byte(page, D*r + d)) * f32(bytes(page, 64*D + 4*r .. +3))

with A, S = D/2, D/32 (nibble 0 = low, lower index), and that the mask is ``j < context_lens[b]``.

The proof has two halves. Positions are symbolic: the interpreter reads the gather, slices and
views as index expressions (``symbolic.values.substitute``), and every byte the key reads must be the
address above, shown by exact integer rewriting of floor/mod of mixed-radix indices
(``_digits``). Values are exhaustive: the elementwise program between the bytes and k (LUT,
shifts, masks, exp2/pow, casts, as the real aten ops) is run on every data byte, every scale
byte 0..254 and both nibble positions and must equal the format's decode exactly (fp8: the
program must be e4m3(byte) times the fp32 scale word, and the e4m3 part is run on all 256
bytes). Scale byte 0xFF (NaN in E8M0) is not checked: eager's exp2(128) is inf, the op's NaN.
A decode table that is a graph input (values unknown) is proven structurally instead
(``_check_mxfp4_table``) and passed to the ops as their ``table`` operand.
Any doubt raises ``Reject``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import sympy
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .. import formats
from ..symbolic import Atoms, Elem, Interpreter, Reject, as_expr, packet, run_prog
from .forms import Term, exact_source
from .indexer import IndexerForm

aten = torch.ops.aten
PAGE = formats.PAGE_ROWS
_SIGNED_E2M1 = torch.tensor(formats.E2M1_VALUES + tuple(-v for v in formats.E2M1_VALUES), dtype=torch.float64)


@dataclass
class PagedKey:
    q: Term                     # bf16 / fp16 / fp32 q (exact upcasts peeled)
    cache: fx.Node              # uint8, pages on dim 0, a page's bytes row-major in the rest
    table: fx.Node              # int [B, max_pages]
    context_lens: Optional[fx.Node]  # int [B]; None: no mask (every row of every page visible)
    fmt: str
    flavor: str
    head_dim: int
    lut: Optional[fx.Node] = None    # MXFP4 codes decoded through this graph-input table (16 floats)


# ---- mixed-radix integer rewriting ------------------------------------------------------------
def _digits(num, m, A: Atoms):
    """(floor(num / m), num mod m) when num = m*H + L with 0 <= L < m provable term by term
    (L: non-negative multiples of index atoms of known size and a constant), else None."""
    m = sympy.sympify(m)
    if not (m.is_Integer and m > 0):
        return None
    m = int(m)
    hi, lo, lo_max = sympy.Integer(0), sympy.Integer(0), 0
    for t in sympy.Add.make_args(sympy.expand(num)):
        c, rest = t.as_coeff_Mul()
        if rest == 1:
            if not c.is_Integer:
                return None
            hi += m * (int(c) // m)
            lo += int(c) % m
            lo_max += int(c) % m
        elif c.is_Integer and int(c) % m == 0:
            hi += t
        elif c.is_Integer and c > 0 and A.atom_of(rest) is not None:
            size = A.size(A.atom_of(rest))
            if not size.is_Integer:
                return None
            lo += t
            lo_max += int(c) * (int(size) - 1)
        else:
            return None
    if lo_max >= m:
        return None
    return sympy.expand(hi / m), lo


def _norm(e, A: Atoms):
    """``e`` with Mod(x, m) written x - m*floor(x / m), and every floor(x / m) of a mixed-radix
    index rewritten by digits (or, failing that, with the integer part of its constant pulled
    out, so that equal floors cancel)."""
    def fix(x):
        num, den = sympy.fraction(sympy.together(x.args[0]))
        d = _digits(num, den, A)
        if d is not None:
            return d[0]
        num = sympy.expand(num)
        c = num.as_coeff_Add()[0]
        if den.is_Integer and den > 0 and c.is_Integer and not 0 <= c < den:
            return c // den + sympy.floor((num - den * (c // den)) / den)
        return x
    e = A.resolve(sympy.sympify(e)).rewrite(sympy.floor)
    return sympy.expand(e.replace(lambda x: isinstance(x, sympy.floor), fix))


def _same(a, b) -> bool:
    return sympy.expand(a - b) == 0


def _linear(A: Atoms, atoms) -> sympy.Expr:
    out, stride = sympy.Integer(0), sympy.Integer(1)
    for a in reversed(list(atoms)):
        out += stride * A.linear(a)
        stride *= A.size(a)
    return sympy.expand(out)


# ---- the proof ----------------------------------------------------------------------------------
def reads_byte_cache(node: fx.Node, limit: int = 64) -> bool:
    """Is a gather from a uint8 tensor among the nearest ``limit`` ancestors of ``node``?"""
    seen, todo = set(), [node]
    while todo and len(seen) < limit:
        x = todo.pop(0)
        if x in seen or not isinstance(x, fx.Node):
            continue
        seen.add(x)
        if x.op == "call_function" and packet(x) in (aten.index, aten.index_select):
            src = x.args[0].meta.get("val")
            if isinstance(src, torch.Tensor) and src.dtype == torch.uint8:
                return True
        todo += x.all_input_nodes
    return False


def read_paged(I: Interpreter, form: IndexerForm) -> Optional[PagedKey]:
    """The paged key of a proven indexer form; None if k does not read a byte cache through a
    gather (a dense key: the prefill replacement applies); ``Reject`` if it does but is not
    provably the MXFP4 / FP8 paged decode."""
    if not reads_byte_cache(form.k.node):
        return None
    A = I.A
    k = form.k_value
    if not isinstance(k, Elem):
        raise Reject("the key read from a byte cache is not decoded elementwise from its bytes "
                     "(a lookup table that is neither a graph constant nor a 16-entry graph input?)")
    d_size = A.shapes.hint(sympy.Mul(*[A.size(a) for a in form.contract]))
    bl, jl, dl = (_linear(A, form.batch), _linear(A, form.keys), _linear(A, form.contract))
    pr = _digits(jl, PAGE, A)
    if pr is None:
        raise Reject(f"the key index does not split into (page, row of {PAGE})")
    page, row = pr
    cache, table, reads, others = _cache_reads(I, k, bl, page)
    key_size = sympy.Mul(*[A.size(a) for a in form.keys])
    if not A.shapes.eq(key_size, PAGE * as_size(table, 1)):
        raise Reject(f"the keys ({key_size}) are not all {PAGE} rows of every block-table page")
    n_batch = sympy.Mul(*[A.size(a) for a in form.batch])
    if not A.shapes.eq(n_batch, as_size(table, 0)):
        raise Reject("the block table's rows are not the batch of the queries")
    page_bytes = sympy.Mul(*[as_size(cache, i) for i in range(1, cache.meta["val"].dim())])
    errors = []
    for fmt in formats.FMTS:
        a, s = formats.row_bytes(fmt, d_size)
        try:
            if not A.shapes.eq(page_bytes, PAGE * (a + s)):
                raise Reject(f"a cache page holds {page_bytes} bytes, not {PAGE} x {a + s}")
            roles = _roles(A, fmt, reads, others, row, dl, d_size)
            flavor, lut = _check_values(A, k, fmt, roles)
        except Reject as e:
            errors.append(f"{fmt}: {e}")
            continue
        return PagedKey(_query(I, form), cache, table, _context_lens(I, form, bl), fmt, flavor, d_size, lut)
    raise Reject("the key is not the paged decode (" + "; ".join(errors) + ")")


def as_size(node: fx.Node, i: int) -> sympy.Expr:
    return as_expr(node.meta["val"].shape[i])


def _cache_reads(I, k: Elem, bl, page):
    """Classify k's inputs: (cache node, table node, {input: within-page offset}, [other inputs])."""
    A = I.A
    cache = table = None
    reads, others = {}, []
    for i, (ix, dt, nb) in enumerate(k.inputs):
        fns = {fn: node for fn, node, _ in ix.leaves}
        e = A.resolve(ix.expr)
        apps = [f for f in e.atoms(sympy.core.function.AppliedUndef) if f.func in fns
                and fns[f.func].meta["val"].dtype == torch.uint8]
        if not apps:
            if any(f.func in fns for f in e.atoms(sympy.core.function.AppliedUndef)):
                raise Reject("the key reads a tensor that is not the uint8 cache")
            others.append(i)
            continue
        if len(apps) != 1 or (e != apps[0] and nb != 1):
            raise Reject("a key element combines several cache bytes in index arithmetic")
        byte = sympy.Symbol("_byte", integer=True)
        of_byte = e.xreplace({apps[0]: byte})  # e.g. byte - 127 on a widened byte
        if of_byte.atoms(sympy.core.function.AppliedUndef):
            raise Reject("a cache byte is combined with other tensors in index arithmetic")
        e = apps[0]
        c_node = fns.get(e.func)
        if c_node is None or c_node.meta["val"].dtype != torch.uint8 or not e.args:
            raise Reject("the key reads a tensor that is not the uint8 cache")
        t = e.args[0]
        t_node = fns.get(getattr(t, "func", None))
        if t_node is None or t_node.meta["val"].dim() != 2 or t_node.meta["val"].dtype.is_floating_point:
            raise Reject("the cache is not indexed by a 2-D block table on its page dim")
        if (cache or c_node) is not c_node or (table or t_node) is not t_node:
            raise Reject("the key reads several caches or block tables")
        cache, table = c_node, t_node
        b_arg, p_arg = (_norm(x, A) for x in t.args)
        if not _same(b_arg, bl) or not _same(p_arg, page):
            raise Reject("the page is not block_table[b, j // 64]")
        sizes = [as_size(cache, i) for i in range(1, cache.meta["val"].dim())]
        off, stride = sympy.Integer(0), sympy.Integer(1)
        for arg, z in reversed(list(zip(e.args[1:], sizes))):
            off += stride * arg
            stride *= z
        if any(isinstance(x, sympy.core.function.AppliedUndef) for x in off.atoms(sympy.core.function.AppliedUndef)):
            raise Reject("a byte offset inside the page depends on tensor values")
        reads[i] = (_norm(off, A), nb, (byte, of_byte))
    if cache is None:
        raise Reject("the key reads no cache bytes")
    return cache, table, reads, others


def _roles(A, fmt, reads, others, row, dl, d_size):
    """{input: ("data" | "scale", (byte symbol, its value as a function of the byte)) | ("sel", d % 2)}."""
    roles = {}
    if fmt == "mxfp4":
        a, s = formats.row_bytes(fmt, d_size)
        half, blk = _digits(dl, 2, A), _digits(dl, formats.MXFP4_BLOCK, A)
        if half is None or blk is None:
            raise Reject("head_dim does not split into nibble pairs and blocks of 32")
        want = {"data": (sympy.expand(a * row + half[0]), 1),
                "scale": (sympy.expand(PAGE * a + s * row + blk[0]), 1)}
        parity = half[1]
    else:
        want = {"data": (sympy.expand(d_size * row + dl), 1),
                "scale": (sympy.expand(PAGE * d_size + 4 * row), 4)}
        parity = None
    for i, (off, nb, _) in reads.items():
        hit = [r for r, (w, wb) in want.items() if wb == nb and _same(off, w)]
        if not hit:
            raise Reject(f"a cache byte at page offset {off} is neither this row's data nor its scale "
                         "(layout: a page's 64 data rows, then its 64 scale rows)")
        roles[i] = (hit[0], reads[i][2])
    if {r[0] for r in roles.values()} != set(want):
        raise Reject("the key does not read both the data and the scale bytes")
    for i in others:
        roles[i] = _selector(A, i, parity)
    return roles


def _selector(A, i, parity):
    """A non-cache input (the new index of a stack) may depend on d % 2 only (checked on use)."""
    if parity is None or not isinstance(parity, sympy.Symbol):
        raise Reject("the key depends on an index other than the cache bytes and the nibble position")
    return ("sel", parity)  # (role, the nibble-position symbol)


def _check_values(A, k: Elem, fmt, roles):
    """(flavor, the graph-input decode table or None)."""
    with unset_fake_temporarily():
        luts = _tables_of(k.prog)
        if fmt == "mxfp4" and luts:
            return _check_mxfp4_table(A, k, roles, luts)
        if luts:
            raise Reject("an FP8 key is read through a lookup table")
        return (_check_mxfp4(A, k, roles) if fmt == "mxfp4" else _check_fp8(k, roles)), None


def _inputs_of(prog, out=None):
    out = set() if out is None else out
    kind = prog[0]
    if kind == "in":
        out.add(prog[1])
    elif kind == "pick":
        out.add(prog[1])
        for p in prog[2]:
            _inputs_of(p, out)
    elif kind == "op":
        for a in prog[2]:
            for x in (a if isinstance(a, list) else [a]):
                if isinstance(x, tuple) and x and x[0] in ("in", "const", "pick", "op"):
                    _inputs_of(x, out)
    return out


def _sel_values(A, k: Elem, roles, i, parity_t):
    sym = roles[i][1]
    e = _norm(k.inputs[i][0].expr, A)
    if not e.free_symbols <= {sym}:
        raise Reject("the nibble selector is not a function of d % 2")
    return torch.tensor([int(e.xreplace({sym: int(t)})) for t in parity_t.tolist()], dtype=torch.int64)


def _mxfp4_grid(A, k: Elem, roles):
    """(x, y, t, input values): every data byte x, scale byte y (0..254) and nibble position t."""
    x, y, t = torch.meshgrid(torch.arange(256), torch.arange(255), torch.arange(2), indexing="ij")
    x, y, t = x.reshape(-1), y.reshape(-1), t.reshape(-1)
    values = []
    for i, (ix, dt, nb) in enumerate(k.inputs):
        r = roles[i]
        if r[0] == "data":
            values.append(_of_byte(r[1], dt)[x.long()])
        elif r[0] == "scale":
            values.append(_of_byte(r[1], dt)[y.long()])
        else:
            values.append(_sel_values(A, k, roles, i, t).to(dt))
    return x, y, t, values


def _check_mxfp4(A, k: Elem, roles) -> str:
    x, y, t, values = _mxfp4_grid(A, k, roles)
    got = run_prog(k.prog, values)
    nib = torch.where(t == 0, x & 15, x >> 4)
    exact = _SIGNED_E2M1[nib] * torch.exp2(y.double() - 127)
    want = exact.to(got.dtype)
    if not torch.equal(want.to(torch.float32), exact.to(torch.float32)):
        raise Reject(f"the key is decoded to {got.dtype}, which rounds MXFP4 values (the kernels decode them "
                     "exactly, as bf16 / fp32 hold them)")
    if got.shape != want.shape or not torch.equal(got, want):
        bad = (got != want).nonzero()
        j = int(bad[0]) if bad.numel() else 0
        raise Reject(f"the decode differs from MXFP4 (byte {int(x[j])}, nibble {int(t[j])}, scale {int(y[j])}: "
                     f"{float(got.reshape(-1)[j]) if got.numel() > j else got} vs {float(want[j])})")
    return "fn"


def _tables_of(prog, out=None) -> list:
    """The graph-input table nodes of ("table", node) leaves, once per occurrence."""
    out = [] if out is None else out
    if prog[0] == "table":
        out.append(prog[1])
    elif prog[0] == "pick":
        for p in prog[2]:
            _tables_of(p, out)
    elif prog[0] == "op":
        for a in prog[2]:
            for x in (a if isinstance(a, list) else [a]):
                if isinstance(x, tuple) and x and x[0] in ("in", "const", "table", "pick", "op"):
                    _tables_of(x, out)
    return out


_EXACT_CASTS = (torch.float32, torch.float64)  # every bf16 / fp16 / fp32 table value is exact in these


def _lookup_index(prog, lut):
    """The index program of a lookup ``lut[idx]`` (through exact float casts and picks between
    lookups: their value is lut[the picked idx]); None if ``prog`` is anything else."""
    if prog[0] == "pick":
        subs = [_lookup_index(p, lut) for p in prog[2]]
        return None if any(s is None for s in subs) else ("pick", prog[1], tuple(subs))
    if prog[0] != "op":
        return None
    p = packet_of(prog[1])
    if p is torch.ops.prims.convert_element_type and prog[2][1] in _EXACT_CASTS + (lut.meta["val"].dtype,):
        return _lookup_index(prog[2][0], lut) if isinstance(prog[2][0], tuple) else None
    if p is aten.index and len(prog[2]) == 2 and prog[2][0] == ("table", lut) and len(prog[2][1]) == 1:
        return prog[2][1][0]
    return None


def _check_mxfp4_table(A, k: Elem, roles, luts):
    """A decode table that is a graph input: its values are unknown, so the program is proven for
    every table, structurally: [exact casts of] mul(L, s) with L = lut[idx] (exact casts, picks of
    such lookups; the table appears nowhere else), idx exhaustively the nibble, s exhaustively
    2^(y - 127) and free of the table, the product fp32 (the op's one fp32 rounding)."""
    lut = luts[0]
    if any(n is not lut for n in luts):
        raise Reject("the key reads several graph-input lookup tables")
    prog = k.prog
    x, y, t, values = _mxfp4_grid(A, k, roles)
    probe = {lut: torch.arange(1, 17, dtype=lut.meta["val"].dtype)}
    while prog[0] == "op" and packet_of(prog[1]) is torch.ops.prims.convert_element_type:
        if prog[2][1] not in _EXACT_CASTS:
            raise Reject(f"the table-decoded key is cast to {prog[2][1]}, which rounds arbitrary fp32 values "
                         "(the op keeps the fp32 keys)")
        prog = prog[2][0]
    if not (prog[0] == "op" and packet_of(prog[1]) is aten.mul and len(prog[2]) == 2
            and all(isinstance(a, tuple) for a in prog[2])):
        raise Reject("the key read through a graph-input table is not lut[nibble] * scale")
    for li, si in ((0, 1), (1, 0)):
        idx = _lookup_index(prog[2][li], lut)
        if idx is not None and not _tables_of(prog[2][si]):
            break
    else:
        raise Reject("the graph-input table is not read once as lut[nibble] times a scale without it "
                     "(used twice or not as a plain lookup)")
    nib = torch.where(t == 0, x & 15, x >> 4)
    got_idx = run_prog(idx, values)
    if got_idx.dtype.is_floating_point or got_idx.shape != nib.shape or not torch.equal(got_idx.long(), nib):
        raise Reject("the graph-input table is indexed by something other than the nibble (low nibble = even d)")
    s = run_prog(prog[2][si], values)
    if not s.dtype.is_floating_point or s.shape != y.shape or not torch.equal(s.double(), torch.exp2(y.double() - 127)):
        raise Reject("the scale multiplying the table lookup is not 2^(E8M0 - 127)")
    if run_prog(prog, values, probe).dtype != torch.float32:
        raise Reject("the table lookup times the scale is not computed in fp32 (the op's rounding)")
    return "fn", lut


def _of_byte(fn, dtype) -> torch.Tensor:
    """The input's value for each byte 0..255 (a widened byte, or integer arithmetic on it)."""
    sym, e = fn
    vals = [int(e.xreplace({sym: v})) for v in range(256)]
    info = torch.iinfo(dtype) if not dtype.is_floating_point else None
    if info is None or min(vals) < info.min or max(vals) > info.max:
        raise Reject(f"the byte arithmetic {e} does not fit {dtype}")
    return torch.tensor(vals, dtype=dtype)


def _check_fp8(k: Elem, roles) -> str:
    if any(r[0] not in ("data", "scale") or r[1][1] != r[1][0] for r in roles.values()):
        raise Reject("an FP8 key depends on more than its row's bytes and scale")
    prog = k.prog
    if not (prog[0] == "op" and packet_of(prog[1]) is aten.mul and len(prog[2]) == 2):
        raise Reject("the FP8 key is not value * scale")
    scale_in = {i for i, r in roles.items() if r[0] == "scale"}
    sides = [_inputs_of(p) if isinstance(p, tuple) else set() for p in prog[2]]
    for vi, si in ((0, 1), (1, 0)):
        sp = prog[2][si]
        if sides[si] <= scale_in and sides[vi].isdisjoint(scale_in) and _is_word(sp, k):
            x = torch.arange(256, dtype=torch.uint8)
            got = run_prog(prog[2][vi], [x.to(k.inputs[i][1]) if roles[i][0] == "data" else None
                                         for i in range(len(k.inputs))])
            if not got.dtype.is_floating_point or got.dtype.itemsize < 2:
                break
            for flavor, dt in formats.FP8_DTYPES.items():
                want = x.view(dt).to(torch.float64)
                g = got.to(torch.float64)
                if torch.equal(torch.isnan(g), torch.isnan(want)) and torch.equal(g.nan_to_num(0), want.nan_to_num(0)):
                    return flavor
            raise Reject("the FP8 values are not e4m3fn or e4m3fnuz decodes of the bytes")
    raise Reject("the FP8 key is not e4m3(byte) * the row's fp32 scale")


def _is_word(prog, k: Elem) -> bool:
    """The fp32 scale word itself, or cast to fp32/fp64 (exact)."""
    while prog[0] == "op" and packet_of(prog[1]) is torch.ops.prims.convert_element_type \
            and prog[2][1] in (torch.float32, torch.float64):
        prog = prog[2][0]
    return prog[0] == "in" and k.inputs[prog[1]][1] == torch.float32 and k.inputs[prog[1]][2] == 4


def packet_of(target):
    return getattr(target, "overloadpacket", target)


_Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the paged kernels take (narrowest first)


def _query(I: Interpreter, form: IndexerForm) -> Term:
    """The q the paged kernels take (bf16 / fp16 / fp32): q itself, or the narrowest such tensor
    under exact upcasts (``q.float()`` of bf16 is passed as bf16: one dot instead of three)."""
    v = form.q_value
    v = exact_source(v, (torch.float32, torch.float64))
    dt = None if v.origin is None else v.origin.meta["val"].dtype
    if dt not in _Q_DTYPES:
        raise Reject(f"q is {dt if dt is not None else form.q.dtype}, not bf16 / fp16 / fp32 (or an exact upcast "
                     "of one): the paged kernels take those")
    return Term(v.origin, I.A.flat_dims(v.origin_dims), dt)


def _context_lens(I: Interpreter, form: IndexerForm, bl) -> Optional[fx.Node]:
    """The mask must be exactly j < context_lens[b] (every query token of request b)."""
    A = I.A
    if form.ranges is None:
        return None
    rng = form.ranges
    if rng.row_cond is not None or not _same(A.resolve(rng.k_start), 0):
        raise Reject("the mask is not j < context_lens[b] (it has a lower bound or a row condition)")
    end = A.resolve(rng.k_end) if rng.k_end is not None else None
    fns = {fn: node for fn, node, _ in form.mask_leaves}
    if not isinstance(end, sympy.core.function.AppliedUndef) or end.func not in fns:
        raise Reject(f"the mask end {rng.k_end} is not context_lens[b] (a causal offset per query "
                     "token is not supported)")
    node = fns[end.func]
    if node.meta["val"].dim() != 1 or len(end.args) != 1 or not _same(_norm(end.args[0], A), bl):
        raise Reject("the mask end is not a 1-D context_lens indexed by the request")
    return node


def render_paged(region: str, key: PagedKey) -> str:
    """``indexer.render``'s text with the key line describing the paged cache instead."""
    ctx = "context_lens[b]" if key.context_lens is not None else "all rows"
    line = (f"  k       paged {key.fmt}{'/' + key.flavor if key.fmt == 'fp8' else ''} cache, "
            f"head_dim {key.head_dim}, page = block_table[b, j // {PAGE}], visible j < {ctx}")
    return "\n".join(line if ln.startswith("  k ") else ln for ln in region.split("\n"))
