"""Gloaguen-KGW: stage 1 is the stored Gu-KGW student, stage 2 a fine-tuning stage of its own, and stage 3 changes
only the stable parameters (the others stay bit-identical to stage 1's)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from harness.cell.pipeline import Pipeline
from harness.config.errors import HarnessError
from harness.config.registry import attacks, methods
from harness.store.stages import Store

SETTINGS = {"train.steps": "3", "train.batch_size": "2", "train.seq_len": "16", "train.lr": "1e-2",
            "eval.num_prompts": "4", "eval.prompt_tokens": "4", "eval.new_tokens": "6",
            "eval.batch_size": "2"}  # fmt: skip


def test_stage3_changes_only_stable_parameters(random_llamas, tmp_path, small_preset):
    from methods.gloaguen_kgw import StableMasks

    base, _ = random_llamas
    store = Store(tmp_path / "runs")
    settings = {"k": "1", "delta": "2", "stable_fraction": "0.3", "ft_steps": "3", "ft_lr": "1e-2", "ft_warmup": "0"}
    cells = Pipeline(small_preset(tmp_path, base, **SETTINGS), store, "cpu").run(
        methods.build("gloaguen-kgw", settings), attacks.build("none", {})
    )
    assert [c.row for c in cells] == ["Unwatermarked base", "Unaltered"]
    trained = {
        json.loads((p / "spec.json").read_text())["method"]: p for p in (tmp_path / "runs/stages/train").iterdir()
    }
    assert set(trained) == {"gu-kgw", "gloaguen-kgw"}  # stage 1 is a Gu-KGW train stage of its own
    report = json.loads((trained["gloaguen-kgw"] / "manifest.json").read_text())["report"]
    assert report["stage1"] == trained["gu-kgw"].name
    stage2 = tmp_path / "runs/stages/gloaguen-finetune" / report["stage2"]
    one = load_file(trained["gu-kgw"] / "model/model.safetensors")
    three = load_file(trained["gloaguen-kgw"] / "model/model.safetensors")
    masks = StableMasks(trained["gu-kgw"] / "model", stage2 / "finetuned", 0.3)
    assert set(masks) == set(one)
    moved = 0
    for name, mask in masks.items():
        assert torch.equal(three[name][~mask], one[name][~mask]), name  # outside the mask: bit-identical
        moved += int((three[name][mask] != one[name][mask]).sum())
        assert int(mask.sum()) == max(1, round(0.3 * mask.numel())), name
    assert moved > 0  # inside it, stage 3 did train
    key = json.loads((trained["gloaguen-kgw"] / "key.json").read_text())
    assert (
        key["method"] == "gloaguen-kgw"
        and key["detector"] == json.loads((trained["gu-kgw"] / "key.json").read_text())["detector"]
    )


@pytest.mark.parametrize("fraction, count", [(0.001, 1), (0.3, 300), (0.5, 500), (0.97, 970), (1.0, 1000)])
def test_stable_mask_keeps_what_a_stable_sort_of_the_change_keeps(fraction, count):
    from methods.gloaguen_kgw import kept_count, stable_mask

    generator = torch.Generator().manual_seed(0)
    before = torch.randn(40, 25, generator=generator)
    # few distinct changes, so that many entries tie at the threshold
    after = before + torch.randint(-3, 4, before.shape, generator=generator) / 8
    change = (after - before).abs()
    mask = stable_mask(change, fraction)
    order = torch.argsort(change.flatten(), stable=True)
    expected = torch.zeros(before.numel(), dtype=torch.bool)
    expected[order[:count]] = True  # the `count` smallest changes, ties taken in position order
    assert mask.dtype == torch.bool and torch.equal(mask, expected.view(before.shape))
    assert kept_count(1000, fraction) == count and kept_count(1000, 0.0001) == 1  # at least one entry


@pytest.mark.parametrize(
    "fraction, message",
    [("0", "greater than 0"), ("-0.2", "greater than 0"), ("1.5", "less than or equal to 1")],
)
def test_stable_fraction_outside_0_1_is_refused(fraction, message):
    with pytest.raises(HarnessError, match=f"stable_fraction: Input should be {message}"):
        methods.build("gloaguen-kgw", {"stable_fraction": fraction})
