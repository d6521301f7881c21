"""A grid's calibration section (matched quality: each method's strength picked on the unaltered model by a rule
written in the spec) is validated whole before anything runs, each refusal one line naming the spec's line; the
rule itself picks as stated."""

import textwrap

import pytest

from harness.cli.main import main
from harness.config.errors import HarnessError
from harness.grid import calibration
from harness.grid import spec as grid

HEAD = "preset: tiny\ncalibration:\n  ppl_ratio_max: {budget}\n  pick: {pick}\n  sweep:\n"
GROUPS = "groups:\n  matched:\n    methods: {{{method}: [calibrated]}}\n"


def spec(tmp_path, sweep="    gu-kgw: {delta: [1, 2, 4]}\n", budget="1.25", pick="AUC_vs_base", method="gu-kgw"):
    path = tmp_path / "grid.yaml"
    path.write_text(HEAD.format(budget=budget, pick=pick) + sweep + GROUPS.format(method=method))
    return path


def test_the_sweep_is_every_value_unaltered_and_the_calibrated_entries_wait(tmp_path):
    g = grid.load(spec(tmp_path))
    assert [dict(c.method_settings)["delta"] for c in g.sweep] == [1.0, 2.0, 4.0]
    assert {c.attack for c in g.sweep} == {"none"} and not g.cells and g.waiting == ("matched: gu-kgw",)
    chosen = grid.with_choice(g, {"gu-kgw": dict(g.sweep[0].method_settings)})
    assert [c.name() for c in chosen.cells] == [g.sweep[0].name()] and not chosen.waiting


@pytest.mark.parametrize(
    "kwargs, line, words",
    [
        ({"sweep": "    gu-kgw: {delta: [2]}\n"}, 6, "needs at least two values"),
        ({"sweep": "    gu-kgw: {delta: [2, 2.0]}\n"}, 6, "delta=2.0 is swept twice"),
        ({"sweep": "    gu-kgw: {delta: [1, 2], k: [0, 1]}\n"}, 6, "sweep one setting of gu-kgw, not 2"),
        ({"sweep": "    gu-kgw: {strength: [1, 2]}\n"}, 6, "bad settings for method 'gu-kgw'"),
        ({"sweep": "    gu-kgw: {delta: [1, -2]}\n"}, 6, "bad settings for method 'gu-kgw'"),
        ({"sweep": "    gu-kgx: {delta: [1, 2]}\n"}, 6, "unknown method 'gu-kgx'"),
        ({"budget": ".inf"}, 3, "ppl_ratio_max"),
        ({"budget": ".nan"}, 3, "ppl_ratio_max"),
        ({"budget": "0.8"}, 3, "ppl_ratio_max"),
        ({"pick": "PPL"}, 4, "pick"),
        ({"method": "pro"}, 9, "'calibrated' needs a calibration section that sweeps pro"),
        ({"budget": "true"}, 3, "ppl_ratio_max: .*a number, not true or false"),
        ({"sweep": "    pro: {policy_hidden: [100, 200]}\n", "method": "pro"}, 6, "two cells would be one row"),
        (
            {"sweep": "    gu-kgw: {delta: [1, 2]}\n    pro: {delta: [0.5, 1]}\n"},
            7,
            "the calibration sweeps pro, but no group runs pro: \\[calibrated\\]",
        ),
    ],
)
def test_a_calibration_that_cannot_be_run_is_one_line_before_any_work(tmp_path, capsys, kwargs, line, words):
    path = spec(tmp_path, **kwargs)
    with pytest.raises(HarnessError, match=words) as err:
        grid.load(path)
    assert str(err.value).startswith(f"{path}:{line}:"), str(err.value)
    assert main(["grid", str(path), "--results", str(tmp_path / "runs")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_a_group_chosen_alone_keeps_the_sweeps_of_its_own_calibrated_methods(tmp_path):
    """``harness grid --group``: a group that runs no calibrated method runs no sweep; one that does keeps its
    methods' sweeps (each method's choice is a stage of its own, so it is the same choice)."""
    path = tmp_path / "grid.yaml"
    path.write_text(HEAD.format(budget="1.25", pick="AUC_vs_base") + "    gu-kgw: {delta: [1, 2]}\n"
                    "    pro: {delta: [0.5, 1]}\ngroups:\n  matched:\n"
                    "    methods: {gu-kgw: [calibrated], pro: [calibrated]}\n"
                    "  plain:\n    methods: {gu-kth: [{}]}\n")  # fmt: skip
    whole = grid.load(path)
    assert {c.method for c in whole.sweep} == {"gu-kgw", "pro"}
    plain = grid.only_groups(whole, ["plain"])
    assert not plain.sweep and plain.spec.calibration is None and [c.method for c in plain.cells] == ["gu-kth"]
    matched = grid.only_groups(whole, ["matched"])
    assert matched.sweep == whole.sweep and matched.waiting == whole.waiting


def test_calibrated_without_a_calibration_section_is_refused(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(
        textwrap.dedent("""\
        preset: tiny
        groups:
          a:
            methods: {gu-kgw: [calibrated]}
        """)
    )
    with pytest.raises(HarnessError, match=f"{path}:4: 'calibrated' needs a calibration section"):
        grid.load(path)


def rows(values_ratios_picks, quality="ok"):
    return [{"value": v, "settings": {"delta": v}, "PPL_ratio": r, "AUC_vs_base": p, "quality": quality}
            for v, r, p in values_ratios_picks]  # fmt: skip


def test_the_rule_picks_the_strongest_inside_the_budget_and_names_the_closest_when_none_is():
    found = rows([(1, 1.05, 0.90), (2, 1.2, 0.97), (4, 1.6, 0.999)])
    assert calibration.choose("gu-kgw", "delta", [1, 2, 4], found, 1.25, "AUC_vs_base")["value"] == 2
    tie = rows([(1, 1.05, 0.97), (2, 1.2, 0.97)])
    assert calibration.choose("gu-kgw", "delta", [1, 2], tie, 1.25, "AUC_vs_base")["value"] == 1  # the spec's order
    seeds = rows([(1, 1.0, 0.9), (1, 1.1, 0.9), (2, 1.2, 0.99), (2, 1.3, 0.99)])  # delta 2 leaves it on one seed
    assert calibration.choose("gu-kgw", "delta", [1, 2], seeds, 1.25, "AUC_vs_base")["value"] == 1
    with pytest.raises(HarnessError, match=r"the closest, delta=2, reads 1.3x the base's PPL \(ok\)"):
        calibration.choose("gu-kgw", "delta", [2, 4], rows([(2, 1.3, 0.9), (4, 1.9, 0.99)]), 1.25, "AUC_vs_base")
    degenerate = rows([(1, 1.0, 0.99)], quality="degenerate: repeats 0.80 of its 3-grams (bound 0.05)")
    with pytest.raises(HarnessError, match="degenerate: repeats"):  # inside the budget, outside the gate
        calibration.choose("gu-kgw", "delta", [1], degenerate, 1.25, "AUC_vs_base")


def test_over_budget_closest_runs_the_closest_value_inside_the_gate_marked_outside_the_budget():
    """``over_budget: closest``: where no value meets the budget, the smallest worst-seed PPL ratio among the values
    every seed of which passes the gate, with ``within_budget`` false; a value inside the budget is chosen as always;
    where no value passes the gate it is still one line."""
    over = rows([(1, 1.45, 0.44), (2, 1.3, 0.9), (2, 1.4, 0.9), (4, 1.9, 0.99)])  # delta 2's worse seed: 1.4
    chosen = calibration.choose("pro", "delta", [1, 2, 4], over, 1.25, "AUC_vs_base", "closest")
    assert (chosen["value"], chosen["within_budget"], chosen["PPL_ratio"]) == (2, False, 1.4)
    assert "outside the budget (the closest: 1.40x" in calibration.outside(chosen)
    inside = calibration.choose("pro", "delta", [1, 2], rows([(1, 1.1, 0.6), (2, 1.3, 0.9)]), 1.25, "AUC_vs_base",
                                "closest")  # fmt: skip
    assert (inside["value"], inside["within_budget"]) == (1, True) and calibration.outside(inside) == ""
    loops = rows([(1, 1.0, 0.99)], quality="degenerate: repeats 0.80 of its 3-grams (bound 0.05)")
    gated = [*loops, *rows([(2, 1.6, 0.99)], quality="degenerate: PPL 1.6x the base's (bound [0.67, 1.5])")]
    with pytest.raises(HarnessError, match="none passes the gate for over_budget: closest"):
        calibration.choose("pro", "delta", [1, 2], gated, 1.25, "AUC_vs_base", "closest")


def test_over_budget_is_named_in_the_rule_and_refused_when_unknown(tmp_path, capsys):
    path = tmp_path / "g.yaml"
    sweep = "    gu-kgw: {delta: [1, 2]}\n  over_budget: nearest\n"
    path.write_text(HEAD.format(budget=1.25, pick="AUC_vs_base") + sweep + GROUPS.format(method="gu-kgw"))
    with pytest.raises(HarnessError, match="over_budget"):
        grid.load(path)
    path.write_text(path.read_text().replace("nearest", "closest"))
    g = grid.load(path)
    assert "where none does, the value with the smallest PPL ratio" in calibration.describe(
        g.spec.calibration, g.sweep[0].preset.quality_gate)  # fmt: skip
