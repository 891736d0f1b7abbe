#!/usr/bin/env bash
# One call on the lent GPU machine: runners of benchmarks/mnist_table.py side by side on the one GPU,
# merged into one state and table, packed into $OUT/mnist_table_call.tgz (a call returns at most 8 files).
#
#   source .gpu/env.sh && END_S=540 bash benchmarks/mnist_table_gpu.sh "gan_nonprivate gpate_noisefree" \
#       "gpate_paper_eps10_guarantee gpate_eps10_ladder_guarantee" "dpgan_eps10_guarantee dpgan_eps1_guarantee"
#
# Each argument is one runner's rows (in the table's order), optionally led by "xN", that runner's time
# scale (row budgets × N, e.g. "x3 gpate_eps10_ladder_guarantee"); the call ends by END_S seconds after it
# starts (rows that do not fit wait for the next call). Carry .gpu/whl, .gpu/env.sh, .gpu/data/mnist and
# a state to continue (RESUME, default .gpu/mnist_state: e.g. the real baseline and the feature classifier,
# computed on a CPU by `python benchmarks/mnist_table.py --time-budget 0 --state .gpu/mnist_state`).
# Other knobs: TIME_SCALE (row budgets), DEVICE, DATA_ROOT, PYTHON, EXTRA (more runner flags), NOTE, WORK.
# GS-WGAN's rows share one pretraining of their discriminators (GBs, never in the archive): make it first, alone
# (`python benchmarks/mnist_table.py --rows gswgan_eps10_paper --pretrain-only --pretrained-cache outputs/gswgan_pretrained ...`),
# then run the rows with EXTRA="--pretrained-cache outputs/gswgan_pretrained --max-carry-mb 100" and WORK=outputs/mnist_call.
# Unpack here with `tar xzf mnist_table_call.tgz`, then merge its state into the table:
#   python benchmarks/mnist_table.py --state <kept state> --merge-from <unpacked>/merged --results benchmarks/results
# A row split over calls (DP-GAN's) leaves its training checkpoint beside the archive, one file per row
# ($OUT/<row>.ckpt: a call returns files of at most 16 MiB): put them into <unpacked>/merged/ckpt/ and carry
# that folder as the next call's RESUME state, which continues those rows.
# Without arguments it runs issue 57's prepared call, benchmarks/device_call.txt (ROWS_FILE): one runner a line.
# DRY_RUN=1: the same call on this machine's CPU, every runner side by side for a few steps on a tiny MNIST (--smoke, no
# baseline), so that a device call cannot fail on an import, a path, a config key or a missing wheel (the suite runs it).
# It prints the plan first (mnist_table.py --plan: per row its time, its step cap and the steps it reaches).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
if [ $# -eq 0 ]; then
  mapfile -t runners < <(grep -v -E '^[[:space:]]*(#|$)' "${ROWS_FILE:-benchmarks/device_call.txt}")
  set -- "${runners[@]}"
fi
if [ -n "${DRY_RUN:-}" ]; then
  DEVICE=cpu; RESUME=""; EXTRA="--smoke --no-baseline ${EXTRA:-}"; END_S=${END_S:-300}
  PLAN_BUDGET=${PLAN_BUDGET:-475}  # the plan of a real call (END_S 540); the smoke rows ignore their time budgets
fi
echo "the plan of $# runners side by side (each row's time in the call, its step cap, the steps it reaches):"
"${PYTHON:-python3}" benchmarks/mnist_table.py --plan "$@" --time-budget "${PLAN_BUDGET:-$(( ${END_S:-540} - 65 ))}" \
  || echo "(no plan: mnist_table.py --plan failed)"
W=${WORK:-/tmp/mnist_table_call}; mkdir -p "$W"
RESUME=${RESUME-.gpu/mnist_state}
LEFT=$(( ${END_S:-540} - 25 - $(el) ))   # 25 s kept for the merge and the archive
BUDGET=$(( LEFT - 40 ))                  # a runner starts no row that needs more than its budget
THREADS=$(( $(nproc) / $# )); [ "$THREADS" -ge 1 ] || THREADS=1
echo "[$(el) s] $# runners, $THREADS threads each, row budget $BUDGET s, hard stop $LEFT s"
i=0; states=()
for rows in "$@"; do
  i=$((i + 1)); states+=("$W/state_$i")
  scale=${TIME_SCALE:-1}
  case "$rows" in x[0-9]*) scale=${rows%% *}; scale=${scale#x}; rows=${rows#* } ;; esac
  # shellcheck disable=SC2086  # the rows are words
  ( timeout "$LEFT" "${PYTHON:-python3}" benchmarks/mnist_table.py --device "${DEVICE:-cuda}" --threads "$THREADS" \
      --data-root "${DATA_ROOT:-.gpu/data/mnist}" ${RESUME:+--resume-from "$RESUME"} --state "$W/state_$i" \
      --results "$W/results_$i" --time-budget "$BUDGET" --time-scale "$scale" ${EXTRA:-} --rows $rows \
      > "$W/runner_$i.log" 2>&1; echo "[$(el) s] runner $i ($rows, time x$scale) rc=$?" ) &
done
wait
for j in $(seq 1 $i); do echo "--- runner $j"; grep -E "^== |status=|Error" "$W/runner_$j.log" | tail -8; done
"${PYTHON:-python3}" benchmarks/mnist_table.py --state "$W/merged" --merge-from "${states[@]}" --results "$W/merged/results" \
  --note "${NOTE:-$i runners side by side on one GPU: s/step includes the sharing}" > /dev/null
rm -rf "$W"/state_*/cache "$W"/state_*/smoke_data "$W/merged/cache"
# checkpoints of rows cut short stay in $W (a next call on the still-warm machine continues them: RESUME= and the
# same WORK, e.g. under the project's ignored outputs/); the archive leaves them out, and the merged ones also go
# beside it ($OUT/<row>.ckpt, returned when under a call's 16 MiB per file: DP-GAN's) for a call on a fresh machine
if [ -d "$W/merged/ckpt" ]; then cp "$W"/merged/ckpt/*.ckpt "${OUT:-.}/" 2>/dev/null; fi
tar czf "${OUT:-.}/mnist_table_call.tgz" --exclude=ckpt --exclude=pretrained -C "$W" . && echo "[$(el) s] packed ${OUT:-.}/mnist_table_call.tgz"
