"""A small DeepSeek-V4 attention block in plain eager PyTorch, compiled with inductor_dsa.

    python examples/deepseek_v4_attention.py                 # CPU: small config (~70 s of CPU time; ~33 s cached)
    python examples/deepseek_v4_attention.py --device cuda   # V4-Flash sizes: indexer H=64, D=128, top-512
    python examples/deepseek_v4_attention.py --device cuda --pro   # V4-Pro: 128 attention heads, top-1024

Three layers, one of each V4 kind (docs/semantics.md; our own code, written in the style of the
official reference, not copied from it):
  * CSA (compress ratio 4): learned gated pooling of every 4 KV rows + an indexer (q_idx from a
    linear, weights from a linear scaled by D**-0.5 * H**-0.5, einsum "bshd,btd->bsht", relu,
    weighted head-sum, official ratio mask j >= (t+1)//4 -> -inf, topk, official -1
    post-processing) + sliding window 128, then sparse attention with a per-head sink;
  * HCA (ratio 128): window + every visible compressed entry, no indexer;
  * window-only: sliding window 128.
Sparse attention is written eagerly: gather KV rows by index, scores, softmax over
cat([scores, sink]) and drop the sink column.

Prefill: the block runs eagerly, with default torch.compile and with
torch.compile(backend=inductor_dsa.backend); inductor_dsa.report() is printed (the indexer chain
must be swapped); the CSA top-k sets are checked against an fp64 oracle (reference.topk_mismatch)
and the block output against eager.
Decode: decode steps of the CSA layer after the prefill. Each new token is appended eagerly to the
caches (raw KV, compressed KV every 4 tokens, and the compressed index key MXFP4-encoded into a
paged cache with inductor_dsa.formats); the step itself (indexer over the paged MXFP4 cache:
cache[block_table] gather, E2M1/E8M0 decode, einsum, relu, weights, head sum, context_lens mask,
top-k; then window + top-k sparse attention) is compiled the same three ways and checked the same
way (oracle: reference.paged_indexer_logits). Then a table of time and peak GPU memory ("ours, no
checks": the inductor_dsa variant again with the ops' data value checks off, each of which is a
host sync; INDUCTOR_DSA_CHECK_VALUES=0 in serving), and on a GPU a sweep of prefill lengths with a
PNG of the speedup over eager (needs matplotlib).
Exits 1 if any check fails.

Not in this version: RoPE, the real V4 compressor (overlapping windows, positional bias), low-rank
q projection, MTP, batched decode, the MoE / MLA parts of the model. The run prints what the pass
swapped (the indexer, the paged decode indexer and the sparse attention).

Spelling note: a first version fed the compressor output straight into the einsum; the pass
rejected it ("relu is not applied to a q.k product": the key side was a gated-pooling reduction,
not a tensor it can read as keys). Writing the compressed index keys into a kv_cache buffer and
reading a slice of it, as the official prefill branch does (and tests/pass_corpus.py's ToyIndexer),
is swapped.
On a CPU, without TRITON_INTERPRET=1 the inductor_dsa ops run their fp64 reference (the printout
says which), so the CPU timing table compares that reference with compiled code: it checks that
the timing code runs and is not a performance figure (the table says so).
Inductor's caches stay on: a second run is served from them, and inductor_dsa.report() still lists
the swaps (recorded with the cached code).
"""
import argparse
import collections
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

import inductor_dsa
from inductor_dsa import formats, reference

WINDOW = 128


def window_indices(seqlen, device):
    """[S, 128]: rows t-127 .. t of the uncompressed KV, -1 where < 0 (official padding)."""
    t = torch.arange(seqlen, device=device).unsqueeze(1)
    j = t - (WINDOW - 1) + torch.arange(WINDOW, device=device).unsqueeze(0)
    return torch.where(j >= 0, j, -1)


class Compressor(nn.Module):
    """Learned gated pooling: every `ratio` consecutive KV rows -> one row (simplified V4 compressor)."""

    def __init__(self, dim, head_dim, ratio):
        super().__init__()
        self.ratio, self.head_dim = ratio, head_dim
        self.wkv = nn.Linear(dim, head_dim, bias=False)
        self.wgate = nn.Linear(dim, head_dim, bias=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        n = seqlen // self.ratio
        kv = self.wkv(x[:, : n * self.ratio]).view(bsz, n, self.ratio, self.head_dim)
        gate = self.wgate(x[:, : n * self.ratio]).view(bsz, n, self.ratio, self.head_dim)
        return (kv * gate.softmax(dim=2)).sum(dim=2)          # [B, S // ratio, D]


class Indexer(nn.Module):
    """CSA indexer, prefill branch: the chain inductor_dsa's pass swaps for indexer_topk."""

    def __init__(self, dim, n_heads, head_dim, ratio, index_topk, max_len=4096, max_batch=1):
        super().__init__()
        self.n_heads, self.head_dim, self.ratio, self.index_topk = n_heads, head_dim, ratio, index_topk
        self.softmax_scale = head_dim ** -0.5
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.weights_proj = nn.Linear(dim, n_heads, bias=False)
        self.compressor = Compressor(dim, head_dim, ratio)
        # compressed index keys go through a cache, as in the official prefill branch
        self.register_buffer("kv_cache", torch.zeros(max_batch, max_len // ratio, head_dim), persistent=False)

    def query(self, x):
        q = self.wq(x).unflatten(-1, (self.n_heads, self.head_dim))            # [B, S, H, D]
        weights = self.weights_proj(x) * (self.softmax_scale * self.n_heads ** -0.5)
        return q, weights

    def inputs(self, x):
        q, weights = self.query(x)
        return q, self.compressor(x), weights

    def forward(self, x):
        seqlen, ratio = x.size(1), self.ratio
        bsz = x.size(0)
        q, kv, weights = self.inputs(x)
        self.kv_cache[:bsz, : seqlen // ratio] = kv
        index_score = torch.einsum("bshd,btd->bsht", q, self.kv_cache[:bsz, : seqlen // ratio])
        index_score = (index_score.relu_() * weights.unsqueeze(-1)).sum(dim=2)
        mask = torch.arange(seqlen // ratio, device=x.device).repeat(seqlen, 1) >= \
            torch.arange(1, seqlen + 1, device=x.device).unsqueeze(1) // ratio
        index_score += torch.where(mask, float("-inf"), 0)
        topk_idxs = index_score.topk(min(self.index_topk, seqlen // ratio), dim=-1)[1]
        mask = topk_idxs >= torch.arange(1, seqlen + 1, device=x.device).unsqueeze(1) // ratio
        return torch.where(mask, -1, topk_idxs)                                 # [B, S, k], -1 = none

    def decode(self, x, kv_pages, block_table, context_lens):
        """Decode branch, one new token per request: keys from a paged MXFP4 cache (the serving
        layout), visible iff row j < context_lens[b]; eager fallback of the paged indexer."""
        q, weights = self.query(x)                                              # [B, 1, H, D]
        keys = paged_mxfp4_keys(kv_pages, block_table, self.head_dim).to(q.dtype)
        index_score = torch.einsum("bshd,btd->bsht", q, keys)
        index_score = (index_score.relu_() * weights.unsqueeze(-1)).sum(dim=2)  # [B, 1, L]
        ctx = context_lens.view(-1, 1, 1)
        hidden = torch.arange(keys.size(1), device=x.device) >= ctx
        index_score = index_score.masked_fill(hidden, float("-inf"))
        topk_idxs = index_score.topk(min(self.index_topk, keys.size(1)), dim=-1)[1]
        return torch.where(topk_idxs >= ctx, -1, topk_idxs)                    # [B, 1, k]


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def paged_mxfp4_keys(kv_pages, block_table, head_dim):
    """[B, P*64, D] float keys of every request: gather its pages (cache[block_table]), decode the
    E2M1 codes (low nibble = lower index) with a 16-entry table, times the E8M0 scale 2**(e - 127)
    of each 32-element block. Page = [64 rows x D/2 code bytes][64 rows x D/32 scale bytes]."""
    bsz, n_pages = block_table.shape
    pages = kv_pages[block_table.long()]                                      # [B, P, 64 * row bytes]
    rows = n_pages * 64
    codes = pages[..., : 64 * head_dim // 2].reshape(bsz, rows, head_dim // 2)
    scales = pages[..., 64 * head_dim // 2:].reshape(bsz, rows, head_dim // 32)
    lut = torch.tensor(E2M1, device=kv_pages.device)
    vals = torch.stack([lut[(codes & 15).long()], lut[(codes >> 4).long()]], dim=-1)
    vals = vals.view(bsz, rows, head_dim // 32, 32) * torch.exp2(scales.float() - 127).unsqueeze(-1)
    return vals.view(bsz, rows, head_dim)


def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
    """Eager sparse attention: q [B,S,H,D], kv [B,N,D] (K = V), topk_idxs [B,S,K] (-1 = skip)."""
    bsz, seqlen, n_heads, _ = q.shape
    valid = topk_idxs >= 0
    rows = torch.gather(kv.unsqueeze(1).expand(bsz, seqlen, -1, -1), 2,
                        topk_idxs.clamp(min=0).unsqueeze(-1).expand(-1, -1, -1, kv.size(-1)))
    scores = torch.einsum("bshd,bskd->bshk", q.float(), rows.float()) * softmax_scale
    scores = scores.masked_fill(~valid.unsqueeze(2), float("-inf"))
    sink = attn_sink.view(1, 1, n_heads, 1).expand(bsz, seqlen, n_heads, 1)
    probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
    return torch.einsum("bshk,bskd->bshd", probs, rows.float()).to(q.dtype)


class Attention(nn.Module):
    """One V4 attention layer: compress_ratio 0 (window only), 4 (CSA) or 128 (HCA)."""

    def __init__(self, dim, n_heads, head_dim, ratio, index_heads, index_head_dim, index_topk, max_len):
        super().__init__()
        self.n_heads, self.head_dim, self.ratio = n_heads, head_dim, ratio
        self.softmax_scale = head_dim ** -0.5
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wkv = nn.Linear(dim, head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.attn_sink = nn.Parameter(torch.zeros(n_heads, dtype=torch.float32))
        self.compressor = Compressor(dim, head_dim, ratio) if ratio else None
        self.indexer = Indexer(dim, index_heads, index_head_dim, ratio, index_topk, max_len) if ratio == 4 else None

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        q = self.wq(x).unflatten(-1, (self.n_heads, self.head_dim))
        kv = self.wkv(x)                                                          # [B, S, D]
        idxs = window_indices(seqlen, x.device).unsqueeze(0).expand(bsz, -1, -1)
        csa_idxs = None
        if self.ratio:
            kv = torch.cat([kv, self.compressor(x)], dim=1)                       # [B, S + S/r, D]
            if self.indexer is not None:
                csa_idxs = self.indexer(x)
                comp = csa_idxs
            else:   # HCA: every compressed entry, visible iff j < (t + 1) // ratio
                n = seqlen // self.ratio
                j = torch.arange(n, device=x.device).repeat(seqlen, 1)
                comp = torch.where(j >= torch.arange(1, seqlen + 1, device=x.device).unsqueeze(1) // self.ratio,
                                   -1, j).unsqueeze(0).expand(bsz, -1, -1)
            idxs = torch.cat([idxs, torch.where(comp >= 0, comp + seqlen, -1)], dim=-1)
        o = sparse_attn(q, kv, self.attn_sink, idxs, self.softmax_scale)
        return x + self.wo(o.flatten(2)), csa_idxs

    def decode(self, x, pos, kv, kv_cmp, idx_pages, block_table, context_lens):
        """CSA decode, one token per request at position pos[b]: window rows pos-127..pos of the
        raw KV cache `kv` plus the indexer's top-k of the compressed entries `kv_cmp`."""
        q = self.wq(x).unflatten(-1, (self.n_heads, self.head_dim))             # [B, 1, H, Dh]
        j = pos.view(-1, 1, 1) - (WINDOW - 1) + torch.arange(WINDOW, device=x.device)
        top = self.indexer.decode(x, idx_pages, block_table, context_lens)      # [B, 1, k]
        idxs = torch.cat([torch.where(j >= 0, j, -1), torch.where(top >= 0, top + kv.size(1), -1)], dim=-1)
        o = sparse_attn(q, torch.cat([kv, kv_cmp], dim=1), self.attn_sink, idxs, self.softmax_scale)
        return x + self.wo(o.flatten(2)), top


class DecodeCache:
    """Decode state of one CSA layer (batch 1), filled from its prefill input: raw KV rows, the
    compressed KV rows, the normed hidden states (each compressed entry pools 4 of them) and the
    indexer's compressed keys in a paged MXFP4 cache (64-row pages in shuffled order, a block
    table, context_lens = number of compressed entries). Cache writes stay eager, as in an engine."""

    def __init__(self, layer, xn, max_len):
        ratio, dev = layer.ratio, xn.device
        seqlen = xn.size(1)
        self.layer = layer
        self.hidden = xn.new_zeros(1, max_len, xn.size(-1))
        self.hidden[:, :seqlen] = xn
        self.kv = xn.new_zeros(1, max_len, layer.head_dim)
        self.kv[:, :seqlen] = layer.wkv(xn)
        self.kv_cmp = xn.new_zeros(1, max_len // ratio, layer.head_dim)
        self.kv_cmp[:, : seqlen // ratio] = layer.compressor(xn)
        n_pages = -(-(max_len // ratio) // formats.PAGE_ROWS)
        row = sum(formats.row_bytes("mxfp4", layer.indexer.head_dim))
        self.idx_pages = torch.zeros(n_pages + 3, formats.PAGE_ROWS * row, dtype=torch.uint8, device=dev)
        self.block_table = torch.randperm(n_pages + 3, device=dev)[:n_pages].view(1, n_pages).int()
        self.context_lens = torch.zeros(1, dtype=torch.int32, device=dev)
        self.store_keys(layer.indexer.compressor(xn)[0])

    def store_keys(self, keys):
        """Append compressed index keys [n, D] at rows context_lens .. context_lens + n - 1."""
        j = int(self.context_lens[0]) + torch.arange(keys.size(0), device=keys.device)
        rows = self.block_table[0, j // formats.PAGE_ROWS].long() * formats.PAGE_ROWS + j % formats.PAGE_ROWS
        formats.store_rows(self.idx_pages, rows, *formats.mxfp4_encode(keys))
        self.context_lens += keys.size(0)

    def append(self, xn, pos):
        """The new token's normed hidden xn [1, 1, dim] at position pos; completes a compressed
        entry (and its MXFP4 index key) when (pos + 1) % ratio == 0."""
        ratio = self.layer.ratio
        self.hidden[:, pos] = xn[:, 0]
        self.kv[:, pos] = self.layer.wkv(xn)[:, 0]
        if (pos + 1) % ratio == 0:
            group = self.hidden[:, pos + 1 - ratio: pos + 1]
            self.kv_cmp[:, (pos + 1) // ratio - 1] = self.layer.compressor(group)[:, 0]
            self.store_keys(self.layer.indexer.compressor(group)[0])

    def step_args(self, xn, pos):
        return (xn, torch.tensor([pos], device=xn.device), self.kv, self.kv_cmp, self.idx_pages,
                self.block_table, self.context_lens)


class V4Block(nn.Module):
    """CSA, HCA and window-only layers in sequence. Returns (hidden, CSA top-k indices, CSA layer input)."""

    def __init__(self, dim, n_heads, head_dim, index_heads, index_head_dim, index_topk, max_len):
        super().__init__()
        self.layers = nn.ModuleList(
            Attention(dim, n_heads, head_dim, r, index_heads, index_head_dim, index_topk, max_len) for r in (4, 128, 0))
        self.norm = nn.RMSNorm(dim)

    def forward(self, x):
        csa_idxs = None
        for layer in self.layers:
            x, i = layer(self.norm(x))
            csa_idxs = i if i is not None else csa_idxs
        return x, csa_idxs


def sizes(args):
    """V4-Flash / V4-Pro sizes on a GPU (attention head_dim 512, one KV head; indexer H=64,
    D=128), a small config on a CPU."""
    if args.device == "cpu" and not args.pro:
        cfg = dict(seq=256, dim=256, heads=16, head_dim=64, index_heads=64, index_head_dim=128, topk=32, steps=6)
    else:
        cfg = dict(seq=4096, dim=2048, heads=128 if args.pro else 64, head_dim=512, index_heads=64,
                   index_head_dim=128, topk=1024 if args.pro else 512, steps=16)
    for key in ("seq", "heads", "steps"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    return cfg


UNCHECKED = "ours, no checks"  # inductor_dsa with its data value checks off (see timeit_unchecked)


def timeit_unchecked(fn, args, device, iters):
    """timeit with inductor_dsa's data value checks off (``INDUCTOR_DSA_CHECK_VALUES=0``, a serving
    setting): each op's default block-table / index range check reads the data back, a host sync."""
    with inductor_dsa.checks.values(False):
        return timeit(fn, args, device, iters)


def timeit(fn, args, device, iters):
    """(median ms per call over ``iters`` calls, peak MiB allocated during the calls, GPU only) after
    three warm-up calls (mode="reduce-overhead" records its CUDA graph on the second or third).
    GPU: CUDA events around each call, one synchronisation at the end."""
    for _ in range(3):
        fn(*args)
    if device.type != "cuda":
        ms = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(*args)
            ms.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ms), None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        fn(*args)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events), torch.cuda.max_memory_allocated() / 2**20


def compiled(fn, backend, what, mode):
    """fn compiled (static shapes) with a backend and mode; the first call (the compilation) is announced."""
    c = torch.compile(fn, backend=backend, dynamic=False, mode=mode)

    def call(*a):
        if not call.done:
            print(f"[v4] compiling {what} ...", flush=True)
            t0 = time.perf_counter()
        out = c(*a)
        if not call.done:
            print(f"[v4] compiled {what} in {time.perf_counter() - t0:.1f} s", flush=True)
            call.done = True
        return out
    call.done = False
    return call


def owned(out):
    """A copy of a call's outputs (out, idx): a CUDA-graph replay overwrites its outputs."""
    return tuple(o.clone() for o in out)


def check_topk(name, idx, logits64):
    msg = reference.topk_mismatch(idx.reshape(-1, idx.size(-1)), logits64.reshape(-1, logits64.size(-1)), idx.size(-1))
    print(f"[v4]   top-k sets, {name:16s} vs fp64 oracle: {msg or 'match (with tolerance)'}")
    return msg is None


def check_out(name, out, ref, tol):
    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    print(f"[v4]   output, {name:16s} vs eager: max rel err {err:.2e} (tol {tol:.0e}) {'ok' if err <= tol else 'FAIL'}")
    return err <= tol


def show_report(stage):
    print(f"[v4] inductor_dsa.report() after the {stage} compilation:")
    print("  " + str(inductor_dsa.report()).replace("\n", "\n  "))
    swaps = dict(collections.Counter(s.pattern for s in inductor_dsa.report().swaps))  # cache hits included
    print(f"[v4] {stage} swap counts: {swaps}", flush=True)
    inductor_dsa.lowering.reset()
    return swaps


def plot(rows, path):
    """PNG of speedup (eager time / compiled time) against sequence length, if matplotlib is there."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[v4] matplotlib is not installed: no PNG (pip install matplotlib)")
        return
    seqs = [r["seq"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in [n for n in rows[0] if n not in ("seq", "eager")]:
        ax.plot(seqs, [r["eager"] / r[name] for r in rows], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (prefill, batch 1)")
    ax.set_ylabel("speedup over eager")
    ax.set_title(f"V4 attention block, {torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"[v4] wrote {path}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seq", type=int, default=None, help="prefill length (multiple of 128)")
    p.add_argument("--heads", type=int, default=None, help="attention heads")
    p.add_argument("--pro", action="store_true", help="V4-Pro sizes (128 attention heads, top-1024)")
    p.add_argument("--steps", type=int, default=None, help="decode steps after the prefill")
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--skip-default", action="store_true", help="skip the default torch.compile variant")
    p.add_argument("--sweep", default=None,
                   help="comma-separated prefill lengths to time (GPU default 2048,4096,8192; none to skip)")
    p.add_argument("--plot", default="v4_speedup.png", help="PNG of the sweep (needs matplotlib)")
    p.add_argument("--out", default=None, help="write the checks, swaps and timings as JSON here")
    p.add_argument("--mode", default="default", choices=["default", "reduce-overhead"],
                   help="torch.compile mode of both compiled variants (reduce-overhead: CUDA graphs)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    cfg = sizes(args)
    sweep = args.sweep or ("2048,4096,8192" if device.type == "cuda" else "none")
    sweep = [] if sweep == "none" else [int(v) for v in sweep.split(",")]
    if any(v % 128 for v in [cfg["seq"], *sweep]):
        p.error("sequence lengths must be multiples of 128 (HCA ratio)")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    iters = args.iters or (10 if device.type == "cuda" else 5)
    kernels = ("Triton kernels" if device.type != "cpu" or os.environ.get("TRITON_INTERPRET") == "1"
               else "fp64 reference (CPU; TRITON_INTERPRET=1 runs the Triton kernels instead)")
    print(f"[v4] device={device} dtype={dtype} {cfg}; inductor_dsa ops run: {kernels}", flush=True)

    torch.manual_seed(0)
    max_len = max([cfg["seq"] + cfg["steps"], *sweep])
    max_len += -max_len % 128
    block = V4Block(cfg["dim"], cfg["heads"], cfg["head_dim"], cfg["index_heads"],
                    cfg["index_head_dim"], cfg["topk"], max_len).to(device=device, dtype=dtype).eval()
    for layer in block.layers:          # non-zero sinks, kept fp32 like the official attn_sink
        layer.attn_sink.data = torch.randn(cfg["heads"], device=device) * 0.5
    x = torch.randn(1, cfg["seq"], cfg["dim"], device=device, dtype=dtype)
    torch._dynamo.config.cache_size_limit = 64     # static shapes: one graph per (length, backend)
    inductor_dsa.lowering.reset()
    backends = {"eager": None} if args.skip_default else {"eager": None, "default compile": "inductor"}
    backends["inductor_dsa"] = inductor_dsa.backend
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-3
    ok = True
    times = {}
    with torch.no_grad():
        # ---- prefill: the whole block (CSA, HCA, window-only) ----
        print(f"[v4] prefill S={cfg['seq']}", flush=True)
        prefill = {n: block if b is None else compiled(block, b, f"the block ({n})", args.mode) for n, b in backends.items()}
        outs = {n: owned(f(x)) for n, f in prefill.items()}
        swaps = show_report("prefill")
        if swaps.get("indexer_topk", 0) < 1:
            print("[v4] FAIL: the CSA indexer chain was not swapped for indexer_topk")
            ok = False
        csa = block.layers[0]
        xn = block.norm(x)
        q, k, w = csa.indexer.inputs(xn)
        ks, ke = reference.ratio_ranges(cfg["seq"], 4, device)
        logits64 = reference.indexer_logits(q[0], k[0], w[0], ks, ke)
        for name, (out, idx) in outs.items():
            ok &= check_topk(name, idx, logits64)
            if name != "eager":
                ok &= check_out(name, out, outs["eager"][0], tol)
        for name, f in prefill.items():
            times[("prefill", name)] = timeit(f, (x,), device, iters)
        times[("prefill", UNCHECKED)] = timeit_unchecked(prefill["inductor_dsa"], (x,), device, iters)

        # ---- decode: CSA layer steps appending to the paged MXFP4 indexer cache ----
        cache = DecodeCache(csa, xn, max_len)
        if args.mode == "reduce-overhead":  # persistent caches, as in an engine: no copy per replay
            for t in (cache.kv, cache.kv_cmp, cache.idx_pages, cache.block_table, cache.context_lens):
                torch._dynamo.mark_static_address(t)
        dswaps, step, rows = {}, None, []
        decode = {n: csa.decode if b is None else compiled(csa.decode, b, f"the CSA decode step ({n})", args.mode)
                  for n, b in backends.items()}
        for i in range(cfg["steps"]):
            pos = cfg["seq"] + i
            xt = block.norm(torch.randn(1, 1, cfg["dim"], device=device, dtype=dtype))
            cache.append(xt, pos)
            step = cache.step_args(xt, pos)
            outs = {n: owned(f(*step)) for n, f in decode.items()}
            if i == 0:
                dswaps = show_report("decode")
            print(f"[v4] decode step {i + 1}/{cfg['steps']}: position {pos}, "
                  f"{int(cache.context_lens[0])} compressed index keys in the paged MXFP4 cache", flush=True)
            q, w = csa.indexer.query(xt)
            logits64 = reference.paged_indexer_logits(q, cache.idx_pages, w, cache.block_table, cache.context_lens)
            for name, (out, idx) in outs.items():
                ok &= check_topk(name, idx, logits64)
                if name != "eager":
                    ok &= check_out(name, out, outs["eager"][0], tol)
        print(f"[v4] decode swaps: {dswaps or 'none'}" + (
            " (indexer_topk: the chain after the cache[block_table] gather and the MXFP4 decode, which"
            " stay Inductor's; see docs/patterns.md, Limits)" if "indexer_topk" in dswaps else ""))
        for name, f in decode.items() if step else ():
            times[("decode step", name)] = timeit(f, step, device, iters)
        if step:
            times[("decode step", UNCHECKED)] = timeit_unchecked(decode["inductor_dsa"], step, device, iters)

        print(f"[v4] timing (median of {iters} calls after 3 warm-up calls, batch 1, prefill S={cfg['seq']})"
              + ("" if device.type == "cuda" else ": CPU, not a performance figure (the inductor_dsa ops run "
                 "their reference or Triton's interpreter; other variants are compiled CPU code)") + ":")
        print(f"  {'stage':12s} {'variant':16s} {'ms/iter':>10s} {'peak MiB':>10s}")
        for (stage, name), (dt, mem) in times.items():
            print(f"  {stage:12s} {name:16s} {dt:10.2f} {('%.0f' % mem) if mem is not None else '-':>10s}")

        # ---- prefill time against sequence length (GPU) ----
        if sweep:
            for seq in sweep:
                print(f"[v4] sweep: prefill S={seq}", flush=True)
                xs = torch.randn(1, seq, cfg["dim"], device=device, dtype=dtype)
                rows.append(dict(seq=seq, **{n: timeit(f, (xs,), device, iters)[0] for n, f in prefill.items()}))
                print("  " + "  ".join(f"{n} {v:.2f} ms" for n, v in rows[-1].items() if n != "seq"), flush=True)
            plot(rows, args.plot)
    print(f"[v4] {'PASS' if ok else 'FAIL'}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(ok=bool(ok), cfg=cfg, device=str(device), prefill_swaps=swaps, decode_swaps=dswaps,
                           times=[dict(stage=st, variant=n, ms=dt, peak_mib=mem) for (st, n), (dt, mem) in times.items()],
                           sweep=rows), f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
