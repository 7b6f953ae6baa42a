#!/usr/bin/env bash
# Continued pretraining across domains: a BERT pretrained on Gutenberg prose
# (examples/pretrain_local_files.sh) is adapted to WikiText. The held-out WikiText split is
# evaluated before and after with the same fixed masks, so the two figures compare.
#   bash examples/domain_adaptation.sh [path/to/pretrained] [more hydra overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:-outputs/gutenberg-bert-mini/final}
shift || true
WIKI=${DATA:-../shared/data/corpora}/wikitext-2/valid.txt
[ -f "$BASE/config.json" ] || bash examples/pretrain_local_files.sh
OUT=outputs/gutenberg-to-wikitext
echo "== before: $BASE on held-out WikiText"
.venv/bin/python -m mlmkit eval checkpoint="$BASE" data=files "data.train_files=[$WIKI]"
# model.init_from keeps the base model's tokenizer and vocabulary
.venv/bin/python train.py model.init_from="$BASE" data=files "data.train_files=[$WIKI]" \
  optim.lr=5e-4 optim.warmup_steps=50 train.max_steps=500 train.eval_every=100 \
  hydra.run.dir="$OUT" train.resume=auto "$@"
echo "== after: $OUT on held-out WikiText"
.venv/bin/python -m mlmkit eval checkpoint="$OUT" data=files "data.train_files=[$WIKI]"
