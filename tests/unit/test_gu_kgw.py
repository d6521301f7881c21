"""Gu-KGW distillation moves probability onto green tokens; its key and detector round-trip."""

import json

import torch

from harness.config.registry import methods
from harness.config.settings import TrainSettings
from harness.contract.method import TrainContext

TEXTS = ["The quick brown fox jumps over the lazy dog. A watermark is a hidden signal in text."] * 40


def green_mass(model_dir, key: dict, ids: torch.Tensor) -> float:
    """Mean probability the model puts on the green list of each position's context."""
    from harness.assets.models import load_causal_lm
    from methods.kgw import GreenLists, KGWKey

    model = load_causal_lm(str(model_dir), "cpu")
    probs = torch.softmax(model(input_ids=ids).logits.float(), -1)
    masks = GreenLists(KGWKey.from_dict(key)).masks(ids, width=probs.shape[-1])
    return float((probs * masks).sum(-1).mean())


def test_distillation_learns_the_green_list(random_llamas, tmp_path):
    base, _ = random_llamas
    method = methods.build("gu-kgw", {"k": "0", "delta": "2"})
    settings = TrainSettings(steps=30, batch_size=4, seq_len=16, lr=1e-2)
    report = method.train(TrainContext(str(base), iter(TEXTS), settings, "cpu"), tmp_path)
    assert report["loss_last_10"] < report["loss_first"]
    key = json.loads((tmp_path / "key.json").read_text())
    assert key["teacher"]["seeding_scheme"] == "simple_0" and key["teacher"]["excluded_ids"] == []
    assert (tmp_path / "model" / "model.safetensors").exists() and (tmp_path / "model" / "tokenizer.json").exists()
    ids = torch.randint(0, key["detector"]["vocab_size"], (4, 12), generator=torch.Generator().manual_seed(0))
    before, after = green_mass(base, key["teacher"], ids), green_mass(tmp_path / "model", key["teacher"], ids)
    assert before < 0.35 < after  # gamma = 0.25 of the vocabulary; delta = 2 pushes mass onto it


def test_k1_drops_special_tokens_from_the_teacher_only(random_llamas, tmp_path):
    from harness.assets.models import load_tokenizer

    method = methods.build("gu-kgw", {"k": "1"})
    tok = load_tokenizer(str(random_llamas[0]))
    assert method.params.teacher_drop_special is True  # Gu et al.'s choice for simple_1
    assert method.key(tok, True).excluded_ids == (tok.eos_token_id,)
    assert method.key(tok, method.params.detector_drop_special).excluded_ids == ()
    key = {"detector": method.key(tok, False).to_dict(), "ignore_repeated_ngrams": False}
    (tmp_path / "key.json").write_text(json.dumps(key))
    detector = method.detector(tmp_path, tok)
    scores = detector.score([[1, 2, 3, 4, 5]])
    assert scores[0]["scored"] == 4 and set(scores[0]) >= {"score", "p_value", "green"}


def test_text_too_short_to_score_is_neutral_not_an_error():
    """A text with no position to score (e.g. a paraphrase that came out as one token) carries no evidence: z = 0,
    p = 1, scored = 0; the others in the batch are scored as usual."""
    from harness.contract.method import score_long_enough
    from methods.gu_kgw import KGWDetector

    key = {"gamma": 0.25, "delta": 2.0, "seeding_scheme": "simple_1", "vocab_size": 100}
    detector = KGWDetector(key, ignore_repeated_ngrams=False)
    out = detector.score([[5], list(range(1, 30)), []])
    neutral = {"score": 0.0, "p_value": 1.0, "p_value_gu": 1.0, "green": 0, "units": 0, "scored": 0,
               "prefix_scores": []}  # fmt: skip
    assert out[0] == out[2] == neutral
    assert out[1]["scored"] == 28
    assert score_long_enough([[1], [2]], 3, lambda seqs: 1 / 0, {"score": 0.0}) == [{"score": 0.0, "scored": 0}] * 2


def test_chunked_kl_equals_the_whole_kl_with_its_gradient(monkeypatch):
    import torch

    from methods import distill

    g = torch.Generator().manual_seed(0)
    student = torch.randn(3, 7, 50, generator=g, requires_grad=True)
    teacher = torch.randn(3, 7, 50, generator=g)
    whole = distill.kl_per_token(student, teacher)
    (grad_whole,) = torch.autograd.grad(whole, student)
    monkeypatch.setattr(distill, "CHUNK_ELEMENTS", 120)  # chunks of 2 positions
    chunked = distill.kl_per_token(student, teacher)
    (grad_chunked,) = torch.autograd.grad(chunked, student)
    # float32 KL summed over 1,050 entries of either sign in another order (whole, or 11 chunk sums): 6e-8 relative
    # seen, up to ~1e-6 bounded (eps32 x log2(n) x sum|terms| / total); each gradient entry is its own row's alone
    assert torch.allclose(whole, chunked, rtol=1e-5) and torch.allclose(grad_whole, grad_chunked, atol=1e-7)
    bf16 = distill.kl_per_token(student.bfloat16(), teacher.bfloat16())
    assert bf16.dtype == torch.float32 and abs(bf16.item() - whole.item()) < 0.05 * whole.item()


def test_memory_settings_of_the_training_step(random_llamas, tmp_path, monkeypatch):
    """Gradient checkpointing trains the same weights; a bfloat16 teacher is loaded as such and still teaches."""
    from safetensors.torch import load_file
    from transformers import PreTrainedModel

    from harness.assets import models

    base, _ = random_llamas
    method = methods.build("gu-kgw", {"k": "0", "delta": "2"})
    plain = TrainSettings(steps=3, batch_size=4, seq_len=16, lr=1e-2)
    weights, engaged = {}, {}
    enable = PreTrainedModel.gradient_checkpointing_enable
    for name, settings in {
        "plain": plain,
        "checkpointed": plain.model_copy(update={"gradient_checkpointing": True}),
    }.items():
        calls = []
        monkeypatch.setattr(PreTrainedModel, "gradient_checkpointing_enable",
                            lambda self, calls=calls, **kw: calls.append(kw) or enable(self, **kw))  # fmt: skip
        method.train(TrainContext(str(base), iter(TEXTS), settings, "cpu"), tmp_path / name)
        weights[name], engaged[name] = load_file(str(tmp_path / name / "model" / "model.safetensors")), calls
    assert engaged == {"plain": [], "checkpointed": [{"gradient_checkpointing_kwargs": {"use_reentrant": False}}]}
    assert weights["plain"].keys() == weights["checkpointed"].keys()
    assert all(torch.allclose(weights["plain"][k], weights["checkpointed"][k], atol=1e-6) for k in weights["plain"])
    assert plain.unhashed() == {"gradient_checkpointing", "teacher_dtype"}

    loaded = []
    load = models.load_causal_lm
    monkeypatch.setattr(models, "load_causal_lm", lambda *a, **k: loaded.append(k.get("dtype")) or load(*a, **k))
    bf16 = plain.model_copy(update={"teacher_dtype": "bfloat16"})
    report = method.train(TrainContext(str(base), iter(TEXTS), bf16, "cpu"), tmp_path / "bf16")
    assert sorted(loaded) == ["bfloat16", "float32"]  # the teacher in bfloat16, the student in float32
    assert report["loss_last_10"] < report["loss_first"]
    assert bf16.unhashed() == {"gradient_checkpointing"}  # a bfloat16 teacher is part of the training's hash
