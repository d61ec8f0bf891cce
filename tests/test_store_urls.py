"""IMPYARD_DATABASE_URL (issue 21): which database the host uses, and every way the setting can be wrong — one line
that names the host and the database and the fix, and never the password."""

from __future__ import annotations

from pathlib import Path

import pytest

from impyard.storage import urls as dburl
from impyard.storage.db import DatabaseError, open_database
from impyard.storage.urls import DatabaseUrlError

SECRET = "s3cr3t-Pa55"


def test_unset_is_the_sqlite_file_under_the_home(impyard_home: Path) -> None:
    for environ in ({}, {dburl.ENV: ""}, {dburl.ENV: "   "}):
        target = dburl.from_env(environ)
        assert (target.dialect, target.path) == ("sqlite", impyard_home / "impyard.db")


@pytest.mark.parametrize(
    ("text", "dialect", "driver", "redacted"),
    [
        ("sqlite:///rel/x.db", "sqlite", "sqlite+pysqlite", "sqlite:///rel/x.db"),
        ("sqlite:////abs/x.db", "sqlite", "sqlite+pysqlite", "sqlite:////abs/x.db"),
        (f"postgresql://imp:{SECRET}@db.example:6432/yard", "postgresql", "postgresql+psycopg",
         "postgresql+psycopg://imp:***@db.example:6432/yard"),
        (f"postgresql+psycopg://imp:{SECRET}@db.example/yard", "postgresql", "postgresql+psycopg",
         "postgresql+psycopg://imp:***@db.example/yard"),
        (f"postgres://imp:{SECRET}@db.example/yard", "postgresql", "postgresql+psycopg",
         "postgresql+psycopg://imp:***@db.example/yard"),
        ("postgresql:///yard?host=/run/postgresql", "postgresql", "postgresql+psycopg",
         "postgresql+psycopg:///yard?host=%2Frun%2Fpostgresql"),
    ],
)  # fmt: skip
def test_a_good_url_is_taken_and_its_redacted_form_hides_the_password(
    text: str, dialect: str, driver: str, redacted: str
) -> None:
    target = dburl.parse(text)
    assert (target.dialect, target.url.drivername) == (dialect, driver)
    assert target.redacted() == redacted
    assert SECRET not in target.redacted() and SECRET not in target.where()


def test_where_names_host_port_database_or_socket() -> None:
    assert dburl.parse(f"postgresql://u:{SECRET}@h/d").where() == "database 'd' on h:5432"
    assert dburl.parse("postgresql://u@h:7/d").where() == "database 'd' on h:7"
    assert dburl.parse("postgresql:///d?host=/tmp/s").where() == "database 'd' on the socket in /tmp/s"
    assert dburl.parse("postgresql:///d").where() == "database 'd' on the local socket"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (f"{SECRET}", "not a database URL"),
        (f"db.example/{SECRET}", "not a database URL"),
        (f"mysql://imp:{SECRET}@db.example/yard", "scheme 'mysql'"),
        (f"postgresql+psycopg2://imp:{SECRET}@db.example/yard", "psycopg 3 only"),
        (f"postgresql+asyncpg://imp:{SECRET}@db.example/yard", "psycopg 3 only"),
        (f"postgresql://imp:{SECRET}@db.example:port/yard", "port is not a number"),
        (f"postgresql://imp:{SECRET}@[::1/yard", "not a well-formed"),
        (f"postgresql://imp:{SECRET}@db.example:70000/yard", "port 70000 for database 'yard' on db.example"),
        (f"postgresql://imp:{SECRET}@db.example/", "names no database on db.example:5432"),
        (f"postgresql://imp:{SECRET}@db.example", "names no database on db.example:5432"),
        ("sqlite://", "names no SQLite file"),
        ("sqlite:///:memory:", "names no SQLite file"),
    ],
)  # fmt: skip
def test_a_bad_url_is_one_line_with_the_fix_and_never_the_password(text: str, says: str) -> None:
    with pytest.raises(DatabaseUrlError) as caught:
        dburl.parse(text)
    message = caught.value.user_message()
    assert says in message
    assert SECRET not in message and "\n" not in message
    error = caught.value  # no chained exception carries the URL's text into a traceback or a log
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


def test_open_database_reports_a_bad_setting_as_a_database_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dburl.ENV, f"postgresql://imp:{SECRET}@db.example/")
    with pytest.raises(DatabaseError, match="names no database on db.example") as caught:
        open_database()
    assert SECRET not in str(caught.value)


def test_scrub_cuts_the_secret_and_joins_lines() -> None:
    assert dburl.scrub(f"FATAL: no\n\tfor {SECRET}\n", SECRET) == "FATAL: no for ***"
    assert dburl.scrub("a\nb", None) == "a b"
