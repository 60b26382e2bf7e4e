"""`--executor`, `--ray-address` and `--ship`: where `replay bisect` and `replay run` do their work."""
from __future__ import annotations

from typing import Any, Callable

import click

from replay.ray_cluster import EXECUTORS, RAY_EXTRA, SHIP_CHOICES


def executor_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The three options, passed on as `executor`, `ray_address` and `ship`."""
    fn = click.option("--ship", type=click.Choice(SHIP_CHOICES), default="auto", show_default=True,
                      help="How Ray workers get the snapshot and the code: 'shared' reads the paths given here "
                           "(a local Ray, or a temporary directory on a mount every node sees: TMPDIR); 'ray' sends "
                           "them through Ray's object store (no shared disk needed); 'auto' is shared on a Ray of "
                           "one node, this machine, and ray otherwise.")(fn)
    fn = click.option("--ray-address", envvar="RAY_ADDRESS", metavar="ADDR",
                      help="The Ray cluster for --executor ray (default: $RAY_ADDRESS, else a local Ray started for "
                           "this command).")(fn)
    fn = click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
                      help=f"Where the work runs: child processes here, or Ray tasks, one GPU each where the "
                           f"cluster has GPUs (needs {RAY_EXTRA}).")(fn)
    return fn
