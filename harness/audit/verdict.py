"""``harness detect``: audit a suspect model, or a file of texts, against the stored key of a trained watermark.

The key is a train stage of a run store, named by its hash (or a unique prefix, or its folder), or by the method and
settings that trained it. A model is made to continue the evaluation prompts of the key's setup (a generate stage, as
in ``harness run``); texts are read from a file. Each text is scored by the method's own detector, and the texts are
then tested together for one decision about their source:

- where the scheme has a null distribution of its own, its pooled test (``Detector.pool``: KGW's green count over the
  distinct (green list, token) pairs of all texts, KTH's summed statistic against the same texts under keys drawn
  afresh);
- otherwise (PRO) there is no test with a false-positive rate, and the audit says so: no p-value and no verdict.
  The texts' scores are compared with those of the unwatermarked base model's own continuations of the same
  evaluation prompts (the ``generate`` stage ``harness run`` makes for its base row; the AUC against them, and a
  one-sided Mann-Whitney U test of "the source writes like the base") as evidence only. That null is not "the source
  never saw the key": an unwatermarked fine-tune of the base writes unlike the base too, and PRO's key (a learned
  policy that scores likely tokens) rates that shift as watermark (the tiny base's code-instruct donor, which never
  saw a key, reached AUC 0.68 against the base's texts, p = 1e-10 with 200 texts). A null that holds, the suspect's
  scores under keys trained afresh from other seeds (exchangeable with the owner's key when the suspect never saw
  any of them), costs one training a key, and a hundred keys for a p-value that can reach 0.01. A method may score
  differently for an audit (``WatermarkMethod.audit_settings``: PRO's centred score, given the prompts a suspect model
  continued; texts from a file continue no known prompt). Human texts' scores are shown beside it.

The scores are a ``detect`` stage of the store, so the same audit is computed once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

from harness.assets import models
from harness.cell import detection, scoring
from harness.cell.pipeline import source_spec, training_settings
from harness.config.errors import HarnessError, first_line
from harness.config.presets import PRESETS, get_preset
from harness.config.settings import PROMPTS, DataSource, Preset
from harness.contract.method import score_texts
from harness.store import files, kinds
from harness.store.stages import Stage, Store, stage_at

TEXT_SUFFIXES = (".txt", ".jsonl")
# Bump when the decision drawn from the scores changes (the pooled tests): a detect stage's result is keyed by it.
# 2: KGW counts distinct (green list, token) pairs (1: distinct (k+1)-grams); a scheme with no null of its own is
# calibrated on the base model's continuations (1: on human texts); 3: KTH by a permutation test over keys drawn
# afresh (2: a rank test against the reference statistics of human texts, which flagged unwatermarked models); 4: a
# scheme with no null of its own gets no p-value and no verdict (3: a Mann-Whitney p-value against the base's texts,
# which convicted an unwatermarked fine-tune of the base)
DECISION_VERSION = "4"


# --- the key ----------------------------------------------------------------------------------------------------
def train_stage(store: Store, ref: str) -> Stage:
    """The finished train stage that ``ref`` names: a folder, or a hash (or unique prefix) in ``store``."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return _stage_at(path.resolve(), ref)
    if not ref or not all(c in "0123456789abcdef" for c in ref):
        raise HarnessError(f"--key '{ref}' is neither a folder nor a stage hash (hexadecimal)")
    found = store.matching(ref)
    if not found:
        where = store.folder(kinds.TRAIN, "").relative_to(store.root).as_posix()
        raise HarnessError(f"no stage '{ref}' in the store at '{store.root}' (see its {where}/ folder)")
    trains = [s for s in found if s.kind == kinds.TRAIN]
    if len(trains) > 1:
        raise HarnessError(f"'{ref}' names {len(trains)} trained watermarks in '{store.root}': give more of the hash")
    return _stage_at((trains or found)[0].path, ref)


def _stage_at(path: Path, ref: str) -> Stage:
    stage = stage_at(path)
    kind = stage.kind
    if kind != kinds.TRAIN or not (path / "key.json").is_file():
        if not (path / "spec.json").is_file():
            what = "not a stage of a store"
        elif kind == kinds.RUN:
            what = "a run (its spec.json names the train stage as detector.key_from)"
        else:
            what = f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind} stage"
        raise HarnessError(f"--key '{ref}' is not a trained watermark: {what}")
    if not (path / "DONE").is_file():
        raise HarnessError(f"--key '{ref}': the training in {path} did not finish")
    problem = stage.problem()  # spec.json is verified too
    if problem is not None:
        raise HarnessError(f"trained watermark {path} is damaged ({problem})")
    try:
        text = (path / "spec.json").read_bytes()
    except OSError as err:
        raise HarnessError(f"trained watermark {path} is damaged (spec.json: {first_line(err)})") from None
    spec = files.parse_json(text, f"trained watermark {path} is damaged: spec.json")
    shapes = {"method": str, "params": dict, "base_model": dict, "train_data": dict}
    wrong = [k for k, kind in shapes.items() if not isinstance(spec, dict) or not isinstance(spec.get(k), kind)]
    if wrong or not {"ref", "fingerprint"} <= set(spec["base_model"]):
        raise HarnessError(
            f"trained watermark {path} has a spec.json that is not a train stage's ({(wrong or ['base_model'])[0]})"
        )
    return replace(stage, spec=spec)


def setup_of(stage: Stage, preset: Preset | None) -> Preset:
    """The setup the key's texts are judged in: ``preset`` if given, else that of a stored run of this key (its
    evaluation prompts and lengths, at plain sampling of its documents: a run at another decoding or of chat prompts
    does not choose how a suspect is asked), else the tiny preset; always with the key's base model and training data
    (the tokenizer, and the human texts that calibrate a reference distribution)."""
    if preset is None:
        for run in Store(stage.root).runs():
            try:  # (a run damaged or edited since is not a setup to judge by: the next one is)
                spec = json.loads((run / "spec.json").read_text())
                if spec["detector"]["key_from"] == stage.key:
                    preset = Preset.model_validate(spec["config"]["preset"])
                    preset = preset.model_copy(update={"eval": preset.eval.plain()})
                    # The code and chat data a run's spec leaves out (``Preset.hashed``): its named preset's, so that
                    # --prompts code or chat over the key's own setup reads what that preset would.
                    named = PRESETS.get(spec.get("preset"))
                    if named is not None:
                        preset = preset.model_copy(update={k: getattr(preset, k) or getattr(named, k)
                                                           for k in ("code_data", "chat_data")})  # fmt: skip
                    break
            except (OSError, ValueError, KeyError, TypeError):  # (pydantic's ValidationError is a ValueError)
                continue
        else:
            preset = get_preset("tiny")
    data = {k: v for k, v in stage.spec["train_data"].items() if k != "fingerprint"}
    return preset.model_copy(update={"base_model": stage.spec["base_model"]["ref"], "train_data": DataSource(**data)})


# --- what is audited ----------------------------------------------------------------------------------------------
MAX_TEXTS_BYTES = 16 * 2**20  # a texts file is read whole: 16 MiB, some 4 million tokens, is far more than a test needs
MAX_TEXTS = 100_000  # each text costs its own rows of the results (8 million short ones did not end)


def read_texts(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of each text in ``path``: ``.txt`` one per non-empty line, ``.jsonl`` one object with a
    ``text`` field per line. Lines end at '\\n' alone (and a '\\r' before it): U+2028, U+0085, form feeds and the
    other breaks str.splitlines() also splits at are characters of a text, and of JSON. At most ``MAX_TEXTS_BYTES``
    and ``MAX_TEXTS`` texts."""
    if path.suffix not in TEXT_SUFFIXES:
        raise HarnessError(f"texts file '{path}' must be .txt (one text per line) or .jsonl (a 'text' field per line)")
    raw = files.read_bounded(path, "texts file", MAX_TEXTS_BYTES)
    if "\0" in raw:
        line = raw.count("\n", 0, raw.index("\0")) + 1
        raise HarnessError(f"{path}, line {line}: a NUL byte, which no text holds (not a text file)")
    lines = [(n, line.removesuffix("\r")) for n, line in enumerate(raw.split("\n"), 1)]
    lines = [(n, line) for n, line in lines if line.strip()]
    if len(lines) > MAX_TEXTS:
        raise HarnessError(f"texts file '{path}' holds {len(lines):,} texts, more than {MAX_TEXTS:,}; split it")
    if path.suffix == ".txt":
        texts = lines
    else:
        texts = []
        for n, line in lines:
            record = files.parse_json(line, f"{path}, line {n}")
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise HarnessError(f"{path}, line {n}: no 'text' field holding a string")
            texts.append((n, record["text"]))
    if not any(t.strip() for _, t in texts):
        raise HarnessError(f"texts file '{path}' holds no text")
    return texts


def check_text_lengths(path: Path, texts: list[tuple[int, str]], tokenizer, context: int | None) -> None:
    """Each text holds at most ``context`` tokens of the key's tokenizer (the longest sequence the key's base model
    takes): a longer one is refused, naming its line. A text with more characters than ``context`` of the tokenizer's
    longest tokens hold is refused before tokenizing (a 47 MB line took a minute and 6.7 GB to score)."""
    if context is None:
        return
    longest = max(map(len, tokenizer.get_vocab()), default=1)
    for n, text in texts:
        if len(text) > context * longest:
            raise HarnessError(
                f"{path}, line {n}: a text of {len(text):,} characters, more than the {context:,} tokens the key's "
                "base model takes (its max_position_embeddings) can hold; split it"
            )
    for start in range(0, len(texts), 256):
        part = texts[start : start + 256]
        for (n, _), ids in zip(
            part, tokenizer([t for _, t in part], add_special_tokens=False)["input_ids"], strict=True
        ):
            if len(ids) > context:
                raise HarnessError(
                    f"{path}, line {n}: a text of {len(ids):,} tokens, longer than the key's base model takes "
                    f"({context:,}: its max_position_embeddings); split it"
                )


def check_stored_training(store: Store, method, preset: Preset) -> None:
    """Refuse, before the base model is built or converted for the fingerprint a train stage's hash holds, a method and
    settings that no finished train stage of ``store`` has, judged by what its spec says without fingerprints (the
    settings, the training's, the base model's reference); ``Pipeline.train`` then finds the stage itself."""
    want = json.loads(json.dumps(training_settings(preset, method), default=str))
    for spec_file in store.folder(kinds.TRAIN, "").glob("*/spec.json"):
        if not (spec_file.parent / "DONE").is_file():
            continue
        try:
            spec = json.loads(spec_file.read_text())
        except (OSError, ValueError):
            continue  # (a damaged stage is no match; verifying it is the run's)
        if {k: spec.get(k) for k in want} == want and spec.get("base_model", {}).get("ref") == preset.base_model:
            return
    raise HarnessError(
        f"no trained {method.name} with these settings in '{store.root}': train it with 'harness run --preset "
        f"{preset.name} --method {method.name} ...', or name a stored one by --key"
    )


def check_planned_vocabulary(ref: str, trained: Stage) -> None:
    """Refuse a suspect built-in model this machine has not built yet (or a GGUF file not converted yet) whose recipe
    (header) gives a vocabulary of another size than the key's (``trained``'s), before it is built: a key scores the
    ids of its own tokenizer (``check_model`` compares the vocabularies themselves once the model is there)."""
    if not models.planned(ref):
        return
    tokenizer = key_tokenizer(trained)
    if tokenizer is None:
        return
    size, want = models.vocab_length(ref), len(tokenizer.get_vocab())
    if size != want:
        raise HarnessError(
            f"the key's vocabulary does not fit the tokenizer of '{ref}': {want} tokens against {size}; a key scores "
            "the ids of the tokenizer it was trained with"
        )


def key_tokenizer(trained: Stage):
    """The tokenizer the key was trained with, from its student's folder (the base model's is the same, checked once
    the base loads): what texts are checked by before the base model loads or builds. None for a method that keeps
    no student folder (its texts are checked by the base model's tokenizer)."""
    folder = trained.path / "model"
    return models.load_tokenizer(str(folder)) if (folder / "config.json").is_file() else None


def check_causal_lm(ref: str) -> str:
    """The suspect model's folder (or hub id), after checking that it is a causal LM: needs no key, so it runs before
    the key's setup loads (or builds) its base model."""
    models.check(ref)
    resolved = models.resolve(ref)
    models.check_causal_lm(resolved, ref)
    return resolved


def check_model(resolved: str, ref: str, key_tokenizer) -> str:
    """``resolved`` (from ``check_causal_lm``), after checking, before any generation, that its tokenizer is the key's
    (same vocabulary), so that the key's ids mean what they meant in training."""
    vocab, want = models.load_tokenizer(resolved).get_vocab(), key_tokenizer.get_vocab()
    if vocab != want:
        differ = sum(want.get(token) != i for token, i in vocab.items()) + len(set(want) - set(vocab))
        raise HarnessError(
            f"the key's vocabulary does not fit the tokenizer of '{ref}': {len(want)} tokens against {len(vocab)}, "
            f"{differ} of them differ; a key scores the ids of the tokenizer it was trained with"
        )
    return resolved


def audit_method(method, given: set[str] = frozenset()):
    """``method`` with the settings its class scores audits with (``audit_settings``), but those given on the
    command line (``given``); the trained student is the same (a setting that changed it would be no audit setting)."""
    from harness.config.registry import methods

    changes = {k: v for k, v in type(method).audit_settings.items() if k not in given}
    if not changes:
        return method
    return methods.build(method.name, {**method.params.model_dump(), **changes})


# --- the decision -------------------------------------------------------------------------------------------------
def against_base(scores: list[float], base: list[float]) -> dict:
    """How the suspect's texts' ``scores`` compare with the unwatermarked base model's continuations of the same
    prompts (``base``), for a scheme with no null of its own: the AUC against them, and the one-sided Mann-Whitney U
    p-value of "the source writes like the base". Evidence, not a verdict: the p-value is exact under that null
    alone, which every unwatermarked derivative of the base that writes otherwise than the base rejects as well."""
    from scipy.stats import mannwhitneyu

    result = mannwhitneyu(scores, base, alternative="greater")
    return {
        "auc": float(result.statistic / (len(scores) * len(base))),  # U / (n m)
        "writes_like_base_p": float(result.pvalue),
        "base_texts": len(base),
    }


NO_NULL = (
    "{method} has no null distribution: no test here bounds how often an unwatermarked model is flagged (its texts "
    "scored against the unwatermarked base's own continuations tell whether the source writes like the base, and an "
    "unwatermarked fine-tune or merge of the base does not either), so this audit gives no p-value and no verdict"
)


@dataclass(frozen=True)
class Suspect:
    """What is audited: a model (its reference and folder) or texts from a file."""

    kind: str  # "model" | "texts"
    ref: str
    resolved: str | None = None
    texts: tuple[str, ...] = ()


def audit(pipe, method, trained: Stage, suspect: Suspect) -> tuple[Stage, dict]:
    """Score the suspect's texts and as many human texts with ``method``'s detector keyed by ``trained``, in a
    ``detect`` stage of ``pipe``'s store; return the stage and its result (``result.json``)."""
    e = pipe.preset.eval
    source: dict
    generated = reference = None  # generate stages: the suspect model's, and the base model's to calibrate against
    # A model continues the evaluation prompts: a detector that reads prompts is given them, for its texts, the human
    # continuations and the base's (texts from a file continue no known prompt: none for any of them).
    prompted = suspect.kind == "model"
    if prompted:
        model_id = f"model:{models.fingerprint(suspect.resolved)}"
        generated = pipe.generate(suspect.resolved, model_id, f"suspect {suspect.ref}")
        source = {"model": {"ref": suspect.ref, "fingerprint": model_id}, "generate": generated.key}
    else:
        digest = hashlib.sha256(json.dumps(list(suspect.texts)).encode()).hexdigest()
        source = {"texts": {"name": Path(suspect.ref).name, "count": len(suspect.texts), "sha256": digest}}
    spec = {
        "stage": kinds.DETECT,
        "scoring_version": scoring.SCORING_VERSION,
        "decision_version": DECISION_VERSION,
        "detector": {**scoring.detector_spec(method, trained.key, e.score_on, prompted),
                     "settings": method.params.model_dump()},
        "source": source,
        "human": {"eval_data": source_spec(pipe.preset.eval_source()), "prompts": e.num_prompts,
                  "prompt_tokens": e.prompt_tokens, "new_tokens": e.new_tokens},
    }  # fmt: skip
    if e.prompts_label():  # the human answers of chat instructions, or code: what the model was asked is recorded
        spec["human"]["asked"] = {k: v for k, v in e.model_dump().items() if k in PROMPTS}
    if not method.detector_has_null:  # compared with the base model's own continuations (a generate stage)
        reference = pipe.generate(pipe.base["path"], f"base:{pipe.base['fingerprint']}", "base model")
        spec["reference"] = {"generate": reference.key}
    stage = pipe.store.stage(kinds.DETECT, spec)

    def build(out: Path) -> dict:
        detector = detection.keyed_detector(pipe, method, trained)
        prompts = pipe.prompts
        human_texts = [pipe.tokenizer.decode(p["human_ids"], skip_special_tokens=True) for p in prompts]
        if prompted:
            gens = files.read_jsonl(generated.path / "generations.jsonl")
            sequences = detection.detector_input(pipe, gens, "completion")
            texts = [g["completion"] for g in gens]
        else:
            texts = list(suspect.texts)
            sequences = pipe.tokenizer(texts, add_special_tokens=False)["input_ids"]
        human_seqs = pipe.tokenizer(human_texts, add_special_tokens=False)["input_ids"]

        def score(seqs: list[list[int]], rows: list[dict]) -> list[dict]:
            return score_texts(method, detector, seqs, [r["prompt_ids"] for r in rows] if prompted else None)

        scores = score(sequences, gens if prompted else [])
        human = [s["score"] for s in score(human_seqs, prompts)]
        pooled = detector.pool(sequences, scores)
        per_text = pooled.pop("per_text_p_values", None) if pooled is not None else None
        if per_text is not None:  # each text's own test, from the pooled one's keys (KTH's permutation test)
            for s, p in zip(scores, per_text, strict=True):
                s["p_value"] = p
        if pooled is None:
            if reference is None:
                raise RuntimeError(f"{method.name} says its detector has a null of its own (detector_has_null), "
                                   "but its pool returned none")  # fmt: skip
            base_gens = files.read_jsonl(reference.path / "generations.jsonl")
            base = [s["score"] for s in score(detection.detector_input(pipe, base_gens, "completion"), base_gens)]
            evidence = against_base([s["score"] for s in scores], base)
            pooled = {"p_value": None, "statistic": evidence["auc"], "test": NO_NULL.format(method=method.label),
                      "tokens": sum(map(len, sequences)), "against_base": evidence,
                      "reference_median_score": _median(base)}  # fmt: skip
            for s in scores:
                s.pop("p_value", None)  # (a per-text p-value would claim the rate the pooled one cannot)
        rows = [{"i": i, "tokens": len(seq), **s, "text": t}
                for i, (seq, s, t) in enumerate(zip(sequences, scores, texts, strict=True))]  # fmt: skip
        files.write_jsonl(out / "scores.jsonl", rows)
        result = {"texts": len(rows), "human_texts": len(human), "human_median_score": _median(human), **pooled}
        (out / "result.json").write_text(json.dumps(result, indent=2))
        return {"device": pipe.device}

    pipe.store.build_or_reuse(stage, f"detection of {suspect.ref} with {method.label}'s key", build)
    return stage, json.loads((stage.path / "result.json").read_text())


def _median(values: list[float]) -> float:
    import statistics

    return float(statistics.median(values)) if values else float("nan")
