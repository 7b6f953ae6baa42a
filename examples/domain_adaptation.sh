#!/usr/bin/env bash
# Continued pretraining across domains: a BERT pretrained on Gutenberg prose
# (examples/pretrain_local_files.sh, run first when its output is missing) is adapted to
# WikiText. The held-out WikiText split is evaluated before and after with the same fixed
# masks, so the two figures compare.
#   bash examples/domain_adaptation.sh [path/to/pretrained] [more hydra overrides]
# Environment: DATA (the corpora folder, ../shared/data/corpora beside the checkout), RUN_DIR
# (outputs/gutenberg-to-wikitext), PYTHON (default: the checkout's .venv, else python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
DEFAULT_BASE=outputs/gutenberg-bert-mini/final
BASE=${1:-$DEFAULT_BASE}
shift || true
WIKI=${DATA:-$ROOT/../shared/data/corpora}/wikitext-2/valid.txt
OUT=${RUN_DIR:-outputs/gutenberg-to-wikitext}
if [ ! -f "$BASE/config.json" ]; then
  if [ "$BASE" != "$DEFAULT_BASE" ]; then
    echo "Error: $BASE holds no model (config.json); name a model dir such as a run's final/." >&2
    exit 2
  fi
  RUN_DIR=${BASE%/final} bash "$ROOT/examples/pretrain_local_files.sh"
fi
echo "== before: $BASE on held-out WikiText"
"$PYTHON" -m mlmkit eval checkpoint="$BASE" data=files "data.train_files=[$WIKI]"
# model.init_from keeps the base model's tokenizer and vocabulary and takes the
# continued-pretraining recipe (learning rate, warmup, masking) for what is not set here
"$PYTHON" -m mlmkit train model.init_from="$BASE" data=files "data.train_files=[$WIKI]" \
  train.max_steps=500 train.eval_every=100 hydra.run.dir="$OUT" train.resume=auto "$@"
echo "== after: $OUT on held-out WikiText"
"$PYTHON" -m mlmkit eval checkpoint="$OUT" data=files "data.train_files=[$WIKI]"
