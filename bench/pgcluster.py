"""A private PostgreSQL cluster of Debian's binaries, for the benchmark and the tests (issue 21).

``initdb`` and ``pg_ctl`` in a temporary directory, listening on 127.0.0.1 and a socket in that directory only,
password auth over TCP, run as the ``postgres`` user when this process is root (PostgreSQL refuses root). The
tests run it with fsync off (``tests/conftest.py``); the benchmark crash-safe, with commits acknowledged before
they are flushed (``synchronous_commit=off``), the nearest PostgreSQL has to SQLite's WAL with
``synchronous=NORMAL``.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

POSTGRES_START_TIMEOUT_S = 60
NO_BINARIES = "no PostgreSQL binaries in /usr/lib/postgresql/*/bin (apt-get install postgresql; .ci/run does)"


@dataclass(frozen=True)
class PostgresServer:
    """A PostgreSQL server one may create databases on."""

    admin_url: str  # holds the password
    password: str | None

    def url_of(self, database: str) -> str:
        return str(make_url(self.admin_url).set(database=database).render_as_string(hide_password=False))


def postgres_bin() -> Path | None:
    """Debian's binaries (postgresql-NN), the newest version."""
    found = [
        path for path in glob.glob("/usr/lib/postgresql/*/bin")
        if (Path(path) / "initdb").exists() and (Path(path) / "pg_ctl").exists()
    ]  # fmt: skip
    return Path(max(found, key=lambda p: int(re.sub(r"\D", "", Path(p).parent.name) or 0))) if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_cluster(
    bin_dir: Path, root: Path, *, crash_safe: bool = False
) -> tuple[PostgresServer, Callable[[], None]]:
    """initdb + pg_ctl start in ``root``: loopback TCP and a socket in ``root`` only, password auth over TCP.
    PostgreSQL refuses to run as root: as root it runs as the ``postgres`` user (runuser). ``crash_safe``:
    fsync and full-page writes on (the tests turn them off); commits are never waited for on disk either way."""
    as_user: list[str] = []
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")  # Debian's postgresql package creates it
        os.chown(root, entry.pw_uid, entry.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    password = uuid.uuid4().hex
    (root / "pw").write_text(password)
    if as_user:
        os.chown(root / "pw", entry.pw_uid, entry.pw_gid)
    data, port = root / "data", _free_port()

    def run(*args: str) -> None:
        done = subprocess.run(
            [*as_user, *args], capture_output=True, text=True, timeout=POSTGRES_START_TIMEOUT_S
        )
        if done.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed: {(done.stderr or done.stdout).strip()[-500:]}")

    run(
        str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
        "--auth-host=scram-sha-256", f"--pwfile={root / 'pw'}", "--no-sync", "-E", "UTF8", "--no-instructions",
    )  # fmt: skip
    durability = (
        "-c fsync=on -c full_page_writes=on" if crash_safe else "-c fsync=off -c full_page_writes=off"
    )
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} {durability} "
        "-c synchronous_commit=off -c max_connections=300"
    )
    run(
        str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "-t", "60", "-o", options,
        "start",
    )  # fmt: skip

    def stop() -> None:
        subprocess.run(
            [*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True, timeout=POSTGRES_START_TIMEOUT_S,
        )  # fmt: skip

    admin = f"postgresql+psycopg://postgres:{password}@127.0.0.1:{port}/postgres"
    return PostgresServer(admin, password), stop


@contextmanager
def private_server(*, crash_safe: bool = False) -> Iterator[PostgresServer | str]:
    """A private cluster for the block, stopped and deleted after it; or, where none can run, why not (a line to
    show: no binaries, or the start failed with the log's tail)."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        yield NO_BINARIES
        return
    root = Path(tempfile.mkdtemp(prefix="impyard-pg-"))
    try:
        server, stop = start_cluster(bin_dir, root, crash_safe=crash_safe)
    except (OSError, KeyError, RuntimeError, subprocess.SubprocessError) as exc:
        log = root / "log"
        tail = log.read_text(errors="replace")[-300:] if log.exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        yield f"the private PostgreSQL cluster of {bin_dir} did not start: {exc} {tail}".strip()
        return
    try:
        yield server
    finally:
        stop()
        shutil.rmtree(root, ignore_errors=True)


def server_version(server: PostgresServer) -> str:
    """The server's version, e.g. ``15.14``."""
    engine = sa.create_engine(server.admin_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return str(conn.exec_driver_sql("SHOW server_version").scalar_one()).split()[0]
    finally:
        engine.dispose()


@contextmanager
def throwaway_database(server: PostgresServer, prefix: str, template: str | None = None) -> Iterator[str]:
    """A database of its own on ``server`` (a copy of ``template`` when given): its name; dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server.admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")
            )
        yield name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
