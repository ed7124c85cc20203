#!/usr/bin/env bash
# Misbehaviour monitors and the expert fallback for one calibrated run:
# fitting laps on tracks 1010-1020, nominal laps on 42 and 1000-1009 (clean), the same tracks under
# the random colour preset and under twelve corruptions (background texture, camera roll, lens dirt
# at severities 3-5; fog, Gaussian noise and JPEG at 5); `nsacdrive monitor` on them; then the same
# 154 episodes again with the density monitor handing over to the privileged expert for 0.1 s after
# the last alarm.
#
#   bash bench/monitor_fallback.sh RUN NAME      # evaluations in runs/ev/NAME-*, the monitor in runs/mon/NAME
#
# The run needs `nsacdrive calibrate` first (its density, over tokens or --density-source
# tokens+conv). Every step resumes; about 6 min per run on 2 cores for the quality NSAC. Then:
#   python -m bench.monitor_summary LABEL=runs/mon/NAME-s0,runs/mon/NAME-s1,...
#   python -m bench.fallback_summary s0=runs/ev/N-corrupt,runs/ev/N-random,runs/ev/N-nominal:runs/ev/N-fb-corrupt,runs/ev/N-fb-random,runs/ev/N-fb-nominal ...
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: bash bench/monitor_fallback.sh RUN NAME" >&2; exit 2; }
RUN=$1
NAME=$2
N=.venv/bin/nsacdrive
CORRUPTIONS=background-texture-3,background-texture-4,background-texture-5,camera-tilt-3,camera-tilt-4,camera-tilt-5,lens-dirt-3,lens-dirt-4,lens-dirt-5,fog-5,gaussian-noise-5,jpeg-5
TRACKS=42,1000-1009
$N eval "$RUN" --seeds 1010-1020 --out "runs/ev/$NAME-fit" --resume --workers 2
$N eval "$RUN" --seeds $TRACKS --out "runs/ev/$NAME-nominal" --resume --workers 2
$N eval "$RUN" --seeds $TRACKS --colour-preset random --out "runs/ev/$NAME-random" --resume --workers 2
$N eval "$RUN" --seeds $TRACKS --corruption $CORRUPTIONS --out "runs/ev/$NAME-corrupt" --resume --workers 2
$N monitor "runs/ev/$NAME-corrupt" "runs/ev/$NAME-random" "runs/ev/$NAME-nominal" --fit "runs/ev/$NAME-fit" --threshold window-rate \
  --out "runs/mon/$NAME"
FALLBACK=(--monitor "runs/mon/$NAME" --monitor-score density --fallback expert --fallback-seconds 0.1 --resume --workers 2)
$N eval "$RUN" --seeds $TRACKS "${FALLBACK[@]}" --out "runs/ev/$NAME-fb-nominal"
$N eval "$RUN" --seeds $TRACKS --colour-preset random "${FALLBACK[@]}" --out "runs/ev/$NAME-fb-random"
$N eval "$RUN" --seeds $TRACKS --corruption $CORRUPTIONS "${FALLBACK[@]}" --out "runs/ev/$NAME-fb-corrupt"
