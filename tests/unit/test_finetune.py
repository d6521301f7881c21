"""Fine-tuning attack: checkpoints at every requested step from one training run, weights moved, each checkpoint a
row of its own through the pipeline, and bad settings refused before any model loads."""

import json

import pytest
import torch

from harness.assets.models import load_causal_lm
from harness.cell.pipeline import Pipeline
from harness.config.errors import HarnessError
from harness.config.registry import attacks, methods
from harness.contract.attack import AttackContext
from harness.store.stages import Store


def test_checkpoints_at_each_step_from_one_run(random_llamas, tmp_path, instruct_file, saved_weights):
    marked, _ = random_llamas
    data = instruct_file(tmp_path)
    settings = {"dataset": str(data), "steps": "4,2", "lr": "1e-2", "batch_size": "2", "seq_len": "64"}
    attack = attacks.build("finetune", settings)
    assert attack.params.steps == (2, 4)
    assert [sub for _, sub in attack.outputs()] == ["checkpoints/step-2", "checkpoints/step-4"]
    out = tmp_path / "ft"
    out.mkdir()
    report = attack.apply(marked, out, AttackContext(str(marked), "cpu"))
    assert report["steps"] == 4 and len(report["losses"]) == 4
    assert report["dataset"]["fingerprint"] and report["versions"]["transformers"]
    before = saved_weights(marked)
    two, four = saved_weights(out / "checkpoints/step-2"), saved_weights(out / "checkpoints/step-4")
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(before[name], two[name]) and not torch.equal(two[name], four[name])
    model = load_causal_lm(str(out / "checkpoints/step-4"), "cpu")
    ids = torch.tensor([[1, 2, 3]])
    assert model.generate(input_ids=ids, max_new_tokens=4, do_sample=False).shape == (1, 7)
    # Constant learning rate: the step-2 checkpoint does not depend on the later steps asked for.
    alone = tmp_path / "alone"
    alone.mkdir()
    attacks.build("finetune", {**settings, "steps": "2"}).apply(marked, alone, AttackContext(str(marked), "cpu"))
    assert all(torch.equal(v, saved_weights(alone / "checkpoints/step-2")[k]) for k, v in two.items())


def test_each_checkpoint_is_a_row(random_llamas, tmp_path, small_preset, instruct_pairs, instruct_file):
    base, _ = random_llamas
    settings = {"train.steps": "2", "train.batch_size": "2", "train.seq_len": "16", "eval.num_prompts": "4",
                "eval.prompt_tokens": "4", "eval.new_tokens": "6", "eval.batch_size": "2"}  # fmt: skip
    preset = small_preset(tmp_path, base, [f"{p} {r}" for p, r in instruct_pairs], **settings)
    attack = attacks.build(
        "finetune", {"dataset": str(instruct_file(tmp_path)), "steps": "1,3", "batch_size": "2", "seq_len": "64"}
    )
    cells = Pipeline(preset, Store(tmp_path / "runs"), "cpu").run(methods.build("gu-kgw", {}), attack)
    assert [c.row for c in cells][2:] == ["instruct s=1", "instruct s=3"]
    assert len(list((tmp_path / "runs" / "stages" / "attack").iterdir())) == 1  # trained once
    spec = json.loads((cells[3].run.path / "spec.json").read_text())
    assert spec["config"]["attack"]["config_label"] == "s=3"
    assert spec["upstream"]["attack"]["data"]["finetune"]["fingerprint"]
    manifest = json.loads((cells[3].run.path / "manifest.json").read_text())
    assert "fine-tuned" in manifest["report"]["evaluated"]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"steps": "-5,10"}, "steps must be positive"),
        ({"steps": "ten"}, "whole numbers"),
        ({"dataset": "openmathinstrukt"}, "unknown fine-tuning dataset"),
        ({"lr": "0"}, "lr: Input should be greater than 0"),
        ({"steps": "10", "warmup_steps": "10"}, r"warmup_steps \(10\) must be below the last step \(10\)"),
    ],
)
def test_bad_settings_are_one_line(settings, message):
    with pytest.raises(HarnessError, match=message) as err:
        attacks.build("finetune", settings)
    assert "\n" not in str(err.value)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)  # SmolLM2's template, without its default system turn


def test_a_chat_model_is_fine_tuned_through_its_chat_template(random_llamas):
    """A tokenizer with a chat template (SmolLM2's ChatML) gets its examples as a chat: the user turn and the
    assistant header are the prompt (not trained on), the response and its end-of-turn token are trained on; a
    tokenizer without one gets the ### Instruction / ### Response format."""
    from attacks.finetune import format_example
    from harness.assets.models import load_tokenizer

    tokenizer = load_tokenizer(str(random_llamas[0]))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    plain_ids, plain_head = format_example(tokenizer, "Add two numbers.", "def add(a, b):")
    assert "### Response:" in tokenizer.decode(plain_ids[:plain_head])
    tokenizer.chat_template = CHATML
    ids, head = format_example(tokenizer, "Add two numbers.", "def add(a, b):")
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    prompt, trained = tokenizer.decode(ids[:head]), tokenizer.decode(ids[head:])
    assert prompt == "<|im_start|>user\nAdd two numbers.<|im_end|>\n<|im_start|>assistant\n"
    assert trained.startswith("def add(a, b):") and end in ids[head:] and start not in ids[head:]


# --- scrubbing: fine-tuning on plain human text of the evaluation's domain, never its own texts ----------------------


def test_a_plain_text_dataset_is_trained_on_every_token(random_llamas, tmp_path, instruct_pairs, saved_weights):
    """A local file of plain text (``text_field``) gives each document's tokens in windows of seq_len that overlap by
    one token, all trained on; the checkpoints move as with instruction pairs."""
    from attacks.finetune import example_stream, text_windows
    from harness.assets.models import load_tokenizer

    marked, _ = random_llamas
    tokenizer = load_tokenizer(str(marked))
    text = " ".join(f"{p} {r}" for p, r in instruct_pairs[:3])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    windows = text_windows(tokenizer, text, 16)
    assert all(head == 0 and len(w) <= 16 for w, head in windows)
    bos = [] if tokenizer.bos_token_id in (None, tokenizer.eos_token_id) else [tokenizer.bos_token_id]
    # Consecutive windows share one token, so every token after the first is predicted once.
    assert windows[0][0] + [t for w, _ in windows[1:] for t in w[1:]] == [*bos, *ids, tokenizer.eos_token_id]
    assert len(windows) > 1 and all(len(w) == 16 for w, _ in windows[:-1])
    path = tmp_path / "human.jsonl"
    path.write_text("".join(json.dumps({"body": f"{p} {r}"}) + "\n" for p, r in instruct_pairs))
    attack = attacks.build("finetune", {"dataset": str(path), "text_field": "body", "steps": "2", "lr": "1e-2",
                                        "batch_size": "2", "seq_len": "16"})  # fmt: skip
    assert attack.table_label() == "human (scrub)" and attack.data_refs()["finetune"].text_field == "body"
    stats = {"read": 0, "epochs": 0}
    first = next(example_stream(tokenizer, attack.data, attack.params, stats))
    assert first[1] == 0
    out = tmp_path / "scrub"
    out.mkdir()
    report = attack.apply(marked, out, AttackContext(str(marked), "cpu"))
    assert report["loss_on"] == "every token" and report["format"].startswith("plain text")
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(saved_weights(marked)[name], saved_weights(out / "checkpoints/step-2")[name])


def test_the_named_human_text_sets_are_held_out_from_what_evaluations_read():
    """Each named plain-text set is the train split of its corpus; the presets evaluate on another split, and the
    built-in corpora's splits share no document."""
    from attacks.finetune import DATASETS
    from harness.assets import data
    from harness.config.presets import PRESETS

    plain = {name: d for name, d in DATASETS.items() if d.plain_text}
    assert set(plain) == {"tiny-corpus", "small-corpus", "c4-realnewslike", "openwebtext"}
    assert all(d.source.split == "train" for d in plain.values())
    for preset in PRESETS.values():
        assert not any(data.same_documents(d.source, preset.eval_data) for d in plain.values()), preset.name
    train, heldout = (
        set(data.iter_texts(DATASETS["tiny-corpus"].source)),
        set(data.iter_texts(PRESETS["tiny"].eval_data)),
    )
    assert train and heldout and not train & heldout


def test_the_evaluations_own_texts_are_refused(random_llamas, tmp_path, small_preset, instruct_file):
    """A dataset that holds the evaluation's documents (the same file, a folder around it, the same hub split) is one
    line before any work; another file is not."""
    from harness.cell.checks import check_held_out
    from harness.config.presets import TINY
    from harness.config.settings import apply_overrides

    base, _ = random_llamas
    preset = small_preset(tmp_path, base)
    corpus = tmp_path / "corpus.jsonl"
    for dataset in (corpus, tmp_path):
        attack = attacks.build("finetune", {"dataset": str(dataset), "text_field": "text"})
        with pytest.raises(HarnessError, match="is the evaluation's own texts") as err:
            check_held_out(preset, [attack])
        assert "\n" not in str(err.value)
    check_held_out(preset, [attacks.build("finetune", {"dataset": str(instruct_file(tmp_path))})])
    c4 = apply_overrides(TINY, {"eval_data.path": "allenai/c4", "eval_data.name": "realnewslike",
                                "eval_data.split": "train"})  # fmt: skip
    with pytest.raises(HarnessError, match=r"allenai/c4 \(realnewslike\), split train"):
        check_held_out(c4, [attacks.build("lora", {"dataset": "c4-realnewslike"})])
    check_held_out(TINY, [attacks.build("finetune", {"dataset": "tiny-corpus"})])


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"dataset": "tiny-corpus", "text_field": "text"}, "text_field is for a local dataset; 'tiny-corpus' names"),
        ({"text_field": "text"}, "text_field is for a local dataset; 'openmathinstruct' names"),
        ({"prompt_field": "q"}, None),
    ],
)
def test_bad_plain_text_settings_are_one_line(tmp_path, settings, message, instruct_file):
    path = instruct_file(tmp_path)
    if message is None:  # a local file with text_field and a pair field
        settings, message = {"dataset": str(path), "text_field": "prompt", **settings}, "give one or the other"
    with pytest.raises(HarnessError, match=message) as err:
        attacks.build("finetune", settings)
    assert "\n" not in str(err.value)


def test_the_finetune_record_keeps_its_shape():
    """``text_field`` came later: at its default it stays out of the record, so every stored fine-tuning stage keeps
    its hash."""
    params = attacks.build("finetune", {"dataset": "alpaca"}).params
    assert "text_field" not in params.model_dump()
    assert "text_field" in attacks.build("finetune", {"dataset": "/tmp", "text_field": "t"}).params.model_dump()


def test_the_cli_refuses_the_evaluations_own_texts(cli, tmp_path, instruct_pairs):
    corpus = tmp_path / "eval.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"{p} {r}"}) + "\n" for p, r in instruct_pairs))
    for dry in ([], ["--dry-run"]):
        args = [
            "--attack-arg",
            f"dataset={corpus}",
            "--attack-arg",
            "text_field=text",
            "--set",
            f"eval_data.path={corpus}",
        ]
        out = cli("run", "--method", "gu-kgw", "--attack", "finetune", *args, "--results", "store", *dry)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "is the evaluation's own texts" in out.stderr
        assert not (tmp_path / "store" / "stages").exists()
