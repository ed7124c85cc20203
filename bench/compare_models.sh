#!/usr/bin/env bash
# The eight models compared offline over three training seeds: clean test
# tracks and the held-out corruption suite (13 families at severities 1, 3, 5), raw and recalibrated.
# Data: expert laps on tracks 0-59, clean and with executed-action noise 0.2 (the quality data;
# split 48/6/6 tracks). Budget per run: configs/compare.json (the quality recipe's settings with
# the hinge and held-out proxies, 12 epochs x 100 batches x 32 sequences). Every step resumes.
# About 2 h on 2 cores: training ~50 min, calibration ~15 min, the suite table the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
NSAC=.venv/bin/nsacdrive
MODELS=nsac,nac,gmle,mcdropout,ensemble,evidential,sdenet,levy
SEEDS=${SEEDS:-0-2}
SAMPLES=${SAMPLES:-300}
$NSAC collect --agent expert --seeds 0-59 --out data/quality --workers 2 --resume
$NSAC collect --agent expert --seeds 0-59 --noise 0.2 --out data/quality --workers 2 --resume
$NSAC sweep --config configs/compare.json --data data/quality --seeds "$SEEDS" --models "$MODELS" --workers 2 --out runs/cmp
for run in runs/cmp/*-s*; do
  [ -f "$run/calibration.json" ] || $NSAC calibrate "$run" --data data/quality --isotonic
done
# two evaluations side by side, one per core (each pools its models' seeds)
evaluate() {
  local out=$1; shift
  OMP_NUM_THREADS=1 $NSAC evaluate-offline "$@" --data data/quality --corruptions all-1,all-3,all-5 --max-samples "$SAMPLES" --by-model --out "$out"
}
evaluate runs/cmp-offline-a runs/cmp/{nsac,nac,gmle,mcdropout}-s* > runs/cmp-offline-a.log &
first=$!
evaluate runs/cmp-offline-b runs/cmp/{ensemble,evidential,sdenet,levy}-s* > runs/cmp-offline-b.log
wait "$first"
.venv/bin/python -m bench.compare_summary runs/cmp-offline-{a,b}/offline.json | tee runs/cmp-summary.md
