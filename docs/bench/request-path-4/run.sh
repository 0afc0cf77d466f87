#!/usr/bin/env bash
# Issue 57, the request path after the decision's question-only work moved beside the engine: this
# tree ("after") against a checkout of the commit before it ("before", BEFORE=/path, its own code run
# by this venv), side by side in one run on a quiet machine. Writes the raw files beside this script.
#   git worktree add /tmp/before 17cca05 && BEFORE=/tmp/before bash docs/bench/request-path-4/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=docs/bench/request-path-4
BEFORE=${BEFORE:?a checkout of the commit before, e.g. /tmp/before}
PY=.venv/bin/python
MODEL=models/squad2-small-int8
lscpu > "$OUT/lscpu.txt"
$PY -m bench.one_window --tokenizer $MODEL --data data/sample/dev.json --max-seq-len 192 --out /tmp/one-window.json
# both servers at once, each question to both in turn: per-question differences with intervals
for backend in null onnx; do
    $PY -m bench.paired --model $MODEL --backend $backend --repo "$BEFORE" --data /tmp/one-window.json \
        --questions 300 --threads 1 --json "$OUT/paired-$backend.json" > "$OUT/paired-$backend.md"
done
# one server at a time, before and after in turn: absolute host time, and batched vs unbatched at load
for round in 1 2; do
    for backend in null onnx; do
        for side in before after; do
            repo=(); [ "$side" = before ] && repo=(--repo "$BEFORE")
            $PY -m bench.serve --model $MODEL --backend $backend --data /tmp/one-window.json --questions 300 \
                --clients 1,4,16,64 --seconds 4 --warmup 1 --threads 1 --modes batched,unbatched --no-echo \
                "${repo[@]}" --json "$OUT/serve-$backend-$side-$round.json" > "$OUT/serve-$backend-$side-$round.md"
        done
    done
done
# the decode stage in process on the texts built to make it slow (after only: its code is unchanged)
PYTHONPATH=. $PY bench/decode_cases.py --pools default,20,100 --runs 7 --json "$OUT/decode-cases.json"
