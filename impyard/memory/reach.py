"""The reach: whose memories a query may touch, and the one place the scope filter is made.

Every query a box's session makes is filtered by ``imp = ? AND scope IN (reads)`` through ``Reach``; the
operator's reach is every scope of an imp (``scopes`` None). No request names a scope, so no box can ask
past its session. Statements that take the filter are built once per reach shape (``per_reach``), with
bind parameters, so SQLAlchemy's compiled cache serves every turn (issue 18).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Table, and_, bindparam, false


@dataclass(frozen=True)
class Reach:
    """Whose memories a query may touch: one imp, and its scopes (None: every scope — the operator only)."""

    imp: str
    scopes: tuple[str, ...] | None

    @property
    def shape(self) -> str:
        """What the clause looks like (statements are kept per shape): every scope, some, or none."""
        return "all" if self.scopes is None else "some" if self.scopes else "none"

    @staticmethod
    def criterion(table: Table, shape: str) -> ColumnElement[bool]:
        """The one scope filter, with the bind parameters ``reach_imp`` and ``reach_scopes`` (``params``)."""
        if shape == "none":
            return false()
        imp = table.c.imp == bindparam("reach_imp")
        if shape == "all":
            return imp
        return and_(imp, table.c.scope.in_(bindparam("reach_scopes", expanding=True)))

    def where(self, table: Table) -> ColumnElement[bool]:
        return self.criterion(table, self.shape)

    def params(self, **more: Any) -> dict[str, Any]:
        return {"reach_imp": self.imp, "reach_scopes": list(self.scopes or ()), **more}


_BUILT: dict[tuple[str, str], Any] = {}


def per_reach(name: str, reach: Reach, build: Callable[[str], Any]) -> Any:
    """A statement of a fixed shape, built once per reach shape (``Reach.criterion``) and kept."""
    key = (name, reach.shape)
    statement = _BUILT.get(key)
    if statement is None:
        statement = _BUILT[key] = build(reach.shape)
    return statement
