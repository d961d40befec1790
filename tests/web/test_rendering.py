"""Text for pages: titles cut at a word boundary, moments as <time> elements for the relative-time
script."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from webapp.tools.presenting import shorten
from webapp.web.rendering import when


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("Refund $20 on invoice 4471", 80, "Refund $20 on invoice 4471"),  # fits: unchanged
        ("Refund $20 on invoice 4471, the delivery was late", 30, "Refund $20 on invoice 4471…"),
        ("Refund $20 on invoice 4471, the delivery", 27, "Refund $20 on invoice 4471…"),  # the comma goes
        ("Refund   $20\n on\tinvoice", 80, "Refund $20 on invoice"),  # one line, single spaces
        ("Supercalifragilisticexpialidocious", 10, "Supercali…"),  # no boundary: cut inside the word
        ("Refund exactly", 14, "Refund exactly"),
        ("Refund exactly twelve", 15, "Refund exactly…"),  # the cut falls on the space after a word
        ("", 10, ""),
    ],
)
def test_titles_are_cut_at_a_word_boundary_with_an_ellipsis(text, limit, expected):
    shortened = shorten(text, limit)
    assert shortened == expected
    assert len(shortened) <= limit


def test_a_long_first_question_names_the_conversation_without_cutting_a_word():
    question = (
        "Please refund the customer of invoice 4471 in full because the delivery arrived three weeks late and damaged"
    )
    title = shorten(question, 80)
    assert title.endswith("…") and len(title) <= 80
    assert question.startswith(title[:-1]) and question[len(title) - 1] == " "  # ends on a whole word


def test_a_moment_is_a_time_element_with_the_exact_utc_time():
    moment = datetime(2026, 12, 1, 23, 5, 9, tzinfo=UTC)
    assert str(when(moment)) == (
        '<time datetime="2026-12-01T23:05:09Z" data-relative title="2026-12-01 23:05 UTC">2026-12-01 23:05 UTC</time>'
    )
    assert "23:05:09 UTC</time>" in str(when(moment, seconds=True))
    naive = datetime(2026, 12, 1, 23, 5, 9)  # SQLite hands back naive UTC
    assert str(when(naive)) == str(when(moment))
    elsewhere = moment.astimezone(timezone(timedelta(hours=2)))
    assert str(when(elsewhere)) == str(when(moment))
    assert "never" in str(when(None))
    assert 'data-local title="2026-12-01 23:05 UTC"' in str(when(moment, relative=False))
