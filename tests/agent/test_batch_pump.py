"""The pump cuts a run's requests into batches the Message Batches API takes (at most 100,000 requests
and 256 MB a batch), in order, never an empty one."""

from __future__ import annotations

from webapp.agent.batch_pump import MOST_BYTES, MOST_REQUESTS, in_batches


def test_requests_are_cut_by_count_and_by_size_in_order():
    items = [(n, {"messages": [{"role": "user", "content": "x" * 40}]}) for n in range(7)]
    assert [[n for n, _ in batch] for batch in in_batches(items, most_requests=3)] == [[0, 1, 2], [3, 4, 5], [6]]
    one = len('{"messages": [{"role": "user", "content": "' + "x" * 40 + '"}]}')
    by_size = list(in_batches(items, most_bytes=2 * one))
    assert [len(batch) for batch in by_size] == [2, 2, 2, 1]
    assert list(in_batches([])) == []
    huge = [(1, {"text": "y" * 100})]
    assert list(in_batches(huge, most_bytes=10)) == [huge]  # a request larger than the cap still goes, alone


def test_the_limits_stay_inside_the_apis():
    assert MOST_REQUESTS <= 100_000 and MOST_BYTES < 256 * 1024 * 1024
