"""Recognisers: what a DSA indexer, a paged key and sparse attention *are*, proven on the values
the symbolic engine (``inductor_dsa.symbolic``) reads from a graph.

``forms``: shared forms (operands, products and constants, masks, head limits, region text, the
handler sets every recogniser reads with); ``indexer``: the weighted-ReLU indexer logits and their
mask; ``paged``: a key decoded from a paged MXFP4/FP8 byte cache; ``attention``: sparse attention.
"""
