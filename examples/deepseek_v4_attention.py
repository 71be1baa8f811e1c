"""A small DeepSeek-V4 attention block in plain eager PyTorch, compiled with inductor_dsa.

    python examples/deepseek_v4_attention.py                 # CPU-small defaults (< 1 min)
    python examples/deepseek_v4_attention.py --device cuda   # V4-Flash sizes: H=64, D=128, top-512
    python examples/deepseek_v4_attention.py --device cuda --pro   # V4-Pro: H=128, top-1024

Three layers, one of each V4 kind (DSA_SEMANTICS.md; our own code, written in the style of the
official reference, not copied from it):
  * CSA (compress ratio 4): learned gated pooling of every 4 KV rows + an indexer (q_idx from a
    linear, weights from a linear scaled by D**-0.5 * H**-0.5, einsum "bshd,btd->bsht", relu,
    weighted head-sum, official ratio mask j >= (t+1)//4 -> -inf, topk, official -1
    post-processing) + sliding window 128, then sparse attention with a per-head sink;
  * HCA (ratio 128): window + every visible compressed entry, no indexer;
  * window-only: sliding window 128.
Sparse attention is written eagerly: gather KV rows by index, scores, softmax over
cat([scores, sink]) and drop the sink column.

The script runs the block eagerly, with default torch.compile and with
torch.compile(backend=inductor_dsa.backend); prints inductor_dsa.report() (the indexer chain must
be swapped); checks the CSA top-k sets against an fp64 oracle (reference.topk_mismatch) and the
block output against eager; prints time (and GPU peak memory). Exits 1 if any check fails.

Not in this version: decode (paged MXFP4 indexer-key cache, MTP), RoPE, the real V4 compressor
(overlapping windows, positional bias), low-rank q projection, the MoE / MLA parts of the model.
The pass does not match the eager sparse-attention spelling yet, so that part stays Inductor's.

Spelling note: a first version fed the compressor output straight into the einsum; the pass
rejected it ("relu is not applied to a q.k product": the key side was a gated-pooling reduction,
not a tensor it can read as keys). Writing the compressed index keys into a kv_cache buffer and
reading a slice of it, as the official prefill branch does (and tests/pass_corpus.py's ToyIndexer),
is swapped.
On a CPU, without TRITON_INTERPRET=1 the inductor_dsa ops run their fp64 reference (the printout
says which); timings on a small shared CPU are noisy and say nothing about the GPU kernels.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn

import inductor_dsa
from inductor_dsa import reference

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

    def inputs(self, x):
        q = self.wq(x).unflatten(-1, (self.n_heads, self.head_dim))            # [B, S, H, D]
        weights = self.weights_proj(x) * (self.softmax_scale * self.n_heads ** -0.5)
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
    gpu = args.device != "cpu"
    if args.pro:
        cfg = dict(seq=4096, dim=2048, heads=128, head_dim=128, index_heads=128, index_head_dim=128, topk=1024)
    elif gpu:
        cfg = dict(seq=4096, dim=2048, heads=64, head_dim=128, index_heads=64, index_head_dim=128, topk=512)
    else:   # CPU-small: 39-70 s on a shared 2-core CPU (compilations; less once the FX cache is warm)
        cfg = dict(seq=256, dim=256, heads=16, head_dim=64, index_heads=64, index_head_dim=128, topk=32)
    if args.seq:
        cfg["seq"] = args.seq
    if args.heads:
        cfg["heads"] = cfg["index_heads"] = args.heads
    return cfg


def timeit(fn, x, device, iters):
    fn(x)                                           # warm-up (compilation happens here)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / iters * 1e3
    mem = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    return dt, mem


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seq", type=int, default=None, help="sequence length (multiple of 128)")
    p.add_argument("--heads", type=int, default=None, help="attention and indexer heads")
    p.add_argument("--pro", action="store_true", help="V4-Pro sizes (128 heads, top-1024)")
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--skip-default", action="store_true", help="skip the default torch.compile variant")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    cfg = sizes(args)
    if cfg["seq"] % 128:
        p.error("--seq must be a multiple of 128 (HCA ratio)")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    iters = args.iters or (10 if device.type == "cuda" else 2)
    kernels = ("Triton kernels" if device.type != "cpu" or os.environ.get("TRITON_INTERPRET") == "1"
               else "fp64 reference (CPU; TRITON_INTERPRET=1 runs the Triton kernels instead)")
    print(f"[v4] device={device} dtype={dtype} {cfg}; inductor_dsa ops run: {kernels}", flush=True)

    torch.manual_seed(0)
    block = V4Block(cfg["dim"], cfg["heads"], cfg["head_dim"], cfg["index_heads"],
                    cfg["index_head_dim"], cfg["topk"], cfg["seq"]).to(device=device, dtype=dtype).eval()
    for layer in block.layers:          # non-zero sinks, kept fp32 like the official attn_sink
        layer.attn_sink.data = torch.randn(cfg["heads"], device=device) * 0.5
    x = torch.randn(1, cfg["seq"], cfg["dim"], device=device, dtype=dtype)

    ok = True
    with torch.no_grad():
        t0 = time.perf_counter()
        ref_out, ref_idx = block(x)
        print(f"[v4] eager ran in {time.perf_counter() - t0:.2f} s", flush=True)

        times = {"eager": timeit(block, x, device, iters)}
        outs = {}
        if not args.skip_default:
            torch._dynamo.reset()
            default = torch.compile(block)
            t0 = time.perf_counter()
            outs["default compile"] = default(x)
            print(f"[v4] default torch.compile: first call (compile) {time.perf_counter() - t0:.1f} s", flush=True)
            times["default compile"] = timeit(default, x, device, iters)

        torch._dynamo.reset()
        inductor_dsa.lowering.reset()
        # a graph-cache hit would skip the pass (its result is in the cached code) and the report
        # would be empty: compile fresh so the report shows what this run swapped
        torch._inductor.config.force_disable_caches = True
        dsa = torch.compile(block, backend=inductor_dsa.backend)
        t0 = time.perf_counter()
        outs["inductor_dsa"] = dsa(x)
        print(f"[v4] inductor_dsa backend: first call (compile) {time.perf_counter() - t0:.1f} s", flush=True)
        times["inductor_dsa"] = timeit(dsa, x, device, iters)

        print("[v4] inductor_dsa.report():")
        print("  " + str(inductor_dsa.report()).replace("\n", "\n  "))
        swaps = dict(inductor_dsa.lowering.counters)
        print(f"[v4] swap counters: {swaps}")
        if swaps.get("indexer_topk", 0) < 1:
            print("[v4] FAIL: the CSA indexer chain was not swapped for indexer_topk")
            ok = False

        # top-k sets against the fp64 oracle on the same (eager) indexer inputs
        csa = block.layers[0]
        q, k, w = csa.indexer.inputs(block.norm(x))
        ks, ke = reference.ratio_ranges(cfg["seq"], 4, device)
        logits64 = reference.indexer_logits(q[0], k[0], w[0], ks, ke)
        for name, (_, idx) in [("eager", (ref_out, ref_idx))] + list(outs.items()):
            msg = reference.topk_mismatch(idx[0], logits64, idx.size(-1))
            print(f"[v4] top-k sets, {name:16s} vs fp64 oracle: {msg or 'match (with tolerance)'}")
            ok &= msg is None
        tol = 5e-2 if dtype == torch.bfloat16 else 1e-3
        for name, (out, _) in outs.items():
            err = ((out.float() - ref_out.float()).abs().max() / ref_out.float().abs().max()).item()
            good = err <= tol
            print(f"[v4] output, {name:16s} vs eager: max rel err {err:.2e} (tol {tol:.0e}) "
                  f"{'ok' if good else 'FAIL'}")
            ok &= good

        print(f"[v4] timing ({iters} iters after warm-up, batch 1, S={cfg['seq']}):")
        print(f"  {'variant':16s} {'ms/iter':>10s} {'peak MiB':>10s}")
        for name, (dt, mem) in times.items():
            print(f"  {name:16s} {dt:10.1f} {('%.0f' % mem) if mem is not None else '-':>10s}")
    print(f"[v4] {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
