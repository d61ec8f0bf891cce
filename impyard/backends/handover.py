"""A spare box's ``/state`` (issue 37, docs/box.md "Spare boxes"): its own fresh dir, and the channel's files
handed into it at the claim and back at its end.

A spare is started before anyone knows its channel, so its ``/state`` cannot be the channel's dir: it is a fresh,
private dir of its own (``<imp>/state/spares/<run>``), claimed like every box's mount (``impyard.backends.mounts``).
What a channel's boxes keep in ``/state`` is only their own append logs (the journal and the memory's call log,
docs/memory.md): no box reads them back, but a person reads them per channel. So the channel's dir stays their home:

* at the claim, once the channel's previous box has closed, the host moves the channel dir's entries into the
  spare's dir (``hand_in``) — moved, not copied, so no file is ever in two boxes' mounts;
* at the claimed box's end, once it is gone, they move back (``hand_back``): the spare's dir becomes the channel's
  dir (one ``rename`` when the channel's is empty, as it is), and the spare's dir is gone.

A host-owned note beside the spare's dir (``<run>.channel``, never mounted) names the channel dir from the claim
on, so a host that died with a claimed box running hands its files back at the next start (``sweep``); an
unclaimed spare's leftover dir is simply removed. Every step works through directory descriptors opened without
following links, and renames entries without reading them (a link a box planted is moved, never followed).
Blocking: call these from a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

from impyard.backends.statedir import FOREIGN_WRITER_MARK, mark_foreign_writer

log = logging.getLogger("impyard.box")

SPARE_DIRS = "spares"  # under an imp's box state dir (beside ``channels`` and ``tasks``)
NOTE_SUFFIX = ".channel"
MAX_NOTE_BYTES = 4_096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def note_path(spare_dir: Path) -> Path:
    return spare_dir.with_name(spare_dir.name + NOTE_SUFFIX)


def _open_dir(path: Path) -> int | None:
    """The directory ``path`` itself (never a link in its place), or None when it does not exist."""
    try:
        return os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return None


def _move_entries(src_fd: int, dst_fd: int, tag: str) -> int:
    """Every entry of ``src`` into ``dst``, by name; a name ``dst`` already has moves as ``<name>.<tag>``."""
    moved = 0
    for name in os.listdir(src_fd):
        target = name
        with contextlib.suppress(FileNotFoundError):
            os.stat(target, dir_fd=dst_fd, follow_symlinks=False)
            target = f"{name}.{tag}"  # never overwrite: both are kept
        try:
            os.rename(name, target, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            moved += 1
        except OSError as exc:  # gone meanwhile, or a clash on the tagged name too: left where it is, said
            log.warning("could not move %s of a box's /state: %s", name, exc.strerror or exc)
    return moved


def hand_in(channel_dir: Path, spare_dir: Path) -> int:
    """At the claim: note the channel, then move the channel dir's entries into the spare's ``/state``.

    The channel's previous box must have closed (the session waits for it). Returns how many entries moved."""
    note = note_path(spare_dir)
    data = str(channel_dir).encode()[:MAX_NOTE_BYTES]
    fd = os.open(note, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    src = _open_dir(channel_dir)
    if src is None:
        return 0  # the channel's first box: nothing to hand in
    try:
        dst = os.open(spare_dir, _DIR_FLAGS)
        try:
            return _move_entries(src, dst, spare_dir.name[:12])
        finally:
            os.close(dst)
    finally:
        os.close(src)


def hand_back(spare_dir: Path) -> Path | None:
    """At a spare's end, once its box is gone: a claimed spare's ``/state`` becomes its channel's dir again; an
    unclaimed spare's is removed. Returns the channel dir it went to (None: it was never claimed)."""
    note = note_path(spare_dir)
    try:
        with open(note, "rb") as handle:  # noqa: PTH123 - host-owned, written by ``hand_in``
            channel_dir = Path(handle.read(MAX_NOTE_BYTES).decode())
    except FileNotFoundError:
        _remove(spare_dir)
        return None
    channel_dir.parent.mkdir(parents=True, exist_ok=True)
    if (spare_dir.parent / FOREIGN_WRITER_MARK).exists():  # a root host's process box wrote them: the next
        mark_foreign_writer(channel_dir)  # Docker box of the channel repairs their owner once, as for any
    with contextlib.suppress(OSError):  # missing, or not empty: then merged below
        os.rmdir(channel_dir)  # empty since the claim: the spare's dir takes its place whole (owner and all)
    try:
        os.rename(spare_dir, channel_dir)
    except FileNotFoundError:
        pass  # the spare's dir is gone already
    except OSError:  # the channel dir has entries of its own: both are kept, entry by entry
        channel_dir.mkdir(mode=0o700, exist_ok=True)
        src, dst = _open_dir(spare_dir), _open_dir(channel_dir)
        try:
            if src is not None and dst is not None:
                _move_entries(src, dst, spare_dir.name[:12])
        finally:
            for fd in (src, dst):
                if fd is not None:
                    os.close(fd)
        _remove(spare_dir)
    note.unlink(missing_ok=True)
    return channel_dir


def _remove(path: Path) -> None:
    """A spare's dir and what its box wrote there (``rmtree`` works through descriptors: no link followed)."""
    if _open_dir(path) is None:
        return
    try:
        shutil.rmtree(path)
    except OSError as exc:
        log.warning("could not remove the spare box dir %s: %s", path, exc.strerror or exc)


def sweep(spares_dir: Path, running: set[Path]) -> int:
    """At a host's start: every spare dir that no running box holds (``running``: resolved mounts, from the home's
    mount claims) is handed back to its channel, or removed. Returns how many were swept."""
    swept = 0
    try:
        entries = sorted(spares_dir.iterdir())
    except FileNotFoundError:
        return 0
    for entry in entries:
        if entry.name.endswith(NOTE_SUFFIX):
            spare = entry.with_name(entry.name[: -len(NOTE_SUFFIX)])
            if spare.resolve() not in running and _open_dir(spare) is None:
                entry.unlink(missing_ok=True)  # a note whose dir is gone
            continue
        if entry.resolve() in running or entry.is_symlink() or not entry.is_dir():
            continue
        hand_back(entry)
        swept += 1
    return swept
