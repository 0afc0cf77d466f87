"""The CPU's own yardsticks on tiny sizes: bench.gemm_peak (fp32 MatMul, int8 MatMulInteger, torch
matmul, with the CPU's flags) and bench.op_profile (onnxruntime's profile of an export, by op type and
group, warm-up runs left out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import cpu_bound, gemm_peak, op_profile


def test_gemm_peak_reports_each_path_with_the_cpus_flags(tmp_path: Path, capsys) -> None:
    out = tmp_path / "gemm.json"
    assert (
        gemm_peak.main(
            [
                "--shapes",
                "8x16x8,16x32x24",
                "--runs",
                "2",
                "--warmup",
                "1",
                "--threads",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "flags:" in text and "1 thread(s)" in text
    for path in gemm_peak.PATHS:
        assert f"| {path} | 16x32x24 |" in text
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 6 and all(r["G_per_s"] > 0 for r in data["rows"])
    assert set(data["peak"]) == set(gemm_peak.PATHS)


@pytest.mark.parametrize("bad", ["8x8", "8x0x8", "axbxc"])
def test_gemm_peak_refuses_a_shape_that_is_not_one(bad: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        gemm_peak.main(["--shapes", bad])
    assert exc.value.code == 2 and "--shapes: a shape is MxKxN" in capsys.readouterr().err


def test_profile_aggregation_leaves_out_the_warmup_runs() -> None:
    def node(ts: int, dur: int, op: str, name: str) -> dict:
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}

    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},  # warm-up
        node(10, 90, "MatMulInteger", "warm"),
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 50},
        node(205, 30, "MatMulInteger", "mm"),
        node(240, 10, "Gather", "g"),
        {"cat": "Node", "name": "mm_fence_before", "ts": 206, "dur": 5, "args": {"op_name": "MatMulInteger"}},
        {"cat": "Session", "name": "model_run", "ts": 300, "dur": 50},
        node(305, 30, "MatMulInteger", "mm"),
        node(340, 10, "Gather", "g"),
    ]
    nodes, wall_ms = op_profile.measured_nodes(events, runs=2)
    assert len(nodes) == 4 and wall_ms == 0.05
    result = op_profile.aggregate(nodes, runs=2, top=5)
    assert result["node_ms_per_run"] == pytest.approx(0.04)
    assert result["groups"]["int8 compute"]["share"] == pytest.approx(0.75)
    assert result["groups"]["shape plumbing"]["share"] == pytest.approx(0.25)
    assert [(r["op"], r["nodes"]) for r in result["ops"]] == [("MatMulInteger", 1), ("Gather", 1)]
    assert result["slowest_nodes"][0] == {"node": "mm", "op": "MatMulInteger", "ms": pytest.approx(0.03)}


@pytest.mark.serial  # a timing bound
def test_op_profile_of_a_tiny_int8_export(tmp_path: Path, capsys) -> None:
    out = tmp_path / "profile.json"
    args = ["--preset", "tiny", "--precision", "int8", "--shape", "1x32", "--runs", "2", "--warmup", "1"]
    assert op_profile.main([*args, "--threads", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(int8) at 1x32, 1 thread(s)" in text and "| shape plumbing |" in text
    result = json.loads(out.read_text())
    ops = {r["op"] for r in result["ops"]}
    assert ops & op_profile.INT8 and ops & op_profile.PLUMBING
    assert sum(g["share"] for g in result["groups"].values()) == pytest.approx(1.0)
    assert 0 < result["node_ms_per_run"] <= result["wall_ms_per_run"] * 1.5


def test_op_profile_refuses_a_directory_that_is_no_export(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        op_profile.main(["--model", str(tmp_path)])
    assert exc.value.code == 2 and "not an export directory" in capsys.readouterr().err


def _product_event(op: str, inputs: list[list[int]], output: list[int]) -> dict:
    return {
        "args": {
            "op_name": op,
            "input_type_shape": [{"float": dims} for dims in inputs],
            "output_type_shape": [{"float": output}],
        }
    }


def test_cpu_bound_counts_each_product_whatever_its_operands_look_like() -> None:
    # C [2, 5, 7] from A [2, 5, 3]: 2 * 70 * 3 operations, whether B is listed, transposed, a weight left
    # out of the profile's list, broadcast, or beside a bias; A transposed ([2, 3, 5]) contracts axis -2
    plain = _product_event("MatMul", [[2, 5, 3], [2, 3, 7]], [2, 5, 7])
    transposed_b = _product_event("FusedMatMul", [[2, 5, 3], [2, 7, 3]], [2, 5, 7])
    weight = _product_event("DynamicQuantizeMatMul", [[2, 5, 3], [], []], [2, 5, 7])
    broadcast_a = _product_event("MatMul", [[5, 3], [2, 3, 7]], [2, 5, 7])
    gemm_bias = _product_event("Gemm", [[10, 3], [7, 3], [1, 7]], [10, 7])
    for event, attributes in (
        (plain, None),
        (transposed_b, {"transB": 1}),
        (weight, None),
        (broadcast_a, None),
        (gemm_bias, {"transB": 1}),
    ):
        assert cpu_bound.product_ops(event, attributes) == pytest.approx(2 * 70 * 3)
    transposed_a = _product_event("FusedMatMul", [[2, 3, 5], [2, 3, 7]], [2, 5, 7])
    assert cpu_bound.product_ops(transposed_a, {"transA": 1}) == pytest.approx(2 * 70 * 3)
    gather = {"args": {"op_name": "Gather"}}
    int8, floats = cpu_bound.counted_products([plain, weight, weight, gather], runs=2)
    assert (int8, floats) == (pytest.approx(420.0), pytest.approx(210.0))
    assert cpu_bound.floor_ms(2e9, 1e9, 1e12, 1e11) == pytest.approx(2.0 + 10.0)
    # a product it cannot size is refused, not counted as free
    with pytest.raises(ValueError, match="MultiHeadAttention is a product this floor cannot size"):
        cpu_bound.counted_products([_product_event("MultiHeadAttention", [[1, 4, 8]], [1, 4, 8])], runs=1)
    with pytest.raises(ValueError, match="batch-transposed"):
        cpu_bound.product_ops(plain, {"transBatchA": 1})


@pytest.mark.parametrize(("batch", "length"), [(1, 24), (3, 20)])
def test_cpu_bound_of_a_tiny_model_counts_torchs_products(
    tmp_path: Path, capsys, batch: int, length: int
) -> None:
    out = tmp_path / "bound.json"
    shape = f"{batch}x{length}"
    args = ["--preset", "tiny", "--shape", shape, "--threads", "1", "--runs", "1", "--json", str(out)]
    assert cpu_bound.main(args) == 0
    text = capsys.readouterr().out
    assert "| (a) HF eager |" in text and "| (e) ours ONNX int8 |" in text and "flags:" in text
    result = json.loads(out.read_text())
    # the graph onnxruntime runs computes what torch's own count of the same model says it computes
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from bench.latency import make_inputs
    from qa_core.contract import INPUT_NAMES
    from train.model import XLNetConfig, XLNetForQuestionAnswering, triton_attention
    from train.model.inference import QAInference

    torch.manual_seed(0)
    model = XLNetForQuestionAnswering(
        XLNetConfig.preset("tiny", vocab_size=32000, dropout=0.0), head="simple"
    )
    inference = QAInference(model.eval())  # the position table projected here, once, as in the export
    feeds = make_inputs(batch, length, 32000)
    with triton_attention.kernel(False), torch.no_grad(), FlopCounterMode(display=False) as counter:
        inference(*(torch.from_numpy(feeds[n]) for n in INPUT_NAMES))
    total = result["int8_product_ops"] + result["float_product_flops"]
    assert total == pytest.approx(counter.get_total_flops(), rel=1e-9)
    floors = list(result["floor_ms"].values())
    assert 0 < floors[1] <= floors[0] and result["target_ms"] == pytest.approx(
        result["p50_ms"]["(a) HF eager"] / 5
    )


def test_cpu_bound_refuses_what_it_cannot_measure(capsys) -> None:
    for bad, said in ((["--shape", "1by384"], "--shape is BxT"), (["--preset", "huge"], "--preset: one of")):
        with pytest.raises(SystemExit) as exc:
            cpu_bound.main(bad)
        assert exc.value.code == 2 and said in capsys.readouterr().err
