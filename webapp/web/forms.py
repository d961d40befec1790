"""What the desk's posted forms say of a field they do not have (a stale page, or a hand-made post), and the
fields of a decision form."""

from __future__ import annotations

from collections.abc import Iterable

from webapp.web.errors import Refused


def unknown_fields(form: Iterable[str], known: frozenset[str]) -> str | None:
    """The sentence for the fields of `form` outside `known`; None when it has no other."""
    unknown = sorted(set(form) - known)
    return f"This form has no field {', '.join(unknown)}; reload the page." if unknown else None


def only_fields(form, allowed: set[str]) -> None:
    """Refuse a posted form that carries a field its page does not have (the CSRF token aside)."""
    unknown = set(form) - allowed - {"csrf_token"}
    if unknown:
        raise Refused(422, "unknown_field", f"Unknown field {sorted(unknown)[0]!r}; use the form on this page.")


def decision_fields(form) -> tuple[str, str]:
    """A decision form's decision and reason, once it holds nothing else."""
    only_fields(form, {"decision", "reason"})
    return form.get("decision", ""), form.get("reason", "")
