"""Adasum computed in numpy, independently of Perseus, for the tests of every front end.

adasum(inputs) combines one tensor's per-rank values (rank order) in the pairing
Perseus documents: ranks r >= p (p the largest power of two <= n) fold into r - p,
then recursive doubling at distances 1, 2, 4, ... with the lower rank's vector as
`a` in  a' = (1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b  (a zero vector's
coefficient is 1). `round_to` rounds each level's result as the wire dtype would.
"""
import numpy as np


def pair(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    dot = float(np.sum(a * b))
    aa = float(np.sum(a * a))
    bb = float(np.sum(b * b))
    ca = 1.0 if aa == 0 else 1.0 - dot / (2 * aa)
    cb = 1.0 if bb == 0 else 1.0 - dot / (2 * bb)
    return ca * a + cb * b


def round_bf16(x):
    """float64 -> nearest bfloat16 (ties to even, through float32), as float64."""
    bits = np.asarray(x, np.float64).astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


ROUNDING = {
    "float16": lambda x: np.asarray(x).astype(np.float16).astype(np.float64),
    "bfloat16": round_bf16,
    "float32": lambda x: np.asarray(x).astype(np.float32).astype(np.float64),
    "float64": lambda x: np.asarray(x, np.float64),
}

EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}


def adasum(inputs, dtype_name="float64"):
    """The Adasum of `inputs` (one array per rank, rank order), rounded per level."""
    rnd = ROUNDING[dtype_name]
    vs = [rnd(x) for x in inputs]
    n = len(vs)
    p = 1
    while p * 2 <= n:
        p *= 2
    for r in range(n - p):
        vs[r] = rnd(pair(vs[r], vs[r + p]))
    vs = vs[:p]
    d = 1
    while d < p:
        vs = [rnd(pair(vs[min(r, r ^ d)], vs[max(r, r ^ d)])) for r in range(p)]
        d *= 2
    return vs[0]


def assert_adasum_close(got, inputs, dtype_name, what, prescale=1.0, postscale=1.0):
    """got (array-like) against adasum(prescaled inputs) * postscale. Allowed error:
    a few roundings of the dtype per level, relative to the tensor's largest value
    (the reference's sums run in another order; fp16/bf16 round each level)."""
    rnd = ROUNDING[dtype_name]
    scaled = [rnd(np.asarray(x, np.float64) * prescale) for x in inputs]
    expected = adasum(scaled, dtype_name) * postscale
    got = np.asarray(got, np.float64)
    assert got.shape == expected.shape, "%s: shape %s, expected %s" % (what, got.shape, expected.shape)
    if got.size == 0:
        return
    levels = max(1, int(np.ceil(np.log2(max(2, len(inputs))))) + 1)
    bound = 4 * levels * EPS[dtype_name] * max(float(np.abs(expected).max()), 1e-30)
    diff = np.abs(got - expected)
    if not (diff <= bound).all():
        i = int(np.argmax(~(diff <= bound)))
        raise AssertionError("%s: %d of %d elements off Adasum's; first at flat index %d: got %r, "
                             "expected %r (allowed %.3g)"
                             % (what, int((~(diff <= bound)).sum()), diff.size, i,
                                got.ravel()[i], expected.ravel()[i], bound))
