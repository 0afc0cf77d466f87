#!/bin/bash
# Issue 59: the fold readers as an ensemble. Each fold's two readers that never saw its articles, the
# 800-step run's (docs/study/crossfit-4fold/run.sh) and the 1,600-step run's (docs/study/crossfit-steps/
# run.sh), decode its questions with their logits averaged; the trees re-ranker and the rule are refitted
# on those spans, nested by fold; then the ensemble is compared with the 1,600-step reader alone (its
# trees refit, docs/study/crossfit-trees/run.sh), question by question with articles as the unit.
set -eu
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=.
out=runs/crossfit-ensemble/800+1600
.venv/bin/python docs/study/crossfit-ensemble/ensemble.py runs/crossfit-4fold runs/crossfit-4fold-1600 $out trees > /dev/null
for f in RESULTS.md crossfit.json crossfit.png; do cp $out/$f docs/study/crossfit-ensemble/$f; done
{
  echo "## The readers' own best span: the 1,600-step reader -> the ensemble"
  echo
  .venv/bin/python docs/study/crossfit-steps/compare_readers.py runs/crossfit-4fold-1600 $out
  echo
  echo "## The whole pipeline (trees re-ranker, nested rule): the 1,600-step reader -> the ensemble"
  echo
  .venv/bin/python docs/study/crossfit-ensemble/compare_reranked.py runs/crossfit-trees/crossfit-4fold-1600 $out | sed 's/^/- /'
  .venv/bin/python docs/study/crossfit-rule/compare.py runs/crossfit-trees/crossfit-4fold-1600 $out | sed 's/^/- /'
} > docs/study/crossfit-ensemble/COMPARISONS.md
