#!/bin/bash
# New candidate features for the span re-ranker, nested by fold on the 1,600-step cross-fit's kept spans.
set -eu
cd "$(git rev-parse --show-toplevel)"
for cols in "" 0,1,2 3,4,5,6,7; do
  PYTHONPATH=. .venv/bin/python docs/study/crossfit-rerank-features/features.py runs/crossfit-4fold-1600 $cols
  echo
done
