"""Model files attacked: every file the server loads is hashed by the exporter, and a model swapped in past
its hashes (a file replaced, its entry removed, a listed hash kept beside another file) is refused at start;
an export without hashes needs --allow-unhashed-model and is then served with a warning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from server_helpers import OK, ServerProcess, post

from qa_core.runtime.sidecar import SIDECAR_FILE, Sidecar

# ---- model files: every file the server loads is hashed ---------------------------------------------


def copy_export(onnx_export: Path, directory: Path) -> Path:
    shutil.copytree(onnx_export, directory)
    return directory


def swap_model(export: Path) -> None:
    """Replace model.onnx with a valid graph of other weights (what an attacker would swap in)."""
    model = onnx.load(str(export / "model.onnx"))
    first = next(t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)
    first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first) + np.float32(0.5), first.name))
    onnx.save(model, str(export / "model.onnx"))


def edit_sidecar(export: Path, change) -> None:
    data = json.loads((export / SIDECAR_FILE).read_text())
    change(data)
    (export / SIDECAR_FILE).write_text(json.dumps(data))


def refusal(model: Path, log_dir: Path, *flags: str) -> str:
    """The one line a refused start prints (exit 2, before listening); fails the test if it serves."""
    server = ServerProcess(model, log_dir, *flags)
    try:
        server.start()
    except RuntimeError:
        assert server.proc is not None and server.proc.returncode == 2, server.log()
        return server.log().strip()
    finally:
        server.stop()
    pytest.fail(f"served {model} instead of refusing it:\n{server.log()}")


def test_the_exporter_hashes_every_served_file(onnx_export: Path) -> None:
    side = Sidecar.load(onnx_export)
    assert side.files_sha256 is not None and set(side.files_sha256) == set(side.served_files())


def test_a_model_swapped_in_with_its_entry_removed_is_refused(onnx_export: Path, tmp_path: Path) -> None:
    export = copy_export(onnx_export, tmp_path / "swapped")
    swap_model(export)
    edit_sidecar(export, lambda data: data["files_sha256"].pop("model.onnx"))
    line = refusal(export, tmp_path)
    assert line.count("\n") == 0 and line.startswith("error: "), line
    assert "model.onnx" in line and "files_sha256" in line and "Traceback" not in line


def test_an_export_without_hashes_needs_the_flag_and_then_warns(onnx_export: Path, tmp_path: Path) -> None:
    export = copy_export(onnx_export, tmp_path / "unhashed")
    edit_sidecar(export, lambda data: data.pop("files_sha256"))
    line = refusal(export, tmp_path)
    assert line.count("\n") == 0 and "--allow-unhashed-model" in line and "Traceback" not in line, line
    with ServerProcess(export, tmp_path, "--allow-unhashed-model") as s:
        assert post(s.url + "/answer", OK).status_code == 200
        warnings = [x for x in s.log().splitlines() if "records no file hashes" in x]
        assert len(warnings) == 1 and "not verified" in warnings[0], s.log()
    with ServerProcess(export, tmp_path, env={"XLNETQA_ALLOW_UNHASHED_MODEL": "true"}) as s:
        assert post(s.url + "/answer", OK).status_code == 200


def test_a_swapped_file_whose_hash_is_listed_is_still_refused(onnx_export: Path, tmp_path: Path) -> None:
    export = copy_export(onnx_export, tmp_path / "listed")
    swap_model(export)
    for flags in ((), ("--allow-unhashed-model",)):  # the flag never excuses a mismatch
        line = refusal(export, tmp_path, *flags)
        assert line.count("\n") == 0 and "model.onnx differs from the exported file" in line, line
