#!/usr/bin/env bash
# A learning-rate sweep with Hydra's multirun, then one table of the runs' final figures
# and one plot of their curves (<sweep dir>/curves.png).
#   bash examples/sweep_lr.sh [more hydra overrides]
# Environment: SWEEP_DIR (multirun/lr-sweep-<date>-<time>), PYTHON (default: the checkout's
# .venv, else python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
SWEEP=${SWEEP_DIR:-multirun/lr-sweep-$(date +%Y%m%d-%H%M%S)}
"$PYTHON" -m mlmkit train -m optim.lr=1e-3,3e-3,1e-2 train.max_steps=1000 train.eval_every=250 \
  hydra.sweep.dir="$SWEEP" "$@"
"$PYTHON" -m mlmkit sweep "$SWEEP"
"$PYTHON" -m mlmkit plot "$SWEEP"/*/ --out "$SWEEP/curves.png"  # the run dirs, not multirun.yaml
