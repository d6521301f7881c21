"""PRO's watermark policy (paper Section 3.2, CAWP): a frozen sentence encoder E embeds the n tokens before each
position, a trainable MLP M maps the embedding to one watermark logit per vocabulary token (tanh, in [-1, 1]), and
``delta * M(E(x_{i-n..i-1}))`` is added to the base model's logits for token x_i. Also FPL's first-order gradient
(Section 3.3, eq. booster) and the detection score.

Alignment, used everywhere here: in a Hugging Face causal LM the logits at index ``p`` predict token ``p + 1``. The
watermark for predicting token ``i`` is computed from ``x[i-n:i]`` (the n tokens just before it), so it sits at logits
index ``p = i - 1`` and reads ``x[p-n+1 : p+1]`` (the last n tokens of that position's context). Indices
``p >= n - 1`` have a full n-gram; ``watermark_logits`` returns zeros and a False mask below that. The last index
``p = T - 1`` predicts a token past the sequence: distillation needs no target token, so it is kept for training;
detection, which reads the actual next token, stops one earlier.

torch and transformers are imported inside functions and classes so that importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from harness.assets.encoder import Embedder
from harness.compute import distributed

BLOCKS = 2  # M's residual blocks


@cache
def _policy_class():
    import torch
    from torch import nn

    class PolicyMLP(nn.Module):
        """M: Linear(d_in -> hidden), two ReLU residual blocks, Linear(hidden -> vocab), tanh (paper: hidden 500).
        Residual block form (the paper does not give one): ``h + ReLU(Linear(h))``, the plainest residual MLP."""

        def __init__(self, d_in: int, vocab: int, hidden: int = 500, blocks: int = BLOCKS):
            super().__init__()
            self.sizes = {"d_in": d_in, "vocab": vocab, "hidden": hidden, "blocks": blocks}
            self.inp = nn.Linear(d_in, hidden)
            self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(blocks))
            self.out = nn.Linear(hidden, vocab)

        def features(self, e):
            """The hidden state before the vocabulary projection."""
            h = self.inp(e)
            for block in self.blocks:
                h = h + torch.relu(block(h))
            return h

        def forward(self, e):
            return torch.tanh(self.out(self.features(e)))

        def at(self, e, targets):
            """``forward(e)[i, targets[i]]`` without the full (N, V) projection: one row of the output layer per
            position (detection reads one token per position; at V = 128k this is most of its cost)."""
            h = self.features(e)
            return torch.tanh((h * self.out.weight[targets]).sum(-1) + self.out.bias[targets])

    return PolicyMLP


def PolicyMLP(d_in: int, vocab: int, hidden: int = 500, blocks: int = BLOCKS):  # noqa: N802 (a class, built lazily)
    """The mapping model M (see ``_policy_class``); ``vocab`` = the student's logits width, so logits add as is."""
    return _policy_class()(d_in, vocab, hidden, blocks)


def policy_parameters(d_in: int, vocab: int, hidden: int, blocks: int = BLOCKS) -> int:
    """How many parameters ``PolicyMLP(d_in, vocab, hidden, blocks)`` has (weights and biases), building nothing."""
    return (d_in + 1) * hidden + blocks * (hidden + 1) * hidden + (hidden + 1) * vocab


def norm_loss(m, eps: float, lambda_1: float, reduction: str = "mean"):
    """L_norm on M's outputs ``m`` (N samples, V tokens): returns ``(total, unbiased, balanced, hinge)`` with
    ``total = unbiased + balanced + lambda_1 * hinge``.

    unbiased = sum_i |mean_j m_ij| (no persistent preference per sample), balanced = sum_j |mean_i m_ij| (zero
    mean per token over samples), hinge = sum_ij max(0, eps - |m_ij|) (non-vanishing logits). ``reduction="sum"`` is
    the paper's equation literally. ``"mean"`` (default) averages each term over the index it sums instead: the
    paper's sums grow with batch size N and vocabulary V (the hinge with N * V), so with lambda_2 = 1 they would dwarf
    L_sim, a per-token mean KL, and a learning rate tuned for one batch shape would not carry to another.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', not {reduction!r}")
    m = m.float()
    reduce = (lambda t: t.mean()) if reduction == "mean" else (lambda t: t.sum())
    # Several processes (harness/compute/distributed.py), each with its slice of the samples: the per-token mean over
    # samples is taken over all of them (an all-reduce with a gradient), the terms over samples scaled so that the
    # averaged
    # gradients are those of one process on the whole batch.
    column_mean, share = m.mean(dim=0), 1.0
    if distributed.active():
        from torch.distributed.nn.functional import all_reduce

        column_mean = all_reduce(m.sum(dim=0)) / (m.shape[0] * distributed.world_size())
        share = 1.0 if reduction == "mean" else float(distributed.world_size())
    unbiased = reduce(m.mean(dim=1).abs()) * share
    balanced = reduce(column_mean.abs())
    hinge = reduce((eps - m.abs()).clamp(min=0)) * share
    return unbiased + balanced + lambda_1 * hinge, unbiased, balanced, hinge


def prefix_ngrams(input_ids, n: int):
    """(B, T - n + 1, n) windows of ``input_ids`` (B, T): window k is ``x[k:k+n]``, the n-gram that sets the
    watermark at logits index ``p = k + n - 1`` (predicting token ``k + n``). Empty if T < n."""
    if input_ids.shape[1] < n:
        return input_ids.new_zeros(input_ids.shape[0], 0, n)
    return input_ids.unfold(1, n, 1)


def prefix_embeddings(embedder: Embedder, tokenizer, input_ids, n: int):
    """(B, T - n + 1, dim) E-embeddings of ``prefix_ngrams``, on the embedder's device."""
    windows = prefix_ngrams(input_ids, n)
    b, w, _ = windows.shape
    return embedder.embed_ngrams(windows.reshape(-1, n), tokenizer).view(b, w, -1)


def watermark_logits(policy, embedder: Embedder, tokenizer, input_ids, n: int):
    """Raw M values aligned with the model's logits: ``(W (B, T, V), mask (B, T))`` where ``W[:, p]`` is
    ``M(E(x[p-n+1 : p+1]))``, the watermark for the token at ``p + 1``, and ``mask[:, p] = p >= n - 1``; masked-out
    entries are 0. Teacher logits: ``base_logits + delta * W`` (where ``mask``)."""
    import torch

    b, t = input_ids.shape
    emb = prefix_embeddings(embedder, tokenizer, input_ids, n)
    device = emb.device
    mask = torch.zeros(b, t, dtype=torch.bool, device=device)
    mask[:, n - 1 :] = True
    vocab = policy.sizes["vocab"]
    if emb.shape[1] == 0:
        return torch.zeros(b, t, vocab, device=device), mask
    values = policy(emb)
    pad = torch.zeros(b, n - 1, vocab, device=device, dtype=values.dtype)
    return torch.cat([pad, values], dim=1), mask


def detection_scores(
    policy, embedder: Embedder, tokenizer, sequences: list[list[int]], n: int, progress=None, chunk: int = 64
):
    """Per completion (ids, no prompt): ``{"score": z, "scored": k, "prefix_scores": [...]}``, z = mean over tokens
    i >= n of ``M(E(x[i-n:i]))[x_i]``, k = len - n, and the same mean over the first 1, 2, ..., len tokens. A
    sequence of n tokens or fewer has nothing to score: ValueError."""

    def values(part: list[list[int]], _start: int):
        ngrams, targets = scored_positions(part, n)
        embedded = embedder.embed_ngrams(ngrams, tokenizer)
        return policy.at(embedded, targets.to(embedded.device))  # M(E(prefix))[x_i] for every scored position

    return _running_means(policy, sequences, n, values, progress, chunk)


def centred_detection_scores(
    policy,
    embedder: Embedder,
    tokenizer,
    base,
    sequences: list[list[int]],
    n: int,
    progress=None,
    chunk: int = 8,
    prompts: list[list[int]] | None = None,
):
    """As ``detection_scores``, each position's M value less its expectation under the base model's next-token
    distribution: ``c_i = M_i[x_i] - sum_y p_base(y | context, x_<i) M_i[y]``, with ``M_i = M(E(x[i-n:i]))``, and the
    text's score the mean of ``c_i`` (and its running mean). Where the base wrote the text from that context,
    ``E[c_i | context, x_<i] = 0``: the base model's own text scores zero on average however predictable it is, where
    the paper's score rewards predictability itself. The context is the text's prompt (``prompts``, the ids it
    continues, BOS included where the tokenizer adds one) where the caller knows it, else BOS alone (its BOS where the
    tokenizer has one): without the prompt the centring is exact only up to what the prompt told the base (SmolLM2's
    own generations scored 0.016 [0.003, 0.029] so). M reads the text alone in both, as in the paper's score."""
    import torch

    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    device = next(base.parameters()).device
    if prompts is not None and len(prompts) != len(sequences):
        raise ValueError(f"PRO detection: {len(prompts)} prompts for {len(sequences)} sequences")

    def values(part: list[list[int]], start: int):
        ngrams, targets = scored_positions(part, n)
        rows = policy(embedder.embed_ngrams(ngrams, tokenizer))  # (positions, V): M_i for every scored position
        expected = []
        for k, ids in enumerate(part, start):  # the base's next-token distribution where it predicts x_n .. x_end
            context = list(prompts[k]) if prompts is not None else bos
            logits = base(input_ids=torch.tensor([context + ids], device=device)).logits[0].float()
            expected.append(torch.softmax(logits[len(context) + n - 1 : len(context) + len(ids) - 1], -1))
        probs = torch.cat(expected).to(rows.device)
        width = min(probs.shape[1], rows.shape[1])  # (a model's logits may be padded past the vocabulary)
        targets = targets.to(rows.device)
        return rows.gather(1, targets[:, None])[:, 0] - (probs[:, :width] * rows[:, :width]).sum(-1)

    return _running_means(policy, sequences, n, values, progress, chunk)


def scored_positions(sequences: list[list[int]], n: int):
    """Every scored position i >= n of every sequence, flat: ``(ngrams (P, n), targets (P,))`` with the n-gram
    ``x[i-n:i]`` and the token ``x_i`` (the sequences' windows, by unfold: no Python per position)."""
    import torch

    ngrams, targets = [], []
    for ids in sequences:
        ids = torch.tensor(ids, dtype=torch.long)
        ngrams.append(ids[:-1].unfold(0, n, 1))
        targets.append(ids[n:])
    return torch.cat(ngrams), torch.cat(targets)


def _running_means(policy, sequences: list[list[int]], n: int, values: Callable, progress, chunk: int) -> list[dict]:
    """Each text's mean of ``values(texts, start)`` (one value per scored position i >= n of each text, flat;
    ``start``: the index of the chunk's first text in ``sequences``) and its running mean over the first 1, 2, ...,
    len tokens (0 before the first scored one), ``chunk`` texts at a time, with M in eval mode and no gradient."""
    import torch

    for idx, seq in enumerate(sequences):
        if len(seq) <= n:
            raise ValueError(
                f"PRO detection: sequence {idx} has {len(seq)} tokens; scoring needs more than n={n} "
                "(an n-gram prefix and at least one token after it)"
            )
    results = []
    was_training = policy.training
    policy.eval()
    with torch.no_grad():
        for start in range(0, len(sequences), chunk):
            part = [list(seq) for seq in sequences[start : start + chunk]]
            for ids, got in zip(part, values(part, start).split([len(ids) - n for ids in part]), strict=True):
                running = torch.cumsum(got.double(), 0) / torch.arange(1, len(got) + 1, device=got.device)
                prefix = [0.0] * n + [round(v, 4) for v in running.tolist()]  # the score of the first 1..len tokens
                results.append({"score": float(got.mean()), "scored": len(ids) - n, "prefix_scores": prefix})
            if progress is not None:
                progress.update(len(part))
    policy.train(was_training)
    return results


def fpl_gradients(
    model,
    sim_loss_fn: Callable,
    anti_loss_fn: Callable,
    alpha: float,
    beta: float,
    backward=None,
    diagnose=False,
    probe_loss_fn: Callable | None = None,
):
    """FPL's first-order student gradient (eq. booster, second-order term dropped as in first-order MAML/SAM):
    leaves ``grad L_sim(theta) + beta * (g - grad L_anti(theta - alpha * g / ||g||))`` in ``.grad`` (added to any
    gradient already there), with ``g = grad L_anti(theta)`` and ``||g||`` its global norm over all trainable
    parameters. Three forward/backward passes: L_sim, L_anti, and L_anti at the perturbed weights (the probe).
    With ``probe_loss_fn`` (the "resist" reading: L_sim at other weights) the probe is that loss instead, and the
    gradient ``grad L_sim(theta) + beta * grad L_sim(theta - alpha * g / ||g||)``: the watermark's loss where one
    normalised fine-tuning step on anti-watermarked text would take the weights, with the same three passes.

    ``sim_loss_fn(model)`` / ``anti_loss_fn(model)`` return scalar losses; the L_sim forward may have run already
    (a closure returning that loss), as its backward runs first, before any parameter is touched. Every gradient
    goes through ``backward`` (accelerate's, so loss scaling and multi-GPU gradient sync apply; default
    ``loss.backward()``). After the probe the parameters are copied back from a saved copy, so they are bit-identical
    to before (subtracting the step back could differ in the last bits). Returns the three losses and ``||g||``;
    with ``diagnose`` also the global norms of ``grad L_sim`` and of the FPL term ``beta * (g - grad L_anti(probe))``
    and their cosine (``benchmarks/fpl_diagnostics.py``; it keeps a copy of ``grad L_sim``, so it is off in training;
    a gradient there before the call counts in ``grad L_sim``).
    """
    import torch

    backward = backward or (lambda loss: loss.backward())
    sim = sim_loss_fn(model)
    backward(sim)
    # The parameters are listed only now, after a backward: under FSDP2 the ones registered while a forward's graph is
    # alive (the root module's, after PRO's L_sim forward) are the gathered copies, whose storage the backward frees;
    # copying one then read freed memory (a CUDA "invalid argument" on the GPU, a segfault on a CPU).
    params = [p for p in model.parameters() if p.requires_grad]

    def take() -> list:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        for p in params:
            p.grad = None
        return grads

    total = take()  # grad L_sim (plus any gradient there before), then the FPL terms are added in place
    sim_grad = [t.detach().clone() for t in total] if diagnose else None
    anti = anti_loss_fn(model)
    backward(anti)
    g = take()
    with torch.no_grad():
        g_norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(x if x.element_size() >= 4 else x.float()) for x in g])
        )
        scale = alpha / max(float(g_norm), 1e-12)
        saved = [p.detach().clone() for p in params]
        for p, gi in zip(params, g, strict=True):
            p.sub_(gi.to(p.dtype), alpha=scale)
        if probe_loss_fn is None:
            for acc, gi in zip(total, g, strict=True):
                acc.add_(gi, alpha=beta)
    del g
    try:
        probe = (probe_loss_fn or anti_loss_fn)(model)
        backward(probe)
        g_probe = take()
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)
    with torch.no_grad():
        for acc, gp in zip(total, g_probe, strict=True):
            if probe_loss_fn is None:
                acc.sub_(gp, alpha=beta)
            else:
                acc.add_(gp, alpha=beta)
    out = {"sim": sim.item(), "anti": anti.item(), "probe": probe.item(), "g_norm": g_norm.item()}
    if diagnose:
        with torch.no_grad():
            sim_sq = fpl_sq = dot = 0.0
            for acc, s in zip(total, sim_grad, strict=True):
                s = s.double()
                fpl = acc.double() - s
                sim_sq += float(s.square().sum())
                fpl_sq += float(fpl.square().sum())
                dot += float((fpl * s).sum())
        out.update(
            sim_grad_norm=sim_sq**0.5, fpl_grad_norm=fpl_sq**0.5, cosine=dot / max((sim_sq * fpl_sq) ** 0.5, 1e-30)
        )
    for p, acc in zip(params, total, strict=True):
        p.grad = acc
    return out


def anti_processor(policy, embedder: Embedder, tokenizer, n: int, delta: float):
    """A transformers LogitsProcessor that subtracts ``delta * M(E(last n tokens))`` from the next-token scores:
    sampling with it writes anti-watermarked (red-token dominant) text. Contexts shorter than n are left as is."""
    import torch
    from transformers import LogitsProcessor

    class AntiWatermark(LogitsProcessor):
        def __call__(self, input_ids, scores):
            if input_ids.shape[1] < n:
                return scores
            with torch.no_grad():
                emb = embedder.embed_ngrams(input_ids[:, -n:], tokenizer)
                w = policy(emb.to(scores.device)).to(scores.dtype)
            return scores - delta * w

    return AntiWatermark()
