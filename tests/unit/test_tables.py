"""Tables are rebuilt from stored runs alone, in the paper's layout and colour rule."""

from harness.store import Store
from harness.tables import collect, robustness, to_latex, write_tables


def test_robustness_layout_and_colours(tmp_path, fake_run):
    store = Store(tmp_path / "runs")
    fake_run(store, "k=1, delta=2", "Unaltered", "", "", 0.99)
    fake_run(store, "k=1, delta=2", "Merging", "SLERP", "t=0.5", 0.75)
    fake_run(store, "k=0, delta=1", "Merging", "SLERP", "t=0.5", 0.65)
    fake_run(store, "k=0, delta=1", "Reference", "No watermark", "base model", 0.5)
    fake_run(store, "k=0, delta=1", "Finetuning", "OpenMathInstruct", "s=1200", 0.6)
    fake_run(store, "k=0, delta=1", "Finetuning", "OpenMathInstruct", "s=300", 0.7)
    table = robustness(collect(store))
    assert list(table.index.get_level_values("category")) == [
        "Reference",
        "Unaltered",
        "Merging",
        "Finetuning",
        "Finetuning",
    ]
    assert list(table.index.get_level_values("attack_config"))[-2:] == ["s=300", "s=1200"]
    assert table.loc[("Merging", "SLERP", "t=0.5"), ("Gu-KGW (k=1, delta=2)", "AUC")] == 0.75
    assert table.loc[("Merging", "SLERP", "t=0.5"), ("Gu-KGW (k=0, delta=1)", "AUC")] == 0.65
    tex = to_latex(table, "caption")
    assert r"\cellcolor{green!25}$0.990$" in tex  # >= 0.8
    assert r"\cellcolor{yellow!25}$0.750$" in tex  # in between
    assert r"\cellcolor{red!25}$0.650$" in tex  # < 0.7
    assert "--" in tex  # a cell with no run
    written = write_tables(collect(store), tmp_path / "tables")
    assert sorted(p.name for p in written) == ["robustness-tiny.csv", "robustness-tiny.tex", "runs.csv"]
