"""The kinds of stage the run store holds: one vocabulary, named here and nowhere else.

A stage's kind names its folder (``harness/store/stages.py``), is written into its spec (so it is part of its hash) and
tells readers what the folder holds: tables read ``run`` and ``attribution`` stages as results. A method may build
stages of its own (teacher texts, reference statistics: ``TrainContext.stage``); their kinds must be none of these,
else a method's stage would be read as, or stored among, the harness's own.
"""

from __future__ import annotations

from harness.config.errors import HarnessError

TRAIN = "train"  # a watermarked model and its key (methods/)
ATTACK = "attack"  # the model(s) a model attack made of a trained one
TEXT_ATTACK = "text-attack"  # generations whose completions a text attack rewrote
GENERATE = "generate"  # a model's continuations of the evaluation prompts
RUN = "run"  # one table cell: a detector and perplexity on one model's generations
ATTRIBUTION = "attribution"  # a detector on another model's stored generations
DETECT = "detect"  # ``harness detect``'s audit of a suspect model or texts
UTILITY = "utility"  # a model's perplexity on held-out human text (harness/cell/utility.py)
UTILITY_FILE = "utility.json"  # what a utility stage found
CALIBRATION = "calibration"  # a grid's choice of each method's strength on the unaltered model (harness/grid/)

RESERVED = (TRAIN, ATTACK, TEXT_ATTACK, GENERATE, RUN, ATTRIBUTION, DETECT, UTILITY, CALIBRATION)


def check_own(kind: str) -> None:
    """Refuse ``kind`` as a method's own stage kind if the store's own kinds include it (one line naming them)."""
    if kind in RESERVED:
        raise HarnessError(
            f"a method's own stage cannot be of kind '{kind}': {', '.join(RESERVED)} are the harness's stage kinds"
        )
