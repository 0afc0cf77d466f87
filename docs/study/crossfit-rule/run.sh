#!/bin/bash
# Issue 59's answerability changes, measured on the first cross-fitted run's kept out-of-fold spans
# (docs/study/crossfit-4fold/run.sh makes runs/crossfit-4fold; nothing is retrained here, each refit is a
# minute): the features before and now x the rule fitted on every article or on those holding
# unanswerable questions too, then each pair compared question by question, articles as the unit.
set -eu
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=.
for features in before now; do
  for articles in all mixed; do
    .venv/bin/python docs/study/crossfit-rule/refit.py runs/crossfit-4fold $features $articles \
      runs/crossfit-rule/$features-$articles > /dev/null
  done
done
{
  for pair in "before-all before-mixed" "before-mixed now-mixed" "before-all now-all" "before-all now-mixed"; do
    set -- $pair
    echo "## $1 -> $2"
    echo
    .venv/bin/python docs/study/crossfit-rule/compare.py runs/crossfit-rule/$1 runs/crossfit-rule/$2 | sed 's/^/- /'
    echo
  done
} > docs/study/crossfit-rule/COMPARISONS.md
for v in before-all before-mixed now-all now-mixed; do
  cp runs/crossfit-rule/$v/RESULTS.md docs/study/crossfit-rule/RESULTS-$v.md
done
# the same features under a nonlinear model (boosted trees) against a logistic one: ROC AUC out of fold
.venv/bin/python docs/study/crossfit-rule/nonlinear.py runs/crossfit-4fold > docs/study/crossfit-rule/NONLINEAR.md
# boosted trees against the linear re-ranker, span F1 out of fold, on both runs' kept spans (800 and 1,600
# fine-tuning steps; docs/study/crossfit-steps/run.sh makes the second)
{
  .venv/bin/python docs/study/crossfit-rule/reranker_trees.py runs/crossfit-4fold
  echo
  .venv/bin/python docs/study/crossfit-rule/reranker_trees.py runs/crossfit-4fold-1600
} > docs/study/crossfit-rule/RERANKER-TREES.md
