"""In-register decoders shared by the kernels: MXFP4 (E2M1 + E8M0), FP8 e4m3 bytes, float keys.

Nothing dense is ever written: these run on freshly loaded bytes inside a tile.
"""
import triton
import triton.language as tl

# Operand formats (Q_FMT / K_FMT of every kernel), one numbering for all of them:
FMT_TENSOR = tl.constexpr(0)      # plain floating tensor (bf16 / fp16 / fp32 / native fp8), loaded as is
FMT_MXFP4 = tl.constexpr(1)       # uint8 E2M1 codes + E8M0 scales, decoded in registers
FMT_FP8_BYTES = tl.constexpr(2)   # e4m3 bytes decoded arithmetically (targets without that fp8 flavour)
FMT_FP8_NATIVE = tl.constexpr(3)  # e4m3 bytes of the target's own flavour: bitcast + hardware convert


@triton.jit
def e2m1_twice_to_f32(code):
    """2 * E2M1(code) as float32 for an int32 code 0..15 (bit 3 = sign), built as float bits with
    integer ops only, every result exact. Magnitude code m = e:m0 (3 bits): for m >= 2 the twice
    value 2**e * (1 + m0/2) has the bits 0x3F800000 + m * 2**22 (exponent e + 127, mantissa m0);
    m = 0, 1 are the values 0, 1 (bits m * 0x3F800000); bit 3 moves to the sign bit. No
    int -> float conversion: I2F runs at a fraction of the FP32 rate on sm90 and there is one per
    key element (an or-with-2**23 trick is folded back into I2F by LLVM)."""
    m = code & 7
    bits = tl.where(m >= 2, m * 0x400000 + 0x3F800000, m * 0x3F800000) | ((code & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e2m1_to_f32(code):
    """E2M1 code (int32, 0..15) -> float32: bits 0-2 index {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 sign."""
    return e2m1_twice_to_f32(code) * 0.5


@triton.jit
def e8m0_to_f32(s):
    """E8M0 byte (int32) -> 2 ** (s - 127) as float32; 0 -> 2**-127 (subnormal), 255 -> NaN."""
    bits = tl.where(s == 0, 0x00400000, tl.where(s == 255, 0x7FC00000, s << 23))
    return bits.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def e8m0_half_to_f32(s):
    """E8M0 byte (int32) -> 2 ** (s - 128) (half the scale) as float32; 255 -> NaN.
    s = 0, 1 give the fp32 subnormals 2**-128, 2**-127."""
    bits = tl.where(s >= 2, (s - 1) << 23, 0x00200000 << s)
    bits = tl.where(s == 255, 0x7FC00000, bits)
    return bits.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def load_mxfp4_rows(codes_ptr, scale_ptr, code_off, scale_off, row_mask, R: tl.constexpr, D: tl.constexpr):
    """Decode R rows of D MXFP4 elements to float32 [R, D], columns in order.

    code_off / scale_off: int64 [R] element offsets of each row's first code byte / scale byte.
    Byte i of a row holds element 2i in its low nibble and element 2i+1 in its high nibble.
    Each element is (2 * E2M1) * (scale / 2): the halving is folded into the per-block scale.
    """
    c = tl.load(codes_ptr + code_off[:, None] + tl.arange(0, D // 2)[None, :],
                mask=row_mask[:, None], other=0).to(tl.int32)
    codes = tl.reshape(tl.join(c & 15, c >> 4), (R, D))
    s = tl.load(scale_ptr + scale_off[:, None] + tl.arange(0, D // 32)[None, :],
                mask=row_mask[:, None], other=127).to(tl.int32)
    vals = tl.reshape(e2m1_twice_to_f32(codes), (R, D // 32, 32)) * e8m0_half_to_f32(s)[:, :, None]
    return tl.reshape(vals, (R, D))


@triton.jit
def e2m1_pairs(x, SHIFT: tl.constexpr):
    """Two E2M1 codes of each uint32 word x, at bits SHIFT..SHIFT+3 and 16+SHIFT.., as the bits of two
    bf16 (low half, high half) holding E2M1 * 2**-126: code sign to bit 15, magnitude bits e:m to
    bits 8-6, so e > 0 is the normal 2**(e - 127) * (1 + m/2) and e = 0 the subnormal m * 2**-127."""
    if SHIFT > 6:
        mag = (x >> (SHIFT - 6)) & 0x01C001C0
    else:
        mag = (x << (6 - SHIFT)) & 0x01C001C0
    return mag | ((x << (12 - SHIFT)) & 0x80008000)


@triton.jit
def mxfp4_rows_mma(codes_ptr, scale_ptr, code_off, scale_off, row_mask, R: tl.constexpr, D: tl.constexpr,
                   OUT: tl.constexpr, ALIGNED: tl.constexpr, DOT: tl.constexpr, SCALE_WORDS: tl.constexpr = False):
    """R rows of D MXFP4 elements as DOT [R, D], the columns permuted as ``mma_k_order`` says. They
    are computed in OUT: bf16 where packed bf16 multiplies are native (sm90), else fp32 (gfx942,
    the interpreter), then truncated to DOT (exact values: truncation is exact, and one instruction).

    A row's D/2 code bytes are read as D/8 little-endian uint32 words (ALIGNED: one load each, the
    row starts must be 4-byte aligned, and those of the scales with SCALE_WORDS; else assembled from bytes). Word W
    holds element 8W + j in nibble j; elements i and i + 4 become one bf16 pair, the low and high half of a 32-bit word,
    with two shifts and two masks (``e2m1_pairs``): exactly E2M1 * 2**-126. The block scale 2**(s - 127) * 2**126 = 2**(s - 1) then multiplies as
    2**(min(s, 128) - 1) * 2**(max(s, 128) - 128), both factors representable (255 -> NaN), so
    every product is exact. On sm90 the column order gives each thread the 16 bytes of its wgmma
    A fragment as one 128-bit load (lane l % 4 of a row holds k = 2l, 2l + 1 (+ 8) of each 16-wide
    k step), and the decoded pairs are the MMA's packed bf16 registers: no layout shuffle.
    With SCALE_WORDS (and ALIGNED, D >= 128: the paged keys) a row's D/32 scale bytes are read as
    uint32 words too. Read as bytes, R x D/32 of them came to 1-2 per thread on sm90, too narrow
    for the pipeliner's asynchronous copies: a synchronous load per key block (SASS: LDG.E.U16 /
    LDG.E.U8 in the loop). Words made the prefill logits loop slower, though (H100, T=K=4096 bf16
    q + MXFP4 k: 0.436 -> 0.509 ms), so it reads bytes. Masked rows read scale 0 there (finite
    factors; their codes are 0, so their keys are 0).
    """
    NW: tl.constexpr = D // 8
    NB: tl.constexpr = D // 32
    if ALIGNED:
        words = codes_ptr.to(tl.pointer_type(tl.uint32), bitcast=True)
        x = tl.load(words + (code_off // 4)[:, None] + tl.arange(0, NW)[None, :], mask=row_mask[:, None], other=0)
    else:
        byte = tl.arange(0, 4)[None, None, :]
        b = tl.load(codes_ptr + code_off[:, None, None] + 4 * tl.arange(0, NW)[None, :, None] + byte,
                    mask=row_mask[:, None, None], other=0)
        x = tl.sum(b.to(tl.uint32) << (8 * byte).to(tl.uint32), axis=2)
    pairs = tl.join(tl.join(e2m1_pairs(x, 0), e2m1_pairs(x, 4)), tl.join(e2m1_pairs(x, 8), e2m1_pairs(x, 12)))
    if SCALE_WORDS and ALIGNED and NB % 4 == 0:
        sw = tl.load(scale_ptr.to(tl.pointer_type(tl.uint32), bitcast=True) + (scale_off // 4)[:, None]
                     + tl.arange(0, NB // 4)[None, :], mask=row_mask[:, None], other=0)
        s = tl.reshape((sw[:, :, None] >> (8 * tl.arange(0, 4)).to(tl.uint32)[None, None, :]) & 255,
                       (R, NB)).to(tl.int32)
    else:
        s = tl.load(scale_ptr + scale_off[:, None] + tl.arange(0, NB)[None, :], mask=row_mask[:, None],
                    other=127).to(tl.int32)
    f1 = (tl.minimum(s, 128) + 126) << 7  # bf16 bits
    f2 = tl.where(s == 255, 0x7FC0, (tl.maximum(s, 128) - 1) << 7)
    if OUT == tl.bfloat16:
        v = tl.join((pairs >> 16).to(tl.int16), pairs.to(tl.int16)).to(tl.bfloat16, bitcast=True)
        f1 = f1.to(tl.int16).to(tl.bfloat16, bitcast=True)
        f2 = f2.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        v = tl.join(pairs & 0xFFFF0000, pairs << 16).to(tl.float32, bitcast=True)
        f1 = (f1 << 16).to(tl.float32, bitcast=True)
        f2 = (f2 << 16).to(tl.float32, bitcast=True)
    # v [R, NW, h, i, e]: element 8W + 4(1 - e) + 2i + h; words 4b .. 4b+3 share block b's scale
    v = tl.reshape(v, (R, NB, 4, 2, 2, 2)) * f1[:, :, None, None, None, None] * f2[:, :, None, None, None, None]
    v = tl.permute(tl.reshape(v, (R, 4, NB, 2, 2, 2)), (0, 2, 4, 3, 1, 5))
    return tl.reshape(v, (R, D)).to(DOT, fp_downcast_rounding="rtz")


@triton.jit
def mma_k_order(x, R: tl.constexpr, D: tl.constexpr):
    """x [R, D] with its columns in ``mxfp4_rows_mma``'s order: column 32w + 16i + 8h + 2l + e
    (l < 4, w < D/32, i, h, e < 2) holds element 8W + 4(1 - e) + 2i + h of word W = (D/32) l + w
    (pair 2i + h of the word, its high half first). A permutation of the column index bits with e
    flipped: a reshape, a permute and a split / join in registers. The other operand of the dot
    in this order makes the dot over the permuted columns equal the original one."""
    y = tl.permute(tl.reshape(x, (R, 4, D // 32, 2, 2, 2)), (0, 2, 4, 5, 1, 3))
    e1, e0 = tl.split(y)  # the last axis holds 1 - e
    return tl.reshape(tl.join(e0, e1), (R, D))


@triton.jit
def e4m3_bytes_to_f32(b, FNUZ: tl.constexpr):
    """e4m3 byte (int32 0..255) -> float32 for OCP e4m3fn (bias 7, 0x7f/0xff NaN) or fnuz (bias 8, 0x80 NaN)."""
    BIAS: tl.constexpr = 8 if FNUZ else 7
    sign = b >> 7
    e = (b >> 3) & 15
    m = (b & 7).to(tl.float32)
    normal = (1.0 + m * 0.125) * tl.exp2((e - BIAS).to(tl.float32))
    sub = m * 0.125 * tl.exp2((1 - BIAS) * 1.0)
    val = tl.where(e == 0, sub, normal)
    val = tl.where(sign == 1, -val, val)
    if FNUZ:
        val = tl.where(b == 0x80, float("nan"), val)
    else:
        val = tl.where((b & 0x7F) == 0x7F, float("nan"), val)
    return val
