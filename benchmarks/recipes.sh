#!/usr/bin/env bash
# The sweep behind the presets' defaults (docs/recipes.md): held-out loss of the built-in
# corpus's validation split after a fixed wall-clock budget, one Hydra multirun per stage.
#
#   bash benchmarks/recipes.sh PRESET STAGE [BUDGET] [more hydra overrides]
#
#   STAGE masking-batch: 15% vs 40% masking x batch 8 vs 32 (the preset's lr)
#   STAGE lr:            half and twice the preset's lr (LRS=a,b,... for other rates)
#   STAGE positions:     the position table's init, sinusoidal against normal
#   STAGE schedule:      warmup-stable-decay instead of linear decay
#   STAGE warmup:        50 and 200 warmup steps instead of 100
#   BUDGET: train.max_time of each run (default 120s). Each run ends with one evaluation
#   (15% BERT masking with fixed masks, whatever the training masking) and writes no
#   checkpoint. `mlmkit sweep <dir>` prints the table again.
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:?usage: recipes.sh PRESET STAGE [BUDGET] [overrides]}
STAGE=${2:?usage: recipes.sh PRESET STAGE [BUDGET] [overrides]}
BUDGET=${3:-120s}
shift $(( $# < 3 ? $# : 3 ))
PY=${PYTHON:-.venv/bin/python}
LR=$($PY - "$PRESET" <<'PYEOF'
import sys
from omegaconf import OmegaConf
print(OmegaConf.load(f"conf/model/{sys.argv[1]}.yaml").optim.lr)
PYEOF
)
case "$STAGE" in
  masking-batch) GRID=(masking.mlm_probability=0.15,0.4 train.batch_size=8,32) ;;
  lr) GRID=("optim.lr=${LRS:-$($PY -c "print($LR/2)"),$($PY -c "print($LR*2)")}") ;;
  positions) GRID=(model.position_init=sinusoidal,normal) ;;
  schedule) GRID=(optim.schedule=wsd) ;;
  warmup) GRID=(optim.warmup_steps=50,200) ;;
  *) echo "STAGE must be masking-batch, lr, positions, schedule or warmup" >&2; exit 2 ;;
esac
SWEEP=${SWEEP:-multirun/recipes/$PRESET-$STAGE-$(date +%Y%m%d-%H%M%S)}
$PY train.py -m model="$PRESET" "${GRID[@]}" train.max_time="$BUDGET" train.max_steps=100000000 \
  train.eval_every=100000000 train.save_every=0 train.export=false train.progress=false logger=none \
  hydra.sweep.dir="$SWEEP" "$@"
$PY -m mlmkit sweep "$SWEEP"
