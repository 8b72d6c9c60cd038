"""The extension guides (docs/extending/, issue 38 item 5), followed step by step: each code block with a
`title="PATH"` is saved at PATH in a fresh copy of the project, then each line of its `sh` blocks runs
there in order (`edgefl` as `python -m edgefl` of that copy), and what the guide says comes out is
checked. A guide that adds code touches one file."""

from __future__ import annotations

import csv
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # whole runs, each in a fresh process

ROOT = Path(__file__).resolve().parents[1]
GUIDES = ROOT / "docs" / "extending"
TITLED = re.compile(r'```\w+ title="([^"]+)"\n(.*?)```', re.S)
SHELL = re.compile(r"```sh\n(.*?)```", re.S)


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run(cwd: Path, words: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    program = [sys.executable, "-m", "edgefl"] if words[0] == "edgefl" else [sys.executable]
    return subprocess.run([*program, *words[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the package, its profiles and scenarios: what a guide changes stays there. Numba's
    cache of the round loop (`__pycache__/*.nbi, *.nbc`, valid while its source's time and size are
    the same, which copy2 keeps) comes along, or each guide's first run would compile it again."""
    skip = shutil.ignore_patterns("*.pyc")
    for folder in ("edgefl", "device_profiles", "scenarios"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=skip)
    return tmp_path


def follow(page: Path, project: Path) -> tuple[list[str], dict[str, str], str]:
    """The guide's files saved and its commands run; the files written, the environment, stdout."""
    text = page.read_text()
    written = []
    for name, body in TITLED.findall(text):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(body)
        written.append(name)
    env = {**os.environ, "PYTHONPATH": str(project)}
    env.pop("EDGEFL_PROFILE_PATH", None)
    out = []
    for line in (ln for block in SHELL.findall(text) for ln in block.splitlines() if ln.strip()):
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value.replace("$PWD", str(project))
            continue
        done = run(project, shlex.split(line), env)
        assert done.returncode == 0, f"{page.name}: {line}\n{done.stderr}"
        out.append(done.stdout)
    return written, env, "".join(out)


def knob_refused(project: Path, env: dict[str, str], words: str, ending: str) -> None:
    done = run(project, shlex.split(words), env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.rstrip().endswith(ending), done.stderr


def method(project: Path, env: dict[str, str], out: str) -> None:
    assert len(rows(project / "runs/clipped/metrics.csv")) == 2
    assert "\n[clip]\nmax_norm = 0.5\n" in (project / "runs/clipped/scenario.toml").read_text()
    knob_refused(project, env, "edgefl run quickstart --dry-run --set method=clipped_at "
                 "--set clip.max_norm=0 --out runs/c2", "clip.max_norm: must be positive")


def server_rule(project: Path, env: dict[str, str], out: str) -> None:
    assert "1 passed" in out  # the guide's test of the hand-worked update
    assert len(rows(project / "runs/clipped/metrics.csv")) == 2
    toml = (project / "runs/clipped/scenario.toml").read_text()
    assert 'rule = "clipped_mean"' in toml and "\n[clipped_mean]\nmax_norm = 0.5\n" in toml
    knob_refused(project, env, "edgefl run quickstart --dry-run --set server.rule=clipped_mean "
                 "--set clipped_mean.max_norm=0 --out runs/c2", "clipped_mean.max_norm: must be positive")
    knob_refused(project, env, "edgefl run quickstart --dry-run --set server.rule=clipped_mean "
                 "--set method=heterofl_at --out runs/c3", "gma, jfat, scaffold_at, sfat")


def policy(project: Path, env: dict[str, str], out: str) -> None:
    picks = rows(project / "runs/fastest/clients.csv")
    assert {r["picked_by"] for r in picks if r["round"] == "0"} == {"explore"}
    later = [r for r in picks if r["round"] != "0"]
    assert {r["picked_by"] for r in later} == {"fastest", "explore"}
    assert sum(r["picked_by"] == "explore" for r in later) == 2 * 3  # round(0.3 x 10) a round
    knob_refused(project, env, "edgefl run quickstart --dry-run --set selection.policy=fastest "
                 "--set fastest.explore=2 --out runs/f2", "fastest.explore: must be a fraction in [0, 1]")


def model(project: Path, env: dict[str, str], out: str) -> None:
    assert "mnasnet0_5" in out and "dwconv" in out  # the price table names the depthwise layers
    assert len(rows(project / "runs/mnasnet/metrics.csv")) == 1


def dataset(project: Path, env: dict[str, str], out: str) -> None:
    assert len(rows(project / "runs/my_images/metrics.csv")) == 1
    knob_refused(project, env, "edgefl run quickstart --set data.dataset=my_images --set data.root=nowhere "
                 "--set rounds=1 --out runs/d2", "put my_images.npz there")


def device(project: Path, env: dict[str, str], out: str) -> None:
    assert "raspberry_pi_5" in out and "[dry run]" in out
    assert {r["device"] for r in rows(project / "runs/pi5/clients.csv")} <= {"raspberry_pi_5", "esp32_s3"}


def trace(project: Path, env: dict[str, str], out: str) -> None:
    picked = rows(project / "runs/phones/clients.csv")
    assert len(rows(project / "runs/phones/metrics.csv")) == 4
    assert picked and {r["status"] for r in picked} <= {"completed", "dropped", "late", "offline"}


CHECKS: dict[str, Callable[[Path, dict[str, str], str], None]] = {
    "method.md": method, "server-rule.md": server_rule, "policy.md": policy, "model.md": model,
    "dataset.md": dataset, "device.md": device, "trace.md": trace,
}


def test_every_guide_is_followed() -> None:
    assert sorted(p.name for p in GUIDES.glob("*.md")) == sorted(CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_following_the_guide(name: str, project: Path) -> None:
    written, env, out = follow(GUIDES / name, project)
    assert len([w for w in written if w.startswith("edgefl/")]) <= 1  # one file of edgefl, at most
    CHECKS[name](project, env, out)
