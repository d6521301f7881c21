"""Published and secret keys: every scheme's default key is the published one (the paper's, for reproduction) and says
so; a ``seed`` of one's own gives another key, which training, decoding and detection all read from ``key.json``, and
whose texts another key does not detect. Default settings keep every stored hash."""

from __future__ import annotations

import random

import pytest
import torch

from harness.cell.pipeline import training_settings
from harness.cell.scoring import method_info
from harness.config.presets import TINY
from harness.config.registry import methods
from harness.contract.method import read_key, save_key
from harness.store.stages import spec_hash
from methods.kgw import HASH_KEY, GreenLists, KGWKey, pooled_score, secret_hash_key

KGW_METHODS = ("gu-kgw", "gloaguen-kgw", "kgw-decoding")


class Tokenizer:
    """What the keys read of a tokenizer: its vocabulary and special ids."""

    eos_token_id, bos_token_id, pad_token_id, unk_token_id = 0, 1, None, None

    def __init__(self, size: int):
        self.size = size

    def get_vocab(self) -> dict:
        return {f"t{i}": i for i in range(self.size)}

    def __len__(self) -> int:
        return self.size


def test_default_settings_keep_every_stored_hash():
    """Hashes computed on the code before ``seed`` existed (tiny preset: the train stage's spec less the base model's
    and data's fingerprints, and the run's method record), and the default key is lm-watermarking's."""
    before = {
        "gu-kgw": ("2e769085ab187479", "19086b228982a438"),
        "gloaguen-kgw": ("f595c5219426be0b", "264de461a53beb0f"),
        "kgw-decoding": ("3e54017ff7cc6b41", "26a55563c8d9d4c4"),
    }
    for name, (train, info) in before.items():
        method = methods.build(name, {}, TINY)
        assert "seed" not in method.params.model_dump()
        assert (spec_hash(training_settings(TINY, method)), spec_hash(method_info(method))) == (train, info), name
        assert method.key(Tokenizer(50), False).hash_key == HASH_KEY
    assert "seed" not in methods.build("gloaguen-kgw", {}, TINY).kgw_settings()  # its stage 1 is the same Gu-KGW


@pytest.mark.parametrize("name", KGW_METHODS)
def test_a_seed_gives_a_key_of_ones_own_that_the_detector_reads(name, tmp_path):
    tok = Tokenizer(300)
    method = methods.build(name, {"k": "1", "seed": "7"})
    assert method.params.model_dump()["seed"] == 7 and "seed" in method.train_params()
    key = method.detection_key(tok)
    assert key["teacher"]["hash_key"] == key["detector"]["hash_key"] == secret_hash_key(7) != HASH_KEY
    save_key(tmp_path, key)
    assert method.detector(tmp_path, tok).greens.key == KGWKey.from_dict(key["detector"])
    if name == "kgw-decoding":  # the sampler's green lists are the key's too
        assert method.logits_processors(tmp_path, tok)[0].greens.key == KGWKey.from_dict(key["teacher"])
    if name == "gloaguen-kgw":  # stage 1 is the Gu-KGW student of the same key
        assert method.kgw_settings()["seed"] == 7
    secret, published = (GreenLists(KGWKey.from_dict(key["detector"])), GreenLists(KGWKey(0.25, 2.0, "simple_1", 300)))
    assert not torch.equal(secret.green_ids(secret.key.hash_key * 5), published.green_ids(HASH_KEY * 5))
    assert method.published_key(read_key(tmp_path)) is None


def test_secret_hash_keys_differ_and_fit_the_seeds():
    keys = [secret_hash_key(seed) for seed in range(1000)]
    assert len(set(keys)) == 1000 and all(1 <= k < 2**40 for k in keys) and HASH_KEY not in keys
    assert secret_hash_key(7) == secret_hash_key(7)
    with pytest.raises(ValueError, match="hash key"):
        KGWKey(0.25, 2.0, "simple_1", 300, hash_key=0)
    with pytest.raises(ValueError, match="hash key"):
        KGWKey(0.25, 2.0, "simple_2", 2**22, hash_key=2**40)  # its seeds would overflow int64


def green_texts(greens: GreenLists, vocab: int, count: int, length: int, rng: random.Random) -> list[list[int]]:
    """Texts whose every token after the first is green under ``greens`` (k = 1): a KGW watermark at infinite delta."""
    texts = []
    for _ in range(count):
        ids = [rng.randrange(vocab)]
        for _ in range(length - 1):
            green = greens.masks(torch.tensor([ids[-1]]))[0].nonzero().flatten().tolist()
            ids.append(rng.choice(green))
        texts.append(ids)
    return texts


def test_texts_of_one_key_are_not_detected_by_another():
    """Texts green by construction under the key of seed 1 are found by it and not by seed 2's key nor the published
    one: each of those pools them at a p-value far from small (under the null it is uniform; the draw is fixed)."""
    vocab, rng = 400, random.Random(0)
    key = {seed: KGWKey(0.25, 2.0, "simple_1", vocab, hash_key=secret_hash_key(seed)) for seed in (1, 2)}
    texts = green_texts(GreenLists(key[1]), vocab, 8, 40, rng)
    assert pooled_score(GreenLists(key[1]), texts).p_value < 1e-50
    for other in (key[2], KGWKey(0.25, 2.0, "simple_1", vocab)):
        found = pooled_score(GreenLists(other), texts)
        assert found.p_value > 1e-3, found


def test_aar_texts_of_one_seed_are_not_detected_by_another():
    """The same for AAR's key seeds: texts decoded with seed 5's key (AAR decoding of a uniform model: the argmax of
    the key's row) are found by its pooled test and not by seed 42's (Gu et al.'s, published)."""
    from methods.aar import AARKey, decoding_gumbel
    from methods.gu_aar import AARDetector

    vocab, k = 64, 2
    mine, theirs = AARKey(vocab, k, 5), AARKey(vocab, k, 42)
    gumbel, rng = decoding_gumbel(mine), random.Random(0)
    texts = []
    for _ in range(6):
        ids = [rng.randrange(vocab) for _ in range(k)]
        while len(ids) < 40:
            ids.append(int(gumbel[sum(ids[-k:])].argmax()))
        texts.append(ids)
    assert AARDetector(mine).pool(texts, [])["p_value"] < 1e-20
    assert AARDetector(theirs).pool(texts, [])["p_value"] > 1e-3


@pytest.mark.parametrize(
    ("name", "secret", "words"),
    [
        ("gu-kgw", {"seed": "3"}, "15485863"),
        ("gloaguen-kgw", {"seed": "3"}, "15485863"),
        ("kgw-decoding", {"seed": "3"}, "15485863"),
        ("gu-kth", {"seed": "3"}, "seed 42"),
        ("kth-decoding", {"seed": "3"}, "seed 42"),
        ("gu-aar", {"seed": "3"}, "seed 42"),
        ("aar-decoding", {"seed": "3"}, "seed 42"),
        ("gaussmark", {"seed": "3"}, "seed 0"),
        ("gaussian-bias", {"seed": "3"}, "seed 0"),
    ],
)
def test_the_default_key_is_the_published_one(name, secret, words):
    def key_of(method) -> dict:
        if name == "gaussmark":  # (its key is written by train, from the noised model)
            return {"method": name, "seed": method.params.seed}
        return method.detection_key(300 if name == "gaussian-bias" else Tokenizer(300))

    default = methods.build(name, {})
    reason = default.published_key(key_of(default))
    assert reason is not None and words in reason
    assert methods.build(name, secret).published_key(key_of(methods.build(name, secret))) is None


def test_pros_key_is_its_trained_policy_and_never_published():
    assert methods.build("pro", {}).published_key({"method": "pro"}) is None


def test_an_old_kgw_key_without_a_hash_key_reads_as_the_published_one(tmp_path):
    key = methods.build("gu-kgw", {}).detection_key(Tokenizer(300))
    for part in ("teacher", "detector"):
        del key[part]["hash_key"]
    save_key(tmp_path, key)
    method = methods.build("gu-kgw", {})
    assert method.detector(tmp_path, Tokenizer(300)).greens.key.hash_key == HASH_KEY
    assert "15485863" in method.published_key(read_key(tmp_path))
