"""How many of an imp's memories carry a vector of each length (issue 33): a vector is compared only with one of
its own length (mechanism 30), so memories embedded by another embedder than the imp's own are found by person
and recency, never by meaning. ``impyard doctor`` says so after a switch of embedder."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from impyard.storage.db import Database
from impyard.storage.tables import memory_records as _R


def vector_lengths(db: Database, imp: str) -> dict[int, int]:
    """Records with a vector, counted by the vector's length (``dims``); records without one are left out."""

    def read(conn: Connection) -> dict[int, int]:
        statement = select(_R.c.dims, func.count()).where(_R.c.imp == imp, _R.c.dims > 0).group_by(_R.c.dims)
        return {int(dims): int(count) for dims, count in conn.execute(statement)}

    return db.read(read)
