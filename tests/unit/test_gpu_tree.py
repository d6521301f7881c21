"""What travels to a lent GPU machine with each call (benchmarks/gpu_tree.sh): 64 MiB in all, the carried part
included, so the tree without the committed references must leave room for benchmarks/gpu_prepare.sh's parts, and
slim/restore must give git's index back exactly."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_tree.sh"
PART_MIB = 50  # gpu_prepare.sh's default
LIMIT_MIB = 64  # a device call's working tree, carried paths included

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def test_the_slim_tree_leaves_room_for_a_carried_part():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = git(ROOT, "ls-files", "-z").split("\0")
    slim = sum((ROOT / f).stat().st_size for f in tracked if f and not f.startswith("results/reference/")
               and (ROOT / f).is_file())  # fmt: skip
    assert slim + PART_MIB * 2**20 < LIMIT_MIB * 2**20, f"{slim / 2**20:.1f} MiB travel beside a {PART_MIB} MiB part"


def test_slim_then_restore_gives_the_index_back(tmp_path):
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "results" / "reference" / "a").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "benchmarks" / "gpu_tree.sh")
    (repo / "results" / "reference" / "a" / "runs.jsonl").write_bytes(b"x" * 300_000)
    (repo / "code.py").write_text("print(1)\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t")

    def run(verb: str) -> str:
        return subprocess.run(["bash", "benchmarks/gpu_tree.sh", verb], cwd=repo, check=True, capture_output=True,
                              text=True).stdout  # fmt: skip

    def travels(out: str) -> int:
        return int(out.split("travels: ")[1].split(" bytes")[0])

    full = travels(run("size"))
    assert full > 300_000
    slimmed = run("slim")
    assert travels(slimmed) < 10_000  # the reference is neither tracked nor untracked-and-unignored now
    assert (repo / "results" / "reference" / "a" / "runs.jsonl").exists()  # no file touched
    assert "already slim" in run("slim")
    assert travels(run("restore")) == full
    assert git(repo, "status", "--porcelain") == ""  # the index and the ignore rules as before
    (repo / "staged.txt").write_text("s")
    git(repo, "add", "staged.txt")
    refused = subprocess.run(["bash", "benchmarks/gpu_tree.sh", "slim"], cwd=repo, capture_output=True, text=True)
    assert refused.returncode == 2 and "staged changes" in refused.stderr
