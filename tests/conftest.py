"""Shared pytest fixtures: tokenizers trained on the sample, tiny QA checkpoints and their ONNX export
(built once per session), servers on loopback (one per test module), stand-ins for TensorRT and
cuda-bindings, and paths to the data. Test modules use them by name; helpers are plain imports from
``fixtures_spm``, ``server_helpers`` and ``trt_stand_in``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_spm import make_tokenizer_dir
from paths import SAMPLE, SHARED_SQUAD
from server_helpers import ServerProcess, build_qa_checkpoint, export_onnx
from trt_stand_in import StandInCudart, StandInEngine, install

from qa_core.tokenizer import XLNetTokenizer

# Keep the suite predictable on 2 cores.
# One intra-op thread: subprocesses (servers, torchrun ranks) share 2 cores with the test process,
# and OpenMP spin-waiting under oversubscription makes 2-thread runs 10-30x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_report_header() -> str:
    """Say up front whether the larger ../shared data is tested or only the shipped sample."""
    where = (
        f"../shared SQuAD data at {SHARED_SQUAD}"
        if SHARED_SQUAD.exists()
        else "no ../shared: the shipped sample only"
    )
    return f"xlnet-qa data: {where}"


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    return SAMPLE


# ---- tokenizers trained on the sample (well under a second each) -----------------------------------------


@pytest.fixture(scope="session")
def spm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cased 2000-piece XLNet tokenizer directory (spiece.model + tokenizer_config.json)."""
    return make_tokenizer_dir(tmp_path_factory.mktemp("spm_cased"))


@pytest.fixture(scope="session")
def spm_dir_lower(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same, uncased (do_lower_case=True at training and encoding time)."""
    return make_tokenizer_dir(tmp_path_factory.mktemp("spm_lower"), do_lower_case=True)


@pytest.fixture(scope="session")
def xlnet_tok(spm_dir: Path) -> XLNetTokenizer:
    return XLNetTokenizer.from_dir(spm_dir)


@pytest.fixture(scope="session")
def xlnet_tok_lower(spm_dir_lower: Path) -> XLNetTokenizer:
    return XLNetTokenizer.from_dir(spm_dir_lower)


# ---- a tiny QA model, its export, servers ----------------------------------------------------------------


@pytest.fixture(scope="session")
def qa_checkpoint(tmp_path_factory: pytest.TempPathFactory, xlnet_tok: XLNetTokenizer) -> Path:
    """A tiny random shallow-head QA checkpoint (tests copy it before changing anything)."""
    return build_qa_checkpoint(tmp_path_factory.mktemp("qa_ckpt") / "ckpt", xlnet_tok)


@pytest.fixture(scope="session")
def onnx_export(tmp_path_factory: pytest.TempPathFactory, qa_checkpoint: Path) -> Path:
    """``python -m export.onnx`` of ``qa_checkpoint`` (fp32, verified against torch)."""
    return export_onnx(qa_checkpoint, tmp_path_factory.mktemp("qa_export") / "export")


@pytest.fixture(scope="module")
def onnx_server(onnx_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``python -m server`` (onnx backend) on a loopback port, with a 1 MB body limit, grouping windows up
    to the batch size whatever this machine's measurement of grouping says (--batching always: the
    measured decision has tests of its own, tests/test_batch_curve.py)."""
    s = ServerProcess(
        onnx_export,
        tmp_path_factory.mktemp("logs"),
        "--max-body-bytes",
        "1000000",
        "--max-batch-delay-ms",
        "5",
        "--batching",
        "always",
    )
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def torch_server(onnx_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The same model served by torch eager, found through the export's source_checkpoint."""
    s = ServerProcess(onnx_export, tmp_path_factory.mktemp("logs"), backend="torch")
    try:
        yield s.start()
    finally:
        s.stop()


# ---- TensorRT and cuda-bindings, which need an NVIDIA GPU ----------------------------------------------------


@pytest.fixture
def stand_in_stack(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[StandInCudart, StandInEngine]]:
    """Installs the stand-ins of ``trt_stand_in`` for this test: ``cudart, engine = stand_in_stack(...)``."""

    def install_here(**options: Any) -> tuple[StandInCudart, StandInEngine]:
        return install(lambda name, module: monkeypatch.setitem(sys.modules, name, module), **options)

    return install_here
