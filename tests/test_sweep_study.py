"""The trade-off sweep and the end-to-end study, in miniature."""

from __future__ import annotations

import json

from paths import SAMPLE_TRAIN

from qa_core.squad import write_squad
from train.sweep import main as sweep_main


def test_sweep_writes_table_and_plot_and_skips_finished_cells(spm_dir, tmp_path):
    train = json.loads(SAMPLE_TRAIN.read_text())
    train["data"] = [{**train["data"][0], "paragraphs": train["data"][0]["paragraphs"][:2]}]
    write_squad(train, tmp_path / "t.json")
    out = tmp_path / "sweep"
    argv = [
        "--train-file",
        str(tmp_path / "t.json"),
        "--dev-file",
        str(tmp_path / "t.json"),
        "--config",
        "tiny",
        "--spm",
        str(spm_dir),
        "--max-seq-lens",
        "64,96",
        "--freeze-layers",
        "0,1",
        "--heads",
        "shallow",
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert sweep_main(argv) == 0
    table = (out / "sweep.md").read_text().splitlines()
    assert len(table) == 2 + 4 and "s/step" in table[0]
    assert (out / "sweep.png").stat().st_size > 5000
    cells = [json.loads(p.read_text()) for p in sorted(out.glob("*/cell.json"))]
    assert {(c["max_seq_len"], c["freeze_layers"]) for c in cells} == {(64, 0), (64, 1), (96, 0), (96, 1)}
    assert all(c["s_per_step"] > 0 and 0 <= c["dev_f1"] <= 100 for c in cells)
    frozen = {c["freeze_layers"]: c["trainable_params"] for c in cells if c["max_seq_len"] == 64}
    assert frozen[1] < frozen[0]
    before = (out / "seq64-freeze0-shallow" / "cell.json").stat().st_mtime
    assert sweep_main(argv) == 0  # rerun: finished cells are reused, not retrained
    assert (out / "seq64-freeze0-shallow" / "cell.json").stat().st_mtime == before
