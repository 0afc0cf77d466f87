"""The torch backend's bucketed graphs: which bucket a batch runs in, the static buffers (one set per
bucket, reused, filled and padded as pad_batch pads), outputs cut back to the batch, the eager fallback
past every bucket; on the CPU through the real runner with its eager "replay", and on an NVIDIA GPU
(``-m gpu``) with real CUDA graphs and torch.compile in fp16/bf16 against fp32 eager."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from gpu_mode import require_torch_cuda
from module_runs import run_module
from server_helpers import WINDOWS, dev_contexts, server_env

from qa_core.contract import INPUT_NAMES
from qa_core.squad import featurize_one, pad_batch
from qa_core.tokenizer import XLNetTokenizer
from server.backends.base import dummy_batch
from server.backends.buckets import DEFAULT_LENGTH_STEP, MAX_LENGTHS, Bucket, BucketGrid
from server.backends.torch_graphs import PAD_VALUES, ROW_PAD_FIRST, BucketedRunner, EagerReplay

# ---- the buckets (plain Python) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_batch", "max_len", "multiple", "batches", "lengths"),
    [
        (8, 384, None, (1, 2, 4, 8), (64, 128, 192, 256, 320, 384)),
        (32, 384, None, (1, 2, 4, 8, 16, 32), (64, 128, 192, 256, 320, 384)),
        (6, 100, None, (1, 2, 4, 6), (64, 100)),
        (8, 384, 32, (1, 2, 4, 8), tuple(range(32, 385, 32))),
        (1, 16, None, (1,), (16,)),
    ],
)
def test_the_grid_covers_the_servers_batches(max_batch, max_len, multiple, batches, lengths) -> None:
    grid = BucketGrid.for_server(max_batch, max_len, multiple)
    assert (grid.batch_sizes, grid.lengths) == (batches, lengths)
    for b in range(1, max_batch + 1):
        for t in range(1, max_len + 1):
            bucket = grid.choose(b, t)
            assert bucket is not None and bucket.batch >= b and bucket.length >= t
            # the smallest that holds it: no smaller batch size or length of the grid would
            assert all(s < b for s in grid.batch_sizes if s < bucket.batch)
            assert all(n < t for n in grid.lengths if n < bucket.length)
    assert grid.choose(max_batch + 1, 1) is None and grid.choose(1, max_len + 1) is None
    assert grid.largest == Bucket(max_batch, max_len)


def test_fine_padding_is_capped_in_lengths_and_kept_a_multiple() -> None:
    """--pad-multiple-of 8 at 384 tokens would be 48 graphs per batch size: coarser, still multiples of 8."""
    grid = BucketGrid.for_server(8, 384, 8)
    assert len(grid.lengths) <= MAX_LENGTHS and grid.lengths[-1] == 384
    assert all(n % 8 == 0 for n in grid.lengths)
    assert BucketGrid.for_server(8, 384).lengths[0] == DEFAULT_LENGTH_STEP
    assert BucketGrid.for_server(4, 384, None, min_length=70).lengths[0] == 128  # the beam head's top-k


def test_capture_order_is_largest_first_and_bad_grids_are_refused() -> None:
    grid = BucketGrid((1, 2, 4), (16, 32))
    order = grid.buckets()
    assert order[0] == Bucket(4, 32) and order[-1] == Bucket(1, 16) and len(order) == 6
    assert [b.tokens for b in order] == sorted((b.tokens for b in order), reverse=True)
    for bad in (((), (16,)), ((2, 1), (16,)), ((1,), (0, 16)), ((1, 1), (16,))):
        with pytest.raises(ValueError, match="strictly ascending"):
            BucketGrid(*bad)
    with pytest.raises(ValueError):
        grid.choose(0, 16)


# ---- the runner on the CPU: the real bucketing module, "replay" = eager on the static buffers -----------


@pytest.fixture(scope="module")
def qa_model(qa_checkpoint: Path):
    from train.model.checkpoint import load
    from train.model.inference import QAInference

    return QAInference(load(qa_checkpoint).model).eval()


def windows(tok: XLNetTokenizer, lengths: list[int]):
    """One real serving window per entry, about that many tokens long (shorter contexts: shorter windows)."""
    words = " ".join(dev_contexts()).split()
    return [featurize_one("Who wrote it?", " ".join(words[:n]), tok, **WINDOWS)[0] for n in lengths]


def reference(model, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model run eagerly on exactly this batch, nothing padded further."""
    with torch.inference_mode():
        values = model(*(torch.from_numpy(batch[n]) for n in INPUT_NAMES))
    return {name: v.numpy() for name, v in zip(model.names, values, strict=True)}


def test_batches_run_in_their_bucket_with_the_eager_models_answers(qa_model, xlnet_tok) -> None:
    grid = BucketGrid((1, 2, 4), (32, 64, 128))
    runner = BucketedRunner(qa_model, INPUT_NAMES, qa_model.names, grid, torch.device("cpu"), EagerReplay())
    used = []
    for lengths in ([40, 5, 60], [8], [30, 30], [100, 2, 50, 9], [12, 3], [6]):
        features = windows(xlnet_tok, lengths)
        batch = {k: v for k, v in pad_batch(features).items() if k in INPUT_NAMES}
        rows, length = batch["input_ids"].shape
        bucket = grid.choose(rows, length)
        used.append(bucket)
        got, want = runner.run(batch), reference(qa_model, batch)
        assert set(got) == set(qa_model.names)
        for name in want:  # cut back to the batch: [B, T] per token, [B] for cls_logits
            assert got[name].shape == want[name].shape, name
            np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=1e-5, err_msg=name)
        # the bucket's buffers hold the batch, padded exactly as pad_batch pads to the bucket's length
        slot = runner.slots[bucket]
        padded = pad_batch(features, pad_to=bucket.length)
        for name in INPUT_NAMES:
            static = slot.inputs[name].numpy()
            assert static.shape == (bucket.batch, bucket.length)
            np.testing.assert_array_equal(static[:rows], padded[name], err_msg=name)
            assert (static[rows:, 0] == ROW_PAD_FIRST[name]).all() and (
                static[rows:, 1:] == PAD_VALUES[name]
            ).all()
    # one slot per bucket used, reused by the batches that share one (several do here)
    assert set(runner.slots) == set(used) and len(used) > len(runner.slots) and runner.eager_calls == 0


def test_a_bucket_keeps_its_buffers_and_a_smaller_batch_leaves_nothing_stale(qa_model) -> None:
    grid = BucketGrid((2, 4), (16, 32))
    runner = BucketedRunner(qa_model, INPUT_NAMES, qa_model.names, grid, torch.device("cpu"), EagerReplay())
    runner.run(dummy_batch(4, 32))
    slot = runner.slots[Bucket(4, 32)]
    pointers = {name: t.data_ptr() for name, t in slot.inputs.items()}
    small = dummy_batch(3, 20)
    got = runner.run(small)
    assert runner.slots[Bucket(4, 32)] is slot and len(runner.slots) == 1
    assert {name: t.data_ptr() for name, t in slot.inputs.items()} == pointers
    assert (slot.inputs["attention_mask"][:3, 20:] == 0).all() and (
        slot.inputs["input_ids"][3, 1:] == 5
    ).all()
    want = reference(qa_model, small)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=1e-5)


def test_a_batch_beyond_every_bucket_runs_eagerly_and_says_so_once(qa_model, caplog) -> None:
    grid = BucketGrid((1, 2), (16,))
    runner = BucketedRunner(qa_model, INPUT_NAMES, qa_model.names, grid, torch.device("cpu"), EagerReplay())
    with caplog.at_level(logging.WARNING, logger="server.backends.torch_graphs"):
        for shape in ((3, 16), (1, 40), (5, 30)):
            batch = dummy_batch(*shape)
            got, want = runner.run(batch), reference(qa_model, batch)
            for name in want:
                np.testing.assert_allclose(got[name], want[name], atol=1e-6, rtol=1e-6)
    warnings = [r.getMessage() for r in caplog.records if "beyond every bucket" in r.getMessage()]
    assert warnings == [
        "torch eager: a batch of 3x16 is beyond every bucket (up to 2x16): such batches run eagerly (logged once)"
    ]
    assert runner.eager_calls == 3 and runner.slots == {}
    assert runner.describe() == {
        "capture": "eager",
        "buckets": 2,
        "captured": 0,
        "largest_bucket": "2x16",
        "eager_calls": 3,
    }


def test_prepare_captures_every_bucket_largest_first(qa_model) -> None:
    grid = BucketGrid((1, 2), (16, 32))
    runner = BucketedRunner(qa_model, INPUT_NAMES, qa_model.names, grid, torch.device("cpu"), EagerReplay())
    runner.prepare()
    assert list(runner.slots) == grid.buckets() and runner.describe()["captured"] == 4


# ---- the backend and its settings ------------------------------------------------------------------------


def test_the_backend_casts_its_weights_to_the_dtype_asked(onnx_export: Path) -> None:
    """--torch-dtype bf16 (eager, here on the CPU): float32 outputs close to fp32's, the dtype reported."""
    from server.answering.model_spec import resolve_spec
    from server.backends.torch import TorchBackend

    spec = resolve_spec(onnx_export, "torch")
    fp32, bf16 = TorchBackend(spec), TorchBackend(spec, dtype="bf16")
    assert bf16.describe()["dtype"] == "bf16" and "graphs" not in bf16.describe()
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    feeds = dummy_batch(2, 24)
    want, got = fp32.run(feeds), bf16.run(feeds)
    for name in want:
        assert got[name].dtype == np.float32
        scale = max(1.0, float(np.abs(want[name]).max()))
        np.testing.assert_allclose(got[name], want[name], atol=0.05 * scale, rtol=0)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (
            ["--torch-cuda-graphs"],
            "torch_cuda_graphs records CUDA graphs: it needs torch_device cuda[:N], not 'cpu'",
        ),
        (["--torch-compile", "true"], "torch_compile records CUDA graphs: it needs torch_device cuda[:N]"),
        (["--torch-cuda-graphs", "--torch-compile", "--torch-device", "cuda"], "choose one"),
        (["--torch-dtype", "fp8"], "torch_dtype"),
        (["--max-batch-size", "257"], "max_batch_size: Input should be less than or equal to 256"),
    ],
)
def test_graph_settings_that_cannot_run_are_one_line_before_anything_loads(
    onnx_export: Path, flags: list[str], says: str
) -> None:
    flags = ["--backend", "torch", *flags, "--port", "1"]
    proc = run_module("server", "--model", onnx_export, *flags, env=server_env(), timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert says in lines[0]


# ---- on an NVIDIA GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", ["cuda-graphs", "compile"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_recorded_graphs_on_cuda_match_fp32_eager(onnx_export: Path, graphs: str, dtype: str) -> None:
    """Real captures (CUDA graphs, or torch.compile's reduce-overhead), replayed for batches of several
    shapes in one bucket and across buckets: the answers of fp32 eager on the same GPU, within half
    precision; every bucket captured at warm-up, nothing run eagerly."""
    require_torch_cuda()
    from server.answering.model_spec import resolve_spec
    from server.backends.torch import TorchBackend

    spec = resolve_spec(onnx_export, "torch")
    grid = BucketGrid((1, 2, 4), (32, 64))
    eager = TorchBackend(spec, device="cuda")
    fast = TorchBackend(spec, device="cuda", dtype=dtype, graphs=graphs, grid=grid)
    fast.warmup((16, 64), (1, 4))
    facts = fast.describe()["graphs"]
    assert facts["captured"] == 6 and facts["capture"] == graphs
    for shape in ((1, 16), (3, 40), (4, 64), (2, 7), (3, 40)):
        feeds = dummy_batch(*shape)
        want, got = eager.run(feeds), fast.run(feeds)
        for name in want:
            assert got[name].shape == want[name].shape
            scale = max(1.0, float(np.abs(want[name]).max()))
            np.testing.assert_allclose(got[name], want[name], atol=0.03 * scale, rtol=0, err_msg=name)
    assert fast.describe()["graphs"]["eager_calls"] == 0
