"""The text edits (attacks/edits.py): each edits at its rate, is seeded per text, and keeps what it must keep."""

from __future__ import annotations

import random

import pytest

from harness.config.registry import attacks
from harness.contract.attack import AttackContext

TEXT = (
    "The quick brown fox jumps over the lazy dog. A watermark is a hidden signal in generated text, and a detector "
    "can find it again. Return the number of items in the list, or raise an error if it is empty."
)


def edit(name: str, texts: list[str], base=None, **settings) -> list[str]:
    return attacks.build(name, settings).apply_texts(texts, AttackContext(str(base), "cpu"))


RATED = ("token-edit", "token-insert", "word-delete", "synonym", "typo")
# Texts as models write them: newlines, indents, runs of spaces, tabs, text that starts and ends in white space.
LAID_OUT = [
    "def add(a, b):\n    return a + b\n\n\nprint(add(1,  2))\n",
    "  Leading and trailing.  \n",
    "One line\r\nthen\tanother\u00a0word, café ☕ 日本語.",
    TEXT,
    "",
    "   ",
]


def measured(name: str, texts: list[str], base=None, **settings) -> tuple[list[str], list[dict]]:
    return attacks.build(name, settings).apply_texts_measured(texts, AttackContext(str(base), "cpu"))


@pytest.fixture
def lexicon(monkeypatch):
    import attacks.edits

    monkeypatch.setattr(attacks.edits, "wordnet_reader", FakeWordNet)


def test_every_edit_is_registered_with_a_rate_sweep():
    for name in RATED:
        cls = attacks.load(name)
        assert cls.sweep is not None and cls.sweep.setting in cls.Params.model_fields, name
        assert attacks.build(name, {"p": 0.3}).config_label() == "p=0.3"
        with pytest.raises(Exception, match="less than or equal to 1"):
            attacks.build(name, {"p": 1.5})


@pytest.mark.parametrize("name", RATED)
def test_rate_zero_returns_every_text_byte_for_byte(name, random_llamas, lexicon):
    texts, applied = measured(name, LAID_OUT, random_llamas[1], p=0.0)
    assert texts == LAID_OUT
    assert all(a["edited"] == 0 for a in applied)


@pytest.mark.parametrize("name", RATED)
def test_seeded_per_text(name, random_llamas, lexicon):
    texts = [TEXT, TEXT.upper(), TEXT[::-1]]
    once = edit(name, texts, random_llamas[1], p=0.3)
    assert once == edit(name, texts, random_llamas[1], p=0.3)
    assert once != edit(name, texts, random_llamas[1], p=0.3, seed=1)
    # A text's edits depend on its index and the seed, not on the other texts.
    assert edit(name, ["other", TEXT.upper()], random_llamas[1], p=0.3)[1] == once[1]


def _within_binomial(k: int, n: int, p: float) -> bool:
    """Whether k of n lies in the central 99.9% binomial interval of rate p."""
    from scipy.stats import binom

    lo, hi = binom.ppf([0.0005, 0.9995], n, p)
    return lo <= k <= hi


def _corpus() -> list[str]:
    """200 texts laid out like model output: words of the test text in lines, some indented."""
    rng = random.Random(5)
    words = TEXT.split()
    return [
        "\n".join(("    " if rng.random() < 0.3 else "") + " ".join(rng.choices(words, k=rng.randint(4, 12)))
                  for _ in range(rng.randint(2, 5)))
        for _ in range(200)
    ]  # fmt: skip


@pytest.mark.parametrize("p", [0.05, 0.2, 0.5])
def test_word_deletion_deletes_a_share_p_of_words_and_keeps_the_layout(p):
    texts = _corpus()
    out, applied = measured("word-delete", texts, p=p)
    deleted = sum(len(a.split()) - len(b.split()) for a, b in zip(texts, out, strict=True))
    total = sum(len(t.split()) for t in texts)
    assert deleted == sum(a["edited"] for a in applied) and total == sum(a["units"] for a in applied)
    assert _within_binomial(deleted, total, p)
    for before, after in zip(texts, out, strict=True):
        kept = after.split()
        it = iter(before.split())
        assert all(any(w == k for w in it) for k in kept)  # the kept words, in order
        if kept:  # no line is merged into another but where all its words went, and the indents stay
            assert after.count("\n") <= before.count("\n")
            assert after.startswith("    ") == before.startswith("    ")
    assert edit("word-delete", [TEXT], p=1.0) == [""]
    line = edit("word-delete", ["alpha beta\n    gamma delta"], p=0.5, seed=3)[0]
    assert "  " not in line.replace("\n    ", "\n")  # words deleted, never a doubled space left between words


@pytest.mark.parametrize("name", ["token-edit", "token-insert"])
def test_token_edits_change_a_share_p_of_tokens_and_keep_the_rest(name, random_llamas):
    from harness.assets.models import load_tokenizer

    tokenizer = load_tokenizer(str(random_llamas[1]))
    attack = attacks.build(name, {"p": 0.2})
    attack.prepare(AttackContext(str(random_llamas[1]), "cpu"))
    assert not set(tokenizer.all_special_ids) & set(attack.choices)
    assert len(attack.choices) == len(tokenizer) - len(set(tokenizer.all_special_ids))
    texts = _corpus()
    out, applied = measured(name, texts, random_llamas[1], p=0.2)
    tokens = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    assert sum(a["units"] for a in applied) == tokens
    assert _within_binomial(sum(a["edited"] for a in applied), tokens, 0.2 * (1 - 1 / len(attack.choices)))
    for text, edited in zip(texts, out, strict=True):
        pieces = attack.spans(text)
        assert "".join(pieces) == text
        if name == "token-insert":  # every piece of the text is still there, in order
            rest = edited
            for piece in pieces:
                assert piece in rest
                rest = rest[rest.index(piece) + len(piece) :]


def test_synonyms_change_a_share_p_of_all_words_where_enough_have_one(lexicon):
    texts = [" ".join(["The quick dog ran."] * 10) for _ in range(200)]  # 2 of 4 words have a synonym
    for p in (0.1, 0.3):
        out, applied = measured("synonym", texts, p=p)
        changed = sum(
            a != b for t, o in zip(texts, out, strict=True) for a, b in zip(t.split(), o.split(), strict=True)
        )
        total = sum(len(t.split()) for t in texts)
        assert changed == sum(a["edited"] for a in applied) and _within_binomial(changed, total, p)
    out, applied = measured("synonym", texts, p=0.9)  # only half the words have one: the rate applied says so
    assert sum(a["edited"] for a in applied) == sum(a["units"] for a in applied) / 2


def test_typos_touch_letters_only_at_their_rate():
    text = "abc, 123! " * 200
    out, applied = measured("typo", [text], p=0.1)
    out = out[0]
    assert [c for c in out if not c.isalpha()] == [c for c in text if not c.isalpha()]  # in order, untouched
    assert out != text and edit("typo", [text], p=0.0) == [text]
    # Every edit changes the letters' count by at most one; about 0.1 x 600 letters are edited, a quarter of them
    # deletions and a quarter doublings.
    letters = sum(c.isalpha() for c in text)
    assert abs(sum(c.isalpha() for c in out) - letters) < 0.1 * letters
    assert applied[0]["units"] == letters and _within_binomial(applied[0]["edited"], letters, 0.1)


def test_lowercase():
    assert edit("lowercase", ["Hello World", "ABC def"]) == ["hello world", "abc def"]
    assert attacks.build("lowercase", {}).config_label() == ""


class FakeSynset:
    def __init__(self, *names):
        self.names = names

    def lemma_names(self):
        return list(self.names)


class FakeWordNet:
    LEXICON = {
        "quick": [FakeSynset("quick", "speedy", "fast_moving"), FakeSynset("rapid", "fast")],
        "dog": [FakeSynset("dog", "hound", "canine", "pooch")],
        "alpha": [FakeSynset("alpha", "first")],
    }

    def synsets(self, word):
        return self.LEXICON.get(word, [])


def test_synonyms_keep_case_and_punctuation(lexicon):
    import re

    outs = edit("synonym", ["Quick, the dog. The cat sat."] * 20, p=1.0)
    for out in outs:  # multi-word lemmas and the word itself are never chosen
        assert re.fullmatch(r"(Speedy|Rapid|Fast), the (hound|canine|pooch)\. The cat sat\.", out), out
    assert len(set(outs)) > 1


def test_synonyms_without_wordnet_are_one_line_before_any_work(monkeypatch, cli):
    import attacks.edits

    def missing():
        from harness.config.errors import HarnessError

        raise HarnessError(f"the synonym attack needs nltk and its WordNet data: {attacks.edits.WORDNET_HELP}")

    monkeypatch.setattr(attacks.edits, "wordnet_reader", missing)
    out = cli("run", "--method", "gu-kgw", "--attack", "synonym", "--results", "store")
    assert out.returncode == 2 and "python -m nltk.downloader wordnet" in out.stderr, out
    assert out.stderr.count("\n") == 1
