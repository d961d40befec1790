"""RQ entry points: plain importable functions that take ids, make one move and enqueue the next."""
