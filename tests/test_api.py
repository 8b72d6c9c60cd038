"""edgefl as a library (edgefl.api): `edgefl.run` makes the run `edgefl run` makes, `edgefl.compare`
returns the comparison's rows, `import edgefl` loads neither torch nor SimPy, and the simulated
clock lands where it is sent, to the bit (edgefl.sim.engine Federation: SimPy's public calls alone)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import simpy

import edgefl
from edgefl.cli import main
from edgefl.errors import EdgeflError
from edgefl.sim.engine import Federation

SMALL = ["rounds=2", "fleet.clients=4"]


def test_run_makes_the_run_directory_the_command_makes(tmp_path, capsys):
    done = edgefl.run("quickstart", sets=SMALL, out=tmp_path / "api", dry_run=True, progress=False)
    assert main(["run", "quickstart", "--dry-run", "--quiet", *[f"--set={s}" for s in SMALL],
                 "--out", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    assert done.run_dir == tmp_path / "api" and done.summary["rounds"] == 2 and done.summary["dry_run"]
    assert (done.run_dir / "metrics.csv").read_bytes() == (tmp_path / "cli" / "metrics.csv").read_bytes()
    assert printed.split(" -> ")[0].rsplit("(wall", 1)[0] == done.line.rsplit("(wall", 1)[0]


def test_compare_over_two_seeds_returns_its_rows(tmp_path, capsys):
    table = edgefl.compare("compare-digits", ["jfat", "fedavg_at"], sets=SMALL, seeds=2, dry_run=True,
                           out=tmp_path / "cmp", progress=False)
    assert table.seeds == [0, 1] and table.folder == tmp_path / "cmp"
    assert sorted((r["method"], r["seed"]) for r in table.rows) == [
        ("fedavg_at", 0), ("fedavg_at", 1), ("jfat", 0), ("jfat", 1)]
    assert all(p.exists() for p in table.files) and table.folder / "comparison.csv" in table.files
    assert table.markdown.startswith("| method |") and "| jfat |" in table.markdown
    assert capsys.readouterr().out.count("[dry run]") == 4  # each run's line, as it ended
    again = edgefl.compare("compare-digits", "jfat,fedavg_at", sets=SMALL, seeds=[0, 1], dry_run=True,
                           out=tmp_path / "cmp", progress=False)
    assert again.rows == table.rows and capsys.readouterr().out.count("finished, kept") == 4


@pytest.mark.parametrize(("call", "key"), [
    (lambda: edgefl.run(), "scenario"),
    (lambda: edgefl.compare("quickstart", "jfat", seeds=[0, 0]), "--seeds"),
    (lambda: edgefl.compare("quickstart", "jfat", interval="normal"), "--interval"),
    (lambda: edgefl.compare("quickstart", ["jfat", "nope"]), "--methods"),
])
def test_bad_input_is_one_error_line_naming_its_key(call, key):
    with pytest.raises(EdgeflError) as err:
        call()
    assert err.value.key == key and "\n" not in str(err.value)


def test_importing_edgefl_loads_none_of_the_work() -> None:
    code = "import sys, edgefl; print(sorted(m for m in sys.modules if m.split('.')[0] in " \
           "('torch', 'numpy', 'simpy', 'edgefl')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['edgefl', 'edgefl.version']"


def test_the_clock_lands_on_the_moment_it_is_sent_to_exactly() -> None:
    """0.1 + 0.2 + ... sums, random moments, and one that no single SimPy timeout reaches: from
    2^-53, now + (t - now) rounds to 1 or to 1 + 2^-51 for every delay, never to t = 1 + 2^-52."""
    fed, t = Federation(), 0.0
    for _ in range(1000):
        t += 0.1
        fed.reach(t)
        assert fed.now == t
    env = simpy.Environment(initial_time=2.0**-53)
    env.run(until=1 + 2.0**-52)
    assert env.now != 1 + 2.0**-52  # SimPy alone lands one spacing away
    fed = Federation(2.0**-53)
    fed.reach(1 + 2.0**-52)
    assert fed.now == 1 + 2.0**-52
    rnd = random.Random(0)
    for _ in range(2000):
        now = rnd.uniform(0, 1) * 10.0 ** rnd.randint(-6, 6)
        t = now + rnd.uniform(0, 1) * 10.0 ** rnd.randint(-6, 9)
        fed = Federation(now)
        fed.reach(t)
        assert fed.now == t


def test_waiting_adds_the_seconds_as_simpy_does() -> None:
    fed, env = Federation(0.1), simpy.Environment(initial_time=0.1)
    for seconds in (0.2, 0.3, 1e-9, 7.0):
        fed.wait(seconds)
        env.run(until=env.timeout(seconds))
        assert fed.now == env.now
    fed.reach(fed.now)  # already there: nothing to do
    with pytest.raises(ValueError):
        fed.reach(fed.now - 1.0)
