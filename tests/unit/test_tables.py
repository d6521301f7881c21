"""Tables and figures are rebuilt from stored runs alone: the paper's layouts and colour rule, stable bytes, missing
cells shown as missing, and no number carried over from another setup."""

import re

import pandas as pd
import pytest

from harness.cli.main import main
from harness.config.errors import HarnessError
from harness.config.presets import TINY
from harness.config.registry import methods
from harness.config.settings import apply_overrides
from harness.report import collect, frames, latex, tables
from harness.store.stages import Store
from methods.pro import PRO


@pytest.fixture(scope="module")
def store(tmp_path_factory, fake_run):
    """A small grid's worth of runs: four methods, several attacks, configurations and an ablation."""
    store = Store(tmp_path_factory.mktemp("tables") / "runs")
    for method, auc in (("gu-kth", 0.95), ("gu-kgw", 0.99), ("gloaguen-kgw", 0.99), ("pro", 0.995)):
        fake_run(store, method, {}, "base", {}, 0.5)
        fake_run(store, method, {}, "none", {}, auc)
        fake_run(store, method, {}, "gptq", {"bits": 8}, auc - 0.01)
        fake_run(store, method, {}, "finetune", {"steps": "9,18"}, 0.75, output=0)
        fake_run(store, method, {}, "finetune", {"steps": "9,18"}, 0.6 if method != "pro" else 0.8, output=1)
        fake_run(store, method, {}, "dipper", {"lexical": 60, "order": 0}, 0.7)
        if method != "pro":  # PRO's merged cell is missing
            fake_run(store, method, {}, "slerp", {"t": 0.5}, 0.75)
    fake_run(store, "gu-kgw", {"k": 0, "delta": 1}, "none", {}, 0.9)
    for alpha in (0, 0.05):
        fake_run(store, "pro", {"alpha": alpha}, "none", {}, 0.98)
        fake_run(store, "pro", {"alpha": alpha}, "slerp", {"t": 0.5}, 0.8)
    fake_run(store, "pro", {"beta": 10}, "none", {}, 0.97)
    fake_run(store, "pro", {"delta": 0.5}, "none", {}, 0.9)
    return store


def test_tables_are_byte_identical_when_rebuilt_and_show_missing_cells(store, tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert main(["tables", "--results", str(store.root), "--out", str(out), "--ci"]) == 0
    files = sorted(p.relative_to(outs[0]) for p in outs[0].rglob("*") if p.is_file())
    names = {p.name for p in files}
    for table in ("robustness", "fpr_tpr", "dipper", "ft_steps", "ablation", "embedding", "watermark_config"):
        assert {f"{table}.csv", f"{table}.tex"} <= names, table
    for figure in ("auc_ppl", "roc", "auc_vs_slerp", "auc_vs_finetune", "green_ratio"):
        assert {f"{figure}.png", f"{figure}.pdf"} <= names, figure
    for rel in files:
        assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel
        if rel.suffix == ".pdf":
            assert b"/CreationDate" not in (outs[0] / rel).read_bytes(), rel  # no time stamp in the figures
    csv = (outs[0] / "tiny" / "robustness.csv").read_text().splitlines()
    merged = next(line for line in csv if line.startswith("Merging,SLERP,t=0.5"))
    assert merged.endswith("missing,missing,missing,missing,missing")  # PRO's cell (AUC, TPR@5, PPL, CI) is missing
    tex = (outs[0] / "tiny" / "robustness.tex").read_text()
    assert "-- & -- & --" in tex


def test_robustness_layout_and_colour_rule(store):
    df = collect.collect(store)
    table = frames.robustness(df)
    assert list(dict.fromkeys(table.columns.get_level_values(0))) == ["Gu-KTH", "Gu-KGW", "Gloaguen-KGW", "PRO"]
    assert [r[0] for r in table.index] == ["Unaltered", "Quantization", "Merging", "Finetuning", "Finetuning"]
    assert [r[2] for r in table.index][-2:] == ["s=9", "s=18"]
    assert "Paraphrase" not in table.index.get_level_values(0)  # DIPPER has its own table
    tex = latex.robustness_tex(table, "caption")
    for value in table.xs("AUC", axis=1, level=1).stack().dropna():
        assert f"\\cellcolor{{{latex.colour(value)}!25}}${value:.3f}$" in tex
    assert latex.colour(0.8) == "green" and latex.colour(0.7) == "yellow" and latex.colour(0.6999) == "red"


def test_each_table_takes_the_configurations_it_varies(store):
    df = collect.collect(store)
    # The main configurations only, in tab:robustness and tab:fpr_tpr.
    assert len(frames.fpr_tpr(df)) == 4
    config = frames.watermark_config(df)
    assert list(config.loc["Gu-KGW"].index) == ["k=0, delta=1", "k=1, delta=2"]
    assert list(config.loc["PRO"].index) == ["delta=0.5, n=1, alpha=0.005, beta=5", "delta=1, n=1, alpha=0.005, beta=5"]
    ablation_spec, embedding_spec = PRO.ablations
    ablation = frames.ablation(df, "PRO", ablation_spec)
    assert list(ablation.loc["alpha"].index) == [0, 0.005, 0.05]
    assert list(ablation.loc["beta"].index) == [5, 10]
    assert ablation.loc[("alpha", 0.005), "main"] and not ablation.loc[("alpha", 0), "main"]
    assert ablation["Merge AUC"].isna().tolist() == [False, True, False, True, True]  # the main PRO was not merged
    steps = frames.ft_steps(df, "PRO")
    assert steps["baseline"].iloc[0] != "PRO"
    assert steps.loc[(steps.index[1]), "AUC vs baseline"] > 0
    assert len(frames.own(df, "dipper")) == 4 and len(frames.variants(df, "PRO", embedding_spec)) == 1
    assert frames.own(df, "dipper").notna().all().all()  # AUC and how much was rewritten and kept, for every method


@pytest.mark.parametrize("method", methods.ordered())
def test_fake_runs_hold_rows_that_the_real_detector_wrote(method, fake_run, detector_rows, tmp_path):
    """The runs these tests read (tests/conftest.py ``_fake_run``) are made of per-text rows that the method's own
    detector wrote for random texts, each as written, drawn so that the AUC is about the one asked for; every
    registered method has them."""
    import json

    params = json.dumps(methods.build(method, {}, TINY).params.model_dump(), sort_keys=True)
    written = [json.dumps(row, sort_keys=True) for row in detector_rows(method, params, 32, 64)]
    for auc in (0.5, 0.9):
        run = fake_run(Store(tmp_path / "runs"), method, {}, "none", {}, auc)
        stored = [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()]
        for row in stored:
            row = {k: v for k, v in row.items() if k not in ("i", "label", "ppl", "ppl_retokenized")}  # the run adds
            assert json.dumps(row, sort_keys=True) in written, row
        assert json.loads((run / "metrics.json").read_text())["auc"] == pytest.approx(auc, abs=0.12)


def test_another_setup_gets_its_own_tables(fake_run, tmp_path):
    store = Store(tmp_path / "runs")
    fake_run(store, "pro", {}, "none", {}, 0.99)
    other = apply_overrides(TINY, {"eval.new_tokens": "32"})
    fake_run(store, "pro", {}, "slerp", {"t": 0.5}, 0.9, preset=other)
    df = collect.collect(store)
    parts = collect.setups(df)
    assert len(parts) == 2
    for part in parts.values():
        assert part["setup"].nunique() == 1
    assert sorted(parts) == sorted(f"tiny-{key}" for key in df["setup"].unique())
    main_setup = next(p for p in parts.values() if (p["category"] == "Unaltered").any())
    assert ("Merging", "SLERP", "t=0.5") not in frames.robustness(main_setup).index  # not carried over


def test_seeds_are_averaged(tmp_path, fake_run):
    store = Store(tmp_path / "runs")
    a = fake_run(store, "gu-kgw", {}, "none", {}, 0.9, seed=0)
    b = fake_run(store, "gu-kgw", {}, "none", {}, 0.7, seed=1)
    import json

    aucs = [json.loads((p / "metrics.json").read_text())["auc"] for p in (a, b)]
    table = frames.robustness(collect.collect(store))
    assert table.loc[("Unaltered", "", ""), ("Gu-KGW", "AUC")] == pytest.approx(sum(aucs) / 2)


def test_rescore_recomputes_metrics_from_stored_scores(tmp_path, fake_run, monkeypatch, capsys):
    import json

    from harness.cell import metrics
    from harness.store.stages import Stage

    store = Store(tmp_path / "runs")
    run = fake_run(store, "gu-kgw", {}, "none", {}, 0.9)
    before = json.loads((run / "metrics.json").read_text())
    assert main(["rescore", "--results", str(store.root)]) == 0
    assert "0 of 1 stored runs rescored" in capsys.readouterr().out  # up to date: nothing to do
    monkeypatch.setattr(metrics, "METRICS_VERSION", "999")  # the metric code changed: it now reports TPR at 20% too
    monkeypatch.setattr(metrics, "FPRS", (*metrics.FPRS, 0.2))
    assert main(["rescore", "--results", str(store.root)]) == 0
    assert "1 of 1 stored runs rescored" in capsys.readouterr().out
    after = json.loads((run / "metrics.json").read_text())
    assert after["metrics_version"] == "999" and after["auc"] == before["auc"] and "tpr@0.2" not in before
    assert after["tpr@0.2"] >= after["tpr@0.1"]  # computed anew from the stored scores
    assert Stage("run", {}, run.name, run, store.root).problem() is None  # republished: it still verifies
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["rescored"][-1]["to"] == "999"
    df = collect.collect(store)
    assert list(df["metrics_version"]) == ["999"]
    monkeypatch.setattr(metrics, "METRICS_VERSION", "4")  # an older harness on this store: it takes nothing away
    assert main(["rescore", "--results", str(store.root)]) == 0
    assert "0 of 1 stored runs rescored" in capsys.readouterr().out
    assert json.loads((run / "metrics.json").read_text()) == after


def test_green_ratio_shows_the_methods_that_count_green_tokens(store):
    """One panel per method whose scores count green tokens (the KGW methods), none for KTH's or PRO's."""
    from harness.report import figures

    plt = figures._pyplot()
    fig = figures.green_ratio(collect.collect(store), store, plt)
    assert [ax.get_title() for ax in fig.axes] == ["Gu-KGW", "Gloaguen-KGW"]
    plt.close(fig)


def test_names_read_from_the_store_never_write_outside_the_tables_folder(tmp_path, fake_run):
    """A preset name is checked when given (--set name=../../x is refused), but a store can hold anything: the name
    becomes a plain folder name inside --out."""
    store = Store(tmp_path / "deep" / "er" / "runs")
    fake_run(store, "gu-kgw", {}, "none", {}, 0.9, preset=TINY.model_copy(update={"name": "../../escaped"}))
    out = tmp_path / "deep" / "er" / "tables"
    assert main(["tables", "--results", str(store.root), "--out", str(out), "--no-figures"]) == 0
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "runs" not in p.parts]
    assert written and all(out in p.parents for p in written), written
    (folder,) = [p.name for p in out.iterdir() if p.is_dir()]
    assert re.fullmatch(r"escaped-[0-9a-f]{8}", folder), folder
    with pytest.raises(HarnessError, match="bad setting name: String should match pattern"):
        apply_overrides(TINY, {"name": "../../escaped"})


def test_two_main_configurations_in_one_setup_are_never_averaged(tmp_path, fake_run, caplog):
    """`--set methods.gu-kgw.delta=1.0` makes another "main" configuration in the same setup: tables keep the
    preset's own (delta=2) and say which runs they left out, instead of averaging the two."""
    import json

    store = Store(tmp_path / "runs")
    own = fake_run(store, "gu-kgw", {}, "none", {}, 0.95)
    other = apply_overrides(TINY, {"methods.gu-kgw.delta": "1.0"})
    fake_run(store, "gu-kgw", {}, "none", {}, 0.6, preset=other)
    df = collect.collect(store)
    assert df["main"].sum() == 1 and df["setup"].nunique() == 1  # one setup, one main configuration
    table = frames.robustness(df)
    auc = json.loads((own / "metrics.json").read_text())["auc"]
    assert table.loc[("Unaltered", "", ""), ("Gu-KGW", "AUC")] == auc
    assert "another main configuration (k=1, delta=1) share a setup with tiny's k=1, delta=2" in caplog.text


def test_cells_with_fewer_seeds_are_named_not_averaged_as_if_complete(tmp_path, fake_run, caplog):
    store = Store(tmp_path / "runs")
    for seed in (0, 1):
        fake_run(store, "gu-kgw", {}, "none", {}, 0.9, seed=seed)
    fake_run(store, "gu-kgw", {}, "slerp", {"t": 0.5}, 0.8, seed=0)
    (caption,) = [tex for name, (_, tex) in tables.setup_tables(collect.collect(store), False, None).items()
                  if name == "robustness"]  # fmt: skip
    assert "mean over seeds 0, 1 where stored (1 cells have fewer)" in caption
    assert "Gu-KGW x SLERP t=0.5 (1 of 2)" in caplog.text


def test_tables_into_an_unwritable_folder_are_one_line(tmp_path, fake_run, cli):
    store = Store(tmp_path / "runs")
    fake_run(store, "gu-kgw", {}, "none", {}, 0.9)
    (tmp_path / "file").write_text("")
    out = cli("tables", "--results", str(store.root), "--out", str(tmp_path / "file" / "tables"))
    assert out.returncode == 2 and out.stderr.strip().endswith("is not writable: '" + str(tmp_path / "file")
                                                                + "' is a file"), out.stderr  # fmt: skip


def test_tables_reports_and_exports_never_write_into_the_store_they_read(tmp_path, fake_run, cli):
    """The store's root, a run folder or its stages as --out (or an export's destination inside the store) are one
    line, and nothing is written there; a page beside the runs, or a folder beside the store, is fine. An empty path
    (an unset variable in "--out $DIR") is refused rather than read as this folder."""
    store = Store(tmp_path / "runs")
    fake_run(store, "gu-kgw", {}, "none", {}, 0.9)
    (run,) = store.runs()
    before = sorted(p.relative_to(store.root) for p in store.root.rglob("*"))
    refused = [
        ("tables", "--out", str(store.root)),
        ("tables", "--out", str(run)),
        ("tables", "--out", str(run / "tables")),
        ("tables", "--out", str(store.root / "stages" / "tables")),
        ("report", "--out", str(run / "report.html")),
        ("export", str(store.root / "copy")),
        ("export", str(run)),
        ("tables", "--out", ""),
        ("export", ""),
    ]
    for args in refused:
        out = cli(*args, "--results", str(store.root))
        assert out.returncode == 2 and out.stderr.count("\n") == 1, (args, out.stderr)
    assert sorted(p.relative_to(store.root) for p in store.root.rglob("*")) == before
    assert cli("report", "--out", str(store.root / "report.html"), "--results", str(store.root)).returncode == 0
    assert cli("tables", "--out", str(tmp_path / "tables"), "--results", str(store.root)).returncode == 0


def test_a_setup_the_store_no_longer_has_leaves_no_tables_behind(tmp_path, fake_run, cli):
    """When a second setup turns `tiny/` into `tiny-<hash>/`, the old folder does not stay in --out as if current;
    files that harness tables did not write are left alone."""
    store, out = Store(tmp_path / "runs"), tmp_path / "tables"
    fake_run(store, "gu-kgw", {}, "none", {}, 0.9)
    assert cli("tables", "--results", str(store.root), "--out", str(out), "--no-figures").returncode == 0
    (out / "tiny" / "my-notes.txt").write_text("mine")
    fake_run(store, "gu-kgw", {}, "none", {}, 0.9, preset=apply_overrides(TINY, {"eval.new_tokens": "32"}))
    again = cli("tables", "--results", str(store.root), "--out", str(out), "--no-figures")
    assert again.returncode == 0 and "removed" in again.stdout
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["tiny", *sorted(
        f"tiny-{key}" for key in collect.collect(store)["setup"].unique())]  # fmt: skip
    assert [p.name for p in (out / "tiny").iterdir()] == ["my-notes.txt"]  # only what the user put there


def test_rescore_rescores_the_rest_and_names_a_damaged_run(tmp_path, fake_run, cli, monkeypatch):
    import json

    from harness.cell import metrics

    store = Store(tmp_path / "runs")
    good = fake_run(store, "gu-kgw", {}, "none", {}, 0.9)
    bad = fake_run(store, "pro", {}, "none", {}, 0.9)
    (bad / "metrics.json").write_text("{")  # damaged: truncated
    monkeypatch.setattr(metrics, "METRICS_VERSION", "999")
    out = cli("rescore", "--results", str(store.root))
    assert out.returncode == 2 and "1 of 2 stored runs rescored" in out.stdout, out.stdout
    assert "1 runs could not be rescored and were left as they are" in out.stderr and str(bad) in out.stderr
    assert json.loads((good / "metrics.json").read_text())["metrics_version"] == "999"


def test_an_ablation_holds_only_the_setups_main_configuration_and_its_variations(tmp_path, fake_run):
    """PRO with `--set methods.pro.fpl=false` keeps the preset's alpha and beta: it is another main configuration,
    not a point of the alpha/beta ablation of the preset's PRO (it differs in fpl), and is never averaged into it;
    a run that changes alpha alone is one."""
    store = Store(tmp_path / "runs")
    cawp = apply_overrides(TINY, {"methods.pro.fpl": "false"})
    for preset, auc, merged in ((TINY, 0.95, 0.85), (cawp, 0.6, 0.55)):
        fake_run(store, "pro", {}, "none", {}, auc, preset=preset)
        fake_run(store, "pro", {}, "slerp", {"t": 0.5}, merged, preset=preset)
    fake_run(store, "pro", {"alpha": 0.05}, "none", {}, 0.7)
    df = collect.collect(store)
    table = frames.ablation(df, "PRO", PRO.ablations[0])
    main = df[df["main"] & (df["attack_name"] == "none")]
    assert table.loc[("alpha", 0.005), "AUC"] == pytest.approx(main["AUC"].iloc[0], abs=1e-12)
    assert table.loc[("alpha", 0.005), "AUC"] > 0.8 and table.loc[("alpha", 0.005), "Merge AUC"] > 0.7
    assert table.loc[("alpha", 0.05), "AUC"] == pytest.approx(
        df[df["params"].str.contains('"alpha": 0.05')]["AUC"].iloc[0]
    )
    assert set(table.index) == {("alpha", 0.005), ("alpha", 0.05), ("beta", 5.0)}


def test_every_table_name_a_plugin_may_join_is_declared_once():
    """The names plugins join tables by (harness/config, checked as each plugin class is defined) and the tables the
    report declares agree: none a plugin may name is missing, none declared is unreachable."""
    assert len({t.name for t in tables.TABLES}) == len(tables.TABLES)
    assert {t.joined_by for t in tables.TABLES} - {None} == set(tables.JOINED_BY)
    for field, names in tables.JOINED_BY.items():
        assert {t.name for t in tables.TABLES if t.joined_by == field} == set(names), field
    for table in tables.TABLES:  # the module's docstring lists every declaration
        assert f"{table.label} ({table.name}): " in tables.__doc__


VALID_TABLES = "valid tables: robustness, ft_steps, own, curve, flagged"


def test_an_attack_or_ablation_that_names_an_unknown_table_is_an_error_naming_the_valid_ones():
    from harness.contract.attack import ModelAttack, TextAttack
    from harness.contract.plugin import Ablation

    valid = VALID_TABLES
    with pytest.raises(HarnessError, match=rf"attack class .*<locals>\.Typo: unknown table 'robustnes'; {valid}$"):

        class Typo(ModelAttack):
            tables = ("robustness", "robustnes")

    with pytest.raises(HarnessError, match=r"its tables must be a tuple of names, e\.g\. \('own',\), not 'own'"):

        class OneName(TextAttack):
            tables = "own"

    with pytest.raises(HarnessError, match=r"ablation 'grid': unknown layout 'diagonal'; valid layouts: horizontal, "):
        Ablation("grid", ("alpha",), "caption", "diagonal")


def test_an_outside_plugin_with_an_unknown_table_fails_where_it_is_loaded(tmp_path, monkeypatch):
    """An attack registered through the entry points fails when the registry loads it (a run, the tables) instead of
    its rows going to no table."""
    from harness.config import registry

    (tmp_path / "typo_plugin.py").write_text(
        "from harness.contract.attack import ModelAttack\n\n\nclass Typo(ModelAttack):\n    name = 'typo-tables'\n"
        "    category = 'Other'\n    label = 'Typo'\n    tables = ('robustnes',)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_installed", lambda group: (("typo-tables", "typo_plugin:Typo"),) * (
        group == "harness.attacks"))  # fmt: skip
    for load in (registry.attacks.load, lambda name: collect.plugin_class("attack", name)):
        with pytest.raises(HarnessError, match=f"unknown table 'robustnes'; {VALID_TABLES}"):
            load("typo-tables")


def test_an_attack_declares_a_table_of_its_own(store, tmp_path, monkeypatch):
    """A SettingTable on an attack's class (here SLERP's) is written as <attack>_<name>: a row per setting after the
    unaltered model's (or the base's), each named runs.csv column per method's main configuration, equal to the
    runs' own numbers; a method's own column that its runs lack is missing; a name that is no column is one line."""
    from attacks.merge import Slerp
    from harness.contract.plugin import SettingTable

    declared = (SettingTable("by_t", "AUC and TPR at each t", ("AUC", "TPR@1%", "gu-kgw.green")),
                SettingTable("vs_base", "AUC from the base's own texts", ("AUC",), first="base"))  # fmt: skip
    monkeypatch.setattr(Slerp, "setting_tables", declared)
    out = tmp_path / "tables"
    assert main(["tables", "--results", str(store.root), "--out", str(out)]) == 0
    by_t = pd.read_csv(out / "tiny" / "slerp_by_t.csv", index_col=0, na_values=["missing"])
    assert list(by_t.index) == ["unaltered", "t=0.5"]
    assert [c for c in by_t.columns if c.endswith(" AUC")] == ["Gu-KTH AUC", "Gu-KGW AUC", "Gloaguen-KGW AUC"]
    df = collect.collect(store)
    mains = df[df["main"] & (df["method"] == "Gu-KGW")]
    for row, attack in (("unaltered", "none"), ("t=0.5", "slerp")):
        auc = mains.loc[mains["attack_name"] == attack, "AUC"].iloc[0]
        assert by_t.loc[row, "Gu-KGW AUC"] == pytest.approx(auc, abs=1e-4)  # (as the CSV rounds it)
    assert by_t["Gu-KGW gu-kgw.green"].isna().all()  # no method here writes that column
    vs_base = pd.read_csv(out / "tiny" / "slerp_vs_base.csv", index_col=0)
    assert list(vs_base.index) == ["the base's own texts", "t=0.5"]
    assert "AUC and TPR at each t (" in (out / "tiny" / "slerp_by_t.tex").read_text()
    with pytest.raises(HarnessError, match=r"setting table 'typo': 'AUCC' is no column of runs\.csv it can show"):
        SettingTable("typo", "c", ("AUCC",))  # (refused when the class is defined, before any work)
    from harness.contract.plugin import RUN_METRICS

    assert set(RUN_METRICS) <= set(df.columns)  # (each name it may show is one runs.csv has)


@pytest.mark.parametrize(
    "make, message",
    [(lambda T: T("a b", "c", ("AUC",)), "its name is a plain name"),
     (lambda T: T("t", "c", "AUC"), "its values are a non-empty tuple"),
     (lambda T: T("t", "c", ()), "its values are a non-empty tuple"),
     (lambda T: T("flagged", "c", ("AUC",)), "its name is a built-in table's"),
     (lambda T: T("t", "c", ("AUC",), first="middle"), "its first row is one of 'unaltered', 'base', None")],
)  # fmt: skip
def test_a_bad_setting_table_is_one_line(make, message):
    from harness.contract.attack import ModelAttack
    from harness.contract.plugin import SettingTable

    with pytest.raises(HarnessError, match=message):
        make(SettingTable)
    with pytest.raises(HarnessError, match=r"Twice: two of its setting_tables share a name \(t, t\)"):

        class Twice(ModelAttack):
            setting_tables = (SettingTable("t", "c", ("AUC",)), SettingTable("t", "d", ("PPL",)))

    with pytest.raises(HarnessError, match="its setting_tables must be a tuple of SettingTable"):

        class Bare(ModelAttack):
            setting_tables = SettingTable("t", "c", ("AUC",))


def test_a_method_added_later_is_its_presets_main_configuration():
    """Runs of a method added after the first stored results hold no preset settings for it in their spec
    (``Preset.hashed``): its main configuration is the named preset's, so its column is in the tables."""
    from harness.config.presets import TINY
    from harness.report.collect import only, preset_settings

    stored = TINY.hashed()
    assert "gaussmark" not in stored["methods"] and "gu-kgw" in stored["methods"]
    settings = preset_settings("tiny", stored, "gaussmark")
    assert settings == TINY.model_dump()["methods"]["gaussmark"] and settings
    assert preset_settings("tiny", stored, "gu-kgw") == stored["methods"]["gu-kgw"]
    assert preset_settings("no-such-preset", stored, "gaussmark") == {}
    params = methods_params("gaussmark", settings)
    assert only("gaussmark", params, settings, ()) and not only("gaussmark", {**params, "sigma": 0.5}, settings, ())


def methods_params(name: str, settings: dict) -> dict:
    from harness.config.registry import methods

    return methods.build(name, settings).params.model_dump(mode="json")


def test_a_decoding_time_method_says_not_applicable_under_attacks_that_change_weights(tmp_path, fake_run, cli):
    """A decoding-time watermark is not in the weights: under SLERP its cells say n/a, in the CSV, the LaTeX and the
    report (with why), not "missing", which would say a run was not made; a text attack's cell stays what it is."""
    import csv

    from harness.store.stages import Store

    store = Store(tmp_path / "runs")
    fake_run(store, "gu-kgw", {}, "none", {}, 0.95)
    fake_run(store, "gu-kgw", {}, "slerp", {"t": 0.5}, 0.7)
    fake_run(store, "kgw-decoding", {}, "none", {}, 0.99)
    assert cli("tables", "--results", str(store.root), "--out", str(tmp_path / "t")).returncode == 0
    rows = list(csv.reader(next((tmp_path / "t").rglob("robustness.csv")).open()))
    column = rows[0].index("KGW (decoding-time)")
    by_attack = {row[1] or "unaltered": row[column : column + 3] for row in rows[3:]}
    assert by_attack["SLERP"] == ["n/a"] * 3, by_attack  # AUC, TPR@5, PPL
    assert float(by_attack["unaltered"][0]) > 0.5 and "." in by_attack["unaltered"][0], by_attack  # a number, %.6g
    tex = next((tmp_path / "t").rglob("robustness.tex")).read_text()
    assert "n/a" in tex and "say n/a" in tex
    report = tmp_path / "report.html"
    assert cli("report", "--results", str(store.root), "--out", str(report)).returncode == 0
    page = report.read_text()
    assert ">n/a</td>" in page and "watermarks at decoding time, not in the weights" in page


def test_edited_rows_and_the_unaltered_row_show_ppl_on_the_same_footing(fake_run, tmp_path):
    """A text attack's rows measure PPL on their texts tokenized again; where a table holds them beside model rows
    (measured on the sampled ids) every row shows its PPL on the text tokenized again, and the attack's own table
    gives the unaltered texts' PPL on that footing."""
    store = Store(tmp_path / "runs")
    fake_run(store, "gu-kgw", {}, "none", {}, 0.95)
    fake_run(store, "gu-kgw", {}, "slerp", {"t": 0.5}, 0.8)
    fake_run(store, "gu-kgw", {}, "typo", {"p": 0.1}, 0.9)
    df = collect.collect(store)
    by_row = df.set_index("attack_config")
    assert by_row.loc["", "PPL_retokenized"] != by_row.loc["", "PPL"]  # the unaltered row: both footings stored
    assert by_row.loc["p=0.1", "PPL_retokenized"] == by_row.loc["p=0.1", "PPL"]  # the edit's: its one PPL
    model_rows = frames.robustness(df)[("Gu-KGW", "PPL")]  # one footing: the sampled ids'
    assert model_rows.to_dict() == {(r.category, r.attack, r.attack_config): r.PPL for r in df.itertuples()
                                    if r.attack_name != "typo"}  # fmt: skip
    assert frames.ppl_note(df) == ""
    page = frames.robustness(df, every_row=True)[("Gu-KGW", "PPL")]  # the edit's row too: all re-tokenized
    assert page.to_dict() == {(r.category, r.attack, r.attack_config): r.PPL_retokenized for r in df.itertuples()}
    assert "tokenized again" in frames.ppl_note(df, every_row=True)
    own = frames.own(df, "typo")
    assert own.loc["Gu-KGW", ("unaltered", "PPL")] == by_row.loc["", "PPL_retokenized"]
    assert own.loc["Gu-KGW", ("p=0.1", "PPL")] == by_row.loc["p=0.1", "PPL"]
    assert "unaltered" not in latex.own_tex(own, "caption", "Typos")  # the LaTeX shows the AUCs


def _stored(run) -> tuple[list, list]:
    """A run's stored scores read with json alone, by prompt index: (generated, human)."""
    import json

    rows = [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines() if line]
    by = {label: dict(sorted((r["i"], r["score"]) for r in rows if r["label"] == label)) for label in (0, 1)}
    return list(by[1].values()), list(by[0].values())


def test_two_seeds_give_spreads_and_paired_comparisons_recomputed_from_stored_scores(
    tmp_path, fake_run, caplog, monkeypatch
):
    """Two training seeds of Gu-KGW and PRO, unaltered and under SLERP: tab:robustness and tab:fpr_tpr show each
    cell's mean with its t-interval over seeds; tab:comparison's paired intervals are recomputed here from the stored
    per-text scores with plain numpy and sklearn; a run on other prompts is not compared, and says why."""
    import numpy as np
    from scipy.stats import t
    from sklearn.metrics import roc_auc_score, roc_curve

    store = Store(tmp_path / "runs")
    runs = {}
    for seed in (0, 1):
        for method, auc in (("gu-kgw", 0.97), ("pro", 0.9)):
            runs[(method, "none", seed)] = fake_run(store, method, {}, "none", {}, auc - 0.03 * seed, seed=seed)
            runs[(method, "slerp", seed)] = fake_run(store, method, {}, "slerp", {"t": 0.5}, auc - 0.2, seed=seed)
    fake_run(store, "gloaguen-kgw", {}, "none", {}, 0.99, seed=0, prompts=1)  # other prompts: not paired with the rest
    df = collect.collect(store)

    def t_interval(values, within=(-1, 1)):
        half = t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / np.sqrt(len(values))
        return [max(within[0], np.mean(values) - half), min(within[1], np.mean(values) + half)]

    table = frames.robustness(df, ci=True)
    cell = table.loc[("Unaltered", "", ""), "PRO"]
    aucs = [df[df["run"] == runs[("pro", "none", s)].name]["AUC"].iloc[0] for s in (0, 1)]
    assert cell["seeds"] == 2 and cell["AUC"] == pytest.approx(np.mean(aucs))
    assert [cell["AUC_seed_lo"], cell["AUC_seed_hi"]] == pytest.approx(t_interval(aucs, (0, 1)))
    assert table.loc[("Unaltered", "", ""), ("Gloaguen-KGW", "seeds")] == 1
    assert np.isnan(table.loc[("Unaltered", "", ""), ("Gloaguen-KGW", "AUC_seed_lo")])  # one seed: no spread
    rates = frames.fpr_tpr(df)
    tprs = [df[df["run"] == runs[("pro", "none", s)].name]["TPR@1%"].iloc[0] for s in (0, 1)]
    spread = [rates.loc["PRO", "TPR@1%_seed_lo"], rates.loc["PRO", "TPR@1%_seed_hi"]]
    assert spread == pytest.approx(t_interval(tprs, (0, 1)))

    monkeypatch.setattr(frames, "COMPARISON_DRAWS", 200)  # (fewer draws to recompute one at a time below)
    compared = frames.comparison(df, store)
    row = compared.loc[("Merging", "SLERP", "t=0.5", "Gu-KGW", "PRO")]
    scores = {s: [*_stored(runs[("gu-kgw", "slerp", s)]), *_stored(runs[("pro", "slerp", s)])] for s in (0, 1)}
    n = len(scores[0][0])
    draws = np.vstack([np.arange(n), np.random.default_rng(0).integers(0, n, size=(200, n))])
    labels = np.r_[np.ones(n), np.zeros(n)]

    def auc_tpr(pos, neg):
        fp, tp, _ = roc_curve(labels, np.r_[pos, neg], drop_intermediate=False)
        return roc_auc_score(labels, np.r_[pos, neg]), tp[fp <= 0.01].max()

    # draws x seeds x (AUC, TPR) differences
    diffs = np.array([[np.subtract(auc_tpr(np.take(pa, d), np.take(na, d)), auc_tpr(np.take(pb, d), np.take(nb, d)))
                       for pa, na, pb, nb in scores.values()] for d in draws])  # fmt: skip
    mean = diffs.mean(axis=1)
    for k, name in enumerate(("AUC", "TPR@1%")):
        assert row[f"d{name}"] == pytest.approx(mean[0, k], abs=1e-9)
        assert [row[f"d{name}_lo"], row[f"d{name}_hi"]] == pytest.approx(np.percentile(mean[1:, k], [2.5, 97.5]))
        assert [row[f"d{name}_seed_lo"], row[f"d{name}_seed_hi"]] == pytest.approx(t_interval(diffs[0, :, k]))
        shown = [row[f"d{name}_lo"], row[f"d{name}_hi"], row[f"d{name}_seed_lo"], row[f"d{name}_seed_hi"]]
        assert row[f"{name}_excludes_0"] == (min(shown) > 0 or max(shown) < 0)
    assert row["seeds"] == 2 and row["paired_on"] == "evaluation spec" and row["note"] == ""
    other = compared.loc[("Unaltered", "", "", "Gloaguen-KGW", "PRO")]
    assert other["note"].startswith("not compared: ") and "continue different prompts" in other["note"]
    assert np.isnan(other["dAUC"]) and "tab:comparison, Gloaguen-KGW vs PRO (unaltered)" in caplog.text

    out = tmp_path / "tables"
    assert main(["tables", "--results", str(store.root), "--out", str(out), "--no-figures"]) == 0
    csv = (out / "tiny" / "comparison.csv").read_text()
    assert csv.startswith("category,attack,setting,A,B,seeds,dAUC,dAUC_lo,dAUC_hi,dAUC_seed_lo,dAUC_seed_hi,")
    tex = (out / "tiny" / "comparison.tex").read_text()
    assert f"{row['dAUC']:+.3f} [{row['dAUC_lo']:+.3f}, {row['dAUC_hi']:+.3f}] seeds" in tex
    assert "t-intervals over training seeds" in tex


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.7, 7.5, "high", [1, 2], True, None])
def test_metrics_that_are_no_share_are_refused_with_the_reason(value):
    from harness.report.collect import checked_metrics

    good = {"auc": 0.9, "auc_ci95": [0.8, 0.95], "n_pos": 10, "n_neg": 10, "median_ppl": float("nan")}
    assert checked_metrics(good) is good  # (a perplexity no text could be read for is NaN)
    if value is None:
        assert checked_metrics({**good, "auc": None})["auc"] is None  # absent: the table says missing
        return
    with pytest.raises(ValueError, match="metrics.json's auc is"):
        checked_metrics({**good, "auc": value})
    with pytest.raises(ValueError, match="not a mapping"):
        checked_metrics([good])
