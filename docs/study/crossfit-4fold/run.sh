#!/bin/bash
# The first cross-fitted run over all 23 labelled articles, at a reduced budget (600 synthetic and 800
# fine-tuning steps, 4 folds: what fitted in one session on 2 cores); the full recipe is 3,000 + 3,000 and 5 folds.
set -eu
cd "$(git rev-parse --show-toplevel)"
.venv/bin/python -m train.crossfit \
  --labelled ../shared/data/squad2/dev-v2.0.cs224n-13.json ../shared/data/squad2/train-v2.0.first10.json \
  --corpus ../shared/data/squad2/test-v2.0.cs224n.json \
  --folds 4 --synth-steps 600 --finetune-steps 800 --reranker linear --threads 2 --no-progress --out runs/crossfit-4fold
cp runs/crossfit-4fold/{RESULTS.md,crossfit.json,crossfit.png,folds.json} docs/study/crossfit-4fold/
