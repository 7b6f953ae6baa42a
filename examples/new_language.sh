#!/usr/bin/env bash
# An encoder for a new language: Hindi, from Premchand's novel Sevasadan in ../shared/data.
# 1. a WordPiece tokenizer trained on the novel (its defaults keep the vowel signs and viramas
#    of Devanagari; it prints the [UNK] share of the text it held out), 2. bert-mini pretrained
#    with it, scored on held-out passages of the novel against the most-frequent-token
#    baseline, 3. fill-mask on a sentence.
#   bash examples/new_language.sh [more hydra overrides for the training]
# Environment: DATA (the corpora folder, ../shared/data/corpora beside the checkout), RUN_DIR
# (outputs/hindi-bert-mini), VOCAB (16000), PYTHON (default: the checkout's .venv, else python3).
# For another language, point data.train_files at its text. Settings a non-Latin script needs:
# none beyond the defaults (tokenizer.strip_accents stays false, and is refused where marks are
# letters); for a script written without spaces (Thai, Lao, Khmer, Japanese) add
# tokenizer.algorithm=unigram, as WordPiece makes every word of over 100 characters one [UNK].
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
TEXT=${DATA:-$ROOT/../shared/data/corpora}/hindi/sevasadan.txt
OUT=${RUN_DIR:-outputs/hindi-bert-mini}
# the tokenizer once (mlmkit tokenizer never overwrites one; a run again continues with it)
[ -f "$OUT-tokenizer/tokenizer.json" ] || "$PYTHON" -m mlmkit tokenizer data=files "data.train_files=[$TEXT]" \
  tokenizer.vocab_size="${VOCAB:-16000}" out="$OUT-tokenizer"
"$PYTHON" -m mlmkit train model=bert-mini data=files "data.train_files=[$TEXT]" \
  tokenizer.name_or_path="$OUT-tokenizer" data.max_seq_length=128 \
  train.max_steps=1000 train.eval_every=250 hydra.run.dir="$OUT" train.resume=auto "$@"
"$PYTHON" -m mlmkit fill-mask "$OUT/final" "उसने अपने [MASK] से कहा कि वह कल आएगा ।"
