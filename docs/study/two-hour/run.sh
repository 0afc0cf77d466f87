#!/bin/bash
set -u
cd "$(git rev-parse --show-toplevel)"
PY=.venv/bin/python
echo "start $(date -u +%T)"
/usr/bin/time -v $PY -m train.study --labelled ../shared/data/squad2/dev-v2.0.cs224n-13.json \
  --corpus ../shared/data/squad2/test-v2.0.cs224n.json \
  --eval-articles Huguenot,Steam_engine,European_Union_law,Immune_system \
  --calibration-articles Yuan_dynasty,Warsaw,French_and_Indian_War \
  --runs random+synth+match+plausible+hard --seeds 0 --synth-keep-out-of-window 0.2 \
  --synth-steps 3000 --synth-per-sentence 4 --finetune-steps 1000 --eval-every 1000 \
  --config small --threads 2 --resume --out runs/two-hour
echo "end rc=$? $(date -u +%T)"
