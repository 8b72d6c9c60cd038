#!/usr/bin/env bash
# The GPU check (issue 36, item 7), one command on a machine with a CUDA GPU: `make gpu-check`.
# It has never run on a GPU: no GPU was lent to the sessions that wrote it. It prints, in order:
#   1. the quickstart trained on the GPU (device = "cuda"), its one-line result;
#   2. grouped against one-by-one local training throughput on the GPU (bench/throughput.py);
#   3. the compute model's price of the bench's models on the datasheet profile of this GPU, if
#      EDGEFL_GPU_PROFILE names one (e.g. a100_pcie, rtx_3090), beside the measured throughput.
# Not yet in it (the issue asks for them): `edgefl devices calibrate` and bench/fidelity.py time on
# the CPU only; on a GPU they would need CUDA-synchronised timers, which they do not have yet.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
"$BIN/python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible to torch'; \
print('GPU:', torch.cuda.get_device_name(0), '| torch', torch.__version__, '| CUDA', torch.version.cuda)"
echo "== 1. quickstart on the GPU"
timeout 240 "$BIN/edgefl" run quickstart --set 'device="cuda"' --out "$OUT/quickstart" --overwrite --quiet
echo "== 2. local adversarial training, samples/s, grouped vs one by one (bench/throughput.py)"
timeout 240 "$BIN/python" bench/throughput.py --device cuda --repeats 2
if [ -n "${EDGEFL_GPU_PROFILE:-}" ]; then
  echo "== 3. the compute model on $EDGEFL_GPU_PROFILE"
  for model in vgg11 resnet18 smallcnn; do
    "$BIN/edgefl" price "$model" --device "$EDGEFL_GPU_PROFILE" --batch 64 --attack-steps 10 | head -2
  done
fi
