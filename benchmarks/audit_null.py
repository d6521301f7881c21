"""Does each audit's stated false-positive rate hold on unwatermarked derivatives of the base? (``harness detect``)

An audit's null is "the source never saw the key". The models that meet it and matter are not the base alone but
what people make of it: fine-tunes, merges with unrelated models, quantizations. For every scheme whose keys can be
drawn without training (KGW, KTH, AAR, GaussMark, the Gaussian bias), this scores the texts of each derivative with
its pooled test (``Detector.pool``, what ``harness detect`` decides by) under ``--keys`` keys drawn afresh (the
setting that names each scheme's key, seeds 1, 2, ...) and prints the share flagged at ``--alpha`` with its 95%
Clopper-Pearson interval: the stated rate holds where the interval reaches down to ``alpha`` or below.

PRO's key is a trained policy: keys cannot be drawn without a training each, so its row shows, for a trained PRO key
(``--pro-key``: a train stage folder), the AUC of each derivative's centred scores against the base's own
continuations and the Mann-Whitney p-value ``harness detect`` used to decide by (decision version 3), which
convicted derivatives that never saw the key; ``harness detect`` now gives PRO no verdict (``harness.audit.verdict``).

    python benchmarks/audit_null.py [--preset tiny] [--keys 100] [--alpha 0.05] [--results DIR] [--pro-key DIR]

The derivatives: the base itself, the preset's two donors (fine-tunes of the base on code and on prose), the base
fine-tuned by the ``finetune`` attack (its five checkpoints), a TIES merge of the base with the donors, its HQQ 4-bit
quantization, and weight noise at sigma 0.03. Their texts are stages of the store at ``--results``
(reused on a second run). GaussMark's pooled z is ``<xi, g> / (sigma ||g||)`` for the summed log-likelihood's gradient
g, which does not depend on the key: it is computed once per derivative and projected on each key's noise (the
arithmetic of ``GaussMarkDetector.pool``); KTH's permutation test runs with ``--kth-null-keys`` fresh keys (its p-value
is exact for any number; fewer keys only coarsen it).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

# The schemes whose keys are drawn without training (``WatermarkMethod.draw_key``), each by its setting ``seed``; the
# other methods share these detectors and keys (Gloaguen-KGW and kgw-decoding Gu-KGW's; kth- and aar-decoding theirs).
SCHEMES = ("gu-kgw", "gu-kth", "gu-aar", "gaussmark", "gaussian-bias")


def derivatives(pipe) -> list[tuple[str, Path, str]]:
    """(name, folder, model id) of each unwatermarked derivative of the preset's base: built or reused in the store."""
    from harness.assets import models
    from harness.config.registry import attacks
    from harness.contract.attack import Output

    base = Output("base", "", Path(pipe.base["path"]), f"base:{pipe.base['fingerprint']}", None)
    found = [("base", base.path, base.model_id)]
    donors = pipe.preset.attacks.get("merge", {}).get("donors", "")
    for donor in filter(None, donors.split(",")):
        path = models.resolve(donor)
        found.append((f"donor {donor}", Path(path), f"model:{models.fingerprint(path)}"))
    made = [
        ("finetune", {}),
        ("merge", {"method": "ties"}),
        ("hqq", {"bits": 4}),
        ("weight-noise", {"sigma": 0.03}),
    ]
    for name, settings in made:
        attack = attacks.build(name, settings, pipe.preset)
        for out in pipe.attack(attack, base):
            found.append((f"base -> {name} {out.config_label}", out.path, out.model_id))
    return found


def pooled_p_values(name: str, seed: int | None, texts: dict, pipe, kth_null_keys: int, tmp: Path) -> dict:
    """The pooled test's p-value on each derivative's texts (``texts``: name -> token ids) under the key of scheme
    ``name`` drawn from ``seed`` (None: the preset's own, published key)."""
    from harness.config.registry import methods
    from harness.contract.method import read_key

    method = methods.build(name, {} if seed is None else {"seed": seed}, pipe.preset)
    folder = tmp / f"{name}-{seed}"
    folder.mkdir(parents=True)
    method.draw_key(folder, pipe.base["path"])
    key = read_key(folder)
    if name == "gaussmark":  # (one detector, its noise drawn anew for each key: GRADIENTS)
        from scipy.stats import norm

        from methods.gaussmark import noise

        detector = GRADIENTS["detector"]
        detector.xi = {n: noise(key["seed"], n, x.shape, key["sigma"]).to(x.device) for n, x in detector.xi.items()}
        return {d: float(norm.sf(detector.pooled_z(GRADIENTS[d]))) for d in texts}
    if name == "gu-kth":  # (its constructor wants reference statistics, which the pooled test does not read)
        from methods.gu_kth import KTHDetector
        from methods.kth import KTHKey

        detector = KTHDetector(KTHKey.from_dict(key["key"]), key["statistic"], key["gamma"], [])
        return {d: detector.pool(seqs, [], null_keys=kth_null_keys)["p_value"] for d, seqs in texts.items()}
    detector = method.detector(folder, pipe.tokenizer, None)
    return {d: detector.pool(seqs, [])["p_value"] for d, seqs in texts.items()}


# GaussMark's pooled z is <xi, g> / (sigma ||g||) for the summed log-likelihood's gradient g under the base, which does
# not depend on the key: derivative -> g (``GaussMarkDetector.pooled_gradient``), computed once, and the one detector
# under "detector" (``summed_gradients``).
GRADIENTS: dict = {}


def summed_gradients(texts: dict, pipe, tmp: Path) -> None:
    """Fill ``GRADIENTS``: a GaussMark detector at the preset's weights, and each derivative's summed gradient."""
    from harness.config.registry import methods
    from harness.contract.method import read_key
    from methods.gaussmark import GaussMarkDetector

    folder = tmp / "gaussmark-gradients"
    folder.mkdir(parents=True)
    methods.build("gaussmark", {}, pipe.preset).draw_key(folder, pipe.base["path"])
    detector = GaussMarkDetector(read_key(folder), pipe.base["path"], "cpu", pipe.tokenizer, 16)
    GRADIENTS["detector"] = detector
    for derivative, seqs in texts.items():
        GRADIENTS[derivative] = detector.pooled_gradient(seqs)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    a = (1 - level) / 2
    low = float(beta.ppf(a, k, n - k + 1)) if k > 0 else 0.0
    high = float(beta.ppf(1 - a, k + 1, n - k)) if k < n else 1.0
    return low, high


def pro_row(pipe, key_dir: Path, texts: dict[str, list[list[int]]], gens: dict[str, list[dict]]) -> dict[str, str]:
    """Each derivative's texts under a trained PRO key (the centred score): the AUC against the base's own
    continuations, and the Mann-Whitney p-value of decision version 3."""
    from harness.audit import verdict as audit
    from harness.cell import detection
    from harness.config.registry import methods
    from harness.contract.method import read_key, score_texts

    saved = read_key(key_dir)
    method = methods.build("pro", {"score": "centred", "n": saved.get("n", 1)}, pipe.preset)
    detector = method.detector(key_dir, pipe.tokenizer, detection.detect_context(pipe))
    scores = {
        name: [s["score"] for s in score_texts(method, detector, seqs, [g["prompt_ids"] for g in gens[name]])]
        for name, seqs in texts.items()
    }
    row = {}
    for name, values in scores.items():
        found = audit.against_base(values, scores["base"])
        row[name] = f"AUC {found['auc']:.3f}, p {found['writes_like_base_p']:.2g}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--keys", type=int, default=100, help="keys drawn afresh per scheme (seeds 1..K)")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--kth-null-keys", type=int, default=19)
    parser.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated, of " + ", ".join(SCHEMES))
    parser.add_argument("--results", type=Path, default=Path("results/runs"))
    parser.add_argument("--pro-key", type=Path, help="a trained PRO train stage folder (its row)")
    args = parser.parse_args()

    from harness.cell import detection
    from harness.cell.pipeline import Pipeline
    from harness.config import presets
    from harness.store import files
    from harness.store.stages import Store

    preset = presets.get_preset(args.preset)
    pipe = Pipeline(preset, Store(args.results))
    texts, gens = {}, {}
    for name, path, model_id in derivatives(pipe):
        stage = pipe.generate(path, model_id, name)
        gens[name] = files.read_jsonl(stage.path / "generations.jsonl")
        texts[name] = detection.detector_input(pipe, gens[name], "completion")
    print(f"\n{len(texts)} derivatives x {preset.eval.num_prompts} texts of {preset.eval.new_tokens} tokens; "
          f"{args.keys} keys per scheme; share flagged at alpha = {args.alpha:g} [95% Clopper-Pearson]\n")  # fmt: skip
    schemes = [s for s in args.schemes.split(",") if s]
    header = f"| derivative | {' | '.join(schemes)} |"
    lines = [header, "| --- " * (header.count("|") - 1) + "|"]
    cells: dict[str, list[str]] = {name: [] for name in texts}
    with tempfile.TemporaryDirectory(prefix="audit-null-") as tmp:
        for scheme in schemes:
            start = time.time()
            if scheme == "gaussmark":
                summed_gradients(texts, pipe, Path(tmp))
            found = {d: [] for d in texts}  # derivative -> p-values, the preset key's first
            for seed in [None, *range(1, args.keys + 1)]:
                for d, p in pooled_p_values(scheme, seed, texts, pipe, args.kth_null_keys, Path(tmp)).items():
                    found[d].append(p)
            flagged_all = 0
            for d, (preset_p, *ps) in found.items():
                k = sum(p <= args.alpha for p in ps)
                low, high = clopper_pearson(k, len(ps))
                mark = "" if low <= args.alpha else " !"
                cells[d].append(f"{k / len(ps):.2f} [{low:.2f}, {high:.2f}]{mark}; preset key p {preset_p:.2g}")
                flagged_all += k
            total = len(texts) * args.keys
            print(f"{scheme}: {flagged_all}/{total} flagged over all derivatives ({time.time() - start:.0f} s)")
    pro = pro_row(pipe, args.pro_key, texts, gens) if args.pro_key else {}
    if pro:
        lines[0] += " PRO (one trained key: against the base's texts) |"
        lines[1] += " --- |"
    for name, row in cells.items():
        lines.append(f"| {name} | {' | '.join(row)} |" + (f" {pro[name]} |" if pro else ""))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
