#!/usr/bin/env bash
# The device-machine run behind docs/eval-gpu.md: record the DDP job on the GPU
# (benchmarks/gpu_record.py), score the paired conditions there too (a fallback in case the traces
# are too big to bring back), and pack everything under $OUT within the transfer limits (8 files,
# 16 MiB each, 64 MiB in all): traces as .json in tar.xz (smaller than .json.gz), most important first.
#   bash benchmarks/gpu_device.sh            (with $OUT set; .whl/ holds an orjson wheel for python3 there)
set -u
: "${OUT:?set OUT to the folder to bring back}"
REC=/tmp/rec
STAGE=/tmp/stage
PACKED=/tmp/packed
mkdir -p "$STAGE" "$PACKED"
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/log.txt") 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
nproc
timeout "${RECORD_S:-330}" python3 benchmarks/gpu_record.py "$REC" --repeats "${REPEATS:-3}" --budget-s "${BUDGET_S:-200}" --device "${DEVICE:-cuda}" ${SIZES:+--sizes $SIZES} ${DELAYS:+--delays $DELAYS} ${NO_FIXTURES:+--no-fixtures} ${KINDS:+--kinds $KINDS} ${RETRIES:+--retries $RETRIES}
echo "record exit $?"
scorer=
[ "${SCORE_S:-150}" -gt 0 ] && (timeout "${SCORE_S:-150}" python3 benchmarks/corrections_heldout.py "$REC/paired" --json "$OUT/gpu_heldout.json" >"$STAGE/gpu_heldout.txt" 2>&1; echo "score exit $?" >>"$STAGE/gpu_heldout.txt") &
[ "${SCORE_S:-150}" -gt 0 ] && scorer=$!
if [ -n "${SCORE_EACH:-}" ]; then  # every launch scored on its own, side by side: their figures come back, not their traces
  for d in "$REC"/paired/*/; do
    n=$(basename "$d")
    timeout "$SCORE_EACH" python3 benchmarks/corrections_heldout.py "$d/conditions.jsonl" --json "$OUT/score-$n.json" >"$STAGE/score-$n.txt" 2>&1 &
  done
  wait $(jobs -p | grep -v "^${scorer:-none}$")
  cat "$STAGE"/score-*.txt
fi

pack() { # pack NAME PATH...: the paths (relative to $REC) as NAME.tar.xz, traces decompressed
  local name=$1
  shift
  rm -rf "${STAGE:?}/$name"
  mkdir -p "$STAGE/$name"
  (cd "$REC" && cp -r --parents "$@" "$STAGE/$name/") || return 1
  find "$STAGE/$name" -name '*.json.gz' -exec gunzip {} +
  tar -C "$STAGE" -cf - "$name" | xz -6 -T16 >"$PACKED/$name.tar.xz"
  ls -la "$PACKED/$name.tar.xz"
}
meta=(env.json)
for f in "$REC"/paired/paired.jsonl "$REC"/paired/*/conditions.jsonl "$REC"/paired/*/run.yaml "$REC"/paired/*/injections-rank-*.jsonl; do
  [ -e "$f" ] && meta+=("${f#"$REC"/}")
done
pack meta "${meta[@]}"
[ -d "$REC/fixtures" ] && [ -z "${NO_FIXTURES:-}" ] && pack fixtures fixtures
[ -z "${NO_TRACES:-}" ] && for d in "$REC"/paired/*/; do
  [ -d "$d" ] && pack "$(basename "$d")" "paired/$(basename "$d")"
done
[ -n "$scorer" ] && wait "$scorer"  # not a bare wait: that waits for the tee above too
cat "$STAGE/gpu_heldout.txt" 2>/dev/null
# bring back in this order while the limits allow: log, scores, meta, fixtures, launches (split at 15 MiB)
files=$(find "$OUT" -maxdepth 1 -type f | wc -l)
total=$(du -cb "$OUT"/* | tail -1 | cut -f1)
limit=$((62 * 1024 * 1024))
for f in "$PACKED"/meta.tar.xz "$PACKED"/fixtures.tar.xz $(ls -tr "$PACKED"/*.tar.xz | grep -v -e /meta. -e /fixtures.); do
  [ -e "$f" ] || continue
  size=$(stat -c %s "$f")
  parts=$(((size + 15 * 1024 * 1024 - 1) / (15 * 1024 * 1024)))
  if [ $((files + parts)) -gt 8 ] || [ $((total + size)) -gt $limit ]; then
    echo "left behind: $f ($size bytes)"
    continue
  fi
  if [ "$parts" -gt 1 ]; then
    split -b 15M -d "$f" "$OUT/$(basename "$f")."
  else
    cp "$f" "$OUT/"
  fi
  files=$((files + parts))
  total=$((total + size))
done
ls -la "$OUT"
