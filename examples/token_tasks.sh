#!/usr/bin/env bash
# What MLM pretraining is for, beyond sentence classification: bert-mini pretrained on the shared
# corpora (13 Gutenberg books and WikiText-2), then fine-tuned on named entities (WNUT-17: train,
# scored on dev), part-of-speech tags (UD English-EWT dev, UPOS: a fifth of its sentences held
# out) and extractive question answering (the SQuAD 2.0 subset: one of its five articles held
# out); each fine-tuning again from a random init of the same model. Ends with one table:
# pretrained against random init against the task's baseline, and the seconds each took
# (docs/benchmarks.md, "Token classification and question answering").
#   bash examples/token_tasks.sh [more hydra overrides for the pretraining]
# Environment: DATA (../shared/data beside the checkout), WORK (outputs/token_tasks), PYTHON
# (default: the checkout's .venv, else python3), MODEL (bert-mini), PRETRAIN_TIME (15m),
# EPOCHS (5), QA_EPOCHS (3), LR (5e-4), FT_ARGS (more settings for every mlmkit finetune).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
DATA=${DATA:-$ROOT/../shared/data}
WORK=${WORK:-outputs/token_tasks}
read -r -a EXTRA <<< "${FT_ARGS:-}"
mkdir -p "$WORK/seconds"

# 1. MLM pretraining (kept when done: delete $WORK/mlm to train again)
start=$SECONDS
if [ ! -f "$WORK/mlm/final/config.json" ]; then
  "$PYTHON" -m mlmkit train model="${MODEL:-bert-mini}" data=files \
    "data.train_files=[$DATA/corpora/gutenberg/*.txt,$DATA/corpora/wikitext-2/valid.txt]" \
    data.max_seq_length=128 tokenizer.vocab_size=16384 optim.lr=2e-3 \
    train.max_time="${PRETRAIN_TIME:-15m}" train.eval_every=0 train.save_every=0 logger=none \
    hydra.run.dir="$WORK/mlm" "$@"
  echo $((SECONDS - start)) > "$WORK/seconds/mlm"
fi

# 2. each task from the pretrained encoder and from a random init (a run dir kept is not redone)
finetune() {  # finetune <name> <init> [settings]
  local name=$1 init=$2
  shift 2
  [ -f "$WORK/$name-$init/results.json" ] && return
  rm -rf "$WORK/$name-$init"
  start=$SECONDS
  "$PYTHON" -m mlmkit finetune checkpoint="$WORK/mlm" init="$init" lr="${LR:-5e-4}" \
    hydra.run.dir="$WORK/$name-$init" "$@" "${EXTRA[@]}"
  echo $((SECONDS - start)) > "$WORK/seconds/$name-$init"
}
for init in pretrained random; do
  finetune ner $init task=ner task.data_dir="$DATA/tokens/wnut17" epochs="${EPOCHS:-5}"
  finetune pos $init task=pos task.data_dir="$DATA/tokens/ud-ewt" \
    task.train_file=en_ewt-ud-dev.conllu task.eval_file=null task.eval_share=0.2 \
    epochs="${EPOCHS:-5}"
  finetune qa $init task=qa task.data_dir="$DATA/qa" task.train_file=squad2-dev-subset.json \
    task.eval_file=null task.eval_share=0.2 max_seq_length=256 task.doc_stride=64 \
    epochs="${QA_EPOCHS:-3}"
done

# 3. the table
"$PYTHON" - "$WORK" <<'EOF'
import json, sys
from pathlib import Path

work = Path(sys.argv[1])
rows = [  # (task, figure, results.json key, scale)
    ("NER, WNUT-17 dev", "entity F1", "f1", 100),
    ("POS, UD EWT (held-out fifth)", "UPOS accuracy", "accuracy", 100),
    ("QA, SQuAD 2.0 (held-out article)", "exact match", "exact", 1),
    ("", "F1", "f1", 1),
    ("", "F1, answerable", "HasAns_f1", 1),
    ("", "F1, unanswerable", "NoAns_f1", 1),
]
names = {"NER,": "ner", "POS,": "pos", "QA,": "qa"}
seconds = lambda run: (work / "seconds" / run).read_text().strip()
print(f"\n(pretraining: {seconds('mlm') if (work / 'seconds' / 'mlm').is_file() else '?'} s)")
print("| task | figure | pretrained | random init | baseline | seconds (pretrained / random) |")
print("| --- | --- | --- | --- | --- | --- |")
task = None
for label, figure, key, scale in rows:
    task = names[label.split()[0]] if label else task
    pre, rnd = (json.loads((work / f"{task}-{i}" / "results.json").read_text())
                for i in ("pretrained", "random"))
    base = pre["baseline"]
    what = f" ({base['baseline']})" if label else ""
    time = f"{seconds(task + '-pretrained')} / {seconds(task + '-random')}" if label else ""
    print(f"| {label} | {figure} | {scale * pre['eval_' + key]:.1f} | "
          f"{scale * rnd['eval_' + key]:.1f} | {scale * base[key]:.1f}{what} | {time} |")
EOF
