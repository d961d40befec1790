"""What every admin and operator form says of a field it does not have (a stale page, or a hand-made post)."""

from __future__ import annotations

from collections.abc import Iterable


def unknown_fields(form: Iterable[str], known: frozenset[str]) -> str | None:
    """The sentence for the fields of `form` outside `known`; None when it has no other."""
    unknown = sorted(set(form) - known)
    return f"This form has no field {', '.join(unknown)}; reload the page." if unknown else None
