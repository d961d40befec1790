"""Flask extensions, created unbound here and bound to the app in create_app()."""

from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy

from webapp.models import Base

# expire_on_commit off: a move reads its rows, commits its claim, then calls the model without the
# session reloading anything (which would open a transaction for the length of the call).
db = SQLAlchemy(metadata=Base.metadata, session_options={"expire_on_commit": False})
migrate = Migrate()
