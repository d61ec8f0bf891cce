"""Alembic's environment for impyard: configured in code (impyard.storage.migrations.config), no alembic.ini.

impyard runs the migrations itself when it opens a database (impyard.storage.db.Database.migrate), on a connection that
already holds the migration lock inside its transaction; Alembic joins that transaction. The developer's helper
(``python -m impyard.storage.migrations``) passes no connection: then this opens one from the configured URL.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine


def run() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    target_metadata = config.attributes.get("target_metadata")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():  # joins the caller's transaction
            context.run_migrations()
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "sqlite://")
    with engine.begin() as own:
        context.configure(connection=own, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if hasattr(context, "config"):  # run by Alembic; a plain import (a walk over impyard's modules) does nothing
    run()
