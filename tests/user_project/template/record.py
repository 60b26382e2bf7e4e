"""Run the model on a small batch, recording every kernel call: python record.py SNAPSHOT_DIR"""
import sys

import torch

import replay  # before triton: on a machine with no GPU the kernels then run in Triton's interpreter
from mymodel import Block

device = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(device)
position_buf = torch.arange(4, dtype=torch.int32, device=device) + 3  # runtime state: where each token sits

with replay.recording(sys.argv[1]):
    out = Block(device=device).forward(x, position_buf)
print(f"out[0, :4] = {out[0, :4].tolist()}")
