"""GaussMark (Block et al., "GaussMark: A Practical Approach for Structural Watermarking of Language Models", ICML
2025): the key is Gaussian noise xi ~ N(0, sigma^2 I) added to chosen weight matrices of the base model; nothing is
trained. A text y is tested with the gradient of its log-likelihood under the *unwatermarked* base theta with respect
to those weights, projected on the key:

    z(y) = <xi, grad_theta log p_theta(y | x)> / (sigma * ||grad_theta log p_theta(y | x)||)

Under the null (y written independently of xi) the gradient is independent of xi, so z is exactly standard normal
and the one-sided p-value is ``1 - Phi(z)``; a text the noised model wrote tilts towards xi. The paper conditions on
the prompt x; the durability study's ``weightsmark`` sums the log-likelihood of the whole text instead. The harness
conditions on the prompt where it is known (``Detector.score``'s prompts: every run, ``harness detect --model``) and
on BOS alone where it is not (``harness detect --texts``). The pooled test of ``harness detect`` is the same statistic
for the sum of all texts' log-likelihoods (its gradient is the sum of theirs, so it is exactly N(0, 1) under the null
too, where the per-text z's are correlated and could not be combined as independent).

Each text's gradient is one backward pass; a batch of texts takes one, and the per-text projections and norms come
from the chosen layers' inputs and output gradients (``per_text_gradients``), not from a loop of backward passes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import Field, field_validator

from harness.assets import models
from harness.config.errors import HarnessError
from harness.config.params import Params, float32_scale
from harness.contract.method import (
    Detector,
    PublishedDefault,
    TrainContext,
    WatermarkMethod,
    read_key,
    save_key,
    save_trained,
)

DEFAULT_WEIGHTS = ("mlp.up_proj",)


class GaussMarkParams(Params):
    sigma: float = Field(0.01, gt=0)  # the noise's standard deviation, absolute (as the paper and the study set it)
    layers: tuple[int, ...] = (-1,)  # decoder layers (negative: from the last), e.g. layers=0,2
    weights: tuple[str, ...] = DEFAULT_WEIGHTS  # a decoder layer's Linear modules, e.g. mlp.up_proj,mlp.down_proj
    seed: int = Field(0, ge=0, lt=2**63)  # the key's random numbers (0, the default, is published with the code)
    batch_size: int = Field(8, gt=0)  # texts per backward pass at detection

    @field_validator("layers", "weights", mode="before")
    @classmethod
    def _split(cls, value):
        if isinstance(value, str | int):
            return tuple(p.strip() for p in str(value).split(",") if p.strip())
        return value

    _sigma = field_validator("sigma")(float32_scale)

    @field_validator("layers", "weights")
    @classmethod
    def _some(cls, value: tuple) -> tuple:
        if not value:
            raise ValueError("name at least one")
        if len(set(value)) != len(value):
            raise ValueError(f"named twice: {value}")
        return value


def target_names(config, layers: tuple[int, ...], weights: tuple[str, ...]) -> list[str]:
    """The module names the key noises (``model.layers.<i>.<weight>``), layer indices resolved against ``config``."""
    count = config.num_hidden_layers
    for i in layers:
        if not -count <= i < count:
            raise HarnessError(f"GaussMark layer {i} does not exist: the model has {count} layers (0..{count - 1})")
    for i in layers:
        same = [j for j in layers if j != i and j % count == i % count]
        if same:
            raise HarnessError(f"GaussMark layers {i} and {same[0]} are the same layer of this {count}-layer model")
    return [f"model.layers.{i % count}.{w}" for i in sorted({i % count for i in layers}) for w in weights]


def architecture(config) -> dict:
    """What a key must match in a model it reads: the shapes its noise was drawn for."""
    keys = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    return {k: getattr(config, k, None) for k in keys}


def noise(seed: int, name: str, shape, sigma: float):
    """The key's noise for weight ``name``: its own generator, seeded by the key's seed and the name, so a weight's
    noise does not depend on which others are noised."""
    import torch

    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float32) * sigma


class GaussMark(WatermarkMethod):
    name = "gaussmark"
    label = "GaussMark"
    tradeoff_settings = ("sigma",)
    version = "1"
    Params = GaussMarkParams
    detector_has_null = True  # z is exactly N(0, 1) under the null, per text and pooled

    def detector_reads_prompt(self) -> bool:
        return True  # the log-likelihood is the completion's given its prompt, as the paper's

    def validate(self, base_model: str | None = None) -> None:
        if base_model is None:
            return
        from harness.assets import models

        config = models.config(base_model)
        modules = linear_modules(config)
        for name in target_names(config, self.params.layers, self.params.weights):
            if name not in modules:
                inside = sorted({m.split(".", 3)[3] for m in modules if m.startswith("model.layers.0.")})
                raise HarnessError(
                    f"GaussMark weight '{name.split('.', 3)[3]}' is not a Linear module of a decoder layer of "
                    f"{base_model} (it has {', '.join(inside)})"
                )

    def config_label(self) -> str:
        p = self.params
        label = f"sigma={p.sigma:g}, layers={','.join(map(str, p.layers))}"
        return label if p.weights == DEFAULT_WEIGHTS else f"{label}, {'+'.join(p.weights)}"

    def train_params(self) -> dict:
        return self.params.model_dump(exclude={"batch_size"})  # detection's batching changes no weight

    def train(self, ctx: TrainContext, out: Path) -> dict:
        import torch

        tokenizer = models.load_tokenizer(ctx.base_model)
        model = models.load_trainable(ctx.base_model, ctx.device)
        names = target_names(model.config, self.params.layers, self.params.weights)
        modules = dict(model.named_modules())
        shapes = {}
        with torch.no_grad():
            for name in names:
                weight = modules[name].weight
                weight.add_(noise(self.params.seed, name, weight.shape, self.params.sigma).to(weight.device))
                shapes[name] = list(weight.shape)
        key = self.detection_key(model.config, shapes)
        save_trained(out, model, tokenizer, key)
        return {"steps": 0, "noised_weights": len(names), "noised_entries": sum(a * b for a, b in shapes.values())}

    def detection_key(self, config, shapes: dict[str, list[int]]) -> dict:
        """What ``train`` writes as ``key.json`` for a base model of ``config`` whose noised weights have ``shapes``:
        the noise's seed and scale (the noise itself is drawn again from them)."""
        p = self.params
        return {"method": self.name, "sigma": p.sigma, "seed": p.seed, "weights": shapes,
                "architecture": architecture(config)}  # fmt: skip

    def draw_key(self, out: Path, base_model: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from harness.assets import models

        config = models.config(base_model)
        with torch.device("meta"):  # (the shapes alone: no weight loads)
            modules = dict(AutoModelForCausalLM.from_config(config).named_modules())
        names = target_names(config, self.params.layers, self.params.weights)
        save_key(out, self.detection_key(config, {n: list(modules[n].weight.shape) for n in names}))

    def published_default(self) -> PublishedDefault:
        return PublishedDefault.seed_setting(self)

    def detector(self, key_dir: Path, tokenizer=None, ctx=None) -> Detector:
        from harness.assets import models

        key = read_key(key_dir)
        if ctx is None or ctx.base_model is None:
            raise HarnessError("GaussMark's detector needs the unwatermarked base model (its gradient is the test)")
        found = architecture(models.config(ctx.base_model))
        if found != key["architecture"]:
            drawn = key["architecture"]
            differ = ", ".join(f"{k} {drawn.get(k)} against {v}" for k, v in found.items() if v != drawn.get(k))
            raise HarnessError(
                f"GaussMark key in {key_dir} was drawn for another architecture than the base model {ctx.base_model} "
                f"({differ})"
            )
        return GaussMarkDetector(key, ctx.base_model, ctx.device, tokenizer, self.params.batch_size)


def linear_modules(config) -> set[str]:
    """Names of the Linear modules of a model of ``config`` (built on the meta device: no weight loads)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config)
    return {name for name, module in built.named_modules() if isinstance(module, torch.nn.Linear)}


class GaussMarkDetector(Detector):
    def __init__(self, key: dict, base_model: str, device: str, tokenizer, batch_size: int):
        import torch

        from harness.assets import models

        self.sigma = key["sigma"]
        self.model = models.load_causal_lm(base_model, device, dtype="float32").eval()
        self.model.requires_grad_(False)
        modules = dict(self.model.named_modules())
        self.targets = {name: modules[name] for name in key["weights"]}
        for name, module in self.targets.items():
            if list(module.weight.shape) != key["weights"][name]:
                raise HarnessError(f"GaussMark key: {name} has shape {list(module.weight.shape)}, not the key's")
        self.xi = {
            n: noise(key["seed"], n, m.weight.shape, self.sigma).to(m.weight.device) for n, m in self.targets.items()
        }
        self.bos = [tokenizer.bos_token_id] if tokenizer is not None and tokenizer.bos_token_id is not None else []
        self.pad = 0 if tokenizer is None or tokenizer.pad_token_id is None else tokenizer.pad_token_id
        self.batch_size = batch_size
        self.device = self.model.device
        self.torch = torch

    def score(self, sequences: list[list[int]], prompts: list[list[int]] | None = None) -> list[dict]:
        from scipy.stats import norm

        contexts = prompts if prompts is not None else [self.bos] * len(sequences)
        out = []
        for start in range(0, len(sequences), self.batch_size):
            seqs, ctxs = sequences[start : start + self.batch_size], contexts[start : start + self.batch_size]
            for projection, squared in per_text_gradients(self, ctxs, seqs):
                z = projection / (self.sigma * squared**0.5) if squared > 0 else 0.0
                out.append({"score": z, "p_value": float(norm.sf(z)), "grad_norm": squared**0.5})
        return out

    def pool(self, sequences: list[list[int]], scores: list[dict]) -> dict:
        """z of the summed log-likelihood of every text (BOS as each one's context): its gradient is the sum of the
        texts', so z is exactly N(0, 1) under the null whatever the texts' correlations."""
        from scipy.stats import norm

        z = self.pooled_z(self.pooled_gradient(sequences))
        tokens = sum(len(s) for s in sequences)
        return {"p_value": float(norm.sf(z)), "statistic": z, "tokens": tokens,
                "test": f"GaussMark z of the summed log-likelihood of {len(sequences)} texts ({tokens} tokens), "
                        "exactly N(0, 1) under the null"}  # fmt: skip

    def pooled_gradient(self, sequences: list[list[int]]) -> dict:
        """The gradient of the summed log-likelihood of every text (BOS as each one's context) at the key's weights,
        by weight name: what ``pool`` projects on the key's noise. It does not depend on the key, so a test over many
        keys computes it once (``benchmarks/audit_null.py``)."""
        total = {n: self.torch.zeros_like(x) for n, x in self.xi.items()}
        for start in range(0, len(sequences), self.batch_size):
            seqs = sequences[start : start + self.batch_size]
            for name, grad in summed_gradient(self, [self.bos] * len(seqs), seqs).items():
                total[name] += grad
        return total

    def pooled_z(self, total: dict) -> float:
        """z = <xi, g> / (sigma ||g||) of the summed gradient ``total`` (``pooled_gradient``) under this key's noise."""
        projection = sum(float((total[n] * self.xi[n]).sum()) for n in total)
        norm_ = sum(float((g * g).sum()) for g in total.values()) ** 0.5
        return projection / (self.sigma * norm_) if norm_ > 0 else 0.0


def _batch(detector, contexts, sequences):
    """Right-padded ids, attention mask and the mask of the scored (completion) positions' targets."""
    torch = detector.torch
    rows = [list(c) + list(s) for c, s in zip(contexts, sequences, strict=True)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), detector.pad, dtype=torch.long)
    attention = torch.zeros_like(ids)
    scored = torch.zeros_like(ids, dtype=torch.bool)
    for i, (c, r) in enumerate(zip(contexts, rows, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        attention[i, : len(r)] = 1
        scored[i, max(len(c), 1) : len(r)] = True  # (with no context at all, the first token has nothing before it)
    return ids.to(detector.device), attention.to(detector.device), scored.to(detector.device)


def _log_likelihoods(detector, ids, attention, scored):
    torch = detector.torch
    logits = detector.model(input_ids=ids, attention_mask=attention).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (logp * scored[:, 1:]).sum(-1)


def summed_gradient(detector, contexts, sequences) -> dict:
    """The gradient of the batch's summed log-likelihood with respect to the key's weights."""
    weights = [m.weight for m in detector.targets.values()]
    for w in weights:
        w.requires_grad_(True)
    try:
        total = _log_likelihoods(detector, *_batch(detector, contexts, sequences)).sum()
        grads = detector.torch.autograd.grad(total, weights)
    finally:
        for w in weights:
            w.requires_grad_(False)
    return dict(zip(detector.targets, grads, strict=True))


def layer_signals(detector, contexts, sequences) -> tuple[dict, dict, object]:
    """One forward and backward pass of the batch's summed log-likelihood: each key weight's input ``x`` and output
    gradient ``d`` at every position, by weight name (texts share no position), and the batch's padded ids."""
    torch = detector.torch
    inputs, grads, handles = {}, {}, []
    for name, module in detector.targets.items():
        handles.append(module.register_forward_hook(lambda m, a, o, n=name: inputs.__setitem__(n, a[0].detach())))
        handles.append(module.register_full_backward_hook(lambda m, gi, go, n=name: grads.__setitem__(n, go[0])))
    ids, attention, scored = _batch(detector, contexts, sequences)
    try:
        with torch.enable_grad():
            embeddings = detector.model.get_input_embeddings()(ids).detach().requires_grad_(True)
            logits = detector.model(inputs_embeds=embeddings, attention_mask=attention).logits.float()
            logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            (logp * scored[:, 1:]).sum().backward()  # (through the embeddings: the hooks see every layer's gradient)
    finally:
        for handle in handles:
            handle.remove()
    return inputs, grads, ids


def per_text_gradients(detector, contexts, sequences) -> list[tuple[float, float]]:
    """``(<xi, g_i>, ||g_i||^2)`` of each text's log-likelihood gradient g_i, from one backward pass of the batch.

    A Linear weight's gradient for text i is ``sum_t d_t x_t^T`` (x_t its input at position t, d_t the gradient of
    text i's log-likelihood at its output there; texts share no position, so d_t of text i is text i's alone). Then
    ``<xi, g_i> = sum_t d_t . (xi x_t)`` and ``||g_i||^2 = sum_{t,t'} (x_t . x_t')(d_t . d_t')``: no per-text gradient
    matrix is formed (torch.func's per-sample gradients would form them, the size of the weights per text)."""
    torch = detector.torch
    inputs, grads, ids = layer_signals(detector, contexts, sequences)
    projection = torch.zeros(len(sequences), dtype=torch.float64, device=ids.device)
    squared = torch.zeros_like(projection)
    for name, xi in detector.xi.items():
        x, d = inputs[name].double(), grads[name].double()  # (texts, positions, in), (texts, positions, out)
        projection += ((x @ xi.double().T) * d).sum((1, 2))
        squared += ((x @ x.transpose(1, 2)) * (d @ d.transpose(1, 2))).sum((1, 2))
    return list(zip(projection.tolist(), squared.tolist(), strict=True))
