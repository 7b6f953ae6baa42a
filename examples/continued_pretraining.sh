#!/usr/bin/env bash
# Continue pretraining an existing BERT (any Hugging Face BertForMaskedLM dir, e.g. the
# final/ of an mlmkit run) on a new domain. The model keeps its own tokenizer and vocab.
#   bash examples/continued_pretraining.sh path/to/bert-dir [more hydra overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
INIT=${1:?usage: continued_pretraining.sh path/to/bert-dir [overrides]}
shift
DATA=${DATA:-../shared/data/corpora}
.venv/bin/python train.py \
  model.init_from="$INIT" \
  data=files \
  "data.train_files=[$DATA/wikitext-2/valid.txt]" \
  optim.lr=2e-4 optim.warmup_steps=50 train.max_steps=500 train.eval_every=100 \
  hydra.run.dir=outputs/continued-$(basename "$INIT") \
  "$@"
