"""V13 (representation): mlx-vlm's TurboQuant encoder compares each rotated coordinate with
midpoints (c_m + c_{m+1})/2 computed in float32, which rounds when the two levels differ
in exponent. A coordinate between the exact midpoint and the rounded one gets the farther
level; kvlab's oracle uses the exact midpoint (the nearest level). The band is half an ulp
wide (≤ 7.5e-9 at D = 128), below the f32 error of the rotation itself."""
import mlx.core as mx
import numpy as np
from mlx_vlm.turboquant import _TurboQuantMSECodec

codec = _TurboQuantMSECodec(128, 4, 0)
levels = np.array(codec.codebook, dtype=np.float64)
exact = (levels[:-1] + levels[1:]) / 2
rounded = np.array(codec._midpoints, dtype=np.float64)
m = int(np.argmax(rounded - exact))
assert rounded[m] > exact[m], "every f32 midpoint is exact or below"
print(f"midpoint {m}: exact {exact[m]!r}, mlx-vlm {rounded[m]!r}; {int(np.sum(rounded != exact))} of 15 rounded")

# Isolate the comparison: rotate by the identity, so the coordinate is the rounded midpoint.
codec._rotate_forward = lambda x: x
y = np.full((1, 128), rounded[m], dtype=np.float32)
packed = codec._quantize_unit(mx.array(y))
code = int(np.array(packed)[0, 0] & 0xF)
nearest = int(np.argmin(np.abs(levels - float(y[0, 0]))))
print(f"y = {float(y[0, 0])!r}: mlx-vlm code {code}, nearest level {nearest}")
assert code == m and nearest == m + 1, "mlx-vlm picked the nearest level"
