"""LoKr's split of a layer dimension into the two Kronecker factor sizes.

LyCORIS' rule (``factorization(dimension, factor)``): with a positive ``factor`` that divides the
dimension, the split is ``factor × dimension/factor``. Otherwise the divisors of the dimension are
walked upwards from 1, stopping at the first divisor larger than ``factor`` (no limit for a
negative factor) or once the divisor reached is no longer below its cofactor (the square root has
been passed); the last divisor taken and its cofactor are the split. The smaller size always
comes first, so the first factor is the small "scale" matrix and the second the larger one.
"""

from __future__ import annotations


def factorization(dimension: int, factor: int = -1) -> tuple[int, int]:
    """``(m, n)`` with ``m * n == dimension`` and ``m <= n``, chosen by LyCORIS' rule above.

    Examples: ``factorization(128) == (8, 16)``, ``factorization(128, 4) == (4, 32)``,
    ``factorization(250, 4) == (2, 125)`` (4 does not divide 250; 2 is the last divisor <= 4).
    """
    if dimension < 1:
        raise ValueError(f"cannot factorise dimension {dimension}; it must be >= 1")
    if factor > 0 and dimension % factor == 0:
        other = dimension // factor
        return (min(factor, other), max(factor, other))
    limit = dimension if factor < 0 else factor
    taken = 1
    candidate = 1
    # Keep stepping while the divisor taken is still below its cofactor.
    while taken * taken < dimension:
        candidate += 1
        if dimension % candidate:
            continue
        if candidate > limit:
            break
        taken = candidate
    other = dimension // taken
    return (min(taken, other), max(taken, other))
