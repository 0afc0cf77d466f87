#!/usr/bin/env bash
# Issue 57, the decode stage after the re-ranker's reading of the best span is reused by the rule and the
# verifier's logit is computed beside the engine: this tree ("after") against a checkout of the commit
# before it ("before", BEFORE=/path, its own code run by this venv), one server at a time, in the order
# before, after, after, before, before, after (ABBA: a drifting machine favours neither), one client.
#   git worktree add /tmp/before bafb992 && BEFORE=/tmp/before bash docs/bench/request-path-5/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=docs/bench/request-path-5
BEFORE=${BEFORE:?a checkout of the commit before, e.g. /tmp/before}
PY=.venv/bin/python
MODEL=models/squad2-small-int8
lscpu > "$OUT/lscpu.txt"
$PY -m bench.one_window --tokenizer $MODEL --data data/sample/dev.json --max-seq-len 192 --out /tmp/one-window.json
n=0
for side in before after after before before after; do
    n=$((n + 1))
    for backend in onnx null; do
        repo=(); [ "$side" = before ] && repo=(--repo "$BEFORE")
        $PY -m bench.serve --model $MODEL --backend $backend --data /tmp/one-window.json --questions 300 \
            --clients 1 --seconds 3 --warmup 1 --threads 1 --modes batched --no-echo \
            "${repo[@]}" --json "$OUT/serve-$backend-$n-$side.json" > "$OUT/serve-$backend-$n-$side.md"
    done
done
# the decode stage in process, the sample's one-window questions, each decode right after a forward
PYTHONPATH=. $PY "$OUT/decode_in_process.py" > "$OUT/decode-in-process-after.txt"
(cd "$BEFORE" && PYTHONPATH=. "$OLDPWD/$PY" "$OLDPWD/$OUT/decode_in_process.py") > "$OUT/decode-in-process-before.txt"
