"""Several processes on one command, without launching them: how work is split (shards, batch rows), what is refused
(an uneven batch, a grid, FSDP1), and that one process does everything itself.
tests/smoke/test_distributed.py launches two."""

import pytest
import torch

from harness.compute import distributed
from harness.compute.training import my_rows


def test_one_process_does_all_the_work(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not distributed.active() and distributed.shard_bounds(9) == (0, 9)
    assert distributed.map_shards(lambda part, first: [(first, x) for x in part], [1, 2]) == [(0, 1), (0, 2)]
    assert distributed.broadcast("x") == "x"


def test_shards_split_the_work_in_order(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    parts = []
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        parts.append(distributed.shard_bounds(9))
        batch = torch.arange(8).reshape(4, 2)
        assert torch.equal(my_rows(batch), batch[:2] if rank == "0" else batch[2:])
    assert parts == [(0, 4), (4, 9)]
    with distributed.solo():
        assert not distributed.active() and distributed.shard_bounds(9) == (0, 9)


def test_uneven_batch_is_refused(monkeypatch):
    from harness.config.errors import HarnessError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(HarnessError, match="3 rows cannot be split evenly across 2 processes"):
        my_rows(torch.zeros(3, 4))


@pytest.mark.parametrize(
    "args, refused",
    [
        (["--attack", "none", "--set", "train.batch_size=16"], "train.batch_size (16)"),
        (
            ["--attack", "finetune", "--attack-arg", "batch_size=8", "--set", "train.batch_size=12"],
            "fine-tuning attack's batch_size (8)",
        ),
    ],
)
def test_uneven_batch_is_refused_before_any_work(monkeypatch, tmp_path, capsys, args, refused):
    """Under a launch of 3 processes, a batch they cannot split is one line before any model loads (the tiny base
    model is not built: the cache stays empty)."""
    from harness.cli.main import main

    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    code = main(["run", "--method", "gu-kgw", *args, "--results", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"{refused} cannot be split evenly across 3 processes" in err and "\n" not in err
    assert not (tmp_path / "cache").exists()


def test_grid_is_refused_under_a_multi_process_launch(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = cli("grid", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2 and "harness grid runs each cell in one process" in out.stderr, out.stderr


def test_fsdp1_training_is_refused_before_any_step(monkeypatch):
    """FSDP2 trains (tests/smoke/test_fsdp.py); FSDP1, whose wrapper save_model cannot gather from, is one line."""
    import accelerate
    from accelerate.utils import DistributedType

    from harness.compute.training import loss_step, train
    from harness.config.errors import HarnessError
    from harness.config.settings import TrainSettings

    class FSDPAccelerator:
        distributed_type = DistributedType.FSDP
        is_fsdp2 = False

        def __init__(self, **kwargs):
            pass

    monkeypatch.setattr(accelerate, "Accelerator", FSDPAccelerator)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(HarnessError, match="needs FSDP2"):
        train(model, loss_step(lambda m, b: m(b).sum()), iter([]), TrainSettings(steps=1, batch_size=1, seq_len=2,
                                                                                 lr=1e-3))  # fmt: skip


def test_another_process_reports_its_failure_in_one_line(monkeypatch, capsys):
    from harness.cli import commands
    from harness.cli import main as cli

    def broken():
        raise RuntimeError("Connection closed by peer [127.0.0.1]:1234.\nmore detail")

    monkeypatch.setattr(commands, "cmd_list", broken)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert cli.main(["list"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["harness: process 1 stopped: RuntimeError: Connection closed by peer [127.0.0.1]:1234."]
    monkeypatch.setenv("RANK", "0")  # the main process keeps the whole traceback of an unexpected error
    with pytest.raises(RuntimeError):
        cli.main(["list"])
