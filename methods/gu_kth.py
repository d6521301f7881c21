"""Gu-KTH (Gu et al., "On the Learnability of Watermarks for Language Models"): the KTH watermark distilled into the
weights by sampling distillation. The frozen base model writes training texts with KTH decoding (a stage of its
own, reused by every student of the same key and data), and the student is fine-tuned on them with cross-entropy.

As Gu et al.: prompts are the first ``prompt_tokens`` (50) tokens of training documents, each continuation is
exactly ``seq_len`` tokens of KTH decoding starting at one of the key's ``s`` shifts, and the student trains on the
decoded continuations tokenized again and packed into ``seq_len`` blocks. Detection scores the completion against
every key offset (``methods.kth``). Gu et al.'s per-text rank of the statistic among those of ``reference_texts``
human texts of the training data (not the evaluation's negatives; computed once per key and data and stored as a
stage) is kept as ``p_value_gu``, not as a p-value: it holds its level only for texts like those human ones. The
p-values are permutation tests over keys drawn afresh (``KTHDetector.pool``: pooled, and each text's own), exact
whatever wrote the texts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from harness.config.errors import HarnessError
from harness.config.params import Params
from harness.config.settings import MAX_PROMPTS
from harness.contract.method import (
    DetectContext,
    Detector,
    KeyFromTokenizer,
    PublishedDefault,
    TrainContext,
    WatermarkMethod,
    read_key,
    score_long_enough,
)


class GuKTHParams(Params):
    s: int = Field(1, ge=1)  # number of distinct key shifts (paper: 4, 2, 1)
    m: int = Field(256, ge=1)  # key length (Gu et al.: 256)
    seed: int = 42  # key seed (Gu et al.: 42, published; a number of one's own for a secret key)
    vocab_size: int | None = Field(None, ge=2)  # key columns; None: len(tokenizer) of the base model, as Gu et al.
    prompt_tokens: int = Field(50, gt=0)  # teacher prompts (Gu et al.: 50)
    batch_size: int | None = Field(None, gt=0)  # None: the preset's train.batch_size (paper: 128 for KTH)
    seq_len: int | None = Field(None, gt=1)  # None: the preset's train.seq_len (paper: 256 for KTH)
    generate_batch: int = Field(64, gt=0)  # teacher texts per generate call (greedy, equal-length prompts)
    statistic: Literal["levenshtein", "min-offset"] = "levenshtein"  # Gu et al.'s detector is the alignment one
    gamma: float = Field(0.0, ge=0)  # insertion/deletion cost of the alignment (Gu et al.: 0)
    # Gu et al.: 10,000 human texts; at most as many as evaluation prompts (4x as many documents are read for them).
    reference_texts: int = Field(10_000, gt=0, le=MAX_PROMPTS)

    @model_validator(mode="after")
    def _shifts_fit_the_key(self) -> GuKTHParams:
        if self.s > self.m:
            raise ValueError(f"s (shifts) must be in 1..m={self.m}, got {self.s}")
        return self


NULL_KEYS = 199  # keys drawn afresh for the pooled permutation test: p from 1/200, so it can decide at alpha = 0.01


class KTHDetector(Detector):
    def __init__(self, key, statistic: str, gamma: float, reference: list[float]):
        self.key, self.statistic, self.gamma, self.reference = key, statistic, gamma, reference

    def score(self, sequences: list[list[int]]) -> list[dict]:
        from methods.kth import p_values, statistics

        def batch(seqs: list[list[int]]) -> list[dict]:
            stats = statistics(self.key, seqs, self.statistic, self.gamma)
            ranks = p_values(stats, self.reference)
            # Higher score = more watermarked (the statistic is lower for watermarked text). Gu et al.'s rank against
            # human texts is kept as p_value_gu: it is no p-value for a model's text (``methods.kth.p_values``).
            return [{"score": -d, "statistic": d, "p_value_gu": p} for d, p in zip(stats, ranks, strict=True)]

        # An empty text sums no cost: statistic 0, above every reference statistic, so its rank is 1.
        return score_long_enough(sequences, 1, batch, {"score": 0.0, "statistic": 0.0, "p_value_gu": 1.0})

    def pool(self, sequences: list[list[int]], scores: list[dict], null_keys: int = NULL_KEYS) -> dict:
        """Kuditipudi et al.'s permutation test, pooled: the texts' summed statistic under the key against the same
        texts' sums under ``null_keys`` keys drawn afresh (``methods.kth.permutation_p``). It is exact under the null
        that the source does not depend on the key, whatever the source is; so is each text's own permutation
        p-value from the same keys (``per_text_p_values``, what ``harness detect`` shows beside each text). Gu et
        al.'s per-text ranks against the reference statistics of human texts (``p_value_gu``) are not: an
        unwatermarked model's texts are not human texts, and the tiny base's, ranked so, flagged 7% at a stated 1%;
        a test of the texts against that reference (the Mann-Whitney U used before) convicted it."""
        from harness.compute.progress import Progress
        from methods.kth import permutation_p

        scored = [i for i, s in enumerate(sequences) if len(s) > 0]  # an empty text sums no cost under any key
        if not scored:
            return {"p_value": 1.0, "statistic": 0.0, "tokens": 0, "test": "no text to test",
                    "per_text_p_values": [1.0] * len(sequences)}  # fmt: skip
        texts = [sequences[i] for i in scored]
        with Progress(null_keys, "KTH permutation test (keys drawn afresh)", unit="key") as bar:
            found = permutation_p(self.key, texts, self.statistic, self.gamma, null_keys, bar.update)
        per_text = [1.0] * len(sequences)
        for i, p in zip(scored, found["per_text"], strict=True):
            per_text[i] = p
        return {
            "p_value": found["p_value"],
            "per_text_p_values": per_text,
            "statistic": found["z"],
            "test": f"permutation test of the texts' summed KTH statistic against the same texts under {null_keys} "
            "keys drawn afresh (Kuditipudi et al.'s test, pooled over texts): exact under the null, whatever wrote "
            f"the texts; its smallest p is {1 / (null_keys + 1):.3g} (statistic: null standard deviations below the "
            "null keys' mean)",
            "tokens": sum(len(s) for s in texts),
        }


class GuKTH(KeyFromTokenizer, WatermarkMethod):
    name = "gu-kth"
    label = "Gu-KTH"
    tradeoff_settings = ("s",)
    version = "1"
    detector_version = "2"  # (WatermarkMethod.detector_version)
    Params = GuKTHParams
    detector_has_null = True  # its pooled test is exact under the scheme's own null

    def config_label(self) -> str:
        return f"s={self.params.s}"

    def token_lengths(self) -> dict[str, int]:
        p = self.params  # teacher texts: a prompt and seq_len tokens of KTH decoding (None: the preset's seq_len)
        return {"prompt_tokens + seq_len": p.prompt_tokens + p.seq_len} if p.seq_len else {}

    def validate(self, base_model: str | None = None) -> None:
        """The key covers the base model's vocabulary, and its tables (m x V) fit: refused before any work where not
        (torch would fail to allocate them only once training starts)."""
        if base_model is None:
            return
        from harness.assets.models import vocab_length
        from methods.aar import MAX_TABLE_BYTES
        from methods.kth import KTHKey

        found = vocab_length(base_model)
        p = self.params
        if p.vocab_size is not None and found != p.vocab_size:
            raise HarnessError(
                f"{self.name} key vocab_size={p.vocab_size} differs from the base model's vocabulary ({found} "
                "tokens): a key must cover exactly the model's tokens"
            )
        key = KTHKey(vocab_size=found, key_len=p.m, seed=p.seed, num_shifts=p.s)
        if key.table_bytes() > MAX_TABLE_BYTES:
            raise HarnessError(
                f"{self.name}'s key of m={p.m} rows for {found} tokens needs {key.table_bytes() / 2**30:,.0f} GiB to "
                f"detect with (m x V float32 uniforms and float64 costs); at most {MAX_TABLE_BYTES / 2**30:.0f} GiB: "
                f"m of at most {MAX_TABLE_BYTES // (12 * found):,} here"
            )

    def key(self, tokenizer):
        from methods.kth import KTHKey

        p = self.params
        return KTHKey(vocab_size=p.vocab_size or len(tokenizer), key_len=p.m, seed=p.seed, num_shifts=p.s)

    def published_default(self) -> PublishedDefault:
        from methods.kth import DEFAULT_SEED

        return PublishedDefault(("key", "seed"), DEFAULT_SEED, "Gu et al.'s default key seed")

    def train(self, ctx: TrainContext, out: Path) -> dict:
        from methods.distill import sampling_distillation

        return sampling_distillation(self, ctx, out, "kth-teacher-texts", f"KTH teacher texts (s={self.params.s})",
                                     teacher_texts)  # fmt: skip

    def detection_key(self, tokenizer) -> dict:
        """What ``train`` writes as ``key.json`` for the base ``tokenizer``: the KTH key and the detector's settings."""
        p = self.params
        detector = {"statistic": p.statistic, "gamma": p.gamma, "reference_texts": p.reference_texts}
        return {"method": self.name, "key": self.key(tokenizer).to_dict(), **detector}

    def detector(self, key_dir: Path, tokenizer=None, ctx: DetectContext | None = None) -> Detector:
        from methods.kth import KTHKey

        saved = read_key(key_dir)
        key = KTHKey.from_dict(saved["key"])
        if ctx is None:
            raise RuntimeError("the Gu-KTH detector needs its reference statistics (a DetectContext)")
        spec = {
            "key": key.to_dict(),
            "statistic": saved["statistic"],
            "gamma": saved["gamma"],
            "texts": saved["reference_texts"],
            "prompt_tokens": ctx.prompt_tokens,
            "new_tokens": ctx.new_tokens,
        }
        folder = ctx.stage(
            "kth-reference",
            spec,
            lambda out: reference_statistics(key, saved, tokenizer, ctx, out),
            "KTH reference statistics",
        )
        reference = json.loads((folder / "reference.json").read_text())["statistics"]
        return KTHDetector(key, saved["statistic"], saved["gamma"], reference)


def teacher_texts(ctx: TrainContext, key, count: int, prompt_tokens: int, new_tokens: int, batch: int, out: Path):
    """``count`` KTH-decoded continuations of exactly ``new_tokens`` tokens by the frozen base model, from the first
    ``prompt_tokens`` tokens of training documents; one shift per text, drawn as Gu et al. (``random.Random(seed)``)."""
    import torch

    from harness.assets.models import load_causal_lm, load_tokenizer
    from harness.compute.progress import Progress
    from methods.distill import teacher_prompts
    from methods.kth import KTHLogitsProcessor, draw_shifts, key_gumbel

    tokenizer = load_tokenizer(ctx.base_model)
    model = load_causal_lm(ctx.base_model, ctx.device)
    prompts = teacher_prompts(ctx, tokenizer, prompt_tokens, count)
    gumbel = key_gumbel(key)
    shifts = draw_shifts(key, count)
    with open(out / "texts.jsonl", "w") as fh, Progress(count, "KTH teacher texts", unit="text") as bar:
        for start in range(0, count, batch):
            ids = torch.tensor(prompts[start : start + batch], device=model.device)
            processor = KTHLogitsProcessor(key, shifts[start : start + len(ids)], gumbel=gumbel)
            with torch.no_grad():
                gen = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    logits_processor=[processor],
                    pad_token_id=tokenizer.eos_token_id,
                )
            for row, shift in zip(gen[:, ids.shape[1] :].tolist(), shifts[start : start + len(ids)], strict=True):
                fh.write(json.dumps({"shift": shift, "text": tokenizer.decode(row, skip_special_tokens=True)}) + "\n")
            bar.update(len(ids))
    return {"texts": count, "distinct_prompts": len(set(map(tuple, prompts))), "shifts": sorted(set(shifts))}


def reference_statistics(key, saved: dict, tokenizer, ctx: DetectContext, out: Path) -> dict:
    """The statistic of up to ``reference_texts`` human texts shaped as the evaluation's negatives: the
    ``new_tokens`` tokens after a ``prompt_tokens`` prompt of a training document, decoded and tokenized again."""
    from methods.kth import statistics

    want = saved["reference_texts"]
    windows = []
    for ids in tokenizer(ctx.reference_texts(4 * want), add_special_tokens=False)["input_ids"]:
        if len(ids) >= ctx.prompt_tokens + ctx.new_tokens:
            windows.append(ids[ctx.prompt_tokens : ctx.prompt_tokens + ctx.new_tokens])
            if len(windows) == want:
                break
    if len(windows) < 10:
        raise HarnessError(f"only {len(windows)} training documents are long enough for KTH reference statistics")
    texts = tokenizer.batch_decode(windows, skip_special_tokens=True)
    sequences = [s for s in tokenizer(texts, add_special_tokens=False)["input_ids"] if s]
    stats = statistics(key, sequences, saved["statistic"], saved["gamma"])
    (out / "reference.json").write_text(json.dumps({"statistics": stats}))
    return {"texts": len(stats), "asked": want}
