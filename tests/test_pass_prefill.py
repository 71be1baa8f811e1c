"""The prefill indexer corpus: every spelling must be swapped, and stay correct.

Compiled through Inductor's compile_fx with the pass (code generation replaced by running
the rewritten FX graph, see pass_helpers.pass_only_backend); the tests that compile with
``inductor_dsa.backend`` (test_pass_dynamic.py, test_pass_api.py, test_pass_paged.py,
test_pass_attention.py, test_integration.py) cover real code generation. On CPU the inductor_dsa ops run the float64 reference.
"""
import pytest
import torch

from pass_corpus import CASES
from pass_helpers import case_args, check_case, compile_run, default_dtype

PARAMS = [pytest.param(c, dt, id=f"{c.name}-{str(dt).replace('torch.', '')}")
          for c in CASES for dt in c.dtypes]


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_prefill_spelling_is_swapped_and_correct(case, dtype):
    args = case_args(case, dtype)
    with default_dtype(dtype if dtype == torch.bfloat16 else torch.float32):
        out, counts = compile_run(case.fn, args)
        with torch.no_grad():
            eager = case.fn(*args)
    assert counts == case.swaps, f"expected swaps {case.swaps}, got {counts}"
    check_case(case, dtype, args, out, eager)
