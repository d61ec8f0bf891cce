"""The developer's helper for the migration history (docs/storage.md), since impyard ships no alembic.ini:

python -m impyard.storage.migrations revision -m "tasks: a lease column"   # a new, empty revision to fill in
python -m impyard.storage.migrations heads                                 # the newest revision
python -m impyard.storage.migrations history                               # every revision, newest first
"""

from __future__ import annotations

import argparse

from alembic import command

from impyard.storage.migrations import config, next_revision_id


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m impyard.storage.migrations", description=__doc__.split("\n")[0]
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    revision = verbs.add_parser("revision", help="write a new revision after the head, numbered in line")
    revision.add_argument("-m", "--message", required=True, help="what the revision changes, in a few words")
    verbs.add_parser("heads", help="the newest revision")
    verbs.add_parser("history", help="every revision, newest first")
    args = parser.parse_args(argv)
    cfg = config()
    if args.verb == "revision":
        command.revision(cfg, message=args.message, rev_id=next_revision_id())
    elif args.verb == "heads":
        command.heads(cfg)
    else:
        command.history(cfg)


if __name__ == "__main__":
    main()
