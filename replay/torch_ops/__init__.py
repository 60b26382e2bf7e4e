"""Recording and replaying PyTorch operator calls (`replay record --torch-ops`).

    recording.py  a TorchDispatchMode that records aten and torch.library custom op calls
    schema.py     what an operator takes and writes, from its schema; values JSON cannot hold
    rerun.py      a recorded op call as an op: run again by its overload name, and in float64 on the CPU
"""
