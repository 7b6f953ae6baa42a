#!/usr/bin/env bash
# Fine-tune a pretrained checkpoint on SST-2, CoLA and RTE (GLUE TSV files in
# ../shared/data/glue) and print the dev-set figure of each task. Add init=random to see
# what the same fine-tuning reaches without pretraining.
#   bash examples/glue.sh outputs/<run> [more hydra overrides, e.g. epochs=5 lr=5e-5]
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${1:?usage: glue.sh path/to/run-or-model [overrides]}
shift
GLUE=${GLUE:-../shared/data/glue}
for task in sst2:SST-2 cola:CoLA rte:RTE; do
  name=${task%%:*}
  .venv/bin/python -m mlmkit finetune checkpoint="$CKPT" task="$name" \
    task.data_dir="$GLUE/${task##*:}" "$@"
done
