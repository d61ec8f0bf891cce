"""Issue 18: a ``Prepared`` statement gives exactly what SQLAlchemy's ``conn.execute`` gives, on SQLite (where it
runs straight on the driver) and on PostgreSQL (where it is ``conn.execute``): each statement shape the stores use,
its rows by index and by column name, its type processing both ways, its row counts; and a statement the lean path
cannot run as SQLAlchemy would is refused with its reason."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import MultipleResultsFound, NoResultFound

from bench.pgcluster import PostgresServer  # noqa: F401 - the fixtures below come from conftest
from impyard.storage.prepared import Prepared

META = sa.MetaData()
THINGS = sa.Table(
    "prepared_things",
    META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("flag", sa.Boolean, nullable=False),
    sa.Column("at", sa.DateTime, nullable=True),
    sa.Column("n", sa.Integer, nullable=False, server_default="0"),
)
WITH_DEFAULT = sa.Table(
    "prepared_defaults",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("n", sa.Integer, default=5),
)

AT = datetime(2026, 12, 4, 3, 0, 0)
BY_NAME = sa.select(THINGS.c.id, THINGS.c.name, THINGS.c.flag, THINGS.c.at).where(
    THINGS.c.name == sa.bindparam("name")
)
COUNT = (
    sa.select(sa.func.count().label("how_many"))
    .select_from(THINGS)
    .where(THINGS.c.flag == sa.bindparam("flag"))
)
ADD = sa.insert(THINGS).values(name=sa.bindparam("name"), flag=sa.bindparam("flag"), at=sa.bindparam("at"))
ADD_RETURNING = (
    sa.insert(THINGS).values(name=sa.bindparam("name"), flag=True).returning(THINGS.c.id, THINGS.c.flag)
)
BUMP = (
    sa.update(THINGS).where(THINGS.c.flag == sa.bindparam("which")).values(n=THINGS.c.n + sa.bindparam("by"))
)
HALF = sa.select(
    sa.func.sum(THINGS.c.id) / sa.cast(2, sa.Numeric(10, 2))
)  # a NUMERIC: its type from the driver
ALL = sa.select(THINGS.c.name, THINGS.c.flag, THINGS.c.at, THINGS.c.n).order_by(THINGS.c.name)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[sa.Engine]:
    url = (
        f"sqlite:///{tmp_path}/prepared.db"
        if request.param == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    engine = sa.create_engine(url)
    META.drop_all(engine)
    META.create_all(engine)
    yield engine
    META.drop_all(engine)
    engine.dispose()


def _seed(conn: Connection) -> None:
    conn.execute(ADD, [{"name": "ann", "flag": True, "at": AT}, {"name": "bob", "flag": False, "at": None}])


def both(engine: sa.Engine, fn: Callable[[Connection, bool], Any]) -> tuple[Any, Any]:
    """``fn`` run on a fresh table once through SQLAlchemy and once through ``Prepared``: the two results."""
    got = []
    for lean in (False, True):
        META.drop_all(engine)
        META.create_all(engine)  # afresh: ids start over on either engine
        with engine.begin() as conn:
            _seed(conn)
            got.append(fn(conn, lean))
    return got[0], got[1]


def run(conn: Connection, lean: bool, statement: Any, params: Any = None) -> Any:
    return Prepared(statement).run(conn, params) if lean else conn.execute(statement, params)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(lambda c, lean: tuple(run(c, lean, BY_NAME, {"name": "ann"}).first()), id="first"),
        pytest.param(lambda c, lean: run(c, lean, BY_NAME, {"name": "nobody"}).first(), id="first-none"),
        pytest.param(lambda c, lean: [tuple(r) for r in run(c, lean, ALL).all()], id="all"),
        pytest.param(lambda c, lean: [tuple(r) for r in run(c, lean, ALL)], id="iterate"),
        pytest.param(lambda c, lean: run(c, lean, BY_NAME, {"name": "ann"}).first().flag, id="by-name-bool"),
        pytest.param(
            lambda c, lean: run(c, lean, BY_NAME, {"name": "ann"}).first().at, id="by-name-datetime"
        ),
        pytest.param(lambda c, lean: run(c, lean, COUNT, {"flag": True}).scalar_one(), id="scalar_one"),
        pytest.param(lambda c, lean: run(c, lean, COUNT, {"flag": False}).first().how_many, id="label"),
        pytest.param(
            lambda c, lean: run(c, lean, BY_NAME, {"name": "x"}).scalar_one_or_none(), id="scalar-none"
        ),
        pytest.param(lambda c, lean: run(c, lean, BY_NAME, {"name": "ann"}).scalar(), id="scalar"),
        pytest.param(lambda c, lean: tuple(run(c, lean, BY_NAME, {"name": "bob"}).one()), id="one"),
        pytest.param(lambda c, lean: run(c, lean, BUMP, {"which": False, "by": 3}).rowcount, id="rowcount"),
        pytest.param(lambda c, lean: run(c, lean, HALF).scalar_one(), id="numeric"),
        pytest.param(
            lambda c, lean: (
                run(c, lean, BUMP, {"which": True, "by": 2}),
                [tuple(r) for r in run(c, lean, ALL)],
            )[1],
            id="update-then-read",
        ),
        pytest.param(
            lambda c, lean: (
                run(c, lean, ADD, {"name": "cy", "flag": True, "at": AT}),
                tuple(run(c, lean, BY_NAME, {"name": "cy"}).first())[1:],
            )[1],
            id="insert-with-processors",
        ),
        pytest.param(
            lambda c, lean: (
                run(c, lean, ADD, {"name": "cy", "flag": True, "at": AT}),
                c.execute(sa.text("SELECT at, flag FROM prepared_things WHERE name = 'cy'")).one()[:],
            )[1],
            id="stored-as-sqlalchemy-stores-it",
        ),
        pytest.param(
            lambda c, lean: run(c, lean, ADD_RETURNING, {"name": "dee"}).first().flag, id="returning"
        ),
        pytest.param(
            lambda c, lean: (
                run(c, lean, sa.insert(THINGS), {"name": "eve", "flag": False, "at": AT}),
                tuple(run(c, lean, BY_NAME, {"name": "eve"}).first()),
            )[1],
            id="insert-columns-from-keys",
        ),
    ],
)
def test_prepared_gives_what_sqlalchemy_gives(
    engine: sa.Engine, case: Callable[[Connection, bool], Any]
) -> None:
    through_sqlalchemy, prepared = both(engine, case)
    assert prepared == through_sqlalchemy
    assert type(prepared) is type(through_sqlalchemy)


def test_plain_rows_are_what_named_rows_are_by_position(engine: sa.Engine) -> None:
    def fn(conn: Connection, lean: bool) -> list[tuple[Any, ...]]:
        if lean:
            return list(Prepared(ALL, named=False).run(conn).all())
        return [tuple(row) for row in conn.execute(ALL)]

    through_sqlalchemy, prepared = both(engine, fn)
    assert [tuple(row) for row in prepared] == through_sqlalchemy
    assert prepared[0][1] is True  # the Boolean column is still processed


def test_many_runs_once_per_row(engine: sa.Engine) -> None:
    def fn(conn: Connection, lean: bool) -> list[tuple[Any, ...]]:
        rows = [{"name": f"p{i}", "flag": i % 2 == 0, "at": AT} for i in range(3)]
        if lean:
            Prepared(ADD).many(conn, rows)
        else:
            conn.execute(ADD, rows)
        return [tuple(r) for r in conn.execute(ALL)]

    through_sqlalchemy, prepared = both(engine, fn)
    assert prepared == through_sqlalchemy


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c, lean: run(c, lean, ALL).one(), MultipleResultsFound),
        (lambda c, lean: run(c, lean, BY_NAME, {"name": "x"}).one(), NoResultFound),
        (lambda c, lean: run(c, lean, ALL).one_or_none(), MultipleResultsFound),
    ],
)
def test_one_refuses_as_sqlalchemy_does(
    engine: sa.Engine, call: Callable[[Connection, bool], Any], error: type
) -> None:
    for lean in (False, True):
        with engine.begin() as conn:
            conn.execute(THINGS.delete())
            _seed(conn)
            with pytest.raises(error):
                call(conn, lean)


def test_a_missing_parameter_is_named(tmp_path: Any) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path}/p.db")
    META.create_all(engine)
    with engine.begin() as conn, pytest.raises(KeyError, match="'name'"):
        Prepared(BY_NAME).run(conn, {})


@pytest.mark.parametrize(
    ("statement", "why"),
    [
        (sa.insert(WITH_DEFAULT).values(id=sa.bindparam("id")), "Python-side column defaults"),
        (sa.select(THINGS.c.id).where(THINGS.c.id.in_(sa.bindparam("ids", expanding=True))), "expanding"),
    ],
)
def test_what_the_lean_path_cannot_run_is_refused_with_its_reason(
    tmp_path: Any, statement: Any, why: str
) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path}/p.db")
    META.create_all(engine)
    WITH_DEFAULT.create(engine)
    with engine.begin() as conn, pytest.raises(ValueError, match=why):
        Prepared(statement).run(conn, {"id": 1, "ids": [1]})


def test_a_driver_error_on_postgresql_is_sqlalchemys(postgres_url: str) -> None:
    """Issue 36: on PostgreSQL the lean path runs on psycopg's cursor, and a failure comes back as the error
    ``conn.execute`` gives (what ``db.write`` reads a serialization failure or a lost server from), with psycopg's
    error and its SQLSTATE inside; the transaction is then failed, as after ``conn.execute``."""
    engine = sa.create_engine(postgres_url)
    META.drop_all(engine)
    META.create_all(engine)
    try:
        add_id = sa.insert(THINGS).values(id=sa.bindparam("id"), name="x", flag=True)
        for lean in (False, True):
            with engine.connect() as conn, conn.begin():
                conn.execute(THINGS.delete())
                conn.execute(add_id, {"id": 1})
                with pytest.raises(sa.exc.IntegrityError) as caught:
                    run(conn, lean, add_id, {"id": 1})
                assert getattr(caught.value.orig, "sqlstate", None) == "23505"
                with pytest.raises(sa.exc.InternalError, match="aborted"):
                    run(conn, lean, ALL).all()
            with engine.connect() as conn, conn.begin(), pytest.raises(sa.exc.IntegrityError):
                Prepared(add_id).many(conn, [{"id": 7}, {"id": 7}]) if lean else conn.execute(
                    add_id, [{"id": 7}, {"id": 7}]
                )
    finally:
        META.drop_all(engine)
        engine.dispose()
