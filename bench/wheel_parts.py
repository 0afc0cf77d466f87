"""A file too large for one transfer (the onnxruntime-gpu wheel, ~256 MB) carried in parts and put back
together byte for byte, then installed.

``split`` writes ``NAME.partNN`` files of at most ``part_bytes`` and a manifest ``NAME.parts.json``
(each part's size and SHA-256, and the whole file's). ``join`` checks every part against the manifest
before writing anything, names each missing or damaged part in one line, and checks the joined file.
``install`` joins a wheelhouse (a tar of wheels, see ``bench.gpu_run pack``) and installs its wheels
with pip into a target directory (``--no-index --no-deps``: exactly the wheels carried), which a
process then puts first on ``PYTHONPATH``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

MANIFEST_SUFFIX = ".parts.json"
CHUNK = 1 << 20


class PartsError(RuntimeError):
    """Parts missing, damaged or not a wheelhouse: one line saying which."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def split(path: Path, out_dir: Path, part_bytes: int) -> Path:
    """Cut ``path`` into parts of at most ``part_bytes`` in ``out_dir``; returns the manifest's path."""
    if part_bytes < 1:
        raise ValueError(f"a part must hold at least one byte, got {part_bytes}")
    out_dir.mkdir(parents=True, exist_ok=True)
    parts: list[dict[str, Any]] = []
    whole = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(part_bytes):
            name = f"{path.name}.part{len(parts) + 1:02d}"
            (out_dir / name).write_bytes(chunk)
            whole.update(chunk)
            parts.append({"file": name, "size": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"file": path.name, "size": path.stat().st_size, "sha256": whole.hexdigest(), "parts": parts}
    target = out_dir / (path.name + MANIFEST_SUFFIX)
    target.write_text(json.dumps(manifest, indent=2) + "\n")
    return target


def find_manifest(parts_dir: Path) -> Path:
    """The one manifest in ``parts_dir``."""
    found = sorted(parts_dir.glob("*" + MANIFEST_SUFFIX)) if parts_dir.is_dir() else []
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise PartsError(
            f"{parts_dir}: {what} *{MANIFEST_SUFFIX} manifest(s), expected one (bench.gpu_run split)"
        )
    return found[0]


def load_manifest(manifest: Path) -> dict[str, Any]:
    try:
        data = json.loads(manifest.read_text())
        _ = (
            data["file"],
            data["size"],
            data["sha256"],
            [(p["file"], p["size"], p["sha256"]) for p in data["parts"]],
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PartsError(f"{manifest}: not a parts manifest ({exc})") from None
    return dict(data)


def part_problems(manifest: Path) -> list[str]:
    """One entry per part that is missing or not the part the manifest lists (size, then SHA-256)."""
    data = load_manifest(manifest)
    found = []
    for k, part in enumerate(data["parts"], 1):
        path = manifest.parent / part["file"]
        where = f"part {k} of {len(data['parts'])} ({part['file']})"
        if not path.is_file():
            found.append(f"{where} is missing")
        elif path.stat().st_size != part["size"]:
            found.append(f"{where} has {path.stat().st_size} bytes, not {part['size']}")
        elif sha256_of(path) != part["sha256"]:
            found.append(f"{where} is damaged (SHA-256 differs)")
    return found


def join(manifest: Path, out_file: Path) -> Path:
    """The parts of ``manifest`` joined into ``out_file``, checked part by part and as a whole."""
    problems = part_problems(manifest)
    if problems:
        raise PartsError(f"{load_manifest(manifest)['file']}: " + "; ".join(problems))
    data = load_manifest(manifest)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with out_file.open("wb") as out:
        for part in data["parts"]:
            with (manifest.parent / part["file"]).open("rb") as src:
                shutil.copyfileobj(src, out, CHUNK)
    if sha256_of(out_file) != data["sha256"]:
        out_file.unlink()
        raise PartsError(f"{data['file']}: the joined file's SHA-256 differs from the manifest's")
    return out_file


def wheelhouse(wheels: list[Path], out_file: Path) -> Path:
    """A tar of ``wheels``, flat: uncompressed (wheels are zips already), or xz when ``out_file`` ends
    in ``.xz`` (for wheels stored uncompressed, e.g. a library with long runs of zeros)."""
    with tarfile.open(out_file, "w:xz" if out_file.suffix == ".xz" else "w") as tar:
        for wheel in wheels:
            tar.add(wheel, arcname=wheel.name)
    return out_file


def install(parts_dir: Path, target: Path, python: str = sys.executable) -> list[str]:
    """Join the parts in ``parts_dir`` and install what they hold (a wheel, or a tar of wheels) into
    ``target`` with ``python``'s pip; returns the wheels installed."""
    manifest = find_manifest(parts_dir)
    with tempfile.TemporaryDirectory(prefix="wheel-parts-") as tmp:
        joined = join(manifest, Path(tmp) / load_manifest(manifest)["file"])
        if joined.suffix == ".whl":
            wheels = [joined]
        elif tarfile.is_tarfile(joined):
            with tarfile.open(joined) as tar:
                names = [m.name for m in tar.getmembers() if m.isfile() and m.name.endswith(".whl")]
                if any("/" in n or n.startswith(".") for n in names):
                    raise PartsError(f"{joined.name}: a wheelhouse holds wheels at its top level only")
                tar.extractall(tmp, members=[tar.getmember(n) for n in names], filter="data")
            wheels = [Path(tmp) / n for n in names]
        else:
            raise PartsError(f"{joined.name}: neither a wheel nor a tar of wheels")
        if not wheels:
            raise PartsError(f"{joined.name}: no wheels in it")
        cmd = [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--upgrade",
        ]
        proc = subprocess.run(
            [*cmd, "--target", str(target), *map(str, wheels)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise PartsError(f"pip could not install the carried wheels into {target}: {last}")
        return sorted(w.name for w in wheels)
