"""How much a rewrite kept: unigram overlap and sentence-embedding cosine (the MiniLM wheel the extras ship)."""

import pytest

from harness.assets import textsim

ORIGINALS = ["The quick brown fox jumps over the lazy dog.", "A watermark is a hidden signal in generated text."]


def test_unigram_overlap():
    assert textsim.unigram_overlap("a b b c", "b a") == 0.5
    assert textsim.unigram_overlap("", "anything") == 1.0


def test_the_originals_are_embedded_once_per_generation_with_the_same_bits():
    """Text attacks of one generation (a grid of edit rates) embed its originals once per process: the kept
    embeddings give the cosines a fresh embedding gives, to the bit."""
    from harness.assets import models

    encoder = models.resolve(textsim.SIMILARITY_MODEL)
    textsim._embedded.cache_clear()
    same = textsim.embedding_cosine(ORIGINALS, ORIGINALS, encoder)
    assert same == pytest.approx([1.0, 1.0], abs=1e-5)
    edited = [t.rsplit(" ", 2)[0] for t in ORIGINALS]  # the last two words dropped
    kept = textsim.embedding_cosine(ORIGINALS, edited, encoder)
    assert textsim._embedded.cache_info().hits == 1
    textsim._embedded.cache_clear()
    assert textsim.embedding_cosine(ORIGINALS, edited, encoder) == kept
    assert all(0.5 < c < 0.99 for c in kept), kept
