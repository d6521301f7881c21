"""``harness report``: one HTML file from the store alone, every stored cell on it with the paper's colours, missing
cells said, every run one click away, nothing fetched; and (where Debian's chromium is installed) the page renders
from a file path with no network and no console error."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest


@pytest.fixture
def store(two_method_store, fake_run):
    store = two_method_store
    fake_run(store, "gu-kgw", {}, "int8", {}, 0.96)  # PRO has no INT8 run: a missing cell
    fake_run(store, "gu-kgw", {"delta": 1.0}, "none", {}, 0.83)  # another configuration: not in the heatmap
    return store


def stored_cells(store) -> dict:
    """``{run: AUC}`` of every stored run."""
    return {p.name: json.loads((p / "metrics.json").read_text())["auc"] for p in store.runs()}


def test_every_stored_cell_is_on_the_page(store, cli, tmp_path):
    out = cli("report", "--results", str(store.root), "--out", str(tmp_path / "report.html"))
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "report.html").read_text()
    specs = {p.name: json.loads((p / "spec.json").read_text())["config"]["method"] for p in store.runs()}
    other = [run for run, m in specs.items() if m["name"] == "gu-kgw" and m.get("params", {}).get("delta") == 1.0]
    assert len(other) == 1
    for run, auc in stored_cells(store).items():
        assert f'href="#run-{run}">{auc:.3f}</a>' in page, run  # every stored cell, linked to its run
        assert f'<details id="run-{run}">' in page  # its spec, versions and timings
        if run in other:
            continue
        cell = re.search(rf'<td class="cell" style="background:([^"]+)" title="run {run}"><a href="#run-{run}">'
                         rf"([0-9.]+)</a>", page)  # fmt: skip
        assert cell is not None, run
        assert float(cell.group(2)) == pytest.approx(auc, abs=5e-4)
        want = "#b9e3b2" if auc >= 0.8 else "#f2b8b5" if auc < 0.7 else "#fbefa8"
        assert cell.group(1) == want, (run, auc)
        tpr = json.loads((store.root / run / "metrics.json").read_text())["tpr@0.05"]  # tab:robustness's TPR@5%
        assert f'<a href="#run-{run}">{auc:.3f}</a></td><td>{tpr:.3f}</td>' in page, run
        assert f'<details id="run-{run}">' in page  # its spec, versions and timings
    assert page.count('<td class="missing" colspan="2">missing</td>') == 1  # PRO x INT8
    assert "<th>AUC</th><th>TPR@5%</th>" in page
    # tab:comparison's section: Gu-KGW against PRO under the two rows both have (unaltered and SLERP), not INT8
    section = page.split("<h3>Paired differences between methods")[1].split("<h3>")[0]
    assert section.count("<th>Gu-KGW</th>") + section.count("<td>Gu-KGW</td>") == 2, section
    assert "INT8" not in section and "evaluation spec" in section
    assert "<img" in page and "data:image/png;base64," in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched


def test_bad_report_inputs(cli, tmp_path, store):
    out = cli("report", "--results", str(tmp_path / "none"))
    assert out.returncode == 2 and "no run store" in out.stderr
    out = cli("report", "--results", str(store.root), "--out", str(tmp_path / "report.pdf"))
    assert out.returncode == 2 and "must name an .html file" in out.stderr
    (tmp_path / "empty").mkdir()
    out = cli("report", "--results", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html"))
    assert out.returncode == 2 and "no finished runs" in out.stderr


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (Debian: apt-get install chromium)")
def test_the_page_renders_in_headless_chromium_with_no_network(store, cli, tmp_path):
    report = tmp_path / "report.html"
    assert cli("report", "--results", str(store.root), "--out", str(report)).returncode == 0
    run = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=5000", "--dump-dom", report.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    assert 'class="heatmap"' in dom
    for name, auc in stored_cells(store).items():
        assert f'href="#run-{name}">{auc:.3f}</a>' in dom, name
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console
