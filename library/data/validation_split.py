"""Which training images are held out for validation.

Each image gets a rank from a stable hash of (seed, "validation", its key); the k lowest-ranked
images are held out. The choice depends only on the seed and the images' keys, so it is the same
whatever the order in which the folders were scanned, the number of processes or the run.

Stability when the data changes: the existing images keep their ranks, so adding an image
inserts it somewhere in the ranked order and k grows by at most one. The held-out set therefore
changes only at its boundary: the new image may join it, and the image just inside or just
outside the cut may move across it; every other image stays on its side. Removing an image is
the mirror case.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from library.data.schedule import stable_seed


def validation_count(n: int, fraction: float) -> int:
    """How many of ``n`` images are held out for ``fraction`` (see validation_indices)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation fraction {fraction} is outside [0, 1)")
    if fraction == 0.0 or n < 2:
        return 0
    # Half rounds up (not Python's round-half-to-even), so 0.25 of 10 images is 3, not 2.
    k = math.floor(fraction * n + 0.5)
    # At least one image validates, and training always keeps at least one.
    return min(max(k, 1), n - 1)


def validation_indices(keys: Sequence[str], fraction: float, seed: int) -> frozenset[int]:
    """The indices of ``keys`` held out for validation.

    ``keys[i]`` names image i of one dataset's training subsets (e.g. "0/a.png": the subset index
    and the path relative to the subset folder) and must be unique. k = fraction * n rounded
    half up, at least 1 when fraction > 0 and n >= 2, at most n - 1 (fraction 0, or a single
    image: nothing held out). The k images with the lowest stable_seed(seed, "validation", key)
    are chosen. ValueError for a fraction outside [0, 1) or repeated keys.
    """
    k = validation_count(len(keys), fraction)
    if len(set(keys)) != len(keys):
        repeated = sorted(key for key, count in Counter(keys).items() if count > 1)
        raise ValueError(f"validation keys must be unique; repeated: {repeated[:3]}")
    if k == 0:
        return frozenset()
    # The key breaks (astronomically unlikely) hash ties, so the order of `keys` never matters.
    ranked = sorted(
        range(len(keys)), key=lambda i: (stable_seed(seed, "validation", keys[i]), keys[i])
    )
    return frozenset(ranked[:k])
