#!/bin/bash
# Does fine-tuning longer move the readers? The first cross-fitted run's folds and synthetic stage
# (runs/crossfit-4fold, docs/study/crossfit-4fold/run.sh) reused, each reader fine-tuned for 1,600 steps
# instead of 800, then the readers compared on their held-out articles, fold by fold as they finish.
set -eu
cd "$(git rev-parse --show-toplevel)"
mkdir -p runs/crossfit-4fold-1600
for stage in tokenizer synthetic.json synthetic-dev.json synth-stage folds.json; do
  [ -e runs/crossfit-4fold-1600/$stage ] || cp -r runs/crossfit-4fold/$stage runs/crossfit-4fold-1600/
done
.venv/bin/python -m train.crossfit \
  --labelled ../shared/data/squad2/dev-v2.0.cs224n-13.json ../shared/data/squad2/train-v2.0.first10.json \
  --corpus ../shared/data/squad2/test-v2.0.cs224n.json \
  --folds 4 --synth-steps 600 --finetune-steps 1600 --reranker linear --threads 2 --no-progress --out runs/crossfit-4fold-1600
PYTHONPATH=. .venv/bin/python docs/study/crossfit-steps/compare_readers.py runs/crossfit-4fold \
  runs/crossfit-4fold-1600 > docs/study/crossfit-steps/READERS.md
# the whole pipeline on the longer-trained readers (re-ranker and rule refitted on their spans), and its
# decision against the first run's, question by question with articles as the unit
for f in RESULTS.md crossfit.json crossfit.png; do cp runs/crossfit-4fold-1600/$f docs/study/crossfit-steps/$f; done
PYTHONPATH=. .venv/bin/python docs/study/crossfit-rule/compare.py runs/crossfit-4fold runs/crossfit-4fold-1600 \
  > docs/study/crossfit-steps/DECIDED.md
