#!/usr/bin/env bash
# One GPU session of checks and timings, as run on a lent device machine (see benchmarks/README.md):
# the GPU tests, the decodes eager against replayed (decode_graphs.py), then caprl's step against
# self-critical.pytorch's, interleaved, then a profile of caprl's SCST Top-Down step (SKIP_PROFILE=1:
# none). Expects the peers folder and the captions under .gpu/ (copied from ../shared) and the
# wheels the machine lacks under .gpu/whl. Results go to $OUT (or ./gpu-out).
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu CAPRL_GPU_TEST_DEVICE=cpu: a dry run of this script on a CPU machine
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
[ -n "${SKIP_WHEELS:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site:$PWD/.gpu/site  # .gpu/site: pycocoevalcap's bleu module (SCP imports it)
python3 -c "import torch, caprl; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(0))" || exit 1
PEERS=$PWD/.gpu/peers/self-critical.pytorch; CAPS=$PWD/.gpu/data/coco/karpathy_val5k_captions.json; W=/tmp/cmp
START=$(date +%s); t() { echo "[$(( $(date +%s) - START )) s] $*"; }
t "data set-up (background)"
(python3 benchmarks/gpu_compare.py --peers "$PEERS" --captions "$CAPS" --work $W --setup --steps 10 --warmup 5 --configs \
   > "$OUT/setup.txt" 2>&1; echo "setup rc $?" >> "$OUT/setup.txt") &
SETUP=$!
t "GPU tests"
timeout ${GPU_TEST_S:-150} python3 -m pytest tests/test_graphs.py tests/test_gpu.py -m gpu -q -p no:cacheprovider -o addopts="" \
  2>&1 | tail -40 > "$OUT/pytest_gpu.txt"; cat "$OUT/pytest_gpu.txt"
t "decodes: eager against replayed from a CUDA graph"
timeout ${DECODE_S:-150} python3 benchmarks/decode_graphs.py --device $DEVICE --batches 50 250 --repeats 10 --markdown "$OUT/decode_graphs.md" \
  > /dev/null 2>"$OUT/decode_graphs.err"; cat "$OUT/decode_graphs.md"; tail -3 "$OUT/decode_graphs.err"
wait $SETUP; cat "$OUT/setup.txt"
# warm-up 5: the XE step is captured as a CUDA graph after 3 eager steps (caprl.training.graphs)
compare() { timeout ${2:-300} python3 benchmarks/gpu_compare.py --peers "$PEERS" --captions "$CAPS" --work $W --device $DEVICE \
          --json "$OUT/$1.json" --markdown "$OUT/$1.md" --steps 10 --warmup 5 --configs ${@:3}; }
t "goal configurations (and caprl without graphs)"
compare goal 260 scst-topdown xe-topdown --eager-too
t "profile"
[ -n "${SKIP_PROFILE:-}" ] || timeout 45 python3 benchmarks/train_step.py --worker scst-topdown 50 --paths "$(python3 -c "
import json; print(json.dumps({k: '$W/caprl/' + f for k, f in (('annotations', 'annotations.json'), ('vocab', 'vocab.json'),
('labels', 'labels.h5'), ('features', 'features.h5'), ('cider_df', 'cider_df.npz'))}))")" --steps 5 --warmup 3 \
  --device $DEVICE --profile "$OUT/profile_scst_topdown_50.txt" | tail -1
t "other configurations"
compare rest 170 scst-fc xe-fc sll_sle-topdown sll_sle-fc
t "done"
