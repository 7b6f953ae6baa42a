#!/usr/bin/env bash
# Continue pretraining an existing BERT (any Hugging Face BertForMaskedLM dir, e.g. the
# final/ of an mlmkit run) on a new domain. The model keeps its own tokenizer and vocab, and
# the learning rate, warmup and masking come from mlmkit's continued-pretraining recipe
# (logged at the start) unless given here.
#   bash examples/continued_pretraining.sh path/to/bert-dir [more hydra overrides]
# Environment: DATA (the corpora folder, ../shared/data/corpora beside the checkout), RUN_DIR
# (outputs/continued-<dir name>), PYTHON (default: the checkout's .venv, else python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
INIT=${1:?usage: continued_pretraining.sh path/to/bert-dir [overrides]}
shift
DATA=${DATA:-$ROOT/../shared/data/corpora}
"$PYTHON" -m mlmkit train \
  model.init_from="$INIT" \
  data=files \
  "data.train_files=[$DATA/wikitext-2/valid.txt]" \
  train.max_steps=500 train.eval_every=100 \
  hydra.run.dir="${RUN_DIR:-outputs/continued-$(basename "$INIT")}" \
  "$@"
