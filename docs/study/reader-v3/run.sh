#!/bin/bash
# The recipe behind models/squad2-small-int8: train, fit the re-ranker and the rule, report, export, ship.
set -eu
cd "$(git rev-parse --show-toplevel)"
PY=.venv/bin/python
RUN=runs/reader-v3
CK=$RUN/finetune-random-synth-match-plausible-hard
echo "start $(date -u +%T)"
$PY -m train.study --labelled ../shared/data/squad2/dev-v2.0.cs224n-13.json ../shared/data/squad2/train-v2.0.first10.json \
  --corpus ../shared/data/squad2/test-v2.0.cs224n.json \
  --eval-articles Normans,Harvard_University,1973_oil_crisis \
  --calibration-articles Yuan_dynasty,Warsaw,French_and_Indian_War,Scottish_Parliament,Imperialism \
  --runs random+synth+match+plausible+hard --seeds 0 --synth-keep-out-of-window 0.2 \
  --synth-steps 3000 --synth-per-sentence 4 --finetune-steps 3000 --eval-every 3000 \
  --config small --threads 2 --resume --out $RUN
# the re-ranker, then the rule on the re-ranked spans, both on the calibration articles
$PY -m train.calibrate --checkpoint $CK --data $RUN/calibration.json --train-file $RUN/fit.json
$PY -m train.rerank_report --checkpoint $CK --data $RUN/eval.json --out docs/study/reader-v3/rerank
$PY -m export.onnx --checkpoint $CK --precision int8 --agreement-data $RUN/eval.json --out $RUN/int8
$PY docs/study/reader-v3/ship.py --study $RUN --checkpoint $CK --export $RUN/int8 \
  --report docs/study/reader-v3/rerank/rerank.json --demo-articles Normans,Harvard_University \
  --out models/squad2-small-int8
echo "end $(date -u +%T)"
