#!/usr/bin/env bash
# On a GPU machine: the kernel tests (their GPU twins run, the interpreter twins skip), then
# the kernel benchmark. Logs and bench_kernels.json go to $OUT (default ./out).
# Uses the machine's python3 as is (torch, triton, pytest): no install, no network.
#   scripts/gpu_check.sh [bench options, e.g. --sweep]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" \
    2>&1 | tee "$OUT/versions.txt"
python3 -m pytest tests/kernels -q -p no:cacheprovider -rs --durations=10 2>&1 | tee "$OUT/pytest_kernels.log"
tests=${PIPESTATUS[0]}
python3 scripts/bench_kernels.py "$@" 2>&1 | tee "$OUT/bench_kernels.log"
bench=${PIPESTATUS[0]}
echo "gpu_check: tests exit $tests, bench exit $bench" | tee -a "$OUT/pytest_kernels.log"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
