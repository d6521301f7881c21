"""The installed ``harness`` command: help everywhere, and every bad input is one line with exit code 2."""

import pytest


@pytest.mark.parametrize("command", [[], ["list"], ["run"], ["tables"]])
def test_help(harness, command):
    out = harness(*command, "--help")
    assert out.returncode == 0
    assert "usage: harness" in out.stdout


def test_list_shows_methods_attacks_and_planned_entries(harness):
    out = harness("list")
    assert out.returncode == 0, out.stderr
    assert "gu-kgw" in out.stdout and "slerp" in out.stdout and "t=0.5" in out.stdout
    assert "pro" in out.stdout and "delta=" in out.stdout and "planned" in out.stdout


BAD_INPUTS = {
    "unknown method": (["run", "--method", "gu-kwg"], "unknown method 'gu-kwg'. Did you mean 'gu-kgw'? Valid methods:"),
    "unknown attack": (["run", "--method", "gu-kgw", "--attack", "merge"], "Valid attacks: none, slerp"),
    "planned method": (["run", "--method", "gu-kth"], "method 'gu-kth' is not implemented yet"),
    "planned attack": (["run", "--method", "gu-kgw", "--attack", "gptq"], "attack 'gptq' is not implemented yet"),
    "model path": (["run", "--method", "gu-kgw", "--base-model", "./no/such/model"], "does not exist"),
    "data path": (["run", "--method", "gu-kgw", "--set", "train_data.path=/no/data.jsonl"], "does not exist"),
    "malformed arg": (["run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "t"], "expected key=value"),
    "bad value": (["run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "t=1.5"], "t: Input should be"),
    "not a number": (["run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "t=half"], "t: Input should"),
    "unknown setting": (["run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "x=1"], "x: Extra inputs"),
    "method setting": (["run", "--method", "gu-kgw", "--method-arg", "k=7"], "k: Input should be less than or equal"),
    "preset": (["run", "--method", "gu-kgw", "--preset", "huge"], "unknown preset 'huge'"),
    "override": (["run", "--method", "gu-kgw", "--set", "train.stepz=3"], "unknown setting 'train.stepz'"),
    "override value": (["run", "--method", "gu-kgw", "--set", "train.steps=-3"], "bad setting train.steps"),
    "missing flag": (["run"], "the following arguments are required: --method"),
    "unknown device": (["run", "--method", "gu-kgw", "--device", "gpu"], "unknown device 'gpu'"),
    "unknown command": (["fly"], "invalid choice"),
    "no store": (["tables", "--results", "/nonexistent/runs"], "no run store"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(harness, case):
    args, expected = BAD_INPUTS[case]
    out = harness(*args)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert expected in out.stderr
    assert out.stderr.startswith("harness: error: ")


def test_unwritable_results_folder(harness, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = harness("run", "--method", "gu-kgw", "--results", str(blocker / "runs"))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "is not writable" in out.stderr


def test_listing_and_validation_import_no_heavy_library():
    """`harness list` and argument checks stay fast: torch and friends load only when a model does."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from harness.registry import methods, attacks\n"
        "from harness import cli, pipeline, config\n"
        "[r.build(n, {}) for r in (methods, attacks) for n in r.available()]\n"
        "heavy = [m for m in ('torch', 'transformers', 'mergekit', 'sklearn', 'pandas') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
