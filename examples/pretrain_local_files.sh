#!/usr/bin/env bash
# Pretrain bert-mini on local text files: 13 Project Gutenberg books for training, WikiText-2
# (validation split) for evaluation, from ../shared/data beside the checkout.
#   bash examples/pretrain_local_files.sh [more hydra overrides]
# Environment: DATA (the corpora folder), RUN_DIR (outputs/gutenberg-bert-mini), PYTHON (the
# interpreter with mlmkit; default: the checkout's .venv, else python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
DATA=${DATA:-$ROOT/../shared/data/corpora}
"$PYTHON" -m mlmkit train \
  model=bert-mini \
  data=files \
  "data.train_files=[$DATA/gutenberg/*.txt]" \
  "data.validation_files=[$DATA/wikitext-2/valid.txt]" \
  data.max_seq_length=128 \
  tokenizer.vocab_size=16384 \
  optim.lr=2e-3 train.max_steps=2000 train.eval_every=500 \
  hydra.run.dir="${RUN_DIR:-outputs/gutenberg-bert-mini}" \
  "$@"
