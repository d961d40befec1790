"""Where a worker's CPU goes, from a py-spy profile of it: the share of the samples that held the GIL
in each part of a move (RQ's bookkeeping of a job, the database, the model's SDK, the demo model
itself, the audit chain, Redis, the rest of the desk's own code). A sample inside a job's own work
counts for the innermost part it is in; one outside it, under RQ, for RQ's bookkeeping.

    .venv/bin/pip install py-spy
    .venv/bin/py-spy record --pid <worker pid> --duration 10 --rate 200 --gil --format raw -o worker.txt
    .venv/bin/python -m bench.where worker.txt

(`python -m bench --parts throughput` prints each worker's pid in its log; `--gil` keeps only the
samples of the thread holding the GIL, that is the Python code running, not the threads waiting.)
"""

from __future__ import annotations

import argparse
from collections import Counter

# In order: a sample counts for the first part one of its frames matches (innermost frames first).
PARTS = (
    ("the demo model answering (bench only: a real model runs elsewhere)", ("demo/model/",)),
    ("the model's SDK (request, stream parsing)", ("anthropic/", "httpx", "httpcore")),
    ("the audit chain", ("webapp/audit_chain/",)),
    ("the database (SQLAlchemy, the driver)", ("sqlalchemy/", "psycopg", "sqlite3")),
    ("Redis (enqueues, live events)", ("redis/",)),
    ("the desk's own code", ("webapp/", "jobs/")),
)
JOB = ("jobs/",)  # frames of a job's own work: below them, the desk's
RQ = "RQ's bookkeeping of a job (dequeue, registries, heartbeats, its Redis calls)"
OTHER = "other (threads, logging, the interpreter)"


def split(lines) -> tuple[int, Counter]:
    """(samples, samples per part) of py-spy's raw format: "frame;frame;... count" per line,
    outermost frame first."""
    total, parts = 0, Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")[::-1]
        total += int(count)
        parts[_part(frames)] += int(count)
    return total, parts


def _part(frames: list[str]) -> str:
    if not any(mark in frame for frame in frames for mark in JOB) and any("rq/" in frame for frame in frames):
        return RQ
    for frame in frames:
        for name, marks in PARTS:
            if any(mark in frame for mark in marks):
                return name
    return OTHER


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profiles", nargs="+", help="py-spy raw profiles (--format raw)")
    args = parser.parse_args(argv)
    for path in args.profiles:
        with open(path) as profile:
            total, parts = split(profile)
        print(f"{path}: {total} samples holding the GIL")
        for name in [RQ, *(name for name, _ in PARTS), OTHER]:
            print(f"  {parts[name] / total if total else 0:6.1%}  {name}")


if __name__ == "__main__":
    main()
