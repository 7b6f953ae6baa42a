#!/usr/bin/env bash
# Fine-tune a pretrained checkpoint on SST-2, CoLA and RTE (GLUE TSV files in
# ../shared/data/glue) and print the dev-set figure of each task. Add init=random to see
# what the same fine-tuning reaches without pretraining.
#   bash examples/glue.sh outputs/<run> [more hydra overrides, e.g. epochs=5 lr=5e-5]
# Environment: GLUE (the folder of SST-2/, CoLA/ and RTE/), PYTHON (default: the checkout's
# .venv, else python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
CKPT=${1:?usage: glue.sh path/to/run-or-model [overrides]}
shift
GLUE=${GLUE:-$ROOT/../shared/data/glue}
for task in sst2:SST-2 cola:CoLA rte:RTE; do
  "$PYTHON" -m mlmkit finetune checkpoint="$CKPT" task="${task%%:*}" \
    task.data_dir="$GLUE/${task##*:}" "$@"
done
