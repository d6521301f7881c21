"""The training loop's word on a loss that climbs: a training whose loss rises far above where it started (SmolLM2's
PRO at 30x the paper's learning rate went from 0.00 to 6-11 nats a token and wrote token noise) warns once while it
runs and goes on as configured; a loss that falls, or stays near zero, says nothing."""

import logging

import pytest
import torch

from harness.compute.training import climbing, train
from harness.config.settings import TrainSettings


@pytest.mark.parametrize(
    ("losses", "climbs"),
    [
        ([0.0] * 10 + [0.5] * 10 + [6.0] * 10, True),  # PRO on SmolLM2 at lr 3e-4
        ([0.01] * 10 + [0.08] * 10, False),  # PRO on tiny: 8x, but by 0.07 nat
        ([3.0] * 10 + [4.5] * 10, False),  # up by 1.5 nats, but 1.5x
        ([5.0] * 10 + [2.0] * 10, False),  # a loss that falls
    ],
)
def test_a_loss_climbs_where_it_rises_both_far_and_many_times(losses, climbs):
    assert (climbing(losses) is not None) == climbs


def scripted(losses):
    """A training step that reports ``losses`` in turn (the gradient is a real one, of size zero)."""
    values = iter(losses)

    def step(model, batch, backward) -> float:
        backward(model(batch).sum() * 0)
        return next(values)

    return step


@pytest.mark.parametrize("losses", [[0.0] * 10 + [8.0] * 20, [2.0] * 15 + [1.0] * 15])
def test_training_warns_once_while_the_loss_climbs_and_goes_on(losses, caplog):
    settings = TrainSettings(steps=len(losses), batch_size=1, seq_len=2, lr=1e-3)
    batches = iter([torch.ones(1, 2)] * len(losses))
    with caplog.at_level(logging.WARNING, logger="harness"):
        report = train(torch.nn.Linear(2, 1), scripted(losses), batches, settings, desc="train X", device="cpu")
    warned = [r.getMessage() for r in caplog.records if "may be diverging" in r.getMessage()]
    assert report["steps"] == len(losses) and report["losses"] == losses
    assert warned == (["train X: the loss climbed from 0 (mean of the first 10 steps) to 8 (the last 10): the "
                       "training may be diverging (a learning rate too large?)"] if losses[-1] > 2 else [])  # fmt: skip
