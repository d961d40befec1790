"""What a worker process and the jobs its slots run share: who owns the leases the process takes,
whether the worker is stopping, and how many moves it made. The worker (worker.py) sets and reads
it; the move job (jobs/moves.py) reads and counts. Plain module state: one worker per process."""

from __future__ import annotations

import os
import socket
import threading


def process_owner() -> str:
    """The start of every lease owner of this process (host and pid)."""
    return f"{socket.gethostname()}:{os.getpid()}:"


# Set when this process's worker is asked to stop: a job ends its run of moves after the one it is
# making and hands the rest back to the queue (another worker takes it), instead of working on.
stopping = threading.Event()

_moves_made = 0
_moves_lock = threading.Lock()


def moves_made() -> int:
    """How many moves this process has made (its worker's record in Redis carries it, for /ops)."""
    return _moves_made


def count_move() -> None:
    """One move more made by this process (the move job says so after each)."""
    global _moves_made
    with _moves_lock:
        _moves_made += 1
