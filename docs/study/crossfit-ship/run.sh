#!/bin/bash
# The recipe behind models/squad2-small-int8 from the cross-fit: every fold, the shipped reader trained on
# all labelled articles but three (its rule fitted on the fold readers' out-of-fold outputs), then the
# report on the three, the export, the ship.
set -eu
cd "$(git rev-parse --show-toplevel)"
PY=.venv/bin/python
RUN=runs/crossfit-4fold-3000
echo "start $(date -u +%T)"
# the study: the boosted-trees re-ranker
$PY -m train.crossfit --labelled ../shared/data/squad2/dev-v2.0.cs224n-13.json ../shared/data/squad2/train-v2.0.first10.json \
  --corpus ../shared/data/squad2/test-v2.0.cs224n.json --folds 4 --synth-steps 3000 --finetune-steps 3000 --reranker trees \
  --final --final-hold-out 1973_oil_crisis Harvard_University Normans --threads 2 --no-progress --out $RUN
cp $RUN/RESULTS.md docs/study/crossfit-ship/RESULTS-trees.md
# the shipped rule: the same readers (reused), the linear re-ranker (its decode a fifth cheaper)
$PY -m train.crossfit --labelled ../shared/data/squad2/dev-v2.0.cs224n-13.json ../shared/data/squad2/train-v2.0.first10.json \
  --corpus ../shared/data/squad2/test-v2.0.cs224n.json --folds 4 --synth-steps 3000 --finetune-steps 3000 --reranker linear \
  --final --final-hold-out 1973_oil_crisis Harvard_University Normans --threads 2 --no-progress --out $RUN
cp $RUN/RESULTS.md docs/study/crossfit-ship/RESULTS-linear.md
CK=$(ls -d $RUN/final-holdout-*/reader)
$PY -m train.rerank_report --checkpoint $CK --data $CK/../heldout.json --out docs/study/crossfit-ship/rerank
$PY -m export.onnx --checkpoint $CK --precision int8 --agreement-data $CK/../heldout.json --out $RUN/int8
$PY docs/study/crossfit-ship/ship.py --crossfit $RUN --checkpoint $CK --export $RUN/int8 \
  --report docs/study/crossfit-ship/rerank/rerank.json --demo-articles Normans,Harvard_University \
  --out models/squad2-small-int8
echo "end $(date -u +%T)"
