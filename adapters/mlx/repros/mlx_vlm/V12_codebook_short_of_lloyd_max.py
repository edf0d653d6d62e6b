"""V12 (upstream-bug): mlx-vlm's TurboQuant codebook (`_codebook`: at most 100 Lloyd steps on
a 32 768-point grid, started from equal-probability levels) stops short of the Lloyd–Max
optimum, the more so the more levels: from 5 bits its distortion D·E[(y − Q(y))²] for a
coordinate of a uniform unit vector exceeds the TurboQuant paper's upper bound
(√3·π/2)·4^−b, which the optimal quantizer keeps (kvlab's oracle: D·C 0.002451 at D = 128,
5 bits; 0.000630 at 6). Continuing Lloyd from mlx-vlm's own levels lowers it: they are
not a fixed point."""
import math

import numpy as np
from mlx_vlm.turboquant import _codebook

D = 128
theta = (np.arange(1 << 15) + 0.5) * math.pi / (1 << 15) - math.pi / 2
y, w = np.sin(theta), np.cos(theta) ** (D - 2)
w /= w.sum()


def distortion(levels):
    cell = np.searchsorted((levels[:-1] + levels[1:]) / 2, y)
    return D * np.sum(w * (y - levels[cell]) ** 2), cell


for bits in (5, 6):
    levels = np.array(_codebook(D, bits), dtype=np.float64)
    dc, _ = distortion(levels)
    bound = math.sqrt(3) * math.pi / 2 * 4.0 ** -bits
    better = levels.copy()
    for _ in range(300):  # plain Lloyd steps: each level to the mean of its cell
        _, cell = distortion(better)
        better = np.bincount(cell, w * y, len(better)) / np.bincount(cell, w, len(better))
    print(f"{bits} bits: D·C {dc:.6f} (paper's bound {bound:.6f}); "
          f"after 300 more Lloyd steps {distortion(better)[0]:.6f}")
    assert dc > bound, f"{bits} bits: the codebook is within the paper's bound"
    assert distortion(better)[0] < 0.95 * dc, f"{bits} bits: the codebook is near its Lloyd fixed point"
