"""Does each audit's stated false-positive rate hold on unwatermarked derivatives of the base? (``harness detect``)

An audit's null is "the source never saw the key". The models that meet it and matter are not the base alone but
what people make of it: fine-tunes, merges with unrelated models, quantizations. For every scheme whose keys can be
drawn without training (KGW, KTH, AAR, GaussMark, the Gaussian bias), this scores the texts of each derivative with
its pooled test (``Detector.pool``, what ``harness detect`` decides by) and each text by its own p-value (the
per-text column of ``harness detect`` and of runs) under ``--keys`` keys drawn afresh (the setting that names each
scheme's key, seeds 1, 2, ...), and prints at each of ``--alphas`` the share of keys whose pooled test flags the
source with its 95% Clopper-Pearson interval, and the mean share of texts flagged with a 95% bootstrap interval over
keys: the stated rate holds where the interval reaches down to alpha or below (``!`` marks one that does not). 400
keys tell 1% from 2% (Clopper-Pearson [0.3%, 2.5%] at 4 of 400). ``--set`` chooses the text (``eval.prompts=code``
or ``chat``, ``eval.greedy=true`` for greedy decoding); the human continuations are a source too.

PRO's key is a trained policy: keys cannot be drawn without a training each, so its row shows, for a trained PRO key
(``--pro-key``: a train stage folder), the AUC of each derivative's centred scores against the base's own
continuations and the Mann-Whitney p-value ``harness detect`` used to decide by (decision version 3), which
convicted derivatives that never saw the key; ``harness detect`` now gives PRO no verdict (``harness.audit.verdict``).

    python benchmarks/audit_null.py [--preset tiny] [--set KEY=VALUE] [--keys 400] [--alphas 0.01,0.05]
        [--sources base,finetune ...,human] [--schemes gu-kgw,gu-kth] [--results DIR] [--pro-key DIR]

The derivatives: the base itself, the preset's two donors (fine-tunes of the base on code and on prose), the base
fine-tuned by the ``finetune`` attack (its five checkpoints), a TIES merge of the base with the donors, its HQQ 4-bit
quantization, and weight noise at sigma 0.03. Their texts are stages of the store at ``--results``
(reused on a second run). GaussMark's pooled z is ``<xi, g> / (sigma ||g||)`` for the summed log-likelihood's gradient
g, which does not depend on the key: it is computed once per derivative and projected on each key's noise (the
arithmetic of ``GaussMarkDetector.pool``; its per-text p-values, a backward pass per text, are not measured); KTH's
permutation test, pooled and per text, runs with ``--kth-null-keys`` fresh keys (99: its smallest p is 0.01; its
p-value is exact for any number, fewer keys only coarsen it), 100 key evaluations per key: the costly column.
"""

from __future__ import annotations

import argparse
import logging
import re
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
    """(the pooled test's p-value, each text's own p-value or None) on each derivative's texts (``texts``: name ->
    token ids) under the key of scheme ``name`` drawn from ``seed`` (None: the preset's own, published key). Each
    text's own: the detector's ``p_value`` per text, KTH's from its pooled test's keys; GaussMark's per-text z needs
    a gradient per text and is left out (None)."""
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
        return {d: (float(norm.sf(detector.pooled_z(GRADIENTS[d]))), None) for d in texts}
    if name == "gu-kth":  # (its constructor wants reference statistics, which the pooled test does not read)
        from methods.gu_kth import KTHDetector
        from methods.kth import KTHKey

        detector = KTHDetector(KTHKey.from_dict(key["key"]), key["statistic"], key["gamma"], [])
        found = {d: detector.pool(seqs, [], null_keys=kth_null_keys) for d, seqs in texts.items()}
        return {d: (f["p_value"], f["per_text_p_values"]) for d, f in found.items()}
    detector = method.detector(folder, pipe.tokenizer, None)
    return {d: (detector.pool(seqs, [])["p_value"], [s["p_value"] for s in detector.score(seqs)])
            for d, seqs in texts.items()}  # fmt: skip


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


def flagged_cell(pooled: list[float], per_text: list[list[float]] | None, alpha: float) -> str:
    """One table cell: the share of keys whose pooled test flags the source at ``alpha`` [95% Clopper-Pearson], and
    the mean over keys of the share of its texts whose own p-value is at most ``alpha`` [the 2.5 and 97.5
    percentiles of a bootstrap over keys: a key moves all of a source's texts at once, so keys are the unit]."""
    import numpy as np

    k = sum(p <= alpha for p in pooled)
    low, high = clopper_pearson(k, len(pooled))
    cell = f"{k / len(pooled):.3f} [{low:.3f}, {high:.3f}]" + ("" if low <= alpha else " !")
    if per_text:
        shares = np.array([np.mean(np.asarray(ps) <= alpha) for ps in per_text])
        draws = np.random.default_rng(0).choice(shares, (2000, len(shares))).mean(axis=1)
        lo, hi = np.percentile(draws, [2.5, 97.5])
        cell += f"; texts {shares.mean():.3f} [{lo:.3f}, {hi:.3f}]" + ("" if lo <= alpha else " !")
    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="as harness run's --set: e.g. eval.prompts=code, eval.greedy=true")  # fmt: skip
    parser.add_argument("--keys", type=int, default=400, help="keys drawn afresh per scheme (seeds 1..K)")
    parser.add_argument("--alphas", default="0.01,0.05", help="comma-separated levels")
    parser.add_argument("--kth-null-keys", type=int, default=99)
    parser.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated, of " + ", ".join(SCHEMES))
    parser.add_argument("--sources", help="comma-separated names of the sources to test, as the table names them "
                        "(default: all; 'human' is the human continuations)")  # fmt: skip
    parser.add_argument("--results", type=Path, default=Path("results/runs"))
    parser.add_argument("--pro-key", type=Path, help="a trained PRO train stage folder (its row)")
    args = parser.parse_args()

    from harness.cell import detection
    from harness.cell.pipeline import Pipeline
    from harness.cli.main import configure_logging
    from harness.compute.progress import Progress
    from harness.config import presets
    from harness.config.errors import HarnessError
    from harness.config.params import parse_assignments
    from harness.config.registry import methods
    from harness.config.settings import apply_overrides
    from harness.store import files
    from harness.store.stages import Store

    configure_logging(False)  # (the stages' and the keys' progress, on stderr; not each KTH test's, a line a key)
    for handler in logging.getLogger().handlers:
        handler.addFilter(lambda record: "permutation test" not in record.getMessage())
    preset = apply_overrides(presets.get_preset(args.preset), parse_assignments(args.set, "setting"))
    alphas = [float(a) for a in args.alphas.split(",")]
    pipe = Pipeline(preset, Store(args.results))
    schemes = []
    for scheme in filter(None, args.schemes.split(",")):  # (a key the method refuses at this base is left out: Gu-AAR's
        try:  # V x kV table at SmolLM2's 49,152 ids is 18 GiB, and drawing it was an out-of-memory kill, not a line)
            methods.build(scheme, {}, preset).validate(pipe.base["path"])
            schemes.append(scheme)
        except HarnessError as err:
            print(f"{scheme}: left out: {err}", flush=True)
    # (a name's own commas are followed by a space, "base -> merge w=0.5, 2 donors x 0.5, ...": split at the others)
    wanted = None if args.sources is None else set(re.split(r",(?! )", args.sources))
    texts, gens = {}, {}
    for name, path, model_id in derivatives(pipe):
        if wanted is not None and name not in wanted:
            continue
        stage = pipe.generate(path, model_id, name)
        gens[name] = files.read_jsonl(stage.path / "generations.jsonl")
        texts[name] = detection.detector_input(pipe, gens[name], "completion")
    if wanted is None or "human" in wanted:  # the human continuations of the same prompts
        gens["human"] = gens.get("base") or files.read_jsonl(
            pipe.generate(pipe.base["path"], f"base:{pipe.base['fingerprint']}", "base").path / "generations.jsonl"
        )
        texts["human"] = detection.detector_input(pipe, gens["human"], "human")
    print(f"\n{len(texts)} sources x {preset.eval.num_prompts} texts of {preset.eval.new_tokens} tokens "
          f"({preset.eval.prompts_label() or 'documents'}; {preset.eval.decoding_label() or 'plain sampling'}); "
          f"{args.keys} keys per scheme; at alpha = {', '.join(f'{a:g}' for a in alphas)}: the share of keys whose "
          "pooled test flags the source [95% Clopper-Pearson] and the mean share of texts flagged by their own "
          "p-value [95% bootstrap over keys]\n")  # fmt: skip
    columns = [f"{s} at {a:g}" for s in schemes for a in alphas]
    header = f"| source | {' | '.join(columns)} |"
    lines = [header, "| --- " * (header.count("|") - 1) + "|"]
    cells: dict[str, list[str]] = {name: [] for name in texts}
    with tempfile.TemporaryDirectory(prefix="audit-null-") as tmp:
        for scheme in schemes:
            start = time.time()
            if scheme == "gaussmark":
                summed_gradients(texts, pipe, Path(tmp))
            found = {d: [] for d in texts}  # source -> [(pooled p, per-text ps)], the preset key's first
            with Progress(args.keys + 1, f"{scheme}: keys", unit="key") as bar:  # (Gu-KTH at 1%: 30 min a source)
                for seed in [None, *range(1, args.keys + 1)]:
                    for d, result in pooled_p_values(scheme, seed, texts, pipe, args.kth_null_keys, Path(tmp)).items():
                        found[d].append(result)
                    bar.update(1)
            for d, ((preset_p, _), *rest) in found.items():
                pooled, per_text = [p for p, _ in rest], [t for _, t in rest if t is not None]
                for alpha in alphas:
                    cells[d].append(flagged_cell(pooled, per_text, alpha) + f"; preset key p {preset_p:.2g}")
            print(f"{scheme}: {time.time() - start:.0f} s", flush=True)
    pro = pro_row(pipe, args.pro_key, texts, gens) if args.pro_key else {}
    if pro:
        lines[0] += " PRO (one trained key: against the base's texts) |"
        lines[1] += " --- |"
    for name, row in cells.items():
        lines.append(f"| {name} | {' | '.join(row)} |" + (f" {pro[name]} |" if pro else ""))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
