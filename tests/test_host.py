"""The launchers' host-side integer helpers agree with Triton's own (which are slow to call from host code)."""
import triton

from inductor_dsa.kernels.host import cdiv, next_pow2


def test_cdiv_and_next_pow2_match_triton():
    for a in [0, 1, 2, 3, 63, 64, 65, 1000, 4097, 262144, 262145, 2**31 - 1]:
        for b in [1, 2, 3, 16, 64, 132, 528, 4096]:
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
        if a >= 1:
            assert next_pow2(a) == triton.next_power_of_2(a), a
