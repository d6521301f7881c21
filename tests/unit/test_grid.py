"""Grid specs: validated whole before anything runs (errors name the line), expanded into cells that train each
model once, split into deterministic shards."""

import re
import textwrap
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.config.errors import HarnessError
from harness.grid import spec as grid

GRIDS = Path(__file__).resolve().parents[2] / "grids"  # the grid files the project ships
GOOD = """\
preset: tiny
groups:
  robustness:
    methods:
      gu-kgw: [{}]
      pro: [{}]
    attacks:
      none: [{}]
      slerp: [{t: 0.1}, {t: 0.5}]
  configs:
    methods:
      gu-kgw: [{k: 0, delta: 1}, {k: 1, delta: 2}]   # the second is the preset's own: the same cell as above
attribution: robustness
"""


def write(tmp_path, text: str):
    path = tmp_path / "grid.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_cells_are_expanded_deduplicated_and_grouped_by_training(tmp_path):
    g = grid.load(write(tmp_path, GOOD))
    names = [c.name() for c in g.cells]
    assert len(names) == len(set(names)) == 7  # 2 x 3 + the one new configuration
    assert names[:3] == [
        "gu-kgw(k=1, delta=2) x none",
        "gu-kgw(k=1, delta=2) x slerp(t=0.1)",
        "gu-kgw(k=1, delta=2) x slerp(t=0.5)",
    ]
    assert names[-1] == "gu-kgw(k=0, delta=1) x none"
    trainings = [c.training for c in g.cells]
    assert len(set(trainings)) == 3
    # Each training's cells are contiguous: a model is trained once, then all its attacks run.
    assert all(trainings.index(t) + trainings.count(t) - 1 == len(trainings) - 1 - trainings[::-1].index(t)
               for t in set(trainings))  # fmt: skip
    assert [c.method for c in g.attribution] == ["gu-kgw", "pro"]


def test_a_group_runs_alone_and_an_unknown_group_is_one_line(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    g = grid.only_groups(grid.load(path), ["configs"])
    assert [c.name() for c in g.cells] == ["gu-kgw(k=0, delta=1) x none", "gu-kgw(k=1, delta=2) x none"]
    assert g.attribution == ()  # its group is not among them
    both = grid.only_groups(grid.load(path), ["configs", "robustness"])
    assert set(both.cells) == set(grid.load(path).cells) and len(both.attribution) == 2
    assert main(["grid", str(path), "--group", "robust", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no group 'robust' (groups: robustness, configs)" in err and err.count("\n") == 1, err
    assert main(["grid", str(path), "--group", "configs", "--group", "configs", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--group configs is given twice" in err and err.count("\n") == 1, err


def test_cell_names_tell_apart_attacks_that_differ_in_their_table_label(tmp_path):
    spec = GOOD.replace("slerp: [{t: 0.1}, {t: 0.5}]", "merge: [{method: ties}, {method: dare_ties}]")
    names = [c.name() for c in grid.load(write(tmp_path, spec)).cells if c.attack == "merge"]
    assert [n.split(" x ")[1].split(":")[0] for n in names] == ["merge(TIES", "merge(DARE-TIES"] * 2, names


def test_cells_whose_rows_would_read_the_same_are_refused(tmp_path):
    """A setting the row's label does not show (a paraphrase's seed) would make two cells one row of every table:
    refused in one line naming the spec's line; DIPPER's nucleus is shown where it is not 0.75."""
    spec = GOOD.replace("slerp: [{t: 0.1}, {t: 0.5}]", "dipper: [{seed: 1}, {seed: 2}]")
    with pytest.raises(HarnessError, match=r"grid.yaml:\d+: two cells would be one row, .*they differ in seed"):
        grid.load(write(tmp_path, spec))
    spec = GOOD.replace("slerp: [{t: 0.1}, {t: 0.5}]", "dipper: [{}, {top_p: 0.9}]")
    names = {c.name() for c in grid.load(write(tmp_path, spec)).cells if c.attack == "dipper"}
    assert {n.split(" x ")[1] for n in names} == {"dipper(lex=60, order=0)", "dipper(lex=60, order=0, top_p=0.9)"}


def test_seeds_and_overrides_reach_the_preset(tmp_path):
    g = grid.load(
        write(tmp_path, GOOD.replace("preset: tiny", "preset: tiny\nseeds: [3, 4]\noverrides: {train.steps: 7}"))
    )
    assert {c.seed for c in g.cells} == {3, 4} and len(g.cells) == 14
    assert {c.preset.train.seed for c in g.cells} == {3, 4}
    assert {c.preset.train.steps for c in g.cells} == {7}
    assert g.several_seeds and "seed=3" in g.cells[0].name(True)


BOMB = (  # 10 entries, then 10 aliases of each of those, 9 levels deep
    "preset: tiny\nx0: &x0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
    + "".join(f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 10)}]\n" for i in range(1, 9))
    + "groups: {a: {methods: {gu-kgw: [{}]}}}\n"
)


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("preset: tiny\ngroups: {a: {methods: {gu-kgw: [{}]}}\n", 3, "malformed YAML.*starts on line 2"),
        ("preset: tiny\ngroups:\n\ta: 1\n", 3, "malformed YAML"),
        ("preset: tiny\ncolour: red\ngroups:\n  a:\n    methods: {gu-kgw: [{}]}\n", 2, "unknown key"),
        ("preset: tiny\ngroups:\n  a:\n    methods: {gu-kgw: [{}]}\n    atacks: {none: [{}]}\n", 5, "unknown key"),
        ("preset: nano\ngroups:\n  a:\n    methods: {gu-kgw: [{}]}\n", 1, "unknown preset"),
        ("preset: tiny\ngroups:\n  a:\n    methods:\n      gu-kgx: [{}]\n", 5, "unknown method 'gu-kgx'"),
        (
            "preset: tiny\ngroups:\n  a:\n    methods: {gu-kgw: [{}]}\n    attacks:\n      slerp: [{t: 0.5}]\n"
            "      mergee: [{}]\n",
            7,
            "unknown attack 'mergee'",
        ),
        (
            "preset: tiny\ngroups:\n  a:\n    methods:\n      gu-kgw:\n        - {}\n        - {kk: 1}\n",
            7,
            "bad settings for method 'gu-kgw'",
        ),
        (
            "preset: tiny\ngroups:\n  a:\n    methods: {gu-kgw: [{}]}\n    attacks: {slerp: [{t: 2}]}\n",
            5,
            "bad settings for attack 'slerp'",
        ),
        (
            "preset: tiny\noverrides: {train.stepz: 3}\ngroups:\n  a:\n    methods: {gu-kgw: [{}]}\n",
            2,
            "unknown setting",
        ),
        ("preset: tiny\ngroups:\n  a:\n    methods: {gu-kgw: [{}]}\nattribution: b\n", 5, "no group 'b'"),
        ("preset: tiny\ngroups:\n  a:\n    methods: {gu-kgw: [3]}\n", 4, "valid dictionary"),
        ("- just\n- a list\n", 1, "a grid spec is a mapping"),
        ("preset: tiny\n", 1, "groups"),
        # Hostile or careless YAML: a group given twice (YAML keeps the last silently), a key that is not text, an
        # alias that refers to itself, and a "billion laughs" (aliases of aliases: 10^9 entries once expanded).
        (
            "preset: tiny\ngroups:\n  a:\n    methods: {gu-kgw: [{}]}\n  a:\n    methods: {pro: [{}]}\n",
            5,
            r"'a' is given twice \(first on line 3\)",
        ),
        ("preset: tiny\n3: x\ngroups: {a: {methods: {gu-kgw: [{}]}}}\n", 2, "the key '3' is not text"),
        ("preset: tiny\ngroups:\n  a: &a\n    methods: {gu-kgw: [*a]}\n", 3, "an alias that refers to itself"),
        (BOMB, 6, "aliases expand to more than 100,000"),
        # Seeds and settings of the wrong kind: true is no seed (Python's 1), a seed past 64 bits is no train.seed,
        # and a chain link's settings are a mapping.
        ("preset: tiny\nseeds: [0, true]\ngroups: {a: {methods: {gu-kgw: [{}]}}}\n", 2, "seeds.1: Input should"),
        (f"preset: tiny\nseeds: [{2**64}]\ngroups: {{a: {{methods: {{gu-kgw: [{{}}]}}}}}}\n", 2, "train.seed"),
        *(
            (
                "preset: tiny\ngroups:\n  a:\n    methods: {gu-kgw: [{}]}\n    attacks:\n      chain:\n"
                f"        - links: [{{attack: weight-noise, settings: {settings}}}, {{attack: slerp}}]\n",
                7,
                "link 1: its settings must be a mapping",
            )
            for settings in ("[{sigma: 0.1}]", "'sigma=0.1'", "3")
        ),
        (
            "preset: tiny\ngroups:\n  a:\n    methods: {gaussian-bias: [{seed: true}]}\n",
            4,
            "a number, not true or false",
        ),
    ],
)
def test_a_bad_spec_is_refused_whole_naming_the_line(tmp_path, capsys, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(HarnessError, match=words) as err:
        grid.load(path)
    assert str(err.value).startswith(f"{path}:{line}:"), str(err.value)
    assert main(["grid", str(path), "--results", str(tmp_path / "runs")]) == 2
    out = capsys.readouterr()
    assert len(out.err.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "text",
    ["3/2", "0/0", "0/2", "1/0", "a/b", "1", "1/2/3", "-1/2", "5/3", "1/10001", "1/99999999999999999999999",
     "1/" + "9" * 5000, "\u00b2/3", "1/\u0663", "+1/2", "1.0/2"],
)  # fmt: skip
def test_bad_shards_are_one_line_errors(tmp_path, capsys, text):
    """Huge counts (an OverflowError, or Python's 4,300-digit limit on int()) and digits that are not ASCII (int()
    refuses superscripts that str.isdigit() accepts) are one line too, naming the bound."""
    assert main(["grid", str(write(tmp_path, GOOD)), f"--shard={text}", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "bad shard" in err and "<= 10,000" in err and err.count("\n") == 1, err
    assert grid.parse_shard(" 2/10000 ") == (2, 10_000)


def test_unknown_or_missing_executors_are_one_line_errors(tmp_path, capsys, monkeypatch):
    spec = str(write(tmp_path, GOOD))
    assert main(["grid", spec, "--executor", "kubernetes"]) == 2
    assert "unknown executor 'kubernetes'" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    assert main(["grid", spec, "--executor", "slurm", "--results", str(tmp_path / "runs")]) == 2
    assert "sbatch" in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "submitit", None)  # not installed
    assert main(["grid", spec, "--executor", "local", "--results", str(tmp_path / "runs")]) == 2
    assert "pip install 'watermark-harness[cluster]'" in capsys.readouterr().err


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_shards_split_whole_trainings_deterministically(tmp_path, n):
    g = grid.load(write(tmp_path, GOOD.replace("[{t: 0.1}, {t: 0.5}]", "[{t: 0.1}, {t: 0.3}, {t: 0.5}, {t: 0.7}]")))
    shards = [grid.shard(g.cells, i, n) for i in range(1, n + 1)]
    # The split is a pure function of the spec (the same on every machine): trainings of 5 (gu-kgw k=1), 5 (pro) and
    # 1 (gu-kgw k=0) cells, dealt largest first to the least loaded shard.
    sizes = {1: [11], 2: [6, 5], 3: [5, 5, 1], 5: [5, 5, 1, 0, 0], 8: [5, 5, 1, 0, 0, 0, 0, 0]}
    assert [len(s) for s in shards] == sizes[n]
    if n > 1:
        assert {c.method for c in shards[1]} == {"pro"}
    flat = [c for s in shards for c in s]
    assert sorted(map(str, flat)) == sorted(map(str, g.cells)) and len(flat) == len(g.cells)  # each cell once
    for a in range(n):
        for b in range(a + 1, n):
            assert not {c.training for c in shards[a]} & {c.training for c in shards[b]}  # no model trained twice


def test_the_shipped_grids_are_valid():
    tiny = grid.load(GRIDS / "tiny.yaml")
    paper = grid.load(GRIDS / "paper.yaml")
    for g in (tiny, paper):  # the paper's methods and attacks (a grid may hold others)
        assert {c.method for c in g.cells} >= {"gu-kgw", "gu-kth", "gloaguen-kgw", "pro"}
        assert {c.attack for c in g.cells} >= {"none", "gptq", "int8", "hqq", "wanda", "sparsegpt", "slerp", "finetune",
                                               "dipper"}  # fmt: skip
    assert {c.preset.name for c in tiny.cells} == {"tiny"} and {c.preset.name for c in paper.cells} == {"paper"}
    assert len({c.preset.base_model for c in paper.cells}) == 2  # tab:embedding is on LLaMA-3.2-3B


@pytest.mark.parametrize("name", sorted(p.name for p in GRIDS.glob("*.yaml")))
def test_every_committed_grid_expands(name):
    """Each grid file in grids/ stays valid as plugins and presets change (the GPU grids are run only on a lent
    machine, where an invalid one would cost the lease): it loads, with cells to run or a calibration to sweep."""
    g = grid.load(GRIDS / name)
    assert g.cells or g.sweep


def test_a_spec_path_that_is_no_file_is_one_line(tmp_path):
    cases = [
        ("/dev/zero", "is not a regular file"),
        (tmp_path, "is not a regular file"),
        (tmp_path / "x.yaml", "does not exist"),
    ]
    for path, words in cases:
        with pytest.raises(HarnessError, match=words):
            grid.load(path)
    big = tmp_path / "big.yaml"
    big.write_text("preset: tiny\n" + "# padding\n" * 200_000)
    with pytest.raises(HarnessError, match="larger than 1 MiB"):
        grid.load(big)
    # YAML nested past Python's recursion limit (PyYAML's composer recurses), and a lone surrogate (YAML's escapes,
    # as JSON's, make one; writing it out fails later)
    block = "".join(f"{' ' * i}k{i}:\n" for i in range(1200))  # (the same, in block style: each level indented)
    for text, words in (
        ("preset: tiny\ngroups: " + "[" * 5000 + "]" * 5000 + "\n", f"{big}:2: nested too deeply to read"),
        ("preset: tiny\n\nx: {a: [1, {b: " + "[" * 5000 + "]" * 5000 + "}]}\n", f"{big}:3: nested too deeply"),
        ("preset: tiny\ngroups:\n" + block, f"{big}:1202: nested too deeply"),
        ('preset: tiny\nname: "a \\ud800"\n', "a lone surrogate"),
    ):
        big.write_text(text)
        with pytest.raises(HarnessError, match=words):
            grid.load(big)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--shard", ""], "bad shard ''"),
        (["--partition", "gpu"], "--partition: only for --executor slurm"),
        (["--executor", "local", "--account", "a", "--max-parallel", "2"], "--account, --max-parallel: only for"),
        (["--gpus", "1", "--time-min", "30"], "--gpus, --time-min: only for --executor local or slurm"),
        (["--executor", "cloud"], "unknown executor 'cloud'"),
        (["--executor", "local", "--time-min", "0"], "--time-min 0: must be at least 1"),
        (["--executor", "local", "--gpus", "-1"], "--gpus -1: must be at least 0"),
        (["--executor", "local", "--cpus", "9" * 30], f"--cpus {'9' * 30}: must be at most 2147483647"),
        (["--executor", "local", "--mem-gb", str(2**31)], "--mem-gb 2147483648: must be at most 2147483647"),
    ],
)
def test_grid_options_of_another_executor_are_refused_not_ignored(tmp_path, cli, args, words):
    out = cli("grid", str(write(tmp_path, GOOD)), "--results", str(tmp_path / "runs"), "--dry-run", *args)
    assert out.returncode == 2 and words in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr


def test_a_dry_run_builds_no_built_in_model(tmp_path, cli, monkeypatch):
    """On a machine that has built nothing, a dry run of the shipped tiny grid plans every cell as to compute, says
    which built-in models the grid will build and what that costs, and leaves the cache and the store as they were."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("HARNESS_CACHE", str(cache))
    grids = Path(__file__).resolve().parents[2] / "grids"
    out = cli("grid", str(grids / "tiny.yaml"), "--results", str(tmp_path / "runs"), "--dry-run")
    assert out.returncode == 0, out.stderr
    cells = int(re.search(r"tiny\.yaml: (\d+) cells", out.stdout).group(1))
    assert cells >= 90 and f"0 of {cells} cells stored; {cells} to compute" in out.stdout
    from harness.config.refs import BUILTIN_MODELS

    cost = BUILTIN_MODELS["builtin:tiny-lm"].cost
    assert f"builtin:tiny-lm is not built on this machine: the grid will build it once ({cost}" in out.stdout
    assert "builtin:tiny-paraphraser is not built on this machine" in out.stdout
    assert "to compute (first builds builtin:tiny-lm, builtin:tiny-paraphraser)" in out.stdout  # the DIPPER cells
    assert not any(p.name.startswith(("tiny-lm", "tiny-paraphraser")) for p in cache.glob("*"))
    assert not (tmp_path / "runs").exists()


def test_a_dry_run_says_of_each_cell_what_is_stored(monkeypatch):
    """``jobs.dry_run``'s states: all of a cell's runs stored, some, to compute after building what this machine
    lacks, or cannot tell, with why said at the first cell of its setup."""
    from types import SimpleNamespace

    from harness.grid import jobs

    cells = [SimpleNamespace(setup=setup, name=name) for setup, name in
             [("near", "all"), ("near", "some"), ("near", "new"), ("far", "one"), ("far", "two")]]  # fmt: skip
    stored = {"all": [("a", True), ("b", True)], "some": [("a", True), ("b", False)]}

    def plan(cell, results, device):
        if cell.setup == "far":
            raise HarnessError("the hub cannot be reached")
        return stored[cell.name]

    monkeypatch.setattr(jobs, "unbuilt", lambda cell: ["builtin:tiny-lm"] if cell.name == "new" else [])
    monkeypatch.setattr(jobs, "plan", plan)
    assert [(p.state, p.stored, p.builds) for p in jobs.dry_run(cells, Path("runs"), None)] == [
        ("stored", True, ()),
        ("1/2 runs stored", False, ()),
        ("to compute (first builds builtin:tiny-lm)", False, ("builtin:tiny-lm",)),
        ("cannot tell (the hub cannot be reached)", False, ()),
        ("cannot tell (as above)", False, ()),
    ]


def test_a_dry_run_of_one_command_builds_no_built_in_model(tmp_path, cli, monkeypatch):
    """``harness run --dry-run`` on a machine that has built nothing: its inputs checked, the tiny LM named with what
    building it costs, every run to compute, and the cache and the store left as they were."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("HARNESS_CACHE", str(cache))
    out = cli("run", "--method", "pro", "--attack", "slerp", "--results", str(tmp_path / "runs"), "--dry-run")
    assert out.returncode == 0, out.stderr
    from harness.config.refs import BUILTIN_MODELS

    cost = BUILTIN_MODELS["builtin:tiny-lm"].cost
    assert f"builtin:tiny-lm is not built on this machine: the run will build it once ({cost}" in out.stdout
    assert "every run is to compute" in out.stdout
    assert not any(p.is_dir() for p in cache.glob("*")) and not (tmp_path / "runs").exists()
    bad = cli("run", "--method", "pro", "--set", "eval_data.path=missing.jsonl", "--dry-run")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "missing.jsonl" in bad.stderr, bad.stderr


def test_a_grid_of_too_many_cells_is_one_line_before_it_expands(tmp_path, capsys):
    """A 5 KB spec can ask for a million cells (1,000 settings x 1,000 attacks): refused from the counts, before any
    cell is made; below the bound, expansion is linear in the cells (10^4 of them took 70 s when it was quadratic)."""
    methods = ", ".join(f"{{std: {0.1 + i / 1000:.3f}}}" for i in range(1000))  # (a setting each row's label shows)
    attacks = ", ".join(f"{{sigma: 0.0{i % 9 + 1}, seed: {i}}}" for i in range(1000))
    path = write(tmp_path, f"preset: tiny\ngroups:\n  a:\n    methods: {{gaussian-bias: [{methods}]}}\n"
                           f"    attacks: {{weight-noise: [{attacks}]}}\n")  # fmt: skip
    with pytest.raises(HarnessError, match=r":2: the groups make 1,000,000 cells .* more than a grid runs"):
        grid.load(path)
    assert main(["grid", str(path), "--dry-run", "--results", str(tmp_path / "runs")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    fewer = write(tmp_path, f"preset: tiny\ngroups:\n  a:\n    methods: {{gaussian-bias: [{methods}]}}\n"
                            "    attacks: {weight-noise: [{sigma: 0.01}, {sigma: 0.02}]}\n")  # fmt: skip
    cells = grid.load(fewer).cells
    assert len(cells) == 2000 and [c.method_settings for c in cells[:2]] != [c.method_settings for c in cells[2:4]]
