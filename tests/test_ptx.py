"""`replay ptx` on PTX files: the parser (line numbers, the grammar compilers emit, clear errors), the
rules (64-bit shared addresses, grid axes read, pointer parameters dereferenced), an op's rules
(replay.KernelRules: the row axis, arguments to ignore) and the cubin reader."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.cli import main
from replay.errors import RegistryError
from replay.kernel_rules import KernelRules
from replay.ptx import PTXError, analyse, parse
from replay.ptx.compile import CompileJob
from replay.ptx.cubin import registers, stack_bytes
from replay.ptx.rules import op_rule_findings

HERE = Path(__file__).parent / "ptx"
TRITON_KV_SCATTER = HERE / "kv_scatter_sm90.ptx"  # Triton 3.9's PTX of kernels/kv_scatter.py for sm_90


def kernel(path: Path, name: str):
    return next(k for k in parse(path.read_text(), str(path)).kernels if k.name == name)


def test_a_64_bit_shared_address_is_caught_with_its_line() -> None:
    report = analyse(kernel(HERE / "planted_shared_64bit.ptx", "rows_batched"))
    assert [(v.rule, v.line) for v in report.violations] == [("shared-32-bit", 31), ("shared-32-bit", 34)]
    assert "64-bit %rd1" in report.violations[0].message


def test_tensor_memory_copies_are_checked_on_their_shared_side_only() -> None:
    # the tensor map (a 64-bit global address) is no shared address; a predicate may be a named register
    report = analyse(kernel(HERE / "planted_tma.ptx", "tma_copy"))
    assert [(v.rule, v.line) for v in report.violations] == [("shared-32-bit", 33)]
    assert "64-bit %rd2" in report.violations[0].message


def test_a_kernel_read_through_two_levels_of_address_arithmetic_is_named() -> None:
    report = analyse(kernel(HERE / "planted_indirect_position_buf.ptx", "scatter_batched"))
    assert report.params_read == ["scatter_batched_param_k", "scatter_batched_param_position_buf"]
    assert report.params_written == ["scatter_batched_param_cache"]  # through a position loaded: data, not the param
    assert report.axes_read == ["x"]  # a batched kernel that never reads %ctaid.y


PLANTED_SCATTER = HERE / "planted_indirect_position_buf.ptx"


def test_a_batched_kernel_that_never_reads_its_row_axis_is_caught_at_its_entry() -> None:
    report = analyse(kernel(PLANTED_SCATTER, "scatter_batched"))
    rules = KernelRules(row_axis="y")
    (finding,) = op_rule_findings(report, rules, "batched")
    assert (finding.rule, finding.line) == ("row-axis", 7) and "never reads %ctaid.y" in finding.message
    assert op_rule_findings(report, KernelRules(row_axis="x"), "batched") == []
    # a single-vector kernel reading the batched axis is caught where it reads it, unless it runs one program there
    (single,) = op_rule_findings(report, KernelRules(row_axis="x"), "single")
    assert (single.rule, single.line) == ("row-axis", 23)
    assert op_rule_findings(report, KernelRules(row_axis="x"), "single", grid=[1]) == []


def test_the_command_applies_a_row_axis_to_files(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["ptx", str(PLANTED_SCATTER), "--row-axis", "y", "--variant", "batched",
                                       "--json", "-"])
    assert result.exit_code == 1, result.output
    (violation,) = json.loads(result.stdout)["kernels"][0]["violations"]
    assert violation["rule"] == "row-axis" and violation["line"] == 7
    assert CliRunner().invoke(main, ["ptx", str(PLANTED_SCATTER), "--row-axis", "x", "--variant",
                                     "batched"]).exit_code == 0
    lonely = CliRunner().invoke(main, ["ptx", str(PLANTED_SCATTER), "--variant", "batched"])
    assert lonely.exit_code == 2 and "--row-axis" in lonely.stderr


def test_an_argument_read_although_the_call_gave_its_replacement_is_caught_at_the_load() -> None:
    binds = {"position_buf": "position_buf", "k": "k", "cache": "k_cache"}  # kernel argument -> call argument
    names = {f"scatter_batched_param_{n}": n for n in binds}
    report = analyse(kernel(PLANTED_SCATTER, "scatter_batched"), names, binds)
    assert report.arguments_read == ["k", "position_buf"]
    rules = KernelRules(ignore_when_given={"positions": ("position_buf",)})
    (finding,) = op_rule_findings(report, rules, "batched", binds=binds, given={"positions", "k"})
    # the load at line 28 reaches position_buf through cvta and two adds
    assert (finding.rule, finding.line) == ("ignore-when-given", 28)
    assert "reads position_buf (through position_buf) although the call gives positions" in finding.message
    assert op_rule_findings(report, rules, "batched", binds=binds, given={"k"}) == []  # the indirect call


def test_kernel_rules_are_checked_when_declared() -> None:
    with pytest.raises(RegistryError, match="row_axis 'w'"):
        KernelRules(row_axis="w")
    with pytest.raises(RegistryError, match="ignore_when_given"):
        KernelRules(ignore_when_given={"positions": "position_buf"})  # a string, not a tuple of names


def test_the_cubin_reader_takes_only_elf_and_finds_nothing_in_noise() -> None:
    assert registers(b"not an ELF file") is None and stack_bytes(b"") is None
    assert registers(b"\x7fELF\x02\x01" + bytes(100)) is None  # headers that point at nothing


def test_triton_ptx_parses_and_its_kv_scatter_reads_what_the_kernel_says() -> None:
    module = parse(TRITON_KV_SCATTER.read_text(), str(TRITON_KV_SCATTER))
    (scatter,) = module.kernels
    report = analyse(scatter)
    param = "_kv_scatter_kernel_param_{}".format
    # k, v, kv_cache_lengths, the positions it was given, seq_len_buf, block_table; it writes both caches,
    # the lengths and the positions it wrote
    assert report.params_read == sorted(param(i) for i in (0, 1, 4, 5, 6, 7))
    assert report.params_written == sorted(param(i) for i in (2, 3, 4, 8))
    assert (module.target, report.axes_read, report.violations, report.local_accesses) == ("sm_90a", ["x"], [], 0)


def test_the_grammar_compilers_emit_parses() -> None:
    module = parse((HERE / "planted_shared_64bit.ptx").read_text())
    helper, batched = module.functions
    assert (helper.name, helper.is_kernel, batched.is_kernel) == ("helper", False, True)
    assert batched.register_width("%rd7") == 64 and batched.register_width("%r99") == 32
    assert batched.register_width("%p1") == 1 and batched.labels == {"$L__BB0_2": 7}
    vector = next(i for i in batched.instructions if i.opcode == "ld.shared.v2.u32")
    assert vector.operands == ("{%r4, %r5}", "[%rd1+16]") and vector.line == 31
    branch = next(i for i in batched.instructions if i.opcode == "bra")
    assert branch.predicate == "@!%p1" and branch.operands == ("$L__BB0_2",)


@pytest.mark.parametrize("text, line, says", [
    (".version 8.0\n.visible .entry k(\n)\n{\n\tret;\n", 5, "'}' is missing"),
    (".version 8.0\n.visible .entry k()\n{\n\t.reg .b32 %r<;\n\tret;\n}\n", 4, "register"),
    (".version 8.0\n.visible .entry k()\n{\n\tld.global.u32 %r1, [%rd1;\n}\n", 4, "unbalanced"),
    (".version 8.0\nmov.u32 %r1, 1;\n", 2, "outside a function"),
    (".version 8.0\n/* never closed\n.visible .entry k()\n", 2, "unterminated"),
    (".visible .entry k(.param .u64 ,)\n{\n}\n", 1, "parameter"),
    (".visible .entry k()\n{\n\tret\n}\n", 3, "missing ';'"),
])
def test_malformed_ptx_is_one_error_naming_file_and_line(text: str, line: int, says: str) -> None:
    with pytest.raises(PTXError) as caught:
        parse(text, "bad.ptx")
    message = str(caught.value)
    assert message.startswith("bad.ptx") and says in message and "\n" not in message
    if f"bad.ptx:{line}:" not in message:
        assert "missing" in says  # an unclosed body is only known at the end of the file


def test_the_command_reports_violations_exit_1_and_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["ptx", str(HERE / "planted_shared_64bit.ptx"), str(TRITON_KV_SCATTER),
                                       "--json", "-"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert [k["name"] for k in report["kernels"]] == ["rows_batched", "_kv_scatter_kernel"]
    assert report["kernels"][0]["violations"][0]["line"] == 31 and not report["kernels"][1]["violations"]
    clean = CliRunner().invoke(main, ["ptx", str(TRITON_KV_SCATTER), "--kernel", "*scatter*"])
    assert clean.exit_code == 0 and "_kv_scatter_kernel" in clean.stdout


def test_the_command_says_which_file_and_line_is_malformed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ptx"
    bad.write_text(".visible .entry k()\n{\n\tret\n}\n")
    result = CliRunner().invoke(main, ["ptx", str(bad)])
    assert result.exit_code == 2 and result.stderr.strip() == f"replay: error: {bad}:3: missing ';' after 'ret'"
    missing = CliRunner().invoke(main, ["ptx", str(tmp_path / "none.ptx")])
    assert missing.exit_code == 2 and "none.ptx: unreadable" in missing.stderr
    source = tmp_path / "kernels.py"  # a kernel's Python source is not what this reads
    source.write_text("import triton\n")
    python = CliRunner().invoke(main, ["ptx", str(source)])
    assert python.exit_code == 2 and f"{source} is Python, not PTX" in python.stderr and "--snapshot" in python.stderr


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mutated_real_ptx_parses_or_raises_ptx_error_only(data: st.DataObject) -> None:
    text = TRITON_KV_SCATTER.read_text()
    for _ in range(data.draw(st.integers(1, 3))):
        start = data.draw(st.integers(0, len(text)))
        end = data.draw(st.integers(start, min(len(text), start + 40)))
        text = text[:start] + data.draw(st.sampled_from(["", "{", "}", ";", ":", "[", "/*", '"', "\n", "%r1,",
                                                         ".reg .b64 %rd<", "@%p1 ", "$L:", text[start:end]]))
        text += "" if data.draw(st.booleans()) else text[end:]
    try:
        module = parse(text, "fuzz.ptx")
    except PTXError as exc:
        assert str(exc).startswith("fuzz.ptx") and "\n" not in str(exc)
        return
    for function in module.kernels:
        analyse(function)


def test_a_snapshot_without_compilable_launches_or_with_untrusted_modules_is_exit_2(tmp_path: Path) -> None:
    import hostile

    snapshot = hostile.record(tmp_path / "snap")
    result = CliRunner().invoke(main, ["ptx", "--snapshot", str(snapshot)])
    assert result.exit_code == 2 and "no launch record says how to compile" in result.stderr
    hostile.edit_call(lambda call: call.update(launch=[{"kernel": "k", "module": "os", "signature": {"x": "i32"}}]))(
        snapshot)
    result = CliRunner().invoke(main, ["ptx", "--snapshot", str(snapshot)])
    assert result.exit_code == 2 and "provider module 'os' is not trusted" in result.stderr


def test_a_compile_that_runs_out_of_time_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from replay.errors import ReplayError
    from replay.ptx.compile import compile_jobs

    def too_slow(*args: object, **kwargs: object) -> None:
        raise subprocess.TimeoutExpired("python", 5)
    monkeypatch.setattr(subprocess, "run", too_slow)
    job = CompileJob("replay_kernels.rmsnorm", "_rmsnorm_rows_kernel", (("x_ptr", "*fp32"),), (), 90)
    with pytest.raises(ReplayError, match=r"compiling 1 kernel\(s\) for PTX took more than 5 s"):
        compile_jobs([job], timeout=5)


def test_a_launch_record_compiles_only_with_every_constexpr_value_it_names() -> None:
    record = {"module": "m", "kernel": "k", "signature": {"x_ptr": "*fp32", "BLOCK": "constexpr", "scale": "constexpr"},
              "BLOCK": 32}  # replay.launch keeps no float: `scale`'s value is not there
    assert CompileJob.from_launch(record, 90) is None  # never compiled with a None it did not run with
    job = CompileJob.from_launch({**record, "scale": None}, 90)  # a None argument: a constexpr Triton compiles
    assert job is not None and dict(job.constexprs) == {"BLOCK": 32, "scale": None}
    nested = CompileJob.from_launch({**record, "constexprs": {"BLOCK": 16, "scale": 2}}, 90)  # launch_record.py's
    assert nested is not None and dict(nested.constexprs) == {"BLOCK": 16, "scale": 2}
