#!/usr/bin/env bash
# Would compiling the decode path with mypyc (as black ships its wheels) buy what the cold decode needs?
# This commit's tree twice in a scratch folder, one with the decode path's modules compiled by mypyc (those
# that compile as they are: answerability_features and answerability_params keep per-object caches in
# __dict__, which mypyc's native classes do not have), then decode_in_process.py in each, in turn.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=docs/bench/request-path-5
PY=$PWD/.venv/bin/python
SCRATCH=$(mktemp -d)
for side in plain compiled; do
    mkdir "$SCRATCH/$side"
    git archive HEAD | tar -x -C "$SCRATCH/$side"
done
(cd "$SCRATCH/compiled" && "${PY%python}mypyc" qa_core/squad/decode.py qa_core/squad/rerank.py \
    qa_core/squad/alignment.py qa_core/squad/prediction.py qa_core/squad/answerability.py qa_core/text.py \
    qa_core/squad/head_outputs.py > build.log 2>&1)
for side in plain compiled plain compiled; do
    echo "== $side"
    (cd "$SCRATCH/$side" && PYTHONPATH=. "$PY" "$OLDPWD/$OUT/decode_in_process.py")
done > "$OUT/mypyc.txt"
rm -rf "$SCRATCH"
