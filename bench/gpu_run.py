"""``python -m bench.gpu_run``: the whole GPU measurement in as few calls on a lent GPU machine as it can.

The lent machine reaches no package index and takes at most ~64 MiB per call, and the onnxruntime-gpu
wheel alone is ~256 MB; its image has torch (CUDA 13), transformers, onnx and the NVIDIA CUDA 13
wheels, but not onnxruntime-gpu nor the server's fastapi / uvicorn / pydantic. So, on this side:

    python -m bench.gpu_run pack .gpu-parts --prune-tool ../shared/tools/prune_ort_fatbin.py
                                                       # download the missing wheels, keep onnxruntime-gpu's
                                                       # sm_90 code only, tar.xz, split into parts that fit
                                                       # one call beside this tree (two for an H100/H200)
    python -m bench.gpu_run plan .gpu-parts            # the calls: what each carries, runs, may take

and each planned call carries one part and runs stages while the parts arrive (a warm machine keeps
them between calls): the probe first (it needs nothing carried), then, with the last part, ``install``
(join the parts, pip install into ``.gpu-target``) and the onnxruntime-CUDA rows beside the torch rows
of the same call, then the rest: the servers, graphs, memory levers, ``make gpu-test`` and
``make gpu-check``. If the GPU refuses the pruned library ("no kernel image"), ``pack`` again without
``--prune-tool`` (about five parts). Every stage writes ``STAGE.json`` and ``STAGE.log`` under ``--out``; ``report``
merges the directories of all calls into ``summary.json`` and ``summary.md`` (for BENCHMARKS.md).

    python -m bench.gpu_run split FILE OUTDIR [--part-mib N]      python -m bench.gpu_run join PARTS_DIR FILE
    python -m bench.gpu_run install PARTS_DIR TARGET              python -m bench.gpu_run parts PARTS_DIR
    python -m bench.gpu_run stages STAGE... --out DIR [--device cpu --preset tiny --shapes 1x16 ...]
    python -m bench.gpu_run report DIR... --out DIR

``--device cpu --preset tiny`` runs the same stages on a CPU on tiny shapes (a dry run of the code
paths; the GPU-only configurations report why they did not run).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import platform
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.wheel_parts import (
    MANIFEST_SUFFIX,
    PartsError,
    find_manifest,
    join,
    load_manifest,
    split,
    wheelhouse,
)

PROG = "python -m bench.gpu_run"
MIB = 1 << 20
# The most one call carries is 64 MiB, the working tree included (tracked and untracked files git does not
# ignore: ~17 MB now, and growing), so a part's size comes from the tree's real size, with a margin.
CALL_LIMIT_MIB = 64
MARGIN_MIB = 2
REPO = Path(__file__).resolve().parents[1]
PARTS_DIR = ".gpu-parts"
WORK_DIR = ".gpu-work"
TARGET_DIR = ".gpu-target"
# Stage results accumulate on the warm machine (outside $OUT, which each call empties) and travel back as
# one archive: a call returns at most 8 files, and a run writes two per stage.
OUT = ".gpu-work/stages"
BUNDLE = "$OUT/gpu-run.tgz"
# What the lent machines' image lacks for these stages (the device tool's KINDS.md lists what it has:
# torch 2.11 for CUDA 13, transformers, onnx, onnxscript, sentencepiece, httpx, prometheus-client,
# pytest; CPython 3.12), pinned to the versions the CPU venv serves and tests with.
SERVER_WHEELS = (
    "fastapi==0.165.0",
    "starlette==1.10.0",
    "uvicorn==0.54.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "pydantic-settings==2.16.3",
    "python-dotenv==1.2.4",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "opentelemetry-api==1.45.2",  # fastapi imports it at start-up
    "httptools==0.9.0",  # server.door.connection's parser
    "uvloop==0.23.0",
    "orjson==3.13.0",
    "pyzmq==27.3.0",  # --workers N: fronts over one engine process
    "msgspec==0.22.0",
)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)
# The image lacks the server's packages, and every stage that imports server code (bench.latency reads the
# bucketed runner and the server's settings, so latency-torch does; tests/test_gpu_run.py checks the ones
# before) comes after ``install``. The call that brings the last part installs and first measures the
# onnxruntime-CUDA rows beside the torch rows of the same run (with a 15-minute lease, the rows that
# matter most); the other groups follow, one call each.
STAGES_BEFORE_INSTALL = (("probe",),)
STAGES_AFTER_INSTALL = (
    ("install", "latency-torch", "latency-ort"),
    ("serve-torch", "graphs", "serve-ort"),
    ("memory", "gpu-test", "gpu-check", "report"),
)


def carried_tree_bytes(repo: Path) -> int:
    """Bytes of the working tree a call carries: the files git tracks or would track (not ignored)."""
    proc = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    )
    names = {n for n in proc.stdout.decode(errors="surrogateescape").split("\0") if n}
    return sum((repo / n).stat().st_size for n in names if (repo / n).is_file())


def part_mib_for(tree_bytes: int) -> int:
    """The largest whole-MiB part that fits one call beside the tree (and the margin)."""
    room = CALL_LIMIT_MIB * MIB - tree_bytes - MARGIN_MIB * MIB
    if room < 8 * MIB:
        raise PartsError(
            f"the working tree is {tree_bytes / MIB:.1f} MiB: a call carries {CALL_LIMIT_MIB} MiB in all, "
            f"leaving {max(room, 0) / MIB:.1f} MiB for a part; move large untracked files out of the tree"
        )
    return room // MIB


@dataclass(frozen=True)
class Run:
    """One call on the lent machine: the paths it carries, its command, its time limit."""

    carry: tuple[str, ...]
    command: str
    timeout_s: int


def stages_command(stages: Sequence[str], python: str = "python3") -> str:
    run = f"PYTHONUNBUFFERED=1 {python} -m bench.gpu_run stages {' '.join(stages)} --out {OUT}"
    return f"{run}; rc=$?; tar czf {BUNDLE} {OUT}; exit $rc"


def plan_runs(parts_dir: str, manifest: dict[str, Any], python: str = "python3") -> list[Run]:
    """The calls: call k carries part k (with the manifest) and runs a group of stages that need nothing
    carried meanwhile; the call that brings the last part installs, measures the onnxruntime-CUDA rows
    beside the torch rows, then runs what is left from before; one call per remaining group."""
    names = [p["file"] for p in manifest["parts"]]
    carried = f"{parts_dir}/{manifest['file']}{MANIFEST_SUFFIX}"
    before = list(STAGES_BEFORE_INSTALL)
    runs = []
    for k, name in enumerate(names):
        stages: list[str] = []
        if k == len(names) - 1:  # install and the rows that matter first, then what was not run yet
            stages = list(STAGES_AFTER_INSTALL[0]) + [s for group in before for s in group]
        elif before:
            stages = list(before.pop(0))
        command = stages_command(stages, python) if stages else f"{python} -m bench.gpu_run parts {parts_dir}"
        measured = [s for s in stages if s not in ("probe", "install")]
        runs.append(Run((carried, f"{parts_dir}/{name}"), command, min(600, 120 + 240 * len(measured))))
    runs += [Run((), stages_command(group, python), 600) for group in STAGES_AFTER_INSTALL[1:]]
    return runs


def oversized_calls(repo: Path, runs: Sequence[Run], tree_bytes: int) -> list[str]:
    """The calls whose carried files (paths from the repository root) and the tree exceed what one call
    carries, each with its size."""
    found = []
    for k, r in enumerate(runs, 1):
        size = tree_bytes + sum((repo / c).stat().st_size for c in r.carry if (repo / c).is_file())
        if size > CALL_LIMIT_MIB * MIB:
            found.append(f"call {k} carries {size / MIB:.1f} MiB (the tree {tree_bytes / MIB:.1f} MiB)")
    return found


CUDA_PROVIDER_LIBRARY = "libonnxruntime_providers_cuda.so"


def pruned_wheel(wheel: Path, tool: Path, arch: int, out_dir: Path) -> Path:
    """``wheel`` (onnxruntime-gpu) with its CUDA provider library passed through ``tool`` (the shared
    prune_ort_fatbin.py: only the sm_``arch`` machine code kept, the rest zeroed), its RECORD entry
    updated, stored uncompressed so that the wheelhouse's xz removes the zeros."""
    out = out_dir / wheel.name
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as src, tempfile.TemporaryDirectory(prefix="prune-") as tmp:
        libs = [n for n in src.namelist() if n.endswith(CUDA_PROVIDER_LIBRARY)]
        if len(libs) != 1:
            raise PartsError(f"{wheel.name}: expected one {CUDA_PROVIDER_LIBRARY}, found {len(libs)}")
        original, pruned = Path(tmp) / "in.so", Path(tmp) / "out.so"
        original.write_bytes(src.read(libs[0]))
        proc = subprocess.run(
            [sys.executable, str(tool), str(original), str(pruned)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0 or not pruned.is_file():
            last = ((proc.stderr or proc.stdout).strip().splitlines() or ["(no output)"])[-1]
            raise PartsError(f"{tool} could not prune {libs[0]}: {last}")
        print(f"pruned {libs[0]}: {proc.stdout.strip()}")
        data = pruned.read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
            for info in src.infolist():
                content = data if info.filename == libs[0] else src.read(info.filename)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = content.decode().splitlines()
                    content = (
                        "\n".join(
                            f"{libs[0]},sha256={digest},{len(data)}"
                            if line.split(",")[0] == libs[0]
                            else line
                            for line in lines
                        )
                        + "\n"
                    ).encode()
                dst.writestr(info.filename, content)
    return out


def pack(
    out_dir: Path,
    python_version: str,
    part_mib: int,
    wheels_dir: Path | None,
    prune: tuple[Path, int] | None = None,
) -> Path:
    """Download the wheels the lent machine lacks (onnxruntime-gpu for the default stack, the server's
    packages) for its Python, tar them and split the tar into ``out_dir``; returns the manifest. With
    ``prune`` (tool, arch), onnxruntime-gpu's CUDA library keeps only that arch's machine code and the
    tar is xz-compressed: ~256 MB of wheels become two calls' worth."""
    from qa_core.runtime.gpu_stacks import DEFAULT_STACK

    wanted = [f"onnxruntime-gpu=={DEFAULT_STACK.onnxruntime_gpu}", *SERVER_WHEELS]
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as tmp:
        where = wheels_dir or Path(tmp)
        if wheels_dir is None:
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
            cmd += ["--python-version", python_version, "--implementation", "cp", "-d", str(where)]
            cmd += [arg for p in PLATFORMS for arg in ("--platform", p)]
            proc = subprocess.run([*cmd, *wanted], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise PartsError(f"pip download failed: {last}")
        wheels = sorted(where.glob("*.whl"))
        tag = f"cp{python_version.replace('.', '')}"
        if prune is None:
            tarball = wheelhouse(wheels, Path(tmp) / f"gpu-wheels-{tag}.tar")
        else:
            tool, arch = prune
            wheels = [
                pruned_wheel(w, tool, arch, Path(tmp) / "pruned")
                if w.name.startswith("onnxruntime_gpu")
                else w
                for w in wheels
            ]
            tarball = wheelhouse(wheels, Path(tmp) / f"gpu-wheels-{tag}-sm{arch}.tar.xz")
        return split(tarball, out_dir, part_mib * MIB)


def facts() -> dict[str, Any]:
    """This machine, as the report's first line and probe.json say it."""
    import importlib.metadata

    from export.stack_report import collect

    found: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    names = ("torch", "onnxruntime", "onnxruntime-gpu", "transformers", "fastapi", "uvicorn", "pydantic")
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    try:
        import torch

        found["torch_cuda"] = torch.version.cuda
        found["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        found["torch_cuda"] = found["gpu"] = None
    found["stack"] = collect()
    driver = found["stack"].get("driver")
    found["summary"] = (
        f"{found['gpu'] or 'no GPU'}, driver {driver or 'none'}, Python {found['python']}, torch {found['torch']} "
        f"(CUDA {found['torch_cuda']}), onnxruntime-gpu {found['onnxruntime-gpu']}, transformers {found['transformers']}"
    )
    return found


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="cut FILE into parts + manifest in OUTDIR")
    s.add_argument("file", type=Path)
    s.add_argument("out_dir", type=Path)
    s.add_argument("--part-mib", type=int, help="part size (default: what fits one call beside this tree)")
    s = sub.add_parser("join", help="join the parts in PARTS_DIR into FILE (checked)")
    s.add_argument("parts_dir", type=Path)
    s.add_argument("file", type=Path)
    s = sub.add_parser("install", help="join PARTS_DIR and pip install its wheels into TARGET")
    s.add_argument("parts_dir", type=Path)
    s.add_argument("target", type=Path)
    s = sub.add_parser("parts", help="which parts are here")
    s.add_argument("parts_dir", type=Path)
    s = sub.add_parser("pack", help="download, tar and split the wheels the lent machine lacks")
    s.add_argument("out_dir", type=Path)
    s.add_argument("--python", default="3.12", help="the lent machine's CPython version")
    s.add_argument("--part-mib", type=int, help="part size (default: what fits one call beside this tree)")
    s.add_argument("--wheels", type=Path, help="take the wheels from this directory instead of downloading")
    s.add_argument(
        "--prune-tool",
        type=Path,
        help="prune_ort_fatbin.py (../shared/tools/): keep only --prune-sm machine code in onnxruntime-gpu",
    )
    s.add_argument(
        "--prune-sm", type=int, default=90, help="with --prune-tool: the GPU arch kept (H100/H200: 90)"
    )
    s = sub.add_parser("plan", help="print the calls on the lent machine")
    s.add_argument("parts_dir", type=Path)
    s.add_argument("--python", default="python3")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("stages", help="run stages, writing STAGE.json and STAGE.log into --out")
    from bench.gpu_stages import STAGES

    s.add_argument("stages", nargs="+", choices=[*STAGES, "report"])
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--work", type=Path, default=Path(WORK_DIR))
    s.add_argument("--target", type=Path, default=Path(TARGET_DIR))
    s.add_argument("--parts", type=Path, default=Path(PARTS_DIR))
    s.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    s.add_argument(
        "--preset", default="base", help="model shape (random weights): base, or tiny for a dry run"
    )
    s.add_argument("--shapes", default="1x384,8x384,32x384")
    s.add_argument("--runs", type=int, default=20)
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--clients", default="1,16")
    s.add_argument("--seconds", type=float, default=5.0)
    s.add_argument("--max-batch-size", type=int, default=16)
    s = sub.add_parser("report", help="merge the STAGE.json of DIRs into summary.json and summary.md")
    s.add_argument("dirs", type=Path, nargs="+")
    s.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("facts", help="this machine's facts as JSON")
    s.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    try:
        return run(args)
    except (PartsError, OSError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    if args.command == "split":
        manifest = split(
            args.file, args.out_dir, (args.part_mib or part_mib_for(carried_tree_bytes(REPO))) * MIB
        )
        print(f"{len(load_manifest(manifest)['parts'])} parts and {manifest}")
    elif args.command == "join":
        print(join(find_manifest(args.parts_dir), args.file))
    elif args.command == "install":
        from bench.wheel_parts import install

        for wheel in install(args.parts_dir, args.target):
            print(f"installed {wheel} into {args.target}")
    elif args.command == "parts":
        from bench.gpu_stages import parts_status

        print(parts_status(args.parts_dir))
    elif args.command == "pack":
        if args.prune_tool is not None and not args.prune_tool.is_file():
            raise PartsError(f"--prune-tool {args.prune_tool}: no such file")
        part_mib = args.part_mib or part_mib_for(carried_tree_bytes(REPO))
        prune = (args.prune_tool, args.prune_sm) if args.prune_tool else None
        manifest = pack(args.out_dir, args.python, part_mib, args.wheels, prune)
        print(
            f"{len(load_manifest(manifest)['parts'])} parts and {manifest}; next: {PROG} plan {args.out_dir}"
        )
    elif args.command == "plan":
        runs = plan_runs(str(args.parts_dir), load_manifest(find_manifest(args.parts_dir)), args.python)
        if too_big := oversized_calls(REPO, runs, carried_tree_bytes(REPO)):
            raise PartsError(
                "; ".join(too_big) + f": over {CALL_LIMIT_MIB} MiB; pack again with smaller parts"
            )
        if args.json:
            print(json.dumps([asdict(r) for r in runs], indent=2))
        for k, r in enumerate(runs if not args.json else [], 1):
            print(f"call {k}: carry {list(r.carry) or 'nothing'}; timeout_s {r.timeout_s}\n  {r.command}")
    elif args.command == "stages":
        from bench.gpu_stages import StageContext, run_stages

        names = {"out", "work", "target", "parts", "device", "preset", "shapes", "runs", "warmup", "clients"}
        ctx = StageContext(**{k: v for k, v in vars(args).items() if k in names}, seconds=args.seconds)
        ctx.max_batch_size = args.max_batch_size
        for path in run_stages(ctx, args.stages):
            print(f"wrote {path}")
    elif args.command == "report":
        from bench.gpu_stages import write_report

        for path in write_report(args.dirs, args.out):
            print(f"wrote {path}")
    elif args.command == "facts":
        found = facts()
        text = json.dumps(found, indent=2, default=str)
        if args.json:
            args.json.write_text(text)
        print(found["summary"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
