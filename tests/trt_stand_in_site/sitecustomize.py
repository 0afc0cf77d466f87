"""With this directory on PYTHONPATH, a Python process starts with the TensorRT and cuda-bindings
stand-ins of ``tests/trt_stand_in.py`` installed: a server subprocess cannot see a test's monkeypatches,
and this way it runs all of its own code (the GPU stack check included). ``TRT_STAND_IN`` (JSON) holds
the stand-in cudart's options; default: two GPUs."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("trt_stand_in", Path(__file__).parents[1] / "trt_stand_in.py")
assert _spec is not None and _spec.loader is not None
_stand_in = importlib.util.module_from_spec(_spec)
sys.modules["trt_stand_in"] = _stand_in
_spec.loader.exec_module(_stand_in)
_stand_in.install(sys.modules.__setitem__, **json.loads(os.environ.get("TRT_STAND_IN", '{"devices": 2}')))
