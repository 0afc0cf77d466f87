"""What every backend is to the code that checks and serves it: a runner from named input arrays to the
sidecar's outputs in order (onnxruntime sessions, TensorRT engines, PyTorch references alike)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Feeds = dict[str, np.ndarray]
Runner = Callable[[Feeds], Sequence[np.ndarray]]
