#!/usr/bin/env bash
# Masked-LM against replaced-token detection (ELECTRA) at equal wall-clock, judged downstream as
# the paper judges it: the same model pretrained twice for the same time on the same corpus (13
# Gutenberg books; WikiText-2 held out), objective=mlm and objective=rtd, then GLUE's local tasks
# (CoLA, SST-2, STS-B, RTE from ../shared/data/glue: a short fine-tuning of each, the mean of two
# seeds) and the probes (a linear probe on SST-2 at the end of pretraining, zero-shot STS-B) on
# both. Prints one table: each task, the average, the average per fine-tuning seed, the probes,
# and each run's pretraining seconds, tokens and steps. docs/electra.md has a measured table.
#   bash examples/electra_vs_mlm.sh [more hydra overrides for both pretrainings]
# SIDE_BY_SIDE=1 runs the two objectives at once, a process each (OMP_NUM_THREADS=1 gives each a
# core): on a machine others share, both then meet the same load, which sequential runs do not.
# Environment: TIME (pretraining wall-clock of each run, 4m), MODEL (bert-mini), SEED (the
# pretraining seed, 0), TASKS (cola,sst2,stsb,rte), SEEDS (the fine-tuning seeds, 0,1), SAMPLES
# (training examples per GLUE task, 2000), EPOCHS (2), LR (the fine-tuning rate, 2e-4), GLUE_ARGS
# (more settings of mlmkit glue), MLM_ARGS and RTD_ARGS (more settings of one pretraining only,
# e.g. RTD_ARGS=optim.lr=5e-4: each objective at its own rate), SIDE_BY_SIDE (0), OUT
# (outputs/electra-vs-mlm), DATA (the corpora folder), GLUE (the GLUE folder), PYTHON.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
DATA=${DATA:-$ROOT/../shared/data/corpora}
GLUE=${GLUE:-$ROOT/../shared/data/glue}
OUT=${OUT:-outputs/electra-vs-mlm}
TIME=${TIME:-4m}
MODEL=${MODEL:-bert-mini}
SEED=${SEED:-0}
SAMPLES=${SAMPLES:-2000}
EPOCHS=${EPOCHS:-2}
LR=${LR:-2e-4}
TASKS=${TASKS:-cola,sst2,stsb,rte}
SEEDS=${SEEDS:-0,1}
read -r -a GLUE_ARGS <<< "${GLUE_ARGS:-}"
read -r -a MLM_ARGS <<< "${MLM_ARGS:-}"
read -r -a RTD_ARGS <<< "${RTD_ARGS:-}"
mkdir -p "$OUT"

# Each objective with its own masking: MLM with mlmkit's default (40% chosen, 80-10-10), RTD
# with ELECTRA's (15% chosen, 85% [MASK], the rest kept: google-research/electra's
# pretrain_helpers.py). Everything else is the same command line.
declare -A MASKING=(
  [mlm]=""
  [rtd]="masking=bert masking.mask_replace_prob=0.85 masking.random_replace_prob=0.0"
)
run() {  # pretrain with one objective, then fine-tune and probe what it made
  local objective=$1
  shift
  # shellcheck disable=SC2086  # the masking settings are separate words
  "$PYTHON" -m mlmkit train \
    model="$MODEL" objective="$objective" ${MASKING[$objective]} \
    data=files "data.train_files=[$DATA/gutenberg/*.txt]" \
    "data.validation_files=[$DATA/wikitext-2/valid.txt]" data.max_seq_length=128 \
    train.max_time="$TIME" train.seed="$SEED" train.eval_every=0 train.save_every=0 \
    train.progress=false logger=none \
    probe.every=100000000 probe.task.data_dir="$GLUE/SST-2" probe.max_train_samples=4000 \
    hydra.run.dir="$OUT/$objective" "$@"
  "$PYTHON" -m mlmkit glue checkpoint="$OUT/$objective" data_dir="$GLUE" \
    "tasks=[$TASKS]" protocol=modern "lrs=[$LR]" "seeds=[$SEEDS]" epochs="$EPOCHS" \
    max_train_samples="$SAMPLES" max_seq_length=64 hydra.run.dir="$OUT/$objective-glue" \
    "${GLUE_ARGS[@]}"
  "$PYTHON" -m mlmkit eval-sts checkpoint="$OUT/$objective" data_dir="$GLUE/STS-B" \
    output="$OUT/$objective-sts.json"
}
if [ "${SIDE_BY_SIDE:-0}" = 1 ]; then
  run mlm "$@" "${MLM_ARGS[@]}" > "$OUT/mlm.log" 2>&1 &
  mlm=$!
  run rtd "$@" "${RTD_ARGS[@]}" > "$OUT/rtd.log" 2>&1 &
  rtd=$!
  wait "$mlm" || { tail -20 "$OUT/mlm.log"; exit 1; }
  wait "$rtd" || { tail -20 "$OUT/rtd.log"; exit 1; }
else
  run mlm "$@" "${MLM_ARGS[@]}"
  run rtd "$@" "${RTD_ARGS[@]}"
fi

"$PYTHON" - "$OUT" "$TASKS" <<'EOF'
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
columns = {"cola": "CoLA", "sst2": "SST-2", "stsb": "STS-B", "rte": "RTE"}
tasks = [t for t in columns if t in sys.argv[2].split(",")]


def events(run, kind):
    lines = (out / run / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


rows, spreads = {}, {}
for run in ("mlm", "rtd"):
    glue = json.loads((out / f"{run}-glue" / "results.json").read_text())
    by_seed = {}
    for name in tasks:
        for r in glue["tasks"][name]["runs"]:
            by_seed.setdefault(r["seed"], {})[name] = 100 * r["score"]
    per_seed = {s: statistics.mean(v.values()) for s, v in by_seed.items()}
    # each task's mean over the fine-tuning seeds
    scores = {n: statistics.mean(v[n] for v in by_seed.values()) for n in tasks}
    train = events(run, "train")[-1]
    probe = events(run, "probe")[-1]["probe_accuracy"]
    sts = json.loads((out / f"{run}-sts.json").read_text())
    rows[run] = {
        **scores,
        "average": statistics.mean(scores.values()),
        "seeds": per_seed,
        "probe": 100 * probe,
        "sts": 100 * sts["spearman"],
        "seconds": train["elapsed_s"],
        "tokens": train["tokens_seen"],
        "steps": train["step"],
    }
header = ["objective", *[columns[t] for t in tasks], "GLUE avg", "avg per fine-tuning seed",
          "SST-2 probe", "STS-B zero-shot", "pretraining s", "tokens", "steps"]
print("| " + " | ".join(header) + " |")
print("|" + " --- |" * len(header))
for run, r in rows.items():
    seeds = ", ".join(f"{v:.1f}" for _, v in sorted(r["seeds"].items()))
    cells = [run, *[f"{r[t]:.1f}" for t in tasks], f"{r['average']:.1f}", seeds,
             f"{r['probe']:.1f}", f"{r['sts']:.1f}", f"{r['seconds']:.0f}", f"{r['tokens']:,}",
             str(r["steps"])]
    print("| " + " | ".join(cells) + " |")
difference = rows["rtd"]["average"] - rows["mlm"]["average"]
spread = max(max(r["seeds"].values()) - min(r["seeds"].values()) for r in rows.values())
print(f"\nRTD - MLM, GLUE average: {difference:+.1f} points; the fine-tuning seeds alone move "
      f"one model's average by up to {spread:.1f} points.")
EOF
