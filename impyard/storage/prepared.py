"""A statement compiled once and run straight on SQLite's driver (issue 18): the lean path of a warm turn's storage.

SQLAlchemy's execution path costs about 40-80 µs of CPU per statement (its cache key, execution context, parameter
processing and result set-up) against 4-15 µs for the statement itself on SQLite, and a warm turn runs about thirty.
A store wraps each of its hot statements once, at module level: ``_INFO = Prepared(select(...))``, and runs it with
``_INFO.run(conn, params)`` inside the transaction ``db.write``/``db.read`` gave it. On SQLite the statement is
compiled on its first run into SQL text, the order of its parameters and the type processors of its parameters and
columns, and then run on the driver's connection (the transaction is the driver's own: our BEGIN, SQLAlchemy's
commit). On PostgreSQL likewise (issue 36, "PostgreSQL's turn"): compiled once into psycopg's SQL text with named
parameters, run on a cursor of the psycopg connection in the transaction psycopg began for SQLAlchemy; there
SQLAlchemy's path cost as much CPU as psycopg's own (about 50 µs a statement each). A driver error is handed to
SQLAlchemy's own handling (``Connection._handle_dbapi_exception``), so that a store sees the ``DBAPIError`` it
would have seen, a lost connection is invalidated, and ``db.write`` retries or waits exactly as before.

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
    """A statement compiled for the driver: its text, its parameters in order, its columns' result processors."""

    sql: str
    binds: tuple[_Bind, ...]
    results: tuple[Processor | None, ...]
    named: bool  # rows answer by column name too (else plain tuples: a few µs less for each row)
    positional: bool = (
        True  # SQLite's ``?`` parameters in order; PostgreSQL's psycopg: ``%(name)s``, a mapping
    )
    row_type: Any = (
        None  # a namedtuple class, built from the cursor's column names on the first run with rows
    )
    pending: Any = None  # PostgreSQL: (dialect, column types) whose processors need the driver's type codes

    def resolve(self, description: Sequence[Sequence[Any]] | None) -> None:
        """PostgreSQL: the columns' result processors, once, from the first result's type codes (a NUMERIC's
        processor depends on which numeric type came back, as in SQLAlchemy's own result set-up)."""
        if self.pending is None:
            return
        dialect, types = self.pending
        codes = [d[1] for d in description or ()]
        if len(codes) == len(types):
            self.results = tuple(
                t.result_processor(dialect, code) for t, code in zip(types, codes, strict=True)
            )
        self.pending = None

    @property
    def plain(self) -> bool:
        """Rows as the driver gives them: plain tuples, nothing to process."""
        return not self.named and not any(self.results)

    def values(self, params: Mapping[str, Any] | None) -> tuple[Any, ...] | dict[str, Any]:
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
        if self.positional:
            return tuple(out)
        return {bind.name: value for bind, value in zip(self.binds, out, strict=True)}

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
    positional = dialect.paramstyle in ("qmark", "numeric", "format")
    if positional and compiled.positiontup is None:
        why.append("no positional parameters")
    if not positional and dialect.paramstyle not in ("pyformat", "named"):
        why.append(f"the driver's parameter style {dialect.paramstyle}")
    if getattr(compiled, "escaped_bind_names", None):
        why.append("parameter names the driver needs escaped")
    if why:
        raise ValueError(f"the lean path cannot run this statement ({', '.join(why)}): {compiled}")
    binds = []
    for name in compiled.positiontup if positional else compiled.binds:
        bind = compiled.binds[name]
        impl = bind.type.dialect_impl(dialect)
        binds.append(_Bind(name, impl.bind_processor(dialect), bool(bind.required), bind.effective_value))
    columns = list(getattr(statement, "exported_columns", ()) or ())
    types = tuple(column.type.dialect_impl(dialect) for column in columns)
    if dialect.name == "sqlite":
        return _Plan(
            str(compiled), tuple(binds), tuple(t.result_processor(dialect, None) for t in types), named
        )
    return _Plan(str(compiled), tuple(binds), (), named, positional, pending=(dialect, types))


class Prepared:
    """One hot statement of a store: compiled once per process and engine, run on its driver (module docs).

    An ``INSERT`` without explicit values takes its columns from the keys of the parameters it is run with, as
    with ``conn.execute``: it is compiled once for each set of keys (a store passes the same ones every time)."""

    __slots__ = ("statement", "named", "_plans")

    def __init__(self, statement: Executable, *, named: bool = True) -> None:
        """``named=False``: its rows are plain tuples, read by position only (a statement that reads many rows a
        turn)."""
        self.statement = statement
        self.named = named
        self._plans: dict[tuple[str, ...], _Plan] = {}

    def run(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Rows:
        """The statement in ``conn``'s transaction; what it returned."""
        plan = self._plan_for(conn.dialect, params)
        driver: Any = conn.connection.driver_connection
        values = plan.values(params)
        if conn.dialect.name == "sqlite":
            return _LeanRows(plan, driver.execute(plan.sql, values))
        cursor = driver.cursor()
        try:
            cursor.execute(plan.sql, values)
        except conn.dialect.loaded_dbapi.Error as exc:
            conn._handle_dbapi_exception(exc, plan.sql, values, cursor, None)  # raises SQLAlchemy's error
        return _LeanRows(plan, cursor)

    def many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """The statement once for each of ``rows`` (the driver's executemany), in ``conn``'s transaction."""
        if not rows:
            return
        plan = self._plan_for(conn.dialect, rows[0])
        driver: Any = conn.connection.driver_connection
        values = [plan.values(row) for row in rows]
        if conn.dialect.name == "sqlite":
            driver.executemany(plan.sql, values)
            return
        cursor = driver.cursor()
        try:
            if (
                len(values) == 1
            ):  # psycopg's executemany sets up a pipeline: for one row, twice a plain execute
                cursor.execute(plan.sql, values[0])
            else:
                cursor.executemany(plan.sql, values)
        except conn.dialect.loaded_dbapi.Error as exc:
            conn._handle_dbapi_exception(exc, plan.sql, values, cursor, None)  # raises SQLAlchemy's error
        finally:
            cursor.close()

    def _plan_for(self, dialect: Dialect, params: Mapping[str, Any] | None) -> _Plan:
        keys = (dialect.name, *params) if params else (dialect.name,)  # a process may use both engines
        plan = self._plans.get(keys)
        if plan is None:
            plan = self._plans[keys] = _plan(self.statement, dialect, keys[1:], self.named)
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
        self._plan.resolve(cursor.description)
        if not raw or self._plan.plain:
            return raw
        return [self._plan.row(row, cursor.description) for row in raw]

    def first(self) -> Any:
        cursor = self._cursor
        raw = cursor.fetchone()
        if raw is None:
            return None
        self._plan.resolve(cursor.description)
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
