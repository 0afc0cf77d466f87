#!/bin/bash
# Issue 59: the span re-ranker as boosted trees in the whole nested pipeline, on both cross-fitted runs'
# kept out-of-fold spans (docs/study/crossfit-4fold/run.sh: 800 fine-tuning steps; docs/study/crossfit-steps/
# run.sh: 1,600), each against the same run with the linear re-ranker, question by question with articles
# as the unit. Nothing is retrained; each refit is a few minutes on 2 cores.
set -eu
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=.
for run in crossfit-4fold crossfit-4fold-1600; do
  .venv/bin/python docs/study/crossfit-trees/refit.py runs/$run runs/crossfit-trees/$run > /dev/null
  cp runs/crossfit-trees/$run/RESULTS.md docs/study/crossfit-trees/RESULTS-$run.md
  cp runs/crossfit-trees/$run/crossfit.json docs/study/crossfit-trees/crossfit-$run.json
done
{
  for run in crossfit-4fold crossfit-4fold-1600; do
    echo "## $run: linear re-ranker -> boosted trees"
    echo
    .venv/bin/python docs/study/crossfit-rule/compare.py runs/$run runs/crossfit-trees/$run | sed 's/^/- /'
    echo
  done
} > docs/study/crossfit-trees/COMPARISONS.md
# does the re-ranker's predicted F1 of its chosen span add to the rule's P(answerable)? (1,600-step run)
.venv/bin/python docs/study/crossfit-trees/reranker_feature.py runs/crossfit-4fold-1600 \
  runs/crossfit-trees/crossfit-4fold-1600/questions.json > docs/study/crossfit-trees/RERANKER-FEATURE.md
