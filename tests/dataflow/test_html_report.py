"""`replay run --html` and `replay run --propagate --html`: one self-contained page with a heatmap,
row map, values and histogram per failing tensor (and the chain's error curve), checked by its
structure everywhere and in headless Chromium where it is installed."""
from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import replay

from kernel_copies import RMSNORM_MEAN_OVER_H_PLUS_1, RMSNORM_WEIGHT_SATURATES, edited_kernels, kernels_put_back
from replay.cli import main as cli_main

from tests.dataflow.conftest import PLANTED_CALL

ROOT = Path(__file__).parents[2]
SHIPPED = ROOT / "snapshots" / "prefill_001"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))

    def having(self, tag: str, cls: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.found if t == tag and cls in (a.get("class") or "").split()]


def _parsed(path: Path) -> _Elements:
    elements = _Elements()
    elements.feed(path.read_text())
    return elements


@pytest.fixture(scope="module")
def failing_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("page")
    page = tmp / "run.html"
    with kernels_put_back():  # a module's fixture: set up before any test's own putting back
        result = CliRunner().invoke(cli_main, ["run", str(SHIPPED), "--op", "rmsnorm", "--html", str(page), "--code",
                                               str(edited_kernels(tmp, RMSNORM_MEAN_OVER_H_PLUS_1))])
    assert result.exit_code == 1, result.output
    return page


def test_the_page_draws_every_failing_tensor(failing_page: Path) -> None:
    page = _parsed(failing_page)
    calls = page.having("tr", "call")
    assert len(calls) == 5 and all(c["data-passed"] == "false" for c in calls)
    sections = page.having("section", "evidence")
    assert {(s["data-call"], s["data-name"]) for s in sections} == {
        (str(i), name) for i in (0, 10, 16, 26, 32) for name in ("out", "tag rstd")}
    assert len(page.having("svg", "heatmap")) == len(sections) == len(page.having("svg", "histogram"))
    assert len(page.having("svg", "rowmap")) == len(sections) and len(page.having("table", "values")) == len(sections)
    # out [8, 256] in cells of 1 row by 6 columns: 8 x 43
    assert len(page.having("rect", "cell")) == 5 * (8 * 43 + 1 * 8)
    assert "<script src" not in failing_page.read_text() and "http" not in failing_page.read_text().split("<svg")[0]


@pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (Debian's chromium package)")
def test_the_page_opens_in_headless_chromium_without_a_console_error(failing_page: Path) -> None:
    shown = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                            "--v=0", "--virtual-time-budget=5000", "--dump-dom", failing_page.as_uri()],
                           capture_output=True, text=True, timeout=120)
    assert re.search(r'data-heatmaps="(\d+)"', shown.stdout).group(1) == "10"
    assert not [line for line in shown.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def test_a_propagated_page_draws_the_error_curve_and_the_culprit(prefill: Path, tmp_path: Path) -> None:
    page_path = tmp_path / "chain.html"
    result = CliRunner().invoke(cli_main, ["run", str(prefill), "--propagate", "--code", str(edited_kernels(tmp_path, RMSNORM_WEIGHT_SATURATES)),
                                           "--html", str(page_path)])
    assert result.exit_code == 1, result.output
    page = _parsed(page_path)
    assert len(page.having("svg", "error-curve")) == 1 and len(page.having("polyline", "own")) == 1
    assert [s["data-call"] for s in page.having("section", "evidence")] == [str(PLANTED_CALL)]
    assert len(page.having("tr", "call")) == 34


def test_replay_diff_html_draws_where_a_difference_starts(tmp_path: Path) -> None:
    from replay_kernels.model import TinyLlama

    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name, scale in (("a", 1.0), ("b", 1.01)):
        model = TinyLlama(device=device)
        model.weights.layers[1].ffn_norm *= scale  # layer 1's ffn rmsnorm differs first
        with replay.recording(tmp_path / name):
            model.prefill([3, 4])
    page = tmp_path / "diff.html"
    result = CliRunner().invoke(cli_main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--html", str(page)])
    assert result.exit_code == 1
    text = page.read_text()
    # the first differing call is layer 1's ffn rmsnorm (26): its weight, then its output, are drawn
    assert re.findall(r'data-call="(\d+)" data-name="([^"]+)"', text)[:2] == [("26", "in/weight"), ("26", "out/out")]
    assert text.count('class="heatmap"') == text.count('class="evidence"') > 0
