"""Quantised formats used by DeepSeek-V4 indexer caches, in plain torch.

MXFP4 (OCP microscaling): each element is an E2M1 code (bits 0-2 index
``E2M1_VALUES``, bit 3 is the sign), two codes per byte with the LOWER element
index in the LOW nibble, and one E8M0 scale byte per 32 elements worth
``2 ** (byte - 127)`` (0xFF is NaN)::

    x[i] ~= E2M1_VALUES[code[i] & 7] * (-1) ** (code[i] >> 3) * 2 ** (scale[i // 32] - 127)

Encoding rule used here (decoders of every source agree; encoders differ):
scale = 2 ** ceil(log2(amax / 6)) with amax floored at 6 * 2**-126 (the official
reference), codes rounded to the nearest E2M1 value with ties to the even code
(IEEE round-half-even; DeepGEMM/tokenspeed send ties to the smaller magnitude).

FP8 rows: e4m3 values plus one fp32 scale per row, ``x ~= fp8 * scale`` with
scale = amax / fp8_max. ``"fn"`` is OCP e4m3fn (max 448; Hopper, gfx950),
``"fnuz"`` is e4m3fnuz (max 240; the native fp8 of gfx942 / MI300).

Paged cache (tokenspeed / DeepGEMM layout): uint8 pages of ``PAGE_ROWS = 64`` rows,
a page is all row payloads then all row scales::

    mxfp4 page: [64 x D/2 B packed codes][64 x D/32 B E8M0]   (D=128: 68 B per row)
    fp8 page:   [64 x D B e4m3][64 x 4 B fp32 scale]           (D=128: 132 B per row)

Row j of request b lives in page ``block_table[b, j // 64]`` at offset ``j % 64``.
"""
from __future__ import annotations

import torch

MXFP4_BLOCK = 32
PAGE_ROWS = 64
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_MXFP4_AMAX_FLOOR = 6.0 * 2.0**-126
FP8_DTYPES = {"fn": torch.float8_e4m3fn, "fnuz": torch.float8_e4m3fnuz}
FP8_MAX = {"fn": 448.0, "fnuz": 240.0}
FP8_AMAX_FLOOR = 1e-4
FMTS = ("mxfp4", "fp8")


def _check_last_dim(x: torch.Tensor, name: str, multiple: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1 or x.shape[-1] % multiple:
        raise ValueError(f"{name}: last dim {tuple(x.shape)[-1:]} must be a multiple of {multiple}")


def mxfp4_encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x [..., D]`` (D % 32 == 0) to (codes uint8 [..., D/2], E8M0 uint8 [..., D/32])."""
    _check_last_dim(x, "x", MXFP4_BLOCK)
    if not x.is_floating_point():
        raise TypeError(f"x must be floating point, got {x.dtype}")
    xb = x.float().reshape(*x.shape[:-1], -1, MXFP4_BLOCK)
    amax = xb.abs().amax(-1).clamp_min(_MXFP4_AMAX_FLOOR) / 6.0
    mant, exp = torch.frexp(amax)  # amax = mant * 2**exp, mant in [0.5, 1)
    e = torch.where(mant == 0.5, exp - 1, exp).clamp(-127, 127)  # ceil(log2(amax/6))
    y = xb / torch.exp2(e.float()).unsqueeze(-1)
    mag = y.abs().clamp_max(6.0)
    code = torch.zeros_like(mag, dtype=torch.uint8)
    for i, mid in enumerate(_E2M1_MIDPOINTS):
        up = (mag > mid) | ((mag == mid) & (i % 2 == 1))  # tie goes to the even code
        code += up.to(torch.uint8)
    code |= (y < 0).to(torch.uint8) << 3
    code = code.reshape(*x.shape[:-1], -1, 2)
    packed = code[..., 0] | (code[..., 1] << 4)
    return packed.contiguous(), (e + 127).to(torch.uint8)


def mxfp4_decode(packed: torch.Tensor, scale: torch.Tensor, dtype=torch.float32, table=None) -> torch.Tensor:
    """Decode (codes uint8 [..., D/2], E8M0 uint8 [..., D/32]) to ``dtype [..., D]``: fp32
    value[code] * 2^(s - 127), value = E2M1, or the 16 floats of ``table`` (fp32 product, rounded)."""
    if packed.dtype != torch.uint8 or scale.dtype != torch.uint8:
        raise TypeError(f"MXFP4 codes and scales must be uint8, got {packed.dtype}, {scale.dtype}")
    d = packed.shape[-1] * 2
    if scale.shape[:-1] != packed.shape[:-1] or scale.shape[-1] * MXFP4_BLOCK != d:
        raise ValueError(f"MXFP4 scale shape {tuple(scale.shape)} does not fit codes {tuple(packed.shape)}")
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], d).long()
    vals = lut[codes & 7] * torch.where(codes >= 8, -1.0, 1.0) if table is None else table.float()[codes]
    s = torch.exp2(scale.float() - 127.0)
    s = torch.where(scale == 0xFF, torch.nan, s)
    return (vals.reshape(*packed.shape[:-1], -1, MXFP4_BLOCK) * s.unsqueeze(-1)).reshape(vals.shape).to(dtype)


def fp8_encode_rows(x: torch.Tensor, flavor: str = "fn") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x [..., D]`` to (e4m3 [..., D], fp32 scale [...]) with scale = amax / fp8_max."""
    if flavor not in FP8_DTYPES:
        raise ValueError(f"flavor must be one of {sorted(FP8_DTYPES)}, got {flavor!r}")
    _check_last_dim(x, "x", 1)
    scale = x.float().abs().amax(-1).clamp_min(FP8_AMAX_FLOOR) / FP8_MAX[flavor]
    vals = (x.float() / scale.unsqueeze(-1)).clamp(-FP8_MAX[flavor], FP8_MAX[flavor])
    return vals.to(FP8_DTYPES[flavor]), scale


def fp8_decode_rows(vals: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Decode (e4m3 [..., D], fp32 scale [...]) to ``dtype [..., D]``."""
    if vals.dtype not in FP8_DTYPES.values():
        raise TypeError(f"fp8 values must be float8_e4m3fn or float8_e4m3fnuz, got {vals.dtype}")
    if scale.shape != vals.shape[:-1]:
        raise ValueError(f"fp8 scale shape {tuple(scale.shape)} must be {tuple(vals.shape[:-1])}")
    return (vals.float() * scale.float().unsqueeze(-1)).to(dtype)


def row_bytes(fmt: str, head_dim: int) -> tuple[int, int]:
    """(payload bytes, scale bytes) of one cache row: mxfp4 (D/2, D/32), fp8 (D, 4)."""
    if fmt == "mxfp4":
        return head_dim // 2, head_dim // MXFP4_BLOCK
    if fmt == "fp8":
        return head_dim, 4
    raise ValueError(f"fmt must be one of {FMTS}, got {fmt!r}")


def pack_pages(payload: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Lay rows out as pages: payload uint8 [P*64, A], scale uint8 [P*64, S] -> uint8 [P, 64*(A+S)]."""
    rows = payload.shape[0]
    if rows % PAGE_ROWS or scale.shape[0] != rows:
        raise ValueError(f"row count {rows} must be a multiple of {PAGE_ROWS} and match the scales")
    p = rows // PAGE_ROWS
    return torch.cat([payload.reshape(p, -1), scale.reshape(p, -1)], dim=1).contiguous()


def unpack_pages(cache: torch.Tensor, fmt: str, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``pack_pages``: uint8 [P, 64*row] -> (payload [P*64, A], scale [P*64, S]) uint8."""
    a, s = row_bytes(fmt, head_dim)
    if cache.dtype != torch.uint8 or cache.dim() != 2 or cache.shape[1] != PAGE_ROWS * (a + s):
        raise ValueError(
            f"kv_cache must be uint8 [num_pages, {PAGE_ROWS * (a + s)}] for fmt={fmt!r}, D={head_dim}; "
            f"got {cache.dtype} {tuple(cache.shape)}"
        )
    p = cache.shape[0]
    payload = cache[:, : PAGE_ROWS * a].reshape(p * PAGE_ROWS, a)
    scale = cache[:, PAGE_ROWS * a :].reshape(p * PAGE_ROWS, s)
    return payload, scale


def store_rows(cache: torch.Tensor, rows: torch.Tensor, payload: torch.Tensor, scale: torch.Tensor) -> None:
    """Write cache rows in place (the layout of ``pack_pages``): flat row ``rows[i]`` is row
    ``rows[i] % 64`` of page ``rows[i] // 64``; payload uint8 [R, A], scale uint8 [R, S].
    This is how a decode step appends a new key row to a paged cache."""
    a, s = payload.shape[-1], scale.shape[-1]
    if cache.dtype != torch.uint8 or cache.dim() != 2 or cache.shape[1] != PAGE_ROWS * (a + s):
        raise ValueError(f"kv_cache must be uint8 [num_pages, {PAGE_ROWS * (a + s)}], got {cache.dtype} "
                         f"{tuple(cache.shape)}")
    page, off = (rows.long() // PAGE_ROWS).unsqueeze(1), (rows.long() % PAGE_ROWS).unsqueeze(1)
    cache[page, off * a + torch.arange(a, device=cache.device)] = payload
    cache[page, PAGE_ROWS * a + off * s + torch.arange(s, device=cache.device)] = scale


def encode_rows(x: torch.Tensor, fmt: str, flavor: str = "fn") -> tuple[torch.Tensor, torch.Tensor]:
    """Encode ``x [R, D]`` into cache-row bytes: (payload uint8 [R, A], scale uint8 [R, S])."""
    if fmt == "mxfp4":
        return mxfp4_encode(x)
    if fmt == "fp8":
        vals, scale = fp8_encode_rows(x, flavor)
        return vals.view(torch.uint8), scale.view(torch.uint8).reshape(-1, 4)
    raise ValueError(f"fmt must be one of {FMTS}, got {fmt!r}")


def decode_rows(payload: torch.Tensor, scale: torch.Tensor, fmt: str, flavor: str = "fn", table=None) -> torch.Tensor:
    """Decode cache-row bytes (payload uint8 [R, A], scale uint8 [R, S]) to fp32 [R, D]; MXFP4
    codes through ``table`` (16 floats) when given."""
    if fmt == "mxfp4":
        return mxfp4_decode(payload, scale, table=table)
    if fmt == "fp8":
        vals = payload.contiguous().view(FP8_DTYPES[flavor])
        return fp8_decode_rows(vals, scale.contiguous().view(torch.float32).reshape(-1))
    raise ValueError(f"fmt must be one of {FMTS}, got {fmt!r}")
