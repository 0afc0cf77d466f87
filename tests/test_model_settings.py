"""One typed home for a model's settings (qa_core.contract.ModelSettings): what fine-tuning records
is what evaluation, the export's sidecar, the server's model spec and its decoding use, n_best included."""

from __future__ import annotations

from pathlib import Path

import pytest

from export.onnx.cli import main as export_main
from harness.tiny_models import tiny_qa_checkpoint
from qa_core.contract import DEFAULTS, MAX_N_BEST, WINDOW_OVERHEAD, ModelSettings
from qa_core.runtime.sidecar import Sidecar, SidecarError
from qa_core.tokenizer import XLNetTokenizer
from server.answering.host_path import HostPath
from server.answering.model_spec import ModelSpecError, resolve_spec
from train.common.sample_data import SAMPLE_DEV
from train.evaluation.options import EvaluationOptions
from train.evaluation.predict import evaluate_checkpoint
from train.recipes.finetune_config import FinetuneConfig

RECIPE = {"max_seq_len": 128, "doc_stride": 64, "max_query_len": 32, "max_answer_len": 16, "n_best": 5}


def test_defaults_overrides_and_every_problem_named() -> None:
    assert ModelSettings.from_metadata(None) == DEFAULTS
    got = ModelSettings.from_metadata({**RECIPE, "other": "ignored"}, n_best=None, max_answer_len=8)
    assert (got.max_seq_len, got.n_best, got.max_answer_len) == (128, 5, 8)  # None: keep the model's
    with pytest.raises(ValueError) as exc:
        ModelSettings.from_metadata({"n_best": 0, "max_answer_len": "thirty", "no_answer_threshold": 2})
    message = str(exc.value)
    assert "n_best must be a positive integer, got 0" in message
    assert "max_answer_len must be a positive integer, got 'thirty'" in message
    assert "no_answer_threshold must be a probability in [0, 1], got 2.0" in message
    with pytest.raises(ValueError, match=f"needs max_seq_len >= max_query_len \\+ {WINDOW_OVERHEAD}"):
        ModelSettings.from_metadata({"max_seq_len": 40, "max_query_len": 40})
    with pytest.raises(TypeError, match="unknown settings"):
        ModelSettings.from_metadata(None, n_bets=3)
    # what older metadata and hand-written files hold, read as before where nothing is lost
    legacy = ModelSettings.from_metadata({"max_seq_len": 384.0, "n_best": "5", "no_answer_threshold": "0.4"})
    assert (legacy.max_seq_len, legacy.n_best, legacy.no_answer_threshold) == (384, 5, 0.4)
    with pytest.raises(ValueError, match="max_seq_len must be a positive integer, got 384.5"):
        ModelSettings.from_metadata({"max_seq_len": 384.5})
    # a stride longer than the window only means windows that do not overlap
    assert ModelSettings.from_metadata({"max_seq_len": 64, "max_query_len": 24}).doc_stride == 128


def test_a_recipe_model_is_evaluated_exported_and_served_with_its_n_best(
    tmp_path: Path, spm_dir: Path
) -> None:
    """Walk the settings from the checkpoint's metadata to the served model: one type all the way."""
    ckpt = tiny_qa_checkpoint(tmp_path / "ckpt", spm_dir, "shallow", metadata=dict(RECIPE))
    # evaluation: the checkpoint's n_best unless asked otherwise
    result = evaluate_checkpoint(EvaluationOptions(ckpt, SAMPLE_DEV, tmp_path / "eval", progress=False))
    assert 1 <= max(len(p.n_best) for p in result.predictions.values()) <= RECIPE["n_best"]
    more = evaluate_checkpoint(
        EvaluationOptions(ckpt, SAMPLE_DEV, tmp_path / "eval20", overrides={"n_best": 20}, progress=False)
    )
    assert max(len(p.n_best) for p in more.predictions.values()) > RECIPE["n_best"]
    # export: the sidecar records every setting, n_best included
    assert export_main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "onnx")]) == 0
    side = Sidecar.load(tmp_path / "onnx")
    assert {k: getattr(side.serving, k) for k in RECIPE} == RECIPE
    # the server: from the export and from the checkpoint alike, decoding with the model's n_best
    tokenizer = XLNetTokenizer.from_dir(spm_dir)
    for model_dir, backend in ((tmp_path / "onnx", "onnx"), (ckpt, "torch")):
        spec = resolve_spec(model_dir, backend)
        assert {k: getattr(spec.serving, k) for k in RECIPE} == RECIPE, backend
        assert HostPath(spec, tokenizer).n_best_pool == RECIPE["n_best"]
        assert HostPath(spec, tokenizer, n_best_pool=7).n_best_pool == 7  # --n-best-pool says otherwise
    assert spec.public()["n_best"] == RECIPE["n_best"]


def test_bad_recorded_settings_are_refused_where_they_are_read(tmp_path: Path, spm_dir: Path) -> None:
    ckpt = tiny_qa_checkpoint(tmp_path / "ckpt", spm_dir, "shallow", metadata={"n_best": -1})
    with pytest.raises(ModelSpecError, match="n_best must be a positive integer, got -1"):
        resolve_spec(ckpt, "torch")
    with pytest.raises(ValueError, match="n_best must be a positive integer"):
        evaluate_checkpoint(EvaluationOptions(ckpt, SAMPLE_DEV, tmp_path / "eval", progress=False))
    good = tiny_qa_checkpoint(tmp_path / "good", spm_dir, "shallow")
    assert export_main(["--checkpoint", str(good), "--out", str(tmp_path / "onnx")]) == 0
    data = Sidecar.load(tmp_path / "onnx").to_dict()
    with pytest.raises(SidecarError, match="n_best must be a positive integer, got 0"):
        Sidecar.from_dict({**data, "n_best": 0})
    old = {k: v for k, v in data.items() if k != "n_best"}  # a sidecar written before n_best was recorded
    assert Sidecar.from_dict(old).serving.n_best == DEFAULTS.n_best


def test_a_huge_recorded_n_best_is_refused_where_it_is_read_and_cannot_be_trained(
    tmp_path: Path, spm_dir: Path
) -> None:
    """Decoding pairs n-best starts with n-best ends per window: a model file recording more than
    MAX_N_BEST would make every question cost that squared, so its readers refuse it and fine-tuning
    will not write it."""
    ckpt = tiny_qa_checkpoint(tmp_path / "ckpt", spm_dir, "shallow", metadata={"n_best": MAX_N_BEST + 1})
    with pytest.raises(ModelSpecError, match=f"n_best must be at most {MAX_N_BEST}"):
        resolve_spec(ckpt, "torch")
    with pytest.raises(ValueError, match=f"n_best must be at most {MAX_N_BEST}"):
        evaluate_checkpoint(EvaluationOptions(ckpt, SAMPLE_DEV, tmp_path / "eval", progress=False))
    with pytest.raises(ValueError, match=f"--n-best must be at most {MAX_N_BEST}"):
        FinetuneConfig.of(out=str(tmp_path / "run"), n_best=MAX_N_BEST + 1)
    assert ModelSettings(n_best=MAX_N_BEST).problems() == []


def test_each_model_setting_is_declared_once() -> None:
    """ServingSettings is a ModelSettings plus the beam's top-k (it declares only those two); a fine-tuning
    config holds the settings as one value, its flags generated from ModelSettings' own fields."""
    import dataclasses

    from qa_core.contract import WINDOW_AND_DECODING
    from qa_core.runtime.sidecar import ServingSettings

    assert issubclass(ServingSettings, ModelSettings)
    own = set(ServingSettings.__annotations__)
    assert own == {"start_n_top", "end_n_top"}
    config = FinetuneConfig.of(out="x", max_seq_len=256, n_best=7)
    assert isinstance(config.model, ModelSettings) and (config.model.max_seq_len, config.model.n_best) == (
        256,
        7,
    )
    names = {f.name for f in dataclasses.fields(FinetuneConfig)}
    assert not names & set(WINDOW_AND_DECODING)  # none declared again on the config


def test_evaluation_flags_are_the_model_settings_own_fields() -> None:
    """train.evaluate's setting flags are generated from ModelSettings' fields (their type and their one
    help text), and only the ones given reach the evaluation."""
    from dataclasses import fields

    from qa_core.contract import HELP, WINDOW_AND_DECODING, ModelSettings
    from train.common.dataclass_flags import options_from
    from train.evaluate import build_parser

    parser = build_parser()
    args = parser.parse_args(["--checkpoint", "c", "--data", "d", "--out", "o", "--n-best", "7"])
    assert options_from(EvaluationOptions, args).overrides == {"n_best": 7}
    helps = {a.dest: a.help for a in parser._actions}
    for f in fields(ModelSettings):
        if f.name in WINDOW_AND_DECODING:
            assert helps[f.name] == f.metadata[HELP] + " (default: the model's)", f.name
    assert set(WINDOW_AND_DECODING) == {f.name for f in fields(ModelSettings)} - {"no_answer_threshold"}
    with pytest.raises(ValueError, match="cannot override"):
        EvaluationOptions(Path("c"), Path("d"), Path("o"), overrides={"no_answer_threshold": 0.1})
