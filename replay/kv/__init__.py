"""`replay kv-check`: serial, batched and chunked prefills of the same tokens must leave the same KV
cache, and every cache write must read the right state (check.py); a model is driven through its
runs by a small adapter (adapter.py, runs.py)."""
