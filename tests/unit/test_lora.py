"""LoRA fine-tuning through peft: only the adapters train (every base weight frozen and unchanged), each checkpoint is
the adapters merged into a copy of the weights, which differs from the input only in the targeted layers and there by
an update of rank <= r; QLoRA trains on a 4-bit base where bitsandbytes runs it; bad settings are one line, before any
work."""

import json
import re

import pytest
import torch

from attacks import lora
from harness.config.errors import HarnessError
from harness.config.registry import attacks
from harness.contract.attack import AttackContext

TARGETS = ("q_proj", "v_proj", "down_proj")


def settings(dataset, **more):
    return {"dataset": str(dataset), "steps": "2,4", "lr": "5e-2", "batch_size": "2", "seq_len": "64",
            "rank": "3", "alpha": "6", "dropout": "0.1", "target_modules": ",".join(TARGETS), **more}  # fmt: skip


def targeted(name: str) -> bool:
    return name.endswith(".weight") and name.split(".")[-2] in TARGETS


def spy_on_training(monkeypatch) -> dict:
    """Keep the model that ``lora.tune`` trains, to look at it afterwards."""
    seen, real = {}, lora.tune

    def spy(model, *args, **kwargs):
        seen["model"] = model
        return real(model, *args, **kwargs)

    monkeypatch.setattr(lora, "tune", spy)
    return seen


def check_release(before: dict, after: dict, rank: int) -> None:
    """``after`` differs from ``before`` in the targeted weights alone (every other tensor bit for bit), each of them
    by an update of rank at most ``rank``."""
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        if not targeted(name):
            assert torch.equal(after[name], tensor), name
            continue
        delta = (after[name] - tensor).double()
        assert delta.abs().max() > 0, name
        assert torch.linalg.matrix_rank(delta, rtol=1e-6) <= rank, name


def test_only_the_adapters_train_and_each_checkpoint_is_them_merged(
    random_llamas, tmp_path, monkeypatch, instruct_file, saved_weights
):
    marked, _ = random_llamas
    seen = spy_on_training(monkeypatch)
    data = instruct_file(tmp_path)
    attack = attacks.build("lora", settings(data))
    assert [sub for _, sub in attack.outputs()] == ["checkpoints/step-2", "checkpoints/step-4"]
    out = tmp_path / "lora"
    out.mkdir()
    report = attack.apply(marked, out, AttackContext(str(marked), "cpu"))
    before = saved_weights(marked)

    # Training: the adapters alone had gradients and moved; every base weight is as it was loaded.
    model, adapters = seen["model"], 0
    for name, param in model.named_parameters():
        if "lora_" in name:
            adapters += 1
            assert param.requires_grad, name
            continue
        assert not param.requires_grad, name
        base_name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        assert torch.equal(param.detach(), before[base_name]), name
    assert adapters == 2 * 2 * len(TARGETS)  # A and B of each targeted layer of the 2 layers
    moved = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert all(p.abs().max() > 0 for p in moved)  # B starts at zero: it trained
    assert report["adapters"]["adapted_layers"] == 2 * len(TARGETS)
    assert report["adapters"]["trainable_parameters"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert report["versions"]["peft"] and len(report["losses"]) == 4

    # Each checkpoint: the targeted weights moved, by rank <= 3; nothing else changed.
    two, four = saved_weights(out / "checkpoints/step-2"), saved_weights(out / "checkpoints/step-4")
    check_release(before, two, 3)
    check_release(before, four, 3)
    name = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(two[name], four[name])
    # The last checkpoint is peft's merge of the trained adapters: W + (alpha / r) B A.
    layer = model.base_model.model.model.layers[0].mlp.down_proj
    delta = 2.0 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    assert torch.allclose(four[name], before[name] + delta.detach(), atol=1e-6)

    # The step-2 checkpoint does not depend on the later steps asked for (dropout included: merging at step 2 draws
    # nothing from the training's generator).
    alone = tmp_path / "alone"
    alone.mkdir()
    attacks.build("lora", settings(data, steps="2")).apply(marked, alone, AttackContext(str(marked), "cpu"))
    assert all(torch.equal(v, saved_weights(alone / "checkpoints/step-2")[k]) for k, v in two.items())


def test_each_checkpoint_is_a_row(random_llamas, tmp_path, small_preset, instruct_pairs, instruct_file):
    from harness.cell.pipeline import Pipeline
    from harness.config.registry import methods
    from harness.store.stages import Store

    base, _ = random_llamas
    overrides = {"train.steps": "2", "train.batch_size": "2", "train.seq_len": "16", "eval.num_prompts": "4",
                 "eval.prompt_tokens": "4", "eval.new_tokens": "6", "eval.batch_size": "2"}  # fmt: skip
    preset = small_preset(tmp_path, base, [f"{p} {r}" for p, r in instruct_pairs], **overrides)
    attack = attacks.build("lora", settings(instruct_file(tmp_path), steps="1,3"), preset)
    cells = Pipeline(preset, Store(tmp_path / "runs"), "cpu").run(methods.build("gu-kgw", {}), attack)
    assert [c.row for c in cells][2:] == ["instruct, LoRA r=3 s=1", "instruct, LoRA r=3 s=3"]
    assert len(list((tmp_path / "runs" / "stages" / "attack").iterdir())) == 1  # trained once
    manifest = json.loads((cells[3].run.path / "manifest.json").read_text())
    assert "adapters merged in" in manifest["report"]["evaluated"]


def test_qlora_trains_on_4_bits_and_merges_into_the_float_weights(
    random_llamas, tmp_path, monkeypatch, instruct_file, saved_weights
):
    """Where bitsandbytes' 4-bit runs (here: its CPU backend), the adapters train on an NF4 copy of the base and
    merge into the float32 input weights: outside the targeted layers every tensor is the input's, bit for bit."""
    marked, _ = random_llamas
    try:
        lora.check_4bit("cpu")
    except HarnessError as err:
        pytest.skip(str(err))
    seen = spy_on_training(monkeypatch)
    out = tmp_path / "qlora"
    out.mkdir()
    report = attacks.build("lora", settings(instruct_file(tmp_path), steps="2", qlora="true")).apply(
        marked, out, AttackContext(str(marked), "cpu")
    )
    import bitsandbytes

    assert isinstance(
        seen["model"].base_model.model.model.layers[0].self_attn.q_proj.base_layer, bitsandbytes.nn.Linear4bit
    )
    assert "NF4" in report["adapters"]["base"] and report["versions"]["bitsandbytes"]
    check_release(saved_weights(marked), saved_weights(out / "checkpoints/step-2"), 3)
    assert "quantization_config" not in json.loads((out / "checkpoints/step-2" / "config.json").read_text())


@pytest.mark.parametrize(
    "problem, message",
    [
        (RuntimeError("no kernel for this device\nmore"), "does not run on cpu \\(no kernel for this device\\)"),
        (None, "needs bitsandbytes"),
    ],
)
def test_qlora_without_a_working_4_bit_names_what_it_needs(monkeypatch, problem, message):
    import importlib.util

    if problem is None:
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "bitsandbytes" else real(n, *a))
    else:
        from bitsandbytes import functional

        def broken(*args, **kwargs):
            raise problem

        monkeypatch.setattr(functional, "quantize_4bit", broken)
    with pytest.raises(HarnessError, match=message) as err:
        lora.check_4bit("cpu")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("rank=0", "rank: Input should be greater than 0"),
        ("rank=-4", "rank: Input should be greater than 0"),
        ("rank=2.5", "rank: Input should be a valid integer"),
        ("rank=abc", "rank: Input should be a valid integer"),
        ("alpha=0", "alpha: Input should be greater than 0"),
        ("alpha=-16", "alpha: Input should be greater than 0"),
        ("alpha=inf", "alpha: Input should be a finite number"),
        ("alpha=nan", "alpha: Input should be a finite number"),
        ("dropout=1", "dropout: Input should be less than 1"),
        ("dropout=1.5", "dropout: Input should be less than 1"),
        ("dropout=-0.1", "dropout: Input should be greater than or equal to 0"),
        ("dropout=nan", "dropout: Input should be a finite number"),
        ("lr=0", "lr: Input should be greater than 0"),
        ("lr=-1e-4", "lr: Input should be greater than 0"),
        ("lr=inf", "lr: Input should be a finite number"),
        ("lr=nan", "lr: Input should be a finite number"),
        ("steps=", "steps: Value error, give at least one step"),
        ("steps=,", "steps: Value error, give at least one step"),
        ("steps=0", "steps must be positive"),
        ("steps=-5,10", "steps must be positive"),
        ("steps=ten", "whole numbers"),
        ("target_modules=,", "give at least one module"),
        ("target_modules=q_proj,q_proj", "q_proj given twice"),
        ("target_modules=self_attn.q_proj", "a layer's own name"),
        ("target_modules=q-proj", "a layer's own name"),
        ("qlora=maybe", "qlora: Input should be a valid boolean"),
        ("ranks=4", "ranks: Extra inputs are not permitted"),
        ("dataset=openmathinstrukt", "unknown fine-tuning dataset"),
    ],
)
def test_bad_settings_are_one_line(setting, message):
    key, _, value = setting.partition("=")
    with pytest.raises(HarnessError, match=message) as err:
        attacks.build("lora", {key: value})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"rank": "17"}, r"rank 17 is above the width of model.layers.0.self_attn.k_proj \(32 -> 16\)"),
        ({"rank": "33", "target_modules": "q_proj"}, r"rank 33 is above the width of .*q_proj \(32 -> 32\)"),
        ({"rank": "65", "target_modules": "up_proj"}, r"rank 65 is above the width of .*up_proj \(32 -> 64\)"),
        (
            {"target_modules": "qkv_proj"},
            "qkv_proj is no linear layer of .*: its linear layers are down_proj, "
            "gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj",
        ),
        ({"target_modules": "q_proj,c_attn,c_proj"}, "c_attn, c_proj is no linear layer"),
        ({"target_modules": "lm_head"}, "lm_head is no linear layer"),
        ({"target_modules": "embed_tokens"}, "embed_tokens is no linear layer"),
    ],
)
def test_settings_the_model_cannot_take_are_one_line(random_llamas, values, message):
    attack = attacks.build("lora", values)
    with pytest.raises(HarnessError, match=message) as err:
        attack.validate(str(random_llamas[0]))
    assert "\n" not in str(err.value)
    attacks.build("lora", {"rank": "16"}).validate(str(random_llamas[0]))  # k_proj's width itself is fine


@pytest.mark.parametrize("dry", [True, False])
@pytest.mark.parametrize(
    "setting, message",
    [
        ("rank=0", "rank: Input should be greater than 0"),
        ("rank=97", r"rank 97 is above the width of model.layers.0.self_attn.k_proj \(192 -> 96\)"),
        ("target_modules=c_attn", "c_attn is no linear layer"),
        ("alpha=0", "alpha: Input should be greater than 0"),
        ("dropout=1", "dropout: Input should be less than 1"),
        ("lr=nan", "lr: Input should be a finite number"),
        ("steps=,", "give at least one step"),
        ("steps=", "attack setting 'steps=' has no value"),
    ],
)
def test_bad_settings_stop_the_cli_before_any_work(cli, tmp_path, setting, message, dry):
    """On the tiny preset (its base judged by its recipe's config where it is not built): one line, exit 2, and
    nothing trained or stored."""
    args = ["run", "--method", "gu-kgw", "--attack", "lora", "--attack-arg", setting, "--results", "store"]
    out = cli(*args, *(["--dry-run"] if dry else []))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert re.search(message, out.stderr), out.stderr
    assert not (tmp_path / "store" / "stages").exists()


def test_the_presets_give_lora_defaults_that_build():
    from harness.config.presets import PRESETS

    for preset in PRESETS.values():
        attack = attacks.build("lora", {}, preset)
        assert attack.params.lr > 0 and attack.params.steps
    tiny = attacks.build("lora", {}, PRESETS["tiny"]).params
    finetune = attacks.build("finetune", {}, PRESETS["tiny"]).params
    assert (tiny.dataset, tiny.steps, tiny.batch_size) == (finetune.dataset, finetune.steps, finetune.batch_size)


def test_the_preset_defaults_move_no_stored_run():
    """The presets' LoRA defaults came after their runs were stored: the preset as runs store (and hash) it leaves
    them out, and holds the fine-tuning defaults as before."""
    from harness.cell.scoring import preset_settings
    from harness.config.presets import PRESETS, TINY
    from harness.config.settings import HASHED_ATTACK_DEFAULTS, HASHED_METHOD_DEFAULTS

    stored = preset_settings(TINY)["attacks"]
    assert "lora" in TINY.attacks and "lora" not in stored and stored["finetune"] == TINY.attacks["finetune"]
    for preset in PRESETS.values():  # every plugin that came later (merges, quantizers, methods) the same way
        kept = preset_settings(preset)
        assert set(kept["attacks"]) <= set(HASHED_ATTACK_DEFAULTS)
        assert set(kept["methods"]) <= set(HASHED_METHOD_DEFAULTS)
