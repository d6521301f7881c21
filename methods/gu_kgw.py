"""Gu-KGW (Gu et al., "On the Learnability of Watermarks for Language Models"): KGW distilled into the weights by
logit distillation from the frozen base model plus ``delta`` on each context's green list."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from harness.assets import data, models
from harness.config.params import Params
from harness.contract.method import (
    Detector,
    KeyFromTokenizer,
    PublishedDefault,
    TrainContext,
    WatermarkMethod,
    read_key,
    save_trained,
    score_long_enough,
)
from methods.distill import logit_distill


class GuKGWParams(Params):
    k: int = Field(1, ge=0, le=2)  # context width of the hash: lm-watermarking's simple_0 / simple_1 / simple_2
    gamma: float = Field(0.25, gt=0, lt=1)
    delta: float = Field(2.0, gt=0)
    # Gu et al. remove EOS/BOS/PAD/UNK from the teacher's green lists for simple_1 only; None = do as they did.
    teacher_drop_special: bool | None = None
    detector_drop_special: bool = False  # Gu et al.'s detector keeps them
    ignore_repeated_ngrams: bool = False
    # The hash key: None = lm-watermarking's default 15485863 (the paper's, and public: anyone can write text it
    # flags); a number kept secret = a hash key of one's own drawn from it (``methods.kgw.secret_hash_key``).
    seed: int | None = Field(None, ge=0, lt=2**63)
    added_later = ("seed",)

    @model_validator(mode="before")
    @classmethod
    def _resolve_default(cls, values: dict) -> dict:
        if isinstance(values, dict) and values.get("teacher_drop_special") is None:
            try:
                k = int(values.get("k", 1))
            except (TypeError, ValueError, OverflowError):  # (k: .inf in a grid)
                return values  # the field check reports the bad k by name
            values = {**values, "teacher_drop_special": k == 1}
        return values


class KGWDetector(Detector):
    def __init__(self, key: dict, ignore_repeated_ngrams: bool, ctx=None):
        from methods.kgw import KGWKey, green_lists

        stage, device = (ctx.stage, ctx.device) if ctx is not None else (None, "cpu")
        self.greens = green_lists(KGWKey.from_dict(key), stage, device)
        self.ignore_repeated_ngrams = ignore_repeated_ngrams

    def score(self, sequences: list[list[int]]) -> list[dict]:
        from methods.kgw import score_sequences

        def batch(seqs: list[list[int]]) -> list[dict]:
            return [
                {
                    "score": s.z_score,
                    "p_value": s.p_value,
                    "p_value_gu": s.p_value_gu,
                    "green": s.num_green,
                    "scored": s.num_scored,
                    "units": s.units,
                    "prefix_scores": s.prefix,
                }
                for s in score_sequences(self.greens, seqs, self.ignore_repeated_ngrams)
            ]

        # no evidence
        neutral = {"score": 0.0, "p_value": 1.0, "p_value_gu": 1.0, "green": 0, "units": 0, "prefix_scores": []}
        return score_long_enough(sequences, self.greens.key.context_width + 1, batch, neutral)

    def pool(self, sequences: list[list[int]], scores: list[dict]) -> dict:
        from methods.kgw import pooled_score

        s = pooled_score(self.greens, sequences)
        return {
            "p_value": s.p_value,
            "statistic": s.z_score,
            "test": f"KGW green count of the {s.num_scored} distinct (green list, token) pairs of all texts "
            f"({s.num_green} green), exact one-sided binomial at gamma={self.greens.key.gamma:g}",
            "tokens": s.num_scored,
        }


class GuKGW(KeyFromTokenizer, WatermarkMethod):
    name = "gu-kgw"
    label = "Gu-KGW"
    tradeoff_settings = ("k", "delta")
    version = "1"
    detector_version = "2"  # (WatermarkMethod.detector_version)
    Params = GuKGWParams
    detector_has_null = True  # its pooled test is exact under the scheme's own null

    def key(self, tokenizer, drop_special: bool):
        """The KGW key for this tokenizer (``KGWKey``); special ids removed from green lists if ``drop_special``."""
        from methods.kgw import HASH_KEY, KGWKey, secret_hash_key

        special = {tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
        p = self.params
        return KGWKey(
            gamma=p.gamma,
            delta=p.delta,
            seeding_scheme=f"simple_{p.k}",
            vocab_size=len(tokenizer.get_vocab()),
            hash_key=HASH_KEY if p.seed is None else secret_hash_key(p.seed),
            excluded_ids=tuple(sorted(i for i in special if i is not None)) if drop_special else (),
        )

    def published_default(self) -> PublishedDefault:
        from methods.kgw import HASH_KEY

        return PublishedDefault(("detector", "hash_key"), HASH_KEY, "lm-watermarking's default hash key")

    def train(self, ctx: TrainContext, out: Path) -> dict:
        tokenizer = models.load_tokenizer(ctx.base_model)
        teacher_key = self.key(tokenizer, self.params.teacher_drop_special)
        teacher = models.load_causal_lm(ctx.base_model, ctx.device, dtype=ctx.settings.teacher_dtype)
        student = models.load_trainable(ctx.base_model, ctx.device)
        report = distill(student, teacher, teacher_key, tokenizer, ctx, "distill Gu-KGW")
        save_trained(out, student, tokenizer, self.detection_key(tokenizer))
        return report

    def detection_key(self, tokenizer) -> dict:
        """What ``train`` writes as ``key.json`` for the base ``tokenizer``: the teacher's KGW key (the green lists it
        distils), the detector's, and whether the detector skips repeated n-grams."""
        p = self.params
        return {
            "method": self.name,
            "teacher": self.key(tokenizer, p.teacher_drop_special).to_dict(),
            "detector": self.key(tokenizer, p.detector_drop_special).to_dict(),
            "ignore_repeated_ngrams": p.ignore_repeated_ngrams,
        }

    def detector(self, key_dir: Path, tokenizer=None, ctx=None) -> Detector:
        key = read_key(key_dir)
        return KGWDetector(key["detector"], key["ignore_repeated_ngrams"], ctx)

    def config_label(self) -> str:
        return f"k={self.params.k}, delta={self.params.delta:g}"


def distill(student, teacher, key, tokenizer, ctx: TrainContext, desc: str, masks: dict | None = None) -> dict:
    """Distil the KGW teacher (``teacher``'s logits + delta on ``key``'s green lists) into ``student`` over the
    training stream of ``ctx``; return the training report. ``masks``: train only these entries (``train``'s)."""
    from methods.kgw import green_lists, watermark_logits

    greens = green_lists(key, ctx.stages.aux_stage if ctx.stages is not None else None, ctx.device)
    s = ctx.settings
    stream = data.token_stream(tokenizer, ctx.train_texts, max_tokens=s.tokens)
    batches = data.training_batches(tokenizer, stream, s)
    return logit_distill(
        student, teacher, lambda ids, logits: watermark_logits(greens, ids, logits), batches, s, desc, ctx.device, masks
    )
