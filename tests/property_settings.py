"""Hypothesis settings of the property tests (test_properties.py, test_strides.py): small,
derandomized example counts, so the files stay fast under TRITON_INTERPRET=1 and run the same
examples every time."""
import os

from hypothesis import settings

# INDUCTOR_DSA_EXAMPLES=k multiplies every example count by k and draws fresh examples (not
# derandomized): the larger run on a GPU. CI runs the small fixed set (k = 1).
SCALE = int(os.environ.get("INDUCTOR_DSA_EXAMPLES", "1"))


def examples(n: int) -> settings:
    """Hypothesis settings for ``n`` examples (times SCALE), no deadline."""
    return settings(max_examples=n * SCALE, deadline=None, derandomize=SCALE == 1)
