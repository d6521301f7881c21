"""The text edits (attacks/edits.py): each edits at its rate, is seeded per text, and keeps what it must keep."""

from __future__ import annotations

import random

import pytest

from attacks.base import AttackContext
from harness.config.registry import attacks

TEXT = (
    "The quick brown fox jumps over the lazy dog. A watermark is a hidden signal in generated text, and a detector "
    "can find it again. Return the number of items in the list, or raise an error if it is empty."
)


def edit(name: str, texts: list[str], base=None, **settings) -> list[str]:
    return attacks.build(name, settings).apply_texts(texts, AttackContext(str(base), "cpu"))


def test_every_edit_is_registered_with_a_rate_sweep():
    for name in ("token-edit", "word-delete", "synonym", "typo"):
        cls = attacks.load(name)
        assert cls.sweep is not None and cls.sweep.setting in cls.Params.model_fields, name
        assert attacks.build(name, {"p": 0.3}).config_label() == "p=0.3"
        with pytest.raises(Exception, match="less than or equal to 1"):
            attacks.build(name, {"p": 1.5})


@pytest.mark.parametrize("name", ["token-edit", "word-delete", "typo"])
def test_seeded_per_text(name, random_llamas):
    texts = [TEXT, TEXT.upper(), TEXT[::-1]]
    once = edit(name, texts, random_llamas[1], p=0.3)
    assert once == edit(name, texts, random_llamas[1], p=0.3)
    assert once != edit(name, texts, random_llamas[1], p=0.3, seed=1)
    # A text's edits depend on its index and the seed, not on the other texts.
    assert edit(name, ["other", TEXT.upper()], random_llamas[1], p=0.3)[1] == once[1]
    if name != "token-edit":  # (which decodes what it tokenized: its own test below)
        assert edit(name, [TEXT], random_llamas[1], p=0.0) == [TEXT]


def test_token_edits_replace_a_share_p_of_tokens_by_non_special_ones(random_llamas):
    from harness.assets.models import load_tokenizer

    tokenizer = load_tokenizer(str(random_llamas[1]))
    attack = attacks.build("token-edit", {"p": 0.4})
    attack.prepare(AttackContext(str(random_llamas[1]), "cpu"))
    assert not set(tokenizer.all_special_ids) & set(attack.choices)
    assert len(attack.choices) == len(tokenizer) - len(set(tokenizer.all_special_ids))
    ids = tokenizer(TEXT * 20, add_special_tokens=False)["input_ids"]
    rng = random.Random(0)
    edited = [rng.choice(attack.choices) if rng.random() < 0.4 else i for i in ids]
    share = sum(a != b for a, b in zip(ids, edited, strict=True)) / len(ids)
    assert abs(share - 0.4 * (1 - 1 / len(attack.choices))) < 4 * (0.25 / len(ids)) ** 0.5
    assert attack.edit(TEXT, random.Random(0)) != TEXT
    none = attacks.build("token-edit", {"p": 0.0})
    none.prepare(AttackContext(str(random_llamas[1]), "cpu"))
    assert none.edit(TEXT, random.Random(0)) == tokenizer.decode(tokenizer(TEXT, add_special_tokens=False)["input_ids"])


def test_word_deletion_rate():
    words = TEXT.split() * 30
    kept = edit("word-delete", [" ".join(words)], p=0.25)[0].split()
    assert abs(1 - len(kept) / len(words) - 0.25) < 4 * (0.25 * 0.75 / len(words)) ** 0.5
    assert edit("word-delete", [TEXT], p=1.0) == [""]


def test_typos_touch_letters_only_at_their_rate():
    text = "abc, 123! " * 200
    out = edit("typo", [text], p=0.1)[0]
    assert [c for c in out if not c.isalpha()] == [c for c in text if not c.isalpha()]  # in order, untouched
    assert out != text and edit("typo", [text], p=0.0) == [text]
    # Every edit changes the letters' count by at most one; about 0.1 x 600 letters are edited, a quarter of them
    # deletions and a quarter doublings.
    letters = sum(c.isalpha() for c in text)
    assert abs(sum(c.isalpha() for c in out) - letters) < 0.1 * letters


def test_lowercase():
    assert edit("lowercase", ["Hello World", "ABC def"]) == ["hello world", "abc def"]
    assert attacks.build("lowercase", {}).config_label() == ""


class FakeSynset:
    def __init__(self, *names):
        self.names = names

    def lemma_names(self):
        return list(self.names)


class FakeWordNet:
    LEXICON = {"quick": [FakeSynset("quick", "speedy", "fast_moving")], "dog": [FakeSynset("dog", "hound")]}

    def synsets(self, word):
        return self.LEXICON.get(word, [])


def test_synonyms_keep_case_and_punctuation(monkeypatch):
    import attacks.edits

    monkeypatch.setattr(attacks.edits, "wordnet_reader", FakeWordNet)
    out = edit("synonym", ["Quick, the dog. The cat sat."], p=1.0)[0]
    assert out == "Speedy, the hound. The cat sat."  # multi-word lemmas and the word itself are never chosen


def test_synonyms_without_wordnet_are_one_line_before_any_work(monkeypatch, cli):
    import attacks.edits

    def missing():
        from harness.config.errors import HarnessError

        raise HarnessError(f"the synonym attack needs nltk and its WordNet data: {attacks.edits.WORDNET_HELP}")

    monkeypatch.setattr(attacks.edits, "wordnet_reader", missing)
    out = cli("run", "--method", "gu-kgw", "--attack", "synonym", "--results", "store")
    assert out.returncode == 2 and "python -m nltk.downloader wordnet" in out.stderr, out
    assert out.stderr.count("\n") == 1
