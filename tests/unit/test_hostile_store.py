"""A store received from someone else is read, never trusted: folder names, labels, settings and texts that hold
markup, script, URL schemes or TeX specials reach the report escaped for where they land (text, attribute, link),
the LaTeX tables escaped for LaTeX, and the figures as plain text (never parsed as mathtext); ``harness tables`` and
``harness report`` succeed on such a store. Where Debian's chromium is installed, the hostile report is opened
headless and no injected handler runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from html.parser import HTMLParser

import pytest

from harness.store.stages import Stage, Store, spec_hash

IMG = '"><img src=x onerror=document.title="pwned">'
SCRIPT = '</script><script>document.title="pwned"</script>'
JS = "javascript:document.title='pwned'"
TEX = r"$\foo$ {_} % & # ^ ~"
FORMULA = '=HYPERLINK("http://x","pwned")'  # run by a spreadsheet that opens the CSV
TERM = "\x1b]0;pwned\x07\x1b[2J\r\u202e"  # a terminal title, a screen clear, a carriage return, a bidi override
# Run folder names cannot hold "/", so the closing tags of SCRIPT go in labels and texts only.
FOLDERS = [IMG, JS, TEX, "a&b%c_d{e}"]


@pytest.fixture
def hostile(tmp_path, fake_run):
    """Gu-KGW and PRO, base, unaltered and SLERP rows plus another configuration and an unaltered row sampled with
    top-p 0.9, and an attribution stage: every label, setting and text a hostile string (each stage republished, so
    it verifies, under its new spec's hash), and copies of runs under hostile folder names (skipped: not their hash)."""
    store = Store(tmp_path / "runs")
    runs = []
    for method, auc in (("gu-kgw", 0.97), ("pro", 0.9)):
        runs += [fake_run(store, method, {}, "base", {}, 0.5), fake_run(store, method, {}, "none", {}, auc)]
        runs.append(fake_run(store, method, {}, "slerp", {"t": 0.5}, auc - 0.25))
    runs.append(fake_run(store, "gu-kgw", {"delta": 1.0}, "none", {}, 0.83))  # not main: the other configurations
    # sampled with top-p 0.9: the decoding table and its section of the report
    from harness.config.presets import TINY
    from harness.config.settings import apply_overrides

    runs.append(fake_run(store, "gu-kgw", {}, "none", {}, 0.9, preset=apply_overrides(TINY, {"eval.top_p": "0.9"})))
    labels = {"gu-kgw": f"KGW{IMG}", "pro": f"PRO{SCRIPT}"}
    settings = None
    for k, path in enumerate(runs):
        spec = json.loads((path / "spec.json").read_text())
        config = spec["config"]
        config["method"]["label"] = labels[config["method"]["name"]]
        config["method"]["config_label"] = f"{FORMULA} {config['method']['config_label']} {TEX} {SCRIPT}"
        config["preset"]["base_model"] = f"builtin:{IMG}{TEX}"
        if config["attack"].get("name") == "slerp":
            config["attack"]["label"] = JS
            config["attack"]["config_label"] = f"t=0.5 {TEX}"
            config["attack"]["category"] = f"Merging {SCRIPT} {TEX} {TERM}"
        spec["preset"] = f"tiny{IMG}"
        settings = config["preset"]
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["host"] = f"{SCRIPT}{IMG}"
        Stage("run", {}, path.name, path, store.root).update(
            {"spec.json": json.dumps(spec, indent=2), "manifest.json": json.dumps(manifest)}
        )
        path = path.rename(path.with_name(spec_hash(spec)))  # (a run's folder is named by its spec's hash)
        if k < len(FOLDERS):  # and copies under hostile names, which no store reads as runs
            shutil.copytree(path, path.with_name(FOLDERS[k]))
    who = {"detector": {"method": labels["pro"], "config": TEX}, "source": {"label": JS + SCRIPT}}
    attribution = {"stage": "attribution", "preset": f"tiny{IMG}", "preset_settings": settings, "labels": who}

    def build(out):
        (out / "metrics.json").write_text(json.dumps({"auc": 0.9, "tpr@0.01": 0.5}))
        return {}

    store.stage("attribution", attribution).build(build)
    return store


class Tags(HTMLParser):
    """Every start tag of a page with its attributes, as a browser's tokenizer sees them."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "table", "thead", "tbody", "tr",
             "th", "td", "a", "span", "figure", "img", "figcaption", "details", "summary", "pre", "code"}  # fmt: skip


def test_a_hostile_store_makes_a_report_with_no_markup_of_its_own(hostile, cli, tmp_path):
    report = tmp_path / "report.html"
    out = cli("report", "--results", str(hostile.root), "--out", str(report))
    assert out.returncode == 0, out.stderr
    page = report.read_text()
    # The hostile strings reached the page (escaped), so what follows tests something.
    assert "&lt;img src=x onerror=" in page and "&lt;/script&gt;&lt;script&gt;" in page
    assert "javascript:" in page and r"$\foo$" in page and "<img src=x" not in page
    assert "<script" not in page.lower()  # the page has no script of its own either
    parser = Tags()
    parser.feed(page)
    assert {t for t, _ in parser.tags} <= PAGE_TAGS, {t for t, _ in parser.tags} - PAGE_TAGS
    ids = {a["id"] for _, a in parser.tags if "id" in a}
    targets = set()
    for tag, attrs in parser.tags:
        assert not [name for name in attrs if name.startswith("on")], (tag, attrs)
        # (rowspan, valign: pandas' tables with a row index of several levels, e.g. detection by text length, which
        # the report shows for detectors that keep prefix scores, as the KGW and PRO rows here do)
        assert set(attrs) <= {"class", "colspan", "rowspan", "valign", "style", "title", "href", "id", "alt", "src",
                              "lang", "charset", "border"}, (tag, attrs)  # fmt: skip
        if tag == "img":
            assert attrs["src"].startswith("data:image/png;base64,"), attrs["src"][:80]
        if "href" in attrs:
            assert attrs["href"].startswith("#"), attrs["href"]  # a link within the page: no scheme at all
            targets.add(urllib.parse.unquote(attrs["href"][1:]))
    assert targets <= ids  # every link still finds its run
    # Every run's AUC is a link to it; the copies under hostile names are no runs (their spec hashes elsewhere).
    assert targets == {f"run-{run.name}" for run in hostile.runs() if run.name not in FOLDERS}


def test_a_hostile_store_makes_tables_and_figures(hostile, cli, tmp_path):
    out = cli("tables", "--results", str(hostile.root), "--out", str(tmp_path / "tables"))
    assert out.returncode == 0, out.stderr
    written = [p for p in (tmp_path / "tables").rglob("*") if p.is_file()]
    assert {p.suffix for p in written} >= {".csv", ".tex", ".png", ".pdf"}
    assert all((tmp_path / "tables") in p.parents for p in written)
    tex = "\n".join(p.read_text() for p in written if p.suffix == ".tex")
    assert r"\$\textbackslash{}foo\$ \{\_\} \% \& \# \textasciicircum{} \textasciitilde{}" in tex
    assert r"$\foo$" not in tex and "{_}" not in tex
    assert "javascript:document.title='pwned'" in tex  # (no special of LaTeX's in it: as it is)
    # A label that a spreadsheet would run as a formula reaches every CSV defused, and no cell starts as one.
    import csv

    cells = [c for p in written if p.suffix == ".csv" for row in csv.reader(p.open()) for c in row]
    assert any(c.startswith("'=HYPERLINK(") for c in cells)
    assert not [c for c in cells if c.startswith(("=", "+", "@")) or c.startswith("-") and not c[1:2].isdigit()]
    # What it prints of the store's labels is shown, never obeyed by the terminal.
    assert not any(c in out.stdout for c in "\x1b\x07\r\u202e") and "\\x1b]0;pwned" in out.stdout, out.stdout


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (Debian: apt-get install chromium)")
def test_no_injected_handler_runs_in_headless_chromium(hostile, cli, tmp_path):
    report = tmp_path / "report.html"
    assert cli("report", "--results", str(hostile.root), "--out", str(report)).returncode == 0
    run = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--virtual-time-budget=5000", "--dump-dom", report.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "<title>harness report</title>" in run.stdout  # an injected handler would have set it to "pwned"
    assert "pwned</title>" not in run.stdout


CONTROLS = "\x00\x07\x1b"


def test_control_characters_in_labels_reach_no_terminal_raw(two_method_store, harness, tmp_path):
    """A run label holding NUL, BEL and ESC: matplotlib has no glyph for them and its warning (on stderr, outside
    the harness's own output) quoted them raw; ``tables`` and ``report`` show them escaped, in the figures too."""
    store = two_method_store
    for path in store.runs():
        spec = json.loads((path / "spec.json").read_text())
        spec["config"]["method"]["label"] += "\x00\x07\x1b[2J"
        spec["config"]["attack"]["label"] += "\x1b]0;pwned\x07\u202e"
        Stage("run", {}, path.name, path, store.root).update({"spec.json": json.dumps(spec, indent=2)})
        path.rename(path.with_name(spec_hash(spec)))  # (a run's folder is named by its spec's hash)
    for args in (["tables", "--out", str(tmp_path / "t")], ["report", "--out", str(tmp_path / "r.html")]):
        out = harness(*args, "--results", str(store.root))
        assert out.returncode == 0, out.stderr
        assert not any(c in out.stdout + out.stderr for c in CONTROLS), (out.stdout, out.stderr)
    # Nor the files: LaTeX stops at an ESC, and a bidi override reorders what a reader of the page sees.
    written = [*(tmp_path / "t").rglob("*.tex"), *(tmp_path / "t").rglob("*.csv"), tmp_path / "r.html"]
    tex_and_page = [f for f in written if f.suffix != ".csv"]
    assert tex_and_page and all(not any(c in f.read_text() for c in (*CONTROLS, "\u202e")) for f in tex_and_page)
    assert "\\u202e" in (tmp_path / "r.html").read_text()  # (shown as its escape)


def test_control_characters_in_a_grid_reach_no_terminal_raw(cli, tmp_path):
    """An ESC in the name of a grid's local fine-tuning dataset is shown escaped in the dry run's cell list, as in
    everything the harness prints (its standard output goes through ``printable``)."""
    data = tmp_path / "data\x1b[2J\x07.jsonl"
    data.write_text(json.dumps({"prompt": "Write a function.", "response": "def f(): return 1 " * 30}) + "\n")
    spec = tmp_path / "grid.yaml"
    spec.write_text(
        "preset: tiny\ngroups:\n  g:\n    methods: {gu-kgw: [{}]}\n"
        f"    attacks: {{finetune: [{{dataset: {json.dumps(str(data))}}}]}}\n"
    )
    out = cli("grid", str(spec), "--results", str(tmp_path / "runs"), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert not any(c in out.stdout + out.stderr for c in CONTROLS), (out.stdout, out.stderr)
    assert "finetune(data\\x1b[2J\\x07" in out.stdout


def test_json_nested_too_deeply_in_a_store_is_skipped_not_a_traceback(two_method_store, cli, tmp_path):
    """A run whose published metrics, or manifest, is JSON nested past Python's recursion limit (it verifies: it is
    what the store published) is left out with one warning, as an unreadable run is."""
    store = two_method_store
    deep = "[" * 100_000 + "]" * 100_000
    runs = store.runs()
    for path, name in ((runs[0], "metrics.json"), (runs[1], "manifest.json")):
        Stage("run", {}, path.name, path, store.root).update({name: deep})
    for args in (
        ["tables", "--out", str(tmp_path / "t"), "--no-figures"],
        ["report", "--out", str(tmp_path / "r.html")],
    ):
        out = cli(*args, "--results", str(store.root))
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert runs[0].name not in (tmp_path / "t" / "runs.csv").read_text()


@pytest.mark.parametrize("auc", ["NaN", "7.5", '"high"'])
def test_metrics_edited_with_their_contents_are_left_out_not_shown(two_method_store, harness, tmp_path, auc):
    """A run whose metrics.json was edited and republished (its contents.json rewritten to match, so the store's
    hashes hold) with an AUC that is no share is left out of the tables and the report with one warning naming it,
    never printed as a result nor met as a traceback."""
    store = two_method_store
    run = store.runs()[0]
    text = (run / "metrics.json").read_text()
    edited = json.dumps({**json.loads(text), "auc": "AUC"}).replace('"AUC"', auc)
    Stage("run", {}, run.name, run, store.root).update({"metrics.json": edited})
    for args in (["tables", "--out", str(tmp_path / "t")], ["report", "--out", str(tmp_path / "r.html")]):
        out = harness(*args, "--results", str(store.root))
        assert out.returncode == 0, out.stderr
        warned = [line for line in out.stderr.splitlines() if run.name in line]
        assert len(warned) == 1 and "metrics.json's auc is" in warned[0], out.stderr
    runs = (tmp_path / "t" / "runs.csv").read_text()
    assert run.name not in runs and len(runs.splitlines()) == len(store.runs())  # (a header and the other runs)


def test_scores_edited_with_their_contents_are_one_line(two_method_store, cli, tmp_path):
    store = two_method_store
    run = store.runs()[-1]
    broken = (run / "scores.jsonl").read_text() + "{broken\n"
    Stage("run", {}, run.name, run, store.root).update({"scores.jsonl": broken})
    out = cli("tables", "--out", str(tmp_path / "t"), "--results", str(store.root))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"run {run.name}: scores.jsonl line" in out.stderr and "is not a JSON object" in out.stderr
