"""Quick demo: the fused DSA indexer top-k on random V4-shaped inputs, checked against the oracle.

    python examples/demo.py            # GPU if present, else Triton's CPU interpreter (small sizes)

logits[t, j] = sum_h w[t, h] * relu(q[t, h] . k[j]) over the visible j < (t + 1) // 4 (V4 ratio-4
mask), then the top-k per query, as DeepSeek-V4's CSA indexer selects compressed KV entries.
"""
import os
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # run the Triton kernels on the CPU

import inductor_dsa  # noqa: E402
from inductor_dsa import formats, reference  # noqa: E402


def main():
    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    s, h, d, topk = (8192, 64, 128, 512) if gpu else (128, 64, 128, 16)
    n = s // 4
    print(f"device: {torch.cuda.get_device_name() if gpu else 'CPU (Triton interpreter)'}; "
          f"S={s} compressed K={n} H={h} D={d} top-{topk}")
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(s, h, d, device=dev, generator=g).bfloat16()
    k = torch.randn(n, d, device=dev, generator=g).bfloat16()
    w = (torch.randn(s, h, device=dev, generator=g) * (d * h) ** -0.5).bfloat16()
    ks, ke = reference.ratio_ranges(s, 4, dev)
    for label, kk in (("bf16 keys", k), ("MXFP4 keys", formats.mxfp4_encode(k))):
        t0 = time.perf_counter()
        vals, idx = inductor_dsa.indexer_topk(q, kk, w, topk, k_start=ks, k_end=ke)
        if gpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rows = torch.linspace(0, s - 1, 64, device=dev).long()
        ref = reference.indexer_logits(q[rows], kk, w[rows], ks[rows], ke[rows])
        verdict = reference.topk_mismatch(idx[rows], ref, topk) or "matches the fp64 oracle (as sets, with tolerance)"
        print(f"{label:11} first call {dt * 1e3:8.1f} ms (includes compile); top-{topk} of row {s - 1}: "
              f"{idx[-1, :5].tolist()}...; {verdict}")
        if verdict.startswith("row"):
            raise SystemExit(1)


if __name__ == "__main__":
    main()
