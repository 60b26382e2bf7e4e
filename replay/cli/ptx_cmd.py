"""`replay ptx`: compile or read PTX and check its kernels; the work is replay.ptx's."""
from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from replay.cli.common import (chosen_device, cuda_targets, device_option, error, finish, json_option,
                               kernel_trust_options)
from replay.errors import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_PASS
from replay.kernel_rules import AXES, KernelRules
from replay.ptx.analysis import PtxReport, check_sources
from replay.ptx.sources import file_ptx, op_ptx, snapshot_ptx
from replay.code import KernelCode

DTYPES = ("float32", "bfloat16", "float16")


@click.command("ptx")
@click.argument("targets", nargs=-1, metavar="[OP ...] [FILE.ptx ...]")
@click.option("--snapshot", type=click.Path(path_type=Path), metavar="DIR",
              help="Compile the Triton kernels that ran in snapshot DIR with their recorded constexprs and argument "
                   "types (its launch records, or the Triton launches `replay record` recorded), and "
                   "specialised as the launch was (an int equal to 1 compiled in, ints divisible by 16 and "
                   "pointers aligned to 16 bytes known so), unless the snapshot predates that record.")
@click.option("--arch", "archs", default="sm_90", show_default=True, metavar="sm_80,sm_89,...",
              help="CUDA targets to compile for, comma-separated.")
@click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16", show_default=True,
              help="Activation dtype of the examples OPs run on.")
@device_option
@click.option("--row-axis", type=click.Choice(AXES), help="For FILE.ptx: the grid axis batched kernels take rows from.")
@click.option("--variant", type=click.Choice(["batched", "single"]),
              help="For FILE.ptx with --row-axis: its kernels are batched ones (must read the axis) or single-vector "
                   "ones (must not).")
@kernel_trust_options
@click.option("--kernel", "kernel_glob", metavar="GLOB", default="*", show_default=True,
              help="Only kernels whose name matches GLOB.")
@json_option
def command(targets: tuple[str, ...], snapshot: Path | None, archs: str, dtype: str, device: str | None,
            row_axis: str | None, variant: str | None, providers: tuple[str, ...], code_dir: Path | None,
            kernel_glob: str, json_target: str | None) -> None:
    """Check compiled kernels statically: shared memory addressed with 32-bit registers; the
    grid axis a batched kernel takes its row from (and a single-vector one does not); which
    pointer parameters each kernel dereferences (def-use from ld.param through address
    arithmetic to global loads and stores), named as the call's arguments, so that it says
    whether a kernel reads position_buf; local memory (spills); registers and shared memory.

    \b
    What is checked:
      OP ...        the kernels each op's single and batched variants launch on its registered
                    examples (Op.example), compiled for each --arch; no OP and no FILE: every op
      --snapshot    the kernels and constexprs a recording ran
      FILE.ptx      PTX from any compiler (nvcc, Triton's cache, by hand)
    An op's rules come from its registration (replay.KernelRules); an op's batched and single
    kernels are then listed side by side where they differ.

    \b
    Examples:
      replay ptx                                   # every registered op, sm_90
      replay ptx q6k_gemv kv_scatter --arch sm_80,sm_89,sm_90
      replay ptx --snapshot snapshots/prefill_001 --arch sm_90
      replay ptx --snapshot snapshots/serve_001 --code .      # a program recorded by `replay record`
      replay ptx build/gemv.ptx --row-axis y --variant batched --json -

    Compiling takes seconds a kernel on a CPU core, spread over the cores; Triton's cache
    makes a second run fast. Exit 0 when every rule holds, 1 on a violation, 2 on bad input
    (a malformed file: one line naming the file and line; a kernel that does not compile from
    what its launch recorded: its row says why, the others are checked all the same).
    """
    files = [Path(t) for t in targets if t.endswith(".ptx") or Path(t).is_file()]
    op_names = [t for t in targets if not (t.endswith(".ptx") or Path(t).is_file())]
    python = [str(path) for path in files if path.suffix == ".py"]
    if python:
        raise click.BadParameter(f"{python[0]} is Python, not PTX: check the kernels a program ran with "
                                 "`replay record -- python PROG.py` and then --snapshot DIR, or name a registered op",
                                 param_hint="FILE")
    if variant is not None and row_axis is None:
        raise click.BadParameter("needs --row-axis, the axis the rule is about", param_hint="--variant")
    targets_archs = cuda_targets(archs, "--arch")
    file_rules = KernelRules(row_axis=row_axis) if row_axis else None
    sources = [file_ptx(path, file_rules, variant) for path in files]
    if snapshot is not None:
        sources += snapshot_ptx(snapshot, targets_archs, providers, code_dir)
    examples_device = None
    if op_names or (not files and snapshot is None):
        examples_device = chosen_device(device)
        import torch

        ops = KernelCode(code_dir, providers).ops(op_names)
        sources += op_ptx(ops, targets_archs, getattr(torch, dtype), examples_device)
    report = check_sources(sources, kernel_glob)
    for source in report.uncompiled:  # the others are reported all the same
        error(f"{source.where}: did not compile: {source.error}")
    exit_code = EXIT_DIVERGED if not report.passed else EXIT_BAD_INPUT if report.uncompiled else EXIT_PASS
    finish(json_target, {**report.to_json(), "examples_device": examples_device},
           lambda console: _print(console, report, examples_device), exit_code)


def _print(console: Console, report: PtxReport, examples_device: str | None) -> None:
    if examples_device == "cpu":
        console.print("[yellow]note:[/] the ops' examples ran on the CPU (Triton interpreter), so their launch "
                      "configurations are the ones a kernel picks there; where it picks by device (the GEMV tiles), "
                      "run on a GPU machine or check a GPU recording with --snapshot")
    table = Table(title_justify="left", title=f"{len(report.kernels)} kernels (reads, writes: the call's arguments "
                                              "where the launch recorded them, else the kernel's parameters)")
    for column in ("source", "target", "kernel", "grid axes", "reads", "writes", "regs", "stack", "smem", "local",
                   "verdict"):
        table.add_column(column, overflow="fold")
    for kernel in report.kernels:
        r, s = kernel.report, kernel.source
        verdict = "[red]" + escape("; ".join(f"line {v.line}: {v.message}" for v in r.violations)) + "[/]" \
            if r.violations else "[green]ok[/]"
        table.add_row(escape(s.where), f"sm_{s.arch}" if s.arch else "-", escape(r.name), ", ".join(r.axes_read) or "-",
                      _named(r.params_read, s.binds), _named(r.params_written, s.binds), _shown(s.registers),
                      _shown(s.stack), _shown(s.shared), str(r.local_accesses), verdict)
    for s in report.uncompiled:
        table.add_row(escape(s.where), f"sm_{s.arch}" if s.arch else "-", escape(s.kernel or "-"), *["-"] * 7,
                      "[red]did not compile: " + escape(s.error or "") + "[/]")
    console.print(table)
    pairs = [p for p in report.pairs() if p.differences]
    if pairs:
        side = Table(title_justify="left", title="batched vs single, where they differ")
        for column in ("op", "example", "target", "what", "batched", "single"):
            side.add_column(column, overflow="fold")
        for pair in pairs:
            for what, (batched, single) in pair.differences.items():
                side.add_row(escape(pair.op), escape(pair.example or "-"), f"sm_{pair.arch}", what, _shown(batched),
                             _shown(single))
        console.print(side)


def _named(params: list[str], binds: dict[str, str]) -> str:
    return escape(", ".join(str(binds.get(p, p)) for p in params)) or "-"


def _shown(value: object) -> str:
    if isinstance(value, dict):
        return escape(", ".join(f"{k}={v}" for k, v in value.items())) or "-"
    if isinstance(value, list):
        return escape(", ".join(map(str, value))) or "-"
    return "-" if value is None else escape(str(value))
