"""PTX static analysis (`replay ptx`): a parser for the PTX compilers emit, and rules on kernels."""
from replay.ptx.parser import Function, Instruction, Module, PTXError, parse
from replay.ptx.rules import KernelReport, analyse

__all__ = ["Function", "Instruction", "KernelReport", "Module", "PTXError", "analyse", "parse"]
