#!/usr/bin/env bash
# The picture in docs/trace_example.png: the tiny model's 8-token prefill and 4 decode steps,
# recorded, drawn by `replay trace --html`, and photographed by headless Chromium.
#   scripts/trace_example.sh [OUT_DIR]        (default: a temporary directory; needs chromium)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)}"
python="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
"$python" - "$out/gen" <<'PY'
import sys

import replay_kernels  # noqa: F401 (registers the ops; the interpreter without a GPU)
import replay
from replay_kernels.model import TinyLlama, prompt_tokens

with replay.recording(sys.argv[1], notes="tiny llama: 8-token prefill, 4 decode steps"):
    TinyLlama(seed=0).generate(prompt_tokens(8, 0), 5)
PY
"$python" -m replay trace "$out/gen" --html "$out/trace.html" --chrome "$out/trace.json" > /dev/null
chromium --headless --no-sandbox --disable-gpu --virtual-time-budget=5000 --window-size=1500,420 \
    --screenshot=docs/trace_example.png "file://$out/trace.html" 2> /dev/null
echo "wrote docs/trace_example.png (page: $out/trace.html, Chrome trace: $out/trace.json)"
