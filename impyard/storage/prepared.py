"""A statement compiled once and run straight on SQLite's driver (issue 18): the lean path of a warm turn's storage.

SQLAlchemy's execution path costs about 40-80 µs of CPU per statement (its cache key, execution context, parameter
processing and result set-up) against 4-15 µs for the statement itself on SQLite, and a warm turn runs about thirty.
A store wraps each of its hot statements once, at module level: ``_INFO = Prepared(select(...))``, and runs it with
``_INFO.run(conn, params)`` inside the transaction ``db.write``/``db.read`` gave it. On SQLite the statement is
compiled on its first run into SQL text, the order of its parameters and the type processors of its parameters and
columns, and then run on the driver's connection (the transaction is the driver's own: our BEGIN, SQLAlchemy's
commit). On PostgreSQL it is ``conn.execute`` (there every statement is a round trip, which SQLAlchemy's CPU is
small beside).

What comes back (``Rows``) answers what the stores ask of a result: ``first``, ``one``, ``one_or_none``, ``all``,
``scalar``, ``scalar_one``, ``scalar_one_or_none``, ``rowcount``, iteration; its rows are tuples that also answer by
column name (``row.channel_id``), as SQLAlchemy's rows do. A statement the lean path cannot run as SQLAlchemy would
is refused when it is wrapped or first run (a ``ValueError`` naming why): one with Python-side column defaults, or
with expanding (``IN``) parameters. Such a statement stays on ``conn.execute``.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import MultipleResultsFound, NoResultFound
from sqlalchemy.sql import Executable

__all__ = ["Prepared", "Rows"]


class Rows(Protocol):
    """What the stores ask of a statement's result, on either path."""

    @property
    def rowcount(self) -> int: ...

    def first(self) -> Any: ...

    def one(self) -> Any: ...

    def one_or_none(self) -> Any: ...

    def all(self) -> Sequence[Any]: ...

    def scalar(self) -> Any: ...

    def scalar_one(self) -> Any: ...

    def scalar_one_or_none(self) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


Processor = Callable[[Any], Any]


@dataclass(frozen=True)
class _Bind:
    name: str
    processor: Processor | None
    required: bool
    default: Any  # the value a statement carries for this parameter (``.values(state="settled")``)


@dataclass
class _Plan:
    """A statement compiled for SQLite: its text, its parameters in order, its columns' result processors."""

    sql: str
    binds: tuple[_Bind, ...]
    results: tuple[Processor | None, ...]
    named: bool  # rows answer by column name too (else plain tuples: a few µs less for each row)
    row_type: Any = (
        None  # a namedtuple class, built from the cursor's column names on the first run with rows
    )

    @property
    def plain(self) -> bool:
        """Rows as the driver gives them: plain tuples, nothing to process."""
        return not self.named and not any(self.results)

    def values(self, params: Mapping[str, Any] | None) -> tuple[Any, ...]:
        given = params or {}
        out = []
        for bind in self.binds:
            if bind.name in given:
                value = given[bind.name]
            elif bind.required:
                raise KeyError(f"a value is required for the parameter {bind.name!r} of: {self.sql}")
            else:
                value = bind.default
            out.append(value if bind.processor is None else bind.processor(value))
        return tuple(out)

    def row(self, raw: tuple[Any, ...], description: Sequence[Sequence[Any]]) -> Any:
        if self.row_type is None and self.named:
            self.row_type = namedtuple("Row", [d[0] for d in description], rename=True)  # type: ignore[misc]
        if any(self.results):
            raw = tuple(
                value if p is None or value is None else p(value)
                for p, value in zip(self.results, raw, strict=True)
            )
        return self.row_type._make(raw) if self.named else raw


def _plan(statement: Executable, dialect: Dialect, keys: Sequence[str], named: bool) -> _Plan:
    compiled: Any = statement.compile(dialect=dialect, column_keys=list(keys))  # type: ignore[attr-defined]
    why = []
    if compiled.insert_prefetch or compiled.update_prefetch:
        why.append("Python-side column defaults")
    if compiled.post_compile_params or compiled.literal_execute_params:
        why.append("expanding or literal-execute parameters")
    if compiled.positiontup is None:
        why.append("no positional parameters")
    if why:
        raise ValueError(f"the lean path cannot run this statement ({', '.join(why)}): {compiled}")
    binds = []
    for name in compiled.positiontup:
        bind = compiled.binds[name]
        impl = bind.type.dialect_impl(dialect)
        binds.append(_Bind(name, impl.bind_processor(dialect), bool(bind.required), bind.effective_value))
    columns = list(getattr(statement, "exported_columns", ()) or ())
    results = tuple(column.type.dialect_impl(dialect).result_processor(dialect, None) for column in columns)
    return _Plan(str(compiled), tuple(binds), results, named)


class Prepared:
    """One hot statement of a store: compiled once per process for SQLite, run on its driver (module docs).

    An ``INSERT`` without explicit values takes its columns from the keys of the parameters it is run with, as
    with ``conn.execute``: it is compiled once for each set of keys (a store passes the same ones every time)."""

    __slots__ = ("statement", "named", "_plans")

    def __init__(self, statement: Executable, *, named: bool = True) -> None:
        """``named=False``: on SQLite its rows are plain tuples, read by position only (a statement that reads
        many rows a turn); on PostgreSQL they are SQLAlchemy's rows either way."""
        self.statement = statement
        self.named = named
        self._plans: dict[tuple[str, ...], _Plan] = {}

    def run(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Rows:
        """The statement in ``conn``'s transaction; what it returned."""
        if conn.dialect.name != "sqlite":
            return conn.execute(self.statement, params)
        plan = self._plan_for(conn.dialect, params)
        driver: Any = conn.connection.driver_connection
        return _LeanRows(plan, driver.execute(plan.sql, plan.values(params)))

    def many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """The statement once for each of ``rows`` (the driver's executemany), in ``conn``'s transaction."""
        if not rows:
            return
        if conn.dialect.name != "sqlite":
            conn.execute(self.statement, list(rows))
            return
        plan = self._plan_for(conn.dialect, rows[0])
        driver: Any = conn.connection.driver_connection
        driver.executemany(plan.sql, [plan.values(row) for row in rows])

    def _plan_for(self, dialect: Dialect, params: Mapping[str, Any] | None) -> _Plan:
        keys = tuple(params) if params else ()
        plan = self._plans.get(keys)
        if plan is None:
            plan = self._plans[keys] = _plan(self.statement, dialect, keys, self.named)
        return plan

    def __repr__(self) -> str:
        return f"Prepared({self.statement})"


class _LeanRows:
    """A driver cursor's rows as ``Rows``: fetched when asked, processed as SQLAlchemy would."""

    __slots__ = ("_plan", "_cursor")

    def __init__(self, plan: _Plan, cursor: Any) -> None:
        self._plan = plan
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    def _rows(self) -> list[Any]:
        cursor = self._cursor
        raw = cursor.fetchall()
        if not raw or self._plan.plain:
            return raw
        return [self._plan.row(row, cursor.description) for row in raw]

    def first(self) -> Any:
        cursor = self._cursor
        raw = cursor.fetchone()
        if raw is None:
            return None
        row = self._plan.row(raw, cursor.description)
        cursor.close()  # the rest is not wanted: the statement is done with
        return row

    def all(self) -> list[Any]:
        return self._rows()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows())

    def one_or_none(self) -> Any:
        rows = self._rows()
        if len(rows) > 1:
            raise MultipleResultsFound(f"one row at most was expected, {len(rows)} came: {self._plan.sql}")
        return rows[0] if rows else None

    def one(self) -> Any:
        row = self.one_or_none()
        if row is None:
            raise NoResultFound(f"one row was expected, none came: {self._plan.sql}")
        return row

    def scalar(self) -> Any:
        row = self.first()
        return None if row is None else row[0]

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalar_one_or_none(self) -> Any:
        row = self.one_or_none()
        return None if row is None else row[0]
