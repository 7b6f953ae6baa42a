#!/usr/bin/env bash
# From raw text to a sentence embedder, scored on held-out retrieval and STS: bert-tiny
# pretrained (MLM) on news text (AG News's texts, labels dropped), then mlmkit embed with pairs
# (STS-B train pairs scored >= 4) and without (unsupervised SimCSE on the same news text), each
# model scored by mlmkit eval-sts (STS-B dev) and mlmkit eval-retrieval (a BEIR-format set built
# from STS-B dev: the second sentence of each pair scored >= 4 is the one relevant document of
# the first, among all other dev sentences), as is a random init of the same model; without
# pairs, neighbouring sentences of one news item as pairs are tried too. Ends with
# the table of docs/embeddings.md. With HINDI_RUN (a run of examples/new_language.sh) the stage
# without pairs also runs on its Hindi novel, scored on passages of the novel it held out.
#   bash examples/embedder.sh [more hydra overrides for the pretraining]
# Environment: DATA (../shared/data beside the checkout), WORK (outputs/embedder), PYTHON
# (default: the checkout's .venv, else python3), MODEL (bert-tiny), PRETRAIN_STEPS (600),
# PAIR_STEPS (150), TEXT_STEPS (400), BATCH (64), LR (5e-4), EMBED_ARGS (more settings for every
# mlmkit embed), HINDI_RUN (unset: no Hindi part), HINDI_STEPS (200).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
DATA=${DATA:-$ROOT/../shared/data}
WORK=${WORK:-outputs/embedder}
read -r -a EXTRA <<< "${EMBED_ARGS:-}"
STAGE=(batch_size="${BATCH:-64}" lr="${LR:-5e-4}" logger=none resume=auto "${EXTRA[@]}")
mkdir -p "$WORK/scores"

# 1. held-out data and training pairs from STS-B; the raw corpus: AG News's texts, one a line
"$PYTHON" -m mlmkit.embed.sets stsb "$DATA/glue/STS-B" "$WORK/stsb"
cut -f1 "$DATA/agnews/dev.tsv" "$DATA/agnews/test.tsv" > "$WORK/news.txt"
NEWS=(data=files "data.train_files=[$WORK/news.txt]" data.txt_sample_by=line)

# 2. MLM pretraining (kept when done: delete $WORK/mlm to train again)
start=$SECONDS
if [ ! -f "$WORK/mlm/final/config.json" ]; then
  "$PYTHON" -m mlmkit train model="${MODEL:-bert-tiny}" "${NEWS[@]}" train.max_steps="${PRETRAIN_STEPS:-600}" \
    train.eval_every=0 train.save_every=0 logger=none hydra.run.dir="$WORK/mlm" "$@"
fi
echo $((SECONDS - start)) > "$WORK/scores/mlm.seconds"

# 3. each model scored on the held-out sets: STS-B dev, the retrieval set
score() {  # score <name> <checkpoint> [settings]
  local name=$1 model=$2
  shift 2
  "$PYTHON" -m mlmkit eval-sts checkpoint="$model" data_dir="$DATA/glue/STS-B" \
    output="$WORK/scores/$name.sts.json" "$@"
  "$PYTHON" -m mlmkit eval-retrieval checkpoint="$model" data_dir="$WORK/stsb/retrieval" \
    output="$WORK/scores/$name.retrieval.json" "$@"
}
# embed <name> <seconds file> [settings]: mlmkit embed into $WORK/<name>, its wall time kept
embed() {
  local name=$1
  shift
  start=$SECONDS
  "$PYTHON" -m mlmkit embed checkpoint="$WORK/mlm" hydra.run.dir="$WORK/$name" "${STAGE[@]}" "$@"
  echo $((SECONDS - start)) > "$WORK/scores/$name.seconds"
}
score random "$WORK/mlm" init=random
echo 0 > "$WORK/scores/random.seconds"
score mlm "$WORK/mlm"

# 4. the stage with pairs: STS-B train pairs (those sharing a text with STS-B dev left out)
embed pairs "pairs.files=[$WORK/stsb/train-pairs.jsonl]" max_steps="${PAIR_STEPS:-150}" \
  sts_dir="$DATA/glue/STS-B" retrieval_dir="$WORK/stsb/retrieval"
score pairs "$WORK/pairs"

# 5. the stage without pairs, on the pretraining text alone: unsupervised SimCSE (each sentence
#    its own positive, dropout the noise), then neighbouring sentences of one news item as pairs
for objective in simcse same_document; do
  embed $objective objective=$objective "${NEWS[@]}" max_steps="${TEXT_STEPS:-400}" \
    sts_dir="$DATA/glue/STS-B" retrieval_dir="$WORK/stsb/retrieval"
  score $objective "$WORK/$objective"
done

# 6. Hindi (optional): the stage without pairs on the novel the run was pretrained on
HINDI_ROWS=""
if [ -n "${HINDI_RUN:-}" ]; then
  NOVEL="$DATA/corpora/hindi/sevasadan.txt"
  "$PYTHON" -m mlmkit.embed.sets documents "$WORK/hindi-retrieval" "$NOVEL"
  for objective in simcse same_document; do
    start=$SECONDS
    "$PYTHON" -m mlmkit embed checkpoint="$HINDI_RUN" objective=$objective data=files \
      "data.train_files=[$NOVEL]" max_steps="${HINDI_STEPS:-200}" hydra.run.dir="$WORK/hindi-$objective" \
      retrieval_dir="$WORK/hindi-retrieval" "${STAGE[@]}"
    echo $((SECONDS - start)) > "$WORK/scores/hindi-$objective.seconds"
  done
  HINDI_ROWS="hindi-simcse hindi-same_document"
fi

# 7. the table
"$PYTHON" - "$WORK" $HINDI_ROWS <<'EOF'
import json, sys
from pathlib import Path

work = Path(sys.argv[1])
scores = work / "scores"
names = {"random": "random init", "mlm": "MLM pretraining only", "pairs": "MLM + embed, pairs",
         "simcse": "MLM + embed, no pairs: SimCSE",
         "same_document": "MLM + embed, no pairs: same-document pairs"}
print("\n| model | STS-B dev Spearman | nDCG@10 | recall@100 | MRR@10 | training wall time (s) |")
print("| --- | --- | --- | --- | --- | --- |")
for key, name in names.items():
    sts = json.loads((scores / f"{key}.sts.json").read_text())
    ret = json.loads((scores / f"{key}.retrieval.json").read_text())
    seconds = (scores / f"{key}.seconds").read_text().strip()
    print(f"| {name} | {sts['spearman']:.4f} | {ret['ndcg@10']:.4f} | {ret['recall@100']:.4f} "
          f"| {ret['mrr@10']:.4f} | {seconds} |")
for key in sys.argv[2:]:  # the Hindi stage: its own before and after on the novel's passages
    result = json.loads((work / key / "results.json").read_text())
    before, after = result["before"], result["after"]
    seconds = (scores / f"{key}.seconds").read_text().strip()
    print(f"| Hindi, {result['objective']}: before -> after | - | {before['retrieval_ndcg@10']:.4f} -> "
          f"{after['retrieval_ndcg@10']:.4f} | {before['retrieval_recall@100']:.4f} -> "
          f"{after['retrieval_recall@100']:.4f} | {before['retrieval_mrr@10']:.4f} -> "
          f"{after['retrieval_mrr@10']:.4f} | {seconds} |")
EOF
