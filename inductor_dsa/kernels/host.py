"""Host-side helpers of the launchers: integer arithmetic, torch -> Triton dtypes.

``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr functions in recent Triton: called
from host code each one unwraps its arguments first (a few microseconds; triton 3.7 on this
project's CPU: ~6 us), and a launcher calls them several times per op call.
"""

import torch
import triton.language as tl

TL_DTYPES = {
    torch.bfloat16: tl.bfloat16,
    torch.float16: tl.float16,
    torch.float32: tl.float32,
    torch.float8_e4m3fn: tl.float8e4nv,
    torch.float8_e4m3fnuz: tl.float8e4b8,
}


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for b > 0."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n, for n >= 1."""
    return 1 << (n - 1).bit_length()
