"""DIPPER: the inputs it gives the paraphraser (format, prefix, windows, batching), its sentence splitter, its
settings' validation, and (slow) that the tiny paraphraser built here really rewrites held-out text."""

import pytest

from attacks.paraphrase import Dipper
from harness.assets.dipper_format import split_sentences
from harness.config.errors import HarnessError
from harness.config.registry import attacks
from harness.contract.attack import AttackContext

SENTENCES = ["The cat sat on the mat.", "It was warm there!", "Why did it leave?", "Nobody knows.", "The end."]


def run_dipper(folder, texts, prompts, monkeypatch, **settings):
    """Run DIPPER on ``texts``, recording each generate call's inputs and outputs."""
    calls = []
    original = Dipper.generate

    def recording(self, model, tokenizer, inputs, processors=()):
        outputs = original(self, model, tokenizer, inputs, processors)
        calls.append((inputs, outputs))
        return outputs

    monkeypatch.setattr(Dipper, "generate", recording)
    attack = attacks.build("dipper", {"model": str(folder), "tokenizer": None, "max_length": 12, **settings})
    ctx = AttackContext(base_model="x", device="cpu", models={"paraphraser": str(folder)}, prompts=prompts)
    return attack.apply_texts(texts, ctx), calls


def test_dipper_inputs_follow_the_reference_format(random_t5, monkeypatch):
    texts = [" ".join(SENTENCES), "  Short one.\n\nSecond   sentence here. ", ""]
    prompts = ["Prompt\none.", "Prompt two", "Prompt three"]
    out, calls = run_dipper(random_t5, texts, prompts, monkeypatch)

    assert len(out) == 3 and out[2] == ""  # one text per input, in order; nothing to paraphrase in an empty one
    assert len(calls) == 2  # window 0 of both texts in one batch, then window 1 of the first text
    (first, first_out), (second, second_out) = calls
    assert first == [
        "lexical = 40, order = 100 Prompt one. <sent> The cat sat on the mat. It was warm there! Why did it leave?"
        " </sent>",
        "lexical = 40, order = 100 Prompt two <sent> Short one. Second sentence here. </sent>",
    ]
    # The second window sees the prompt and the first window's paraphrase as its prefix.
    prefix = " ".join(f"Prompt one. {first_out[0]}".split())
    assert second == [f"lexical = 40, order = 100 {prefix} <sent> Nobody knows. The end. </sent>"]
    assert out[0] == " ".join(f"{first_out[0]} {second_out[0]}".split())
    assert out[1] == " ".join(first_out[1].split())


def test_dipper_codes_sampling_is_seeded_and_no_prompts(random_t5, monkeypatch):
    texts = [" ".join(SENTENCES), "One sentence."]
    out_a, calls = run_dipper(random_t5, texts, None, monkeypatch, lexical=0, order=80, sent_interval=2, seed=3)
    assert calls[0][0][1] == "lexical = 100, order = 20 <sent> One sentence. </sent>"  # no prompt: no prefix
    assert [len(inputs) for inputs, _ in calls] == [2, 1, 1]  # 3 windows of 2 sentences, 1 window
    out_b, _ = run_dipper(random_t5, texts, None, monkeypatch, lexical=0, order=80, sent_interval=2, seed=3)
    out_c, _ = run_dipper(random_t5, texts, None, monkeypatch, lexical=0, order=80, sent_interval=2, seed=4)
    assert out_a == out_b and out_c != out_a  # the seed, and only the seed, chooses the draws


def test_long_sentences_are_cut_only_when_asked(random_t5, monkeypatch):
    long = "one two three four five six seven eight nine ten."
    _, calls = run_dipper(random_t5, [f"{long} Short one."], None, monkeypatch, sent_interval=1)
    assert [inputs[0].split("<sent> ")[1] for inputs, _ in calls] == [f"{long} </sent>", "Short one. </sent>"]
    _, calls = run_dipper(random_t5, [f"{long} Short one."], None, monkeypatch, sent_interval=1, max_window_words=4)
    windows = [inputs[0].split("<sent> ")[1].removesuffix(" </sent>") for inputs, _ in calls]
    assert windows == ["one two three four", "five six seven eight", "nine ten.", "Short one."]
    with pytest.raises(HarnessError, match="max_window_words: Input should be greater than 0"):
        attacks.build("dipper", {"max_window_words": 0})


def test_dipper_settings():
    attack = attacks.build("dipper", {})
    assert (attack.params.lexical, attack.params.order) == (60, 0)
    assert attack.config_label() == "lex=60, order=0"
    assert attack.model_refs() == {
        "paraphraser": "kalpeshk2011/dipper-paraphraser-xxl", "tokenizer": "google/t5-v1_1-xxl"
    }  # fmt: skip
    assert attacks.build("dipper", {"model": "builtin:tiny-paraphraser", "tokenizer": None}).model_refs() == {
        "paraphraser": "builtin:tiny-paraphraser"
    }
    assert attacks.build("dipper", {"lexical": "20", "order": "100"}).config_label() == "lex=20, order=100"


@pytest.mark.parametrize("settings", [{"lexical": "30"}, {"order": 120}, {"lexical": -20}, {"temperature": 1}])
def test_dipper_refuses_bad_settings(settings):
    with pytest.raises(HarnessError, match=rf"^bad settings for attack 'dipper': {next(iter(settings))}: "):
        attacks.build("dipper", settings)


def test_dipper_refuses_off_grid_code_with_clear_message():
    with pytest.raises(HarnessError, match=r"lexical: .*must be one of 0, 20, 40, 60, 80, 100"):
        attacks.build("dipper", {"lexical": "30"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("   ", []),
        ("One sentence without a full stop", ["One sentence without a full stop"]),
        ("First one. Second one!  Third?\nFourth.", ["First one.", "Second one!", "Third?", "Fourth."]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ("Use e.g. Python. Mr. Smith and J. Doe came.", ["Use e.g. Python.", "Mr. Smith and J. Doe came."]),
        ("Version 3.5 is out. Call os.path.join() now. (See below.) 42 is the answer.",
         ["Version 3.5 is out.", "Call os.path.join() now.", "(See below.)", "42 is the answer."]),
    ],
)  # fmt: skip
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


@pytest.mark.slow
def test_tiny_paraphraser_rewrites_heldout_text():
    """Builds the tiny paraphraser if this machine has none (35-65 minutes on 2 cores). On held-out text, with the
    tiny preset's settings at DIPPER-1's lexical diversity, it must change words (overlap < 0.9) yet keep most of them
    and much of the meaning: a mean MiniLM cosine above 0.5 and 0.3 above that of unrelated held-out texts (each
    original paired with the next one's paraphrase). Recipe v5 measured overlap 0.57, cosine 0.60, unrelated 0.27."""
    from attacks.paraphrase import measure

    result = measure(texts=40)
    print(result)
    assert 0.3 < result["mean_unigram_overlap"] < 0.9
    assert result["mean_embedding_cosine"] > 0.5
    assert result["mean_embedding_cosine"] > result["unrelated_embedding_cosine"] + 0.3


def test_a_paraphraser_build_goes_on_from_its_copying_stage_with_the_same_bits(tmp_path, monkeypatch):
    """The tiny paraphraser's build (about an hour on 2 cores) saves its model after the copying stage; a build that
    finds that checkpoint skips the copying and ends with the weights of a build that ran through."""
    import torch
    from safetensors.torch import load_file

    from harness.assets import tiny_paraphraser as tp
    from harness.compute import training

    small = {"copy": {"steps": 2, "batch_size": 2, "max_tokens": 8, "max_prefix_tokens": 4},
             "train": {"steps": 2, "batch_size": 2}, "pairs": {"count": 16, "max_words": 8}}  # fmt: skip
    for stage, settings in small.items():
        for key, value in settings.items():
            monkeypatch.setitem(tp.RECIPE[stage], key, value)
    monkeypatch.setattr(tp, "synonyms", lambda texts: {})  # the sentence encoder is not what is tested here
    weights = lambda out: load_file(out / "model.safetensors")  # noqa: E731

    through = tmp_path / "through"
    tp.build(through)
    checkpoint, first = tmp_path / "copied", tmp_path / "first"
    report = tp.build(first, checkpoint)  # saves the copying stage
    assert (checkpoint / "model.safetensors").is_file() and not report["copy_resumed"]

    real_train = training.train

    def no_copying(model, step, batches, settings, desc="", **kw):
        assert "copying" not in desc, "the copying stage ran again"
        return real_train(model, step, batches, settings, desc=desc, **kw)

    monkeypatch.setattr(training, "train", no_copying)
    resumed = tmp_path / "resumed"
    report = tp.build(resumed, checkpoint)
    assert report["copy_resumed"]
    for out in (first, resumed):
        a, b = weights(through), weights(out)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), out
