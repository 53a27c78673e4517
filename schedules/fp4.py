"""NVFP4, the batched-GEMV seed's format: 4-bit e2m1 values with one e4m3 scale per 16 of them.

An e2m1 code is 4 bits, sign (bit 3), exponent (bits 2-1) and mantissa (bit 0):
0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. Two codes share a byte, the element with the
lower index in the low nibble (torch's `float4_e2m1fn_x2`). Each run of 16 consecutive elements
along K has one scale, a float8 e4m3 (`float8_e4m3fn`); an element's value is its code's value
times its scale.

This module holds the format's facts that the workload's compute definition, the kernels and
the tests share: the value table, the decode as a TIR expression (the reference definition's)
and the bit-operation decode of the fast kernels, with its proof of exactness in `fast_decode`.
"""

from __future__ import annotations

from tvm import tirx

NAME = "nvfp4"
SCALE_DTYPE = "float8_e4m3fn"
CODE_BYTES = "uint8"  # A and the vector: two codes per byte, stored as plain bytes
BLOCK = 16  # elements per scale
PER_BYTE = 2
# The value of each of the 16 codes, by code: magnitudes 0-7, then the same negated.
VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def code(byte, index):
    """The 4-bit code of element `index` (any integer expression) of a row of packed bytes,
    `byte` being the byte that holds it: the low nibble for an even index, the high for an odd."""
    return (tirx.Cast("int32", byte) >> (index % PER_BYTE * 4)) & 15


def value(code_expr):
    """The float32 value of an e2m1 code, as arithmetic: exponent e and mantissa m give
    m / 2 when e = 0, else (2 + m) * 2^e / 4; bit 3 negates."""
    exponent, mantissa = (code_expr >> 1) & 3, code_expr & 1
    f32 = lambda e: tirx.Cast("float32", e)  # noqa: E731
    magnitude = tirx.Select(exponent == 0, f32(mantissa) * 0.5,
                            f32(2 + mantissa) * f32(tirx.const(1, "int32") << exponent) * 0.25)
    return tirx.Select((code_expr & 8) != 0, -magnitude, magnitude)


# -- the fast decode: bit operations, two values per 32-bit register -----------------------------
# A 32-bit word of packed codes holds 8 elements, e0 (bits 0-3) to e7 (bits 28-31). Pair p
# (0 <= p < 4) is (e_p, e_{p+4}): its nibbles are 16 bits apart, like the two halves of an
# f16x2 register. Shifting the word left by 12 - 4p puts the pair's nibbles at the top of the
# two halves, sign at bit 15; shifting that right by 3 puts their three magnitude bits at bits
# 11-9 (exponent bits 1-0 and the mantissa's top bit). Masked and joined, each half is an fp16
# whose value is the code's value times 2^-14 (the subnormal code 0.5 becomes the fp16 subnormal
# 2^-15); a multiply by 2^14, or a scale that carries it, gives the value. Two shifts and two
# masks per pair of values, no branch, no table.
HALF_SIGNS = 0x80008000
HALF_MAGNITUDES = 0x0E000E00
UNIT = 2.0 ** -14  # what the decoded fp16 holds per unit of the code's value
UNIT_HALF2 = 0x74007400  # 2^14 in both halves of an f16x2: undoes UNIT


def pair_bits(word: int, pair: int) -> int:
    """The f16x2 bits of pair `pair` of a 32-bit word of codes, computed as `pair_expr` does."""
    top = (word << (12 - 4 * pair)) & 0xFFFFFFFF
    return (top & HALF_SIGNS) | ((top >> 3) & HALF_MAGNITUDES)


def pair_expr(word, pair):
    """`pair_bits` as a uint32 TIR expression on `word` (a uint32 expression); `pair` may be
    a loop variable."""
    u32 = lambda v: tirx.Cast("uint32", v)  # noqa: E731
    top = tirx.shift_left(word, u32(12 - 4 * pair))
    return tirx.bitwise_or(tirx.bitwise_and(top, u32(HALF_SIGNS)),
                           tirx.bitwise_and(tirx.shift_right(top, u32(3)), u32(HALF_MAGNITUDES)))


def half_value(bits: int) -> float:
    """The value of 16 fp16 bits, subnormals included."""
    sign = -1.0 if bits & 0x8000 else 1.0
    exponent, fraction = (bits >> 10) & 0x1F, bits & 0x3FF
    if exponent == 0x1F:
        return sign * float("inf") if fraction == 0 else float("nan")
    if exponent == 0:
        return sign * fraction * 2.0 ** -24
    return sign * (1 + fraction / 1024) * 2.0 ** (exponent - 15)


def fast_decode(word: int) -> list[float]:
    """The 8 values of a word of codes as the fast decode gives them, in element order, each
    times 2^14: what `pair_bits`' halves hold, put back in place."""
    values = [0.0] * 8
    for pair in range(4):
        bits = pair_bits(word, pair)
        values[pair] = half_value(bits & 0xFFFF) / UNIT
        values[pair + 4] = half_value(bits >> 16) / UNIT
    return values


def e4m3_value(byte: int) -> float:
    """The value of a float8 e4m3 (`float8_e4m3fn`) byte: bias 7, no infinities, NaN at
    S.1111.111."""
    byte = int(byte)
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 7
    if exponent == 0xF and mantissa == 7:
        return float("nan")
    if exponent == 0:
        return sign * mantissa / 8 * 2.0 ** -6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


# -- the integer decode: a byte table looked up by `prmt`, products summed by `dp4a` -------------
# Twice each code's value is a small integer (0, 1, 2, 3, 4, 6, 8, 12 and their negatives), so a
# 16-element block's sum of products, times 4, is an exact int32. `prmt.b32 d, lo, hi, sel` makes
# each byte i of d from nibble i of sel: its bits 2-0 pick one of the 8 bytes of (hi:lo), its
# bit 3 replaces the picked byte by copies of that byte's sign bit. With the eight doubled
# magnitudes as the table (all below 128, so their sign bit is 0), the codes themselves as the
# selector give four bytes: the doubled magnitude of each positive code and 0 for each negative
# one; the codes with their signs flipped give the negative codes' magnitudes and 0 elsewhere.
# A word of B's codes is then four `prmt` (two halves, each plain and flipped) and two `dp4a`
# sums, the positive codes' and the negative codes', whose difference is the block's sum.
MAGNITUDE_TABLE = (0x03020100, 0x0C080604)  # twice 0, 0.5, 1, 1.5 | 2, 3, 4, 6: bytes 0-7
CODE_SIGNS = 0x88888888
BYTE_BIAS = 0x80808080


def prmt(lo: int, hi: int, selector: int) -> int:
    """PTX's `prmt.b32` in its default mode: byte i of the result from nibble i of `selector`."""
    table = (hi << 32 | lo).to_bytes(8, "little")
    out = 0
    for i in range(4):
        nibble = selector >> (4 * i) & 15
        byte = table[nibble & 7]
        if nibble & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def magnitude_bytes(word: int, half: int, negative: bool) -> int:
    """The doubled magnitudes of codes 4 * half to 4 * half + 3 of a word, one per byte, of the
    positive codes (0 for the negative ones) or, with `negative`, of the negative codes, as the
    `prmt` of `magnitude_bytes_expr` makes them."""
    codes = word >> (16 * half) & 0xFFFF
    return prmt(*MAGNITUDE_TABLE, codes ^ (CODE_SIGNS & 0xFFFF) if negative else codes)


def signed_bytes(word: int, half: int) -> int:
    """Twice the values of codes 4 * half to 4 * half + 3 of a word as four int8 bytes, made as
    `signed_bytes_expr` makes them: the positive codes' bytes, or-ed with the negative codes'
    negated a byte at a time ((128 - m) ^ 128 is -m in 8 bits for m < 128, with no borrow out of
    the byte)."""
    negated = ((BYTE_BIAS - magnitude_bytes(word, half, True)) ^ BYTE_BIAS) & 0xFFFFFFFF
    return magnitude_bytes(word, half, False) | negated


def int8s(word: int) -> list[int]:
    """The four signed bytes of a 32-bit word, byte 0 first."""
    return [(b ^ 0x80) - 0x80 for b in word.to_bytes(4, "little")]
