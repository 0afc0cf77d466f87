"""The recipe objects: configs built from the command line, stages run one at a time, the state they hold."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from paths import SAMPLE
from sample_cuts import first_article_split

from qa_core.contract import HELP
from train import finetune as finetune_cli
from train import pretrain as pretrain_cli
from train.common.dataclass_flags import FLAG_KEY, flag_fields, nested_fields
from train.engine.run_record import RUN_FILE
from train.model import checkpoint
from train.recipes.finetune import FinetuneConfig, FinetuneRecipe
from train.recipes.pretrain import PretrainConfig, PretrainRecipe


def flags_of(config_class) -> dict[str, tuple]:
    """Every flag a config's fields make, by destination: (its default, its help)."""
    out = {}
    for f in flag_fields(config_class):
        spec = f.metadata[FLAG_KEY]
        if spec.nested is not None:
            out |= {sub.name: (sub.default, sub.metadata[HELP]) for sub in nested_fields(spec)}
        else:
            out[f.name] = (None if f.default is dataclasses.MISSING else f.default, spec.help)
    return out


@pytest.mark.parametrize(
    ("cli", "config_class"), [(pretrain_cli, PretrainConfig), (finetune_cli, FinetuneConfig)]
)
def test_a_config_built_from_the_bare_command_line_is_the_defaults(cli, config_class) -> None:
    args = cli.build_parser().parse_args(["--out", "x"])
    assert set(vars(args)) == set(flags_of(config_class))
    config = cli.parse_config(["--out", "x"])
    assert config == config_class(out="x")
    assert config.explicit_flags == {"out"}


@pytest.mark.parametrize(
    ("cli", "config_class"), [(pretrain_cli, PretrainConfig), (finetune_cli, FinetuneConfig)]
)
def test_every_setting_is_one_flag_generated_from_its_field(cli, config_class) -> None:
    """Each field of a training config but the record of given flags is a flag (a nested settings
    value, the model's, a flag per field of its own), shown once in --help's groups, with the field's
    default and help."""
    fields = {f.name for f in dataclasses.fields(config_class) if f.name != "explicit_flags"}
    assert fields == {f.name for f in flag_fields(config_class)}
    flags = flags_of(config_class)
    grouped = [name for names in cli.GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(flags)
    actions = {a.dest: a for a in cli.build_parser()._actions if a.dest in flags}
    for name, (default, text) in flags.items():
        assert actions[name].default == default, name
        assert actions[name].help == text.replace("%", "%%"), name


def test_a_recipe_preset_and_explicit_flags_reach_the_config() -> None:
    config = finetune_cli.parse_config(["--recipe", "xlnet-squad-base", "--lr", "1e-5", "--out", "x"])
    assert (config.recipe, config.lr, config.steps, config.head) == ("xlnet-squad-base", 1e-5, 12000, "beam")
    assert config.explicit_flags == {"recipe", "lr", "out"}


@pytest.mark.parametrize("config_class", [PretrainConfig, FinetuneConfig])
def test_a_config_refuses_two_tokenizer_sources(config_class) -> None:
    with pytest.raises(ValueError, match="either --spm or --train-spm"):
        config_class(out="x", spm="a", train_spm=100)


def tiny_pretrain(out: Path, spm_dir: Path, **kw) -> PretrainConfig:
    fields = dict(out=str(out), corpus=[str(SAMPLE / "corpus.json")], spm=str(spm_dir), config="tiny")
    fields |= dict(steps=4, batch_size=2, seq_len=32, reuse_len=16, mem_len=16, warmup=1, save_every=100)
    return PretrainConfig(**fields, no_progress=True, device="cpu", **kw)


def test_pretrain_stages_run_one_by_one_and_hold_the_state(tmp_path, spm_dir) -> None:
    recipe = PretrainRecipe(tiny_pretrain(tmp_path / "run", spm_dir, stop_after=3))
    recipe.setup()
    assert recipe.step == 0 and recipe.mems is None and recipe.baseline > 0
    assert (tmp_path / "run" / RUN_FILE).exists() and not (tmp_path / "run" / "checkpoints").exists()
    assert recipe.train() == 3 and recipe.step == 3  # --stop-after: a checkpoint, not the final model
    assert recipe.mems is not None  # memory carried to the next batch
    assert (tmp_path / "run" / "checkpoints" / "step-0000003").is_dir()
    summary = recipe.cleanup()
    assert summary["step"] == 3 and not (tmp_path / "run" / "model.safetensors").exists()

    resumed = PretrainRecipe(tiny_pretrain(tmp_path / "run", spm_dir, resume=True))
    resumed.setup()
    assert resumed.step == 3 and resumed.mems is not None  # weights, data position and memory restored
    resumed.train()
    assert resumed.cleanup()["step"] == 4
    meta = checkpoint.load(tmp_path / "run").metadata
    assert meta["stage"] == "pretrain" and meta["step"] == 4 and meta["args"]["seq_len"] == 32


def test_finetune_stages_run_one_by_one_and_evaluate(tmp_path, spm_dir) -> None:
    first_article_split(tmp_path, 2, 1)
    config = FinetuneConfig.of(
        out=str(tmp_path / "run"),
        train_file=str(tmp_path / "train.json"),
        dev_file=str(tmp_path / "dev.json"),
        config="tiny",
        spm=str(spm_dir),
        max_seq_len=64,
        doc_stride=32,
        max_query_len=16,
        steps=2,
        batch_size=4,
        eval_every=1,
        answerability="cls",
        keep_best=True,
        no_progress=True,
        device="cpu",
    )
    recipe = FinetuneRecipe(config)
    recipe.setup()
    assert (recipe.step, recipe.total_steps, recipe.grad_accum, recipe.batch_size) == (0, 2, 1, 4)
    assert recipe.train_features and recipe.dev_features and recipe.final_metrics is None
    metrics = recipe.evaluate(0, final=False)  # a stage of its own: dev metrics of the current weights
    assert recipe.best_step == 0 and recipe.best_f1 == metrics["best_f1"]
    assert (tmp_path / "run" / "best" / "metadata.json").exists()
    assert recipe.train() == 2
    summary = recipe.cleanup()
    assert summary["final_metrics"] == recipe.final_metrics and summary["step"] == 2
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["stage"] == "finetune" and meta["dev_metrics"] == summary["final_metrics"]


def test_a_missing_data_file_is_refused_before_anything_is_recorded(tmp_path) -> None:
    recipe = FinetuneRecipe(FinetuneConfig(out=str(tmp_path / "run"), train_file="nope.json", dev_file="x"))
    with pytest.raises(FileNotFoundError, match="data file not found: nope.json"):
        recipe.setup()
    assert not (tmp_path / "run" / RUN_FILE).exists()
