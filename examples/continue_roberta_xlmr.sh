#!/usr/bin/env bash
# Continued pretraining of released encoders of two families, measured before and after: a small
# RoBERTa (RoBERTa's released byte-level BPE tokenizer, 50,265 tokens) and a small XLM-RoBERTa
# (XLM-R's released SentencePiece, 250,002 tokens: a narrow model) from ../shared/data/tokenizers,
# each laid out as a released model folder from a seeded random init (examples/released_model.py;
# no released weights are here), then:
#   1. "released": pretrained on general text for GENERAL_TIME (RoBERTa: the 13 Gutenberg books;
#      XLM-R: a mix, three English novels and Kabir's Hindi couplets), so that "before" is a
#      model that knows something;
#   2. continued with `mlmkit train model.init_from=<that model>` on a domain for TIME (RoBERTa:
#      WikiText-2; XLM-R: Premchand's Hindi novel Sevasadan), the last tenth of the domain's
#      lines held out;
#   3. both models scored by `mlmkit eval` on the held-out domain text (the same blocks, the same
#      fixed masks) and fine-tuned (RoBERTa: part-of-speech tags, UD English-EWT's UPOS, word
#      accuracy on a fifth of its sentences held out, the task that separates brief pretraining
#      from none in examples/token_tasks.sh; XLM-R: Hindi word order, a sentence of the held-out
#      text as written or with two neighbouring words swapped, accuracy on a fifth of those
#      sentences).
# Prints one Markdown table: family, held-out masked-LM loss and the downstream accuracy, before
# and after. A step whose output exists is kept (delete its folder to redo it). With real
# released weights (roberta-base, xlm-roberta-base), RELEASED_DIR=<folder> holding them as
# <folder>/roberta and <folder>/xlm-roberta replaces step 0's random layouts, and GENERAL_TIME=0
# skips step 1: "before" is then the released model itself.
#   bash examples/continue_roberta_xlmr.sh [more hydra overrides for every mlmkit train]
# Environment: GENERAL_TIME (5m; 0: none), TIME (the continued pretraining, 3m), FAMILIES ("roberta
# xlm-roberta"), SAMPLES (fine-tuning examples, 2000), EPOCHS (5), LR (the fine-tuning rate,
# 5e-4), FT_ARGS (more settings of every mlmkit finetune), EVAL_ARGS (more settings of every
# mlmkit eval), OUT (outputs/continue-roberta-xlmr), DATA (the corpora folder), TOKENS (the tagging
# folder), TOKENIZERS (the released tokenizers), RELEASED_DIR (unset), PYTHON (the checkout's .venv, else python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
DATA=${DATA:-$ROOT/../shared/data/corpora}
TOKENS=${TOKENS:-$ROOT/../shared/data/tokens}
TOKENIZERS=${TOKENIZERS:-$ROOT/../shared/data/tokenizers}
OUT=${OUT:-outputs/continue-roberta-xlmr}
GENERAL_TIME=${GENERAL_TIME:-5m}
TIME=${TIME:-3m}
read -r -a FAMILY_LIST <<< "${FAMILIES:-roberta xlm-roberta}"
read -r -a FT_EXTRA <<< "${FT_ARGS:-}"
read -r -a EVAL_EXTRA <<< "${EVAL_ARGS:-}"

# each family: its released tokenizer, its size (XLM-R narrow: 250,002 x 64 embeddings are
# already 16 M parameters), its general text and its domain
declare -A TOKENIZER=([roberta]=roberta-base [xlm-roberta]=xlm-roberta)
declare -A SIZE=(
  [roberta]="--hidden 128 --layers 4 --heads 4 --ffn 512"
  [xlm-roberta]="--hidden 64 --layers 4 --heads 2 --ffn 256"
)
declare -A GENERAL=(
  [roberta]="$DATA/gutenberg/*.txt"
  [xlm-roberta]="$DATA/gutenberg/austen-*.txt,$DATA/hindi/kabir.txt"
)
declare -A DOMAIN=([roberta]="$DATA/wikitext-2/valid.txt" [xlm-roberta]="$DATA/hindi/sevasadan.txt")

split_domain() {  # split_domain <text> <folder>: its first 90% of lines to train on, the rest held out
  local lines keep
  lines=$(wc -l < "$1")
  keep=$((lines * 9 / 10))
  mkdir -p "$2"
  head -n "$keep" "$1" > "$2/train.txt"
  tail -n "+$((keep + 1))" "$1" > "$2/held-out.txt"
}

train() {  # train <run dir> <init_from> <files> <budget> [settings]: kept when its final/ exists
  local run=$1 init=$2 files=$3 budget=$4
  shift 4
  [ -f "$run/final/config.json" ] && return
  "$PYTHON" -m mlmkit train model.init_from="$init" data=files "data.train_files=[$files]" \
    train.max_time="$budget" train.eval_every=0 train.save_every=0 train.progress=false \
    logger=none hydra.run.dir="$run" "$@" "${OVERRIDES[@]}"
}

score() {  # score <model> <held-out text> <json>: held-out masked-LM loss, fixed masks
  [ -f "$3" ] && return
  "$PYTHON" -m mlmkit eval checkpoint="$1" "files=[$2]" output="$3" "${EVAL_EXTRA[@]}"
}

finetune() {  # finetune <model> <run dir> [settings]: kept when its results.json exists
  local model=$1 run=$2
  shift 2
  [ -f "$run/results.json" ] && return
  rm -rf "$run"
  "$PYTHON" -m mlmkit finetune checkpoint="$model" lr="${LR:-5e-4}" epochs="${EPOCHS:-5}" \
    max_train_samples="${SAMPLES:-2000}" max_seq_length=64 save_model=false \
    hydra.run.dir="$run" "$@" "${FT_EXTRA[@]}"
}

hindi_word_order() {  # hindi_word_order <held-out text> <folder>: train.tsv and dev.tsv
  [ -f "$2/dev.tsv" ] && return
  "$PYTHON" - "$1" "$2" <<'EOF'
import random
import re
import sys
from pathlib import Path

# Sentences of the held-out text (its sentence marks, and the stray symbols that stand for
# punctuation in this conversion), each kept as written (1) or with one pair of neighbouring,
# different words swapped (0), never both: the words alone cannot tell the classes apart.
text = " ".join(Path(sys.argv[1]).read_text(encoding="utf-8").split())
sentences = [s.split() for s in re.split(r"[।॥.?!ॐऽ]", text)]
sentences = [s for s in sentences if 5 <= len(s) <= 30]
rng, rows = random.Random(0), []
for words in sentences:
    swappable = [i for i in range(len(words) - 1) if words[i] != words[i + 1]]
    if rng.random() < 0.5 and swappable:
        i = rng.choice(swappable)
        words = words[:i] + [words[i + 1], words[i]] + words[i + 2 :]
        rows.append((" ".join(words), 0))
    else:
        rows.append((" ".join(words), 1))
rng.shuffle(rows)
out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
cut = len(rows) * 4 // 5
for name, part in (("train.tsv", rows[:cut]), ("dev.tsv", rows[cut:])):
    lines = ["sentence\tlabel"] + [f"{s}\t{label}" for s, label in part]
    (out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
print(f"Hindi word order: {cut} training and {len(rows) - cut} evaluation sentences in {out}")
EOF
}

OVERRIDES=("$@")
for family in "${FAMILY_LIST[@]}"; do
  if [ -z "${TOKENIZER[$family]:-}" ]; then
    echo "Error: FAMILIES names $family; this example runs roberta and xlm-roberta." >&2
    exit 2
  fi
  work=$OUT/$family
  echo "== $family: a released model folder, general pretraining, continued pretraining"
  released=${RELEASED_DIR:+$RELEASED_DIR/$family}
  if [ -z "$released" ]; then  # 0. the family's layout, a seeded random init
    released=$work/released-random
    if [ ! -f "$released/config.json" ]; then
      # shellcheck disable=SC2086  # the sizes are separate words
      "$PYTHON" "$ROOT/examples/released_model.py" "$family" "$TOKENIZERS/${TOKENIZER[$family]}" \
        "$released" ${SIZE[$family]}
    fi
  fi
  split_domain "${DOMAIN[$family]}" "$work/domain"
  # 1. "released": a model that knows general text (a from-scratch rate, not the
  # continued-pretraining recipe's)
  before=$released
  if [ "$GENERAL_TIME" != 0 ]; then
    train "$work/general" "$released" "${GENERAL[$family]}" "$GENERAL_TIME" optim.lr=2e-3 \
      optim.warmup_fraction=0.06 "data.validation_files=[$work/domain/held-out.txt]"
    before=$work/general/final
  fi
  # 2. continued on the domain: the continued-pretraining recipe (rate, warmup, 15% masking)
  train "$work/continued" "$before" "$work/domain/train.txt" "$TIME" \
    "data.validation_files=[$work/domain/held-out.txt]"
  # 3. before and after: held-out loss, and downstream
  for when in before after; do
    model=$before
    [ "$when" = after ] && model=$work/continued/final
    score "$model" "$work/domain/held-out.txt" "$work/eval-$when.json"
    if [ "$family" = roberta ]; then
      finetune "$model" "$work/finetune-$when" task=pos task.data_dir="$TOKENS/ud-ewt" \
        task.train_file=en_ewt-ud-dev.conllu task.eval_file=null task.eval_share=0.2
    else
      hindi_word_order "$work/domain/held-out.txt" "$work/hindi-word-order"
      finetune "$model" "$work/finetune-$when" task=files task.data_dir="$work/hindi-word-order" \
        task.train_file=train.tsv task.eval_file=dev.tsv "task.text_columns=[sentence]"
    fi
  done
done

"$PYTHON" - "$OUT" "${FAMILY_LIST[@]}" <<'EOF'
import json
import sys
from pathlib import Path

out, families = Path(sys.argv[1]), sys.argv[2:]
titles = {"roberta": "RoBERTa", "xlm-roberta": "XLM-RoBERTa"}
domains = {
    "roberta": ("WikiText-2", "UPOS accuracy, UD EWT"),
    "xlm-roberta": ("Sevasadan (Hindi)", "Hindi word order accuracy"),
}


def read(path):
    return json.loads(Path(path).read_text())


def train_seconds(run):
    if not (run / "metrics.jsonl").is_file():
        return "none"
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [e for e in events if e["event"] == "train"][-1]
    return f"{last['elapsed_s']:.0f} s, {last['step']:,} steps"


print(
    "| family | domain | held-out MLM loss, before | after | downstream (its baseline) | "
    "before | after | pretraining: general / continued |"
)
print("| --- | --- | ---: | ---: | --- | ---: | ---: | --- |")
notes = []
for family in families:
    work = out / family
    loss = [read(work / f"eval-{w}.json")["loss"] for w in ("before", "after")]
    results = [read(work / f"finetune-{w}" / "results.json") for w in ("before", "after")]
    acc = [100 * r["eval_" + r["headline"]] for r in results]
    baseline = 100 * results[0]["baseline"]["accuracy"]
    notes.append(f"{titles[family]}'s baseline: {results[0]['baseline']['baseline']}")
    domain, figure = domains[family]
    seconds = f"{train_seconds(work / 'general')} / {train_seconds(work / 'continued')}"
    print(
        f"| {titles[family]} | {domain} | {loss[0]:.3f} | {loss[1]:.3f} | {figure} "
        f"({baseline:.1f}) | {acc[0]:.1f} | {acc[1]:.1f} | {seconds} |"
    )
print("\n" + "; ".join(notes) + ".")
EOF
