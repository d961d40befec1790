"""Server-rendered pages that belong to no resource: the signed-in home page."""

from __future__ import annotations

from flask import Blueprint, render_template

from webapp.web.security import anyone_signed_in

bp = Blueprint("home", __name__)


@bp.get("/")
@anyone_signed_in
def index():
    return render_template("home.html")
