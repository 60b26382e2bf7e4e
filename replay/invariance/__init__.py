"""`replay invariance`: is a row's output the same whatever batch it arrives in (check.py)."""
