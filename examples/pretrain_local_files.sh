#!/usr/bin/env bash
# Pretrain bert-mini on local text files: 13 Project Gutenberg books for training,
# WikiText-2 (validation split) for evaluation. Reads ../shared/data beside the project.
#   bash examples/pretrain_local_files.sh [more hydra overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data/corpora}
.venv/bin/python train.py \
  model=bert-mini \
  data=files \
  "data.train_files=[$DATA/gutenberg/*.txt]" \
  "data.validation_files=[$DATA/wikitext-2/valid.txt]" \
  data.max_seq_length=128 \
  tokenizer.vocab_size=16384 \
  optim.lr=2e-3 train.max_steps=2000 train.eval_every=500 \
  hydra.run.dir=outputs/gutenberg-bert-mini \
  "$@"
