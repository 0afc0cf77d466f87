"""Windows of 1, 2 and 3 tokens: the exported graph's position term runs in 4 query chunks, each needing a
row, so its least length is 4 (``qa_core.contract.GRAPH_MIN_TOKENS``); a shorter window is padded up to it
by the backend (as the server's batcher pads every batch) and its outputs cut back, equal at every real
token to the torch model eager on the unpadded window (which needs no padding)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qa_core.contract import CLS_ID, GRAPH_MIN_TOKENS, SEG_ID_CLS
from server.answering.model_spec import resolve_spec
from server.backends import create_backend
from server.flags import load_settings


@pytest.mark.parametrize("length", [1, 2, 3])
def test_a_short_window_runs_on_the_export_as_on_torch(onnx_export: Path, length: int) -> None:
    exported = resolve_spec(onnx_export, "onnx")
    assert exported.min_engine_seq_len == GRAPH_MIN_TOKENS == 4
    onnx = create_backend(exported, load_settings(["--model", str(onnx_export), "--backend", "onnx"]))
    torch = create_backend(
        resolve_spec(onnx_export, "torch"), load_settings(["--model", str(onnx_export), "--backend", "torch"])
    )
    ids = np.full((2, length), 11, dtype=np.int64)
    ids[1, 0] = 12
    types = np.zeros((2, length), dtype=np.int64)
    ids[:, -1], types[:, -1] = CLS_ID, SEG_ID_CLS  # a window ends in <cls>
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": types}
    got, want = onnx.run(batch), torch.run(batch)
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], atol=1e-4, rtol=0, err_msg=name)
