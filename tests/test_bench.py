"""The benchmark harness runs end to end and reports what it measured (no timing assertions here:
speed is judged in BENCHMARKS.md, not in unit tests)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from bench import serve
from bench.realistic import realistic_windows
from bench.serve_load import Result
from qa_core.contract import INPUT_NAMES


def test_bench_serve_reports_overhead_load_and_targets(onnx_export: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "serve.json"
    rc = serve.main(
        [
            "--model",
            str(onnx_export),
            "--questions",
            "6",
            "--clients",
            "1,3",
            "--seconds",
            "1",
            "--warmup",
            "0.2",
            "--json",
            str(out),
            "--log-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    over = report["overhead"]
    assert over["questions"] == 6
    assert over["bare_p50_ms"] > 0 and over["http_p50_ms"] > 0
    assert np.isfinite(over["overhead_p50_ms"])
    assert over["engine_p50_ms"] > 0 and over["host_p50_ms"] is not None
    rows = {(r["mode"], r["clients"]): r for r in report["load"]}
    modes = ("batched", "unbatched", "echo floor")
    assert set(rows) == {(mode, n) for mode in modes for n in (1, 3)}
    for r in rows.values():
        assert r["requests"] > 0 and r["errors"] == 0 and r["p99_ms"] >= r["p50_ms"] > 0
    assert rows[("unbatched", 3)]["windows_per_call"] == 1.0
    # The host path: every stage the server reports, its total, and the echo floor of the same run.
    stages = report["stages"]
    assert stages["requests"] == 6 and set(stages["stages"]) >= {"featurize", "queue", "engine", "decode"}
    assert report["echo_stages"]["end_to_end"] > 0
    text = capsys.readouterr().out
    assert "overhead p50" in text and "**Targets**" in text and "server overhead p50" in text
    assert "**Host path" in text and "echo floor" in text and "queue p50 at 1 client" in text


def test_serve_targets_report_values_verdicts_and_the_closed_loop_floor() -> None:
    def result(mode: str, clients: int, throughput: float, p50: float, p99: float) -> Result:
        return Result(mode, clients, 8.0, int(throughput * 8), 0, throughput, p50, p99, 1.0)

    over = serve.Overhead(
        questions=10, bare_p50_ms=40.0, http_p50_ms=41.5, overhead_p50_ms=1.5, overhead_p90_ms=3
    )
    results = [
        result("unbatched", 1, 25.0, 40.0, 60.0),
        result("unbatched", 16, 25.0, 640.0, 700.0),
        result("batched", 16, 40.0, 400.0, 500.0),
    ]
    lines = serve.target_lines(over, results)
    assert lines[0] == "- server overhead p50 1.50 ms (target <= 1 ms): NOT met"
    assert lines[1] == "- micro-batching throughput at 16 clients 1.60x (target >= 1.5x): met"
    assert lines[2].startswith("- batched p99 at 16 clients 500 ms vs 2x single-client p50 80 ms: NOT met")
    assert (
        "(unbatched p99 700 ms)" in lines[2]
        and "16 closed-loop clients at 40.0 req/s mean 400 ms" in lines[2]
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "/nonexistent"], "does not exist"),
        (["--clients", "0"], "--clients must be integers in 1..256"),
        (["--clients", "a,b"], "comma-separated integers"),
        (["--modes", "sometimes"], "unknown mode"),
        (["--modes", "fronts=0"], "unknown mode"),
        (["--repo", "/nonexistent"], "is not a checkout of this project"),
        (["--questions", "2"], "no export.json"),
        (["--server-args", "--torch-dtype fp8"], "--server-args: torch_dtype: "),
        (["--server-args=--torch-cuda-graphs"], "needs torch_device cuda[:N]"),
        (["--server-args", "--no-such-flag 1"], "not flags of python -m server: --no-such-flag 1"),
    ],
)
def test_bench_serve_rejects_bad_arguments(argv, message, tmp_path: Path, capsys) -> None:
    model = ["--model", str(tmp_path)] if argv[0] != "--model" else []
    try:
        code = serve.main([*model, *argv])
    except SystemExit as exc:  # argparse errors
        code = exc.code
    assert code not in (0, None)
    assert message in capsys.readouterr().err


def test_bench_serve_runs_fronts_over_one_engine_and_counts_each_process(
    onnx_export: Path, tmp_path: Path
) -> None:
    """``fronts=N`` rows start N fronts over one engine process; every load row says what each kind of
    process spent per request (the numbers the model of more cores is built from)."""
    out = tmp_path / "fronts.json"
    argv = ["--model", str(onnx_export), "--backend", "null", "--modes", "batched,fronts=2", "--clients", "4"]
    argv += ["--seconds", "1", "--warmup", "0.2", "--skip-overhead", "--no-echo", "--json", str(out)]
    assert serve.main([*argv, "--log-dir", str(tmp_path)]) == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())["load"]}
    assert rows["batched"]["cpu_ms_per_request"]["server"] > 0  # one process does everything
    fronts = rows["fronts=2"]
    assert fronts["requests"] > 0 and fronts["errors"] == 0
    assert fronts["cpu_ms_per_request"]["engine"] > 0 and fronts["cpu_ms_per_request"]["front"] > 0


def test_process_cpu_is_counted_by_role_for_a_process_tree() -> None:
    import subprocess
    import sys

    from bench.process_cpu import cpu_seconds_by_role

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ninput()"
    child = subprocess.Popen([sys.executable, "-c", burn, "server.topology.engine"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while cpu_seconds_by_role(os.getpid()).get("engine", 0.0) < 0.25:
            assert time.monotonic() < deadline, cpu_seconds_by_role(os.getpid())
            time.sleep(0.05)
        assert cpu_seconds_by_role(os.getpid())["server"] > 0  # this process itself is the root
    finally:
        child.communicate(b"\n", timeout=10)


def test_host_profile_sorts_stacks_into_components() -> None:
    from bench.host_profile import component

    frames = [
        "a (server/api/routes.py:1)",
        "decode_head_outputs (qa_core/squad/head_outputs.py:2)",
        "all_features (x.py:3)",
    ]
    assert component(frames) == "answerability rule (lexical features)"  # the innermost match wins
    assert component(frames[:2]) == "decode (spans, n-best)"
    assert component(["main (x.py:1)", "encode_with_offsets (spm.py:2)"]).startswith("tokenize")
    assert component(["main (nowhere.py:1)"]) == "other"


def test_cache_effect_reports_decodes_and_hops_of_the_servers_own_path(onnx_export: Path, capsys) -> None:
    from bench.cache_effect import main

    assert main(["--model", str(onnx_export), "--questions", "3"]) == 0
    text = capsys.readouterr().out
    values = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith(("| what", "| ---"))
    }
    assert set(values) == {
        "decode one question, in a loop of decodes",
        next(k for k in values if k.startswith("decode one question, right after a 1x")),
        "engine stage minus its backend calls, per question (AnswerService in process)",
        "backend calls per question",
    }
    assert float(values["backend calls per question"]) >= 1.0  # every question ran at least one window
    assert all(np.isfinite(float(v.split()[0])) for v in values.values())


def test_realistic_windows_are_unpadded_true_lengths(xlnet_tok) -> None:
    windows, questions, source = realistic_windows(12, xlnet_tok, max_seq_len=128, doc_stride=64)
    assert questions == 12 and source.exists() and len(windows) >= questions
    lengths = {w["input_ids"].shape[1] for w in windows}
    assert len(lengths) > 1 and max(lengths) <= 128  # every window at its own length, none over the max
    for w in windows:
        assert set(w) == set(INPUT_NAMES) and w["input_ids"].shape[0] == 1
        assert w["attention_mask"].all()  # no padding


def test_bench_abuse_runs_both_phases_and_reports_the_targets(
    onnx_export: Path, tmp_path: Path, capsys
) -> None:
    from bench import abuse

    out = tmp_path / "abuse.json"
    argv = ["--model", str(onnx_export), "--seconds", "1.5", "--clients", "2", "--adversaries", "2"]
    assert abuse.main([*argv, "--json", str(out), "--log-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "| baseline |" in printed and "| attack |" in printed and "under attack / without" in printed
    baseline, attack = json.loads(out.read_text())["phases"]
    assert baseline["requests"] > 0 and attack["requests"] > 0 and attack["adversary_requests"] >= 2
    for phase in (baseline, attack):  # hostile traffic never makes the server fail or hang
        assert phase["errors_5xx"] == phase["hangs"] == phase["adversary_5xx"] == 0, phase
        assert phase["largest_response_bytes"] < 5000 and phase["peak_rss_mb"] > 0
    statuses = attack["adversary_status"]
    assert any(k.startswith("max-size: ") for k in statuses) and any(
        k.startswith("expanding-unicode: 413") for k in statuses
    )


@pytest.mark.parametrize("argv", [["--seconds", "0"], ["--clients", "0"], ["--seconds", "700"]])
def test_bench_abuse_rejects_unbounded_runs(argv, capsys) -> None:
    from bench import abuse

    with pytest.raises(SystemExit):
        abuse.parse_args(["--model", "m", *argv])
    assert "must be in" in capsys.readouterr().err


def test_train_bench_measures_both_precisions_for_both_models(capsys) -> None:
    from bench.train import main as train_bench

    argv = [
        "--config",
        "tiny",
        "--vocab",
        "200",
        "--batch",
        "2",
        "--seq",
        "32",
        "--runs",
        "1",
        "--threads",
        "1",
    ]
    assert train_bench([*argv, "--precision", "fp32,bf16"]) == 0
    table = capsys.readouterr().out
    for stage in ("pretrain", "fine-tune"):
        for precision in ("fp32", "bf16"):
            assert f"{stage} {precision}" in table and f"{stage} {precision}: ours / HF" in table
        ratio = [line for line in table.splitlines() if f"{stage}: ours bf16 / ours fp32" in line]
        assert len(ratio) == 1 and float(ratio[0].rstrip(" |").split("|")[-1]) > 0
    with pytest.raises(SystemExit):
        train_bench([*argv, "--precision", "fp16"])


def test_bench_abuse_per_key_refuses_the_adversaries_key_with_429(
    onnx_export: Path, tmp_path: Path, capsys
) -> None:
    from bench import abuse

    out = tmp_path / "abuse.json"
    argv = [
        "--model",
        str(onnx_export),
        "--seconds",
        "1.5",
        "--clients",
        "2",
        "--adversaries",
        "2",
        "--per-key",
    ]
    argv += ["--tenants", "2", "--key-max-inflight-windows", "8"]
    assert abuse.main([*argv, "--json", str(out), "--log-dir", str(tmp_path)]) == 0
    assert "API keys: well-behaved clients on 2 keys" in capsys.readouterr().out
    baseline, attack = json.loads(out.read_text())["phases"]
    assert baseline["requests"] > 0 and attack["requests"] > 0
    assert attack["errors_5xx"] == attack["hangs"] == attack["adversary_5xx"] == 0, attack
    assert attack["adversary_status"].get("heavy: 429", 0) >= 1, attack["adversary_status"]
    assert not any(
        k.endswith(": 401") for k in attack["adversary_status"]
    )  # its key is valid: limits, not auth
    # a keyless neighbour on the tenants' address spends its failure budget, never theirs
    keyless = attack["keyless_status"]
    assert keyless.get("401 unauthorized", 0) >= 1 and keyless.get("429 too_many_auth_failures", 0) >= 1, (
        keyless
    )
    assert "too_many_auth_failures" not in attack["well_behaved_429"], attack["well_behaved_429"]
    assert (tmp_path / "abuse-keys.txt").stat().st_mode & 0o077 == 0


def test_corpus_memory_bench_prepares_and_trains_on_both_corpora(tmp_path: Path, capsys) -> None:
    """Tiny sizes: both corpora are built, prepared and trained on, and the table says so (no timing is
    asserted here; the figures go to BENCHMARKS.md)."""
    from bench.corpus_memory import main

    out = tmp_path / "results.json"
    assert (
        main(
            [
                "--gb",
                "0.004",
                "--small-mb",
                "1",
                "--steps",
                "2",
                "--workers",
                "2",
                "--work",
                str(tmp_path),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    results = json.loads(out.read_text())
    assert results["large"]["tokens"] > 2 * results["small"]["tokens"] > 0  # 4 MB of text against 1 MB
    for name in ("small", "large"):
        assert results[name]["train"]["peak_rss_mb"] > 0 and results[name]["prepare"]["wall_s"] > 0
    table = capsys.readouterr().out
    assert (
        "| corpus | MB | tokens | prepare MB/s/worker | peak RSS MB |" in table
        and "large - small peak RSS" in table
    )


def test_memory_bench_counts_each_lever_exactly(capsys) -> None:
    """Tiny shapes under fake tensors: the printed parts add up as they must (Adam: two fp32 moments
    per gradient), each lever cuts what it should, and the peak holds what is alive at once."""
    from bench.memory import main as memory_bench

    # (windows long enough that activations outweigh autocast's bf16 copies of the weights)
    argv = ["--presets", "tiny", "--stages", "finetune,pretrain", "--batch", "4", "--seq", "128"]
    assert memory_bench([*argv, "--unit", "MiB", "--freeze-fraction", "0.5"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| xlnet-tiny")]
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        weights, grads, optimizer, activations, parts, peak = map(float, cells[4:10])
        rows[cells[1], cells[2]] = (float(cells[3]), weights, grads, optimizer, activations, peak)
        assert (
            abs(optimizer - 2 * grads) <= 0.02
            and abs(weights + grads + optimizer + activations - parts) <= 0.03
        )
        assert peak >= weights + optimizer + activations - 0.02 and peak >= weights + grads + optimizer - 0.02
    assert len(rows) == 11
    act = {key: r[4] for key, r in rows.items()}
    for stage in ("finetune", "pretrain"):
        base = act[stage, "fp32 (baseline)"]
        assert act[stage, "activation checkpointing"] < base and act[stage, "bf16 autocast"] < base
    frozen = act["finetune", "freeze 1/2 layers + embedding"]
    assert (
        frozen < act["finetune", "freeze 1/2 layers (embedding trained)"] < act["finetune", "fp32 (baseline)"]
    )
    trained = rows["finetune", "freeze 1/2 layers + embedding"][0]
    assert trained < rows["finetune", "fp32 (baseline)"][0]
    with pytest.raises(SystemExit):
        memory_bench(["--stages", "serve"])
    assert "--stages takes finetune and/or pretrain" in capsys.readouterr().err
