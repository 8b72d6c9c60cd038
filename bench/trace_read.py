"""Reading a large availability trace CSV (issue 39: a 200 MB trace took 48 s and 6.7 GB): edgefl's
reader (pyarrow columns, intervals checked and grouped as arrays) against the reader before it
(the file's text, a list of csv.DictReader rows, a mapping; its `from_mapping` today's, which checks
as arrays too), each in a fresh process, its wall seconds and peak resident memory printed. The
floor of both is the trace itself as Python lists of intervals, which the simulation reads. Not a
test.

    .venv/bin/python bench/trace_read.py [--clients 100000] [--per-client 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WAYS = {
    "columns": "from edgefl.sim.availability import read_trace; read_trace(PATH, False, 'bench')",
    # the reader before (702d691's _from_csv): the text, a list of row dicts, a mapping
    "python rows": "import csv, io; from edgefl.sim.availability import from_mapping\n"
                   "rows = list(csv.DictReader(io.StringIO(PATH.read_text())))\n"
                   "table = {}\n"
                   "for r in rows:\n"
                   "    table.setdefault(r['client'], []).append([float(r['start_s']), float(r['end_s'])])\n"
                   "from_mapping(table)",
}
MEASURE = """import resource, sys, time
from pathlib import Path
PATH = Path(sys.argv[1])
start = time.perf_counter()
{code}
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"""


def write_trace(path: Path, clients: int, per_client: int) -> None:
    """Each client online 500 s of every 1000 s, `per_client` times."""
    with path.open("w") as f:
        f.write("client,start_s,end_s\n")
        for k in range(clients):
            f.writelines(f"{k},{j * 1000.0},{j * 1000.0 + 500}\n" for j in range(per_client))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--clients", type=int, default=100_000)
    p.add_argument("--per-client", type=int, default=20)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.csv"
        started = time.perf_counter()
        write_trace(path, args.clients, args.per_client)
        print(f"{args.clients * args.per_client:,} intervals, {path.stat().st_size / 1e6:.1f} MB "
              f"(written in {time.perf_counter() - started:.1f} s)")
        print(f"{'reader':<14}{'seconds':>9}{'peak MB':>9}")
        for name, code in WAYS.items():
            done = subprocess.run([sys.executable, "-c", MEASURE.format(code=code), str(path)],
                                  capture_output=True, text=True, check=True)
            seconds, peak = map(float, done.stdout.split())
            print(f"{name:<14}{seconds:>9.2f}{peak:>9.0f}")


if __name__ == "__main__":
    main()
