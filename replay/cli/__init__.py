"""The `replay` command line: parses, prints, picks exit codes; the work lives below.

Each command lives in its own module `replay/cli/<name>_cmd.py` exposing `command`.
"""
from __future__ import annotations

import importlib

import click

from replay.cli.common import ReplayGroup

COMMAND_MODULES = ("record", "show", "run", "diff", "graph", "trace", "kvcheck", "invariance", "bisect",
                   "precision", "repro", "ptx", "demo")


@click.group(cls=ReplayGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kernel-replay")
def main() -> None:
    """Record GPU kernel calls, replay them against batched, single-vector and reference
    variants, and bisect git history to the commit that made them diverge.

    \b
    Exit codes (git bisect run understands them):
      0    every check passed
      1    a divergence or contract violation was found
      2    bad input (unreadable snapshot, unknown op, bad ref, bad option)
      125  this commit cannot be tested (import or build failure)
      130  interrupted (Ctrl-C)
      70   an internal error: a bug in kernel-replay, never a verdict
    """


for _name in COMMAND_MODULES:
    main.add_command(importlib.import_module(f"replay.cli.{_name}_cmd").command)
