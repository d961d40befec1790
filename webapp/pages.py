"""Server-rendered pages that belong to no resource: the signed-in home page."""

from __future__ import annotations

from flask import Blueprint, render_template

from webapp.security import signed_in

bp = Blueprint("pages", __name__)


@bp.get("/")
@signed_in
def home():
    return render_template("pages/home.html")
