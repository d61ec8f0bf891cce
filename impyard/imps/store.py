"""Imps: their config (``IMPYARD_HOME/imps/<name>/imp.toml``) and the store that adds, reads and removes them.

An imp's directory holds three things::

    imps/<name>/imp.toml     the config: validated by ImpConfig, no secrets ever
    imps/<name>/persona.md   the persona text (``persona_file``)
    imps/<name>/state/       written by boxes, so never read as config: each box's own /state below it
                             (channels/<channel>/ for a chat session, tasks/<task>/ for a task; issue 22)

``ImpConfig`` is the typed config; ``ImpStore`` reads and writes it. A broken
file raises ``ImpConfigError`` naming the file, the line (where it can be
found), the key, the reason and the fix; nothing is ever half-loaded. The box
receives only ``ImpConfig.imp_spec()``: name, persona and responder/memory
settings, never owners, tokens or host paths (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from box.protocol.models import ImpSpec, MemorySettings
from impyard.imps.config import (  # the config API is re-exported: callers import it from here
    CONFIG_FILE,
    DEFAULT_PERSONA_FILE,
    DEFAULT_STARTER_PERSONA,
    MAX_CONFIG_BYTES,
    MAX_NEWS_BYTES,
    MAX_PERSONA_CHARS,
    MAX_TOKEN_FILE_BYTES,
    NAME_PATTERN,
    STATE_DIR,
    ConfigProblem,
    ImpConfig,
    ImpConfigError,
    ImpError,
    ImpExists,
    ImpNameError,
    ImpNotFound,
    validate_name,
)
from impyard.imps.render import render_config
from impyard.imps.validate import locate, parse_config, validate_config
from impyard.paths import box_dir_name, home, state_root

SESSION_DIRS = "channels"  # under the state dir: one /state per chat channel
TASK_DIRS = "tasks"  # under the state dir: one /state per task
# Issue 33: the vector length each embedding model really gave the imp, beside imp.toml (never in a box's /state:
# a box must not choose what its host believes); the box's own bounds on a length.
EMBEDDING_LENGTHS_FILE = "embedding-lengths.json"
_DIMS_BOUNDS = {
    n: getattr(m, n)
    for m in MemorySettings.model_fields["dimensions"].metadata
    for n in ("ge", "le")
    if getattr(m, n, None) is not None
}
EMBEDDING_LENGTH_BOUNDS: tuple[int, int] = (_DIMS_BOUNDS["ge"], _DIMS_BOUNDS["le"])

# ------------------------------------------------------------------ the store


@dataclass(frozen=True)
class TokenStatus:
    """Where an imp's Discord token comes from and whether it is there; never the token itself."""

    source: str
    is_set: bool
    problem: str | None = None


@dataclass(frozen=True)
class PersonaStatus:
    path: Path
    exists: bool
    text: str
    problem: str | None = None


class ImpStore:
    """The imps under ``home/imps`` (default ``IMPYARD_HOME``). Names are validated before any path is built."""

    def __init__(self, home: Path | None = None) -> None:
        self._home = home

    @property
    def home(self) -> Path:
        return self._home if self._home is not None else home()

    @property
    def root(self) -> Path:
        return self.home / "imps"

    def path(self, name: str) -> Path:
        """The imp's directory (which need not exist)."""
        return self.root / validate_name(name)

    def config_path(self, name: str) -> Path:
        return self.path(name) / CONFIG_FILE

    def state_dir(self, name: str) -> Path:
        """The imp's state dir, under which each of its boxes has its own /state (never mounted itself since
        issue 22; an older home's imp-wide files stay in it). Kept by ``remove`` unless ``purge=True``."""
        return self.path(name) / STATE_DIR

    def box_state_dir(self, name: str) -> Path:
        """Under which each of the imp's boxes has its own /state: ``<state root>/<imp>/state`` (issue 21), the
        imp's ``state_dir`` unless ``IMPYARD_STATE_ROOT`` places boxes' state elsewhere."""
        return state_root(self.home) / validate_name(name) / STATE_DIR

    def session_state_dir(self, name: str, channel_id: str) -> Path:
        """The /state of the imp's chat box in one channel: its own, shared with no other box (issue 22)."""
        return self.box_state_dir(name) / SESSION_DIRS / box_dir_name(channel_id)

    def task_state_dir(self, name: str, task_id: str) -> Path:
        """The /state of one task's box: its own, beside the chat boxes' (a task may post in their channel)."""
        return self.box_state_dir(name) / TASK_DIRS / box_dir_name(task_id)

    def names(self) -> list[str]:
        """Names of every directory that holds an imp.toml, sorted (invalid names included, for ``scan``)."""
        if not self.root.is_dir():
            return []
        return sorted(entry.name for entry in self.root.iterdir() if (entry / CONFIG_FILE).is_file())

    def scan(self) -> list[tuple[str, ImpConfig | ImpError]]:
        """Every imp with its config or the error that keeps it from loading (for listings)."""
        found: list[tuple[str, ImpConfig | ImpError]] = []
        for name in self.names():
            try:
                found.append((name, self.get(name)))
            except ImpError as exc:
                found.append((name, exc))
        return found

    def all_configs(self) -> list[ImpConfig]:
        """Every imp's config, sorted by name; fails closed on the first broken one."""
        configs = []
        for _name, item in self.scan():
            if isinstance(item, ImpError):
                raise item
            configs.append(item)
        return configs

    def get(self, name: str) -> ImpConfig:
        """Load and validate one imp; ``ImpNotFound`` lists the imps there are."""
        file = self.config_path(name)
        text = self.config_text(name)
        config = parse_config(text, str(file), expected_name=name)
        self._check_paths(config, text)
        return config

    def add(self, name: str, persona: str | None = None, **settings: Any) -> ImpConfig:
        """Create ``imps/<name>/`` with imp.toml and persona.md; refuse a name that is already an imp.

        ``settings`` take imp.toml's shape: ``owners=[...]``, ``model={"model": "gpt-4.1"}``,
        ``box={"backend": "process"}`` … ``persona`` is written to persona.md (a short starter
        persona when None). A state dir kept by an earlier ``remove`` is reused: the imp gets its
        memory back. Everything is validated before anything is written; imp.toml is written last,
        atomically and without clobbering, so a failed add leaves no imp behind.
        """
        if "name" in settings:
            raise TypeError("add() takes the name as its first argument, not in settings")
        directory = self.path(name)
        file = directory / CONFIG_FILE
        if file.exists():
            raise ImpExists(
                f"an imp named '{name}' already exists ({file}); pick another name or remove it first"
            )
        config = validate_config({"name": name, **settings}, str(file))
        self._check_paths(config, None)
        custom_persona = config.persona_file != DEFAULT_PERSONA_FILE
        if persona is not None and custom_persona:
            raise ImpError("give the persona text or a persona_file, not both")
        if persona is not None and len(persona) > MAX_PERSONA_CHARS:
            raise ImpError(f"the persona is {len(persona)} characters; the limit is {MAX_PERSONA_CHARS}")
        text = render_config(config)
        if validate_config(tomllib.loads(text), str(file)) != config:  # the hand-written TOML must round-trip
            raise AssertionError(f"imp.toml for {name!r} did not round-trip; please report this")

        self.root.mkdir(parents=True, exist_ok=True)
        try:
            directory.mkdir(mode=0o700)
            created_dir = True
        except FileExistsError:
            created_dir = False  # a state dir kept by an earlier remove, or a concurrent add
        persona_path = directory / DEFAULT_PERSONA_FILE
        persona_tmp: Path | None = None
        linked = False
        try:
            if not custom_persona and (persona is not None or not persona_path.exists()):
                starter = DEFAULT_STARTER_PERSONA.format(name=name)
                persona_tmp = _write_temp(
                    directory, DEFAULT_PERSONA_FILE, persona if persona is not None else starter
                )
            _write_atomic(file, text, exclusive=True)  # the commit point: the imp exists from here on
            linked = True
            if persona_tmp is not None:
                os.replace(persona_tmp, persona_path)
        except BaseException:
            if persona_tmp is not None:
                persona_tmp.unlink(missing_ok=True)
            if linked:
                file.unlink(missing_ok=True)
            if created_dir:
                with contextlib.suppress(OSError):
                    directory.rmdir()  # only if still empty: never take a concurrent add's files with us
            raise
        return config

    def config_text(self, name: str) -> str:
        """The imp's imp.toml as it is on disk, size- and UTF-8-checked (``get``, ``imp set``, ``imp edit``);
        ``ImpNotFound`` if there is none."""
        file = self.config_path(name)
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            raise self._not_found(name) from None
        except OSError as exc:
            raise ImpConfigError(
                [ConfigProblem(str(file), None, "", f"cannot be read ({exc.strerror})")]
            ) from None
        if len(data) > MAX_CONFIG_BYTES:
            raise ImpConfigError(
                [ConfigProblem(str(file), None, "", f"is {len(data)} bytes; an imp.toml may be at most {MAX_CONFIG_BYTES}")]
            )  # fmt: skip
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ImpConfigError(
                [
                    ConfigProblem(
                        str(file), None, "", f"is not UTF-8 text (byte {exc.start}); save it as UTF-8"
                    )
                ]
            ) from None

    def replace_config(self, name: str, text: str, *, was: str | None = None) -> ImpConfig:
        """Write ``text`` as the imp's imp.toml, validated first exactly as ``get`` validates it; a refused
        text leaves the file as it was. ``was``: the text the change was made from; if the file no longer
        holds it (someone changed it meanwhile), nothing is written."""
        file = self.config_path(name)
        if not file.is_file():
            raise self._not_found(name)
        size = len(text.encode("utf-8"))
        if size > MAX_CONFIG_BYTES:
            raise ImpConfigError(
                [
                    ConfigProblem(
                        str(file),
                        None,
                        "",
                        f"would be {size} bytes; an imp.toml may be at most {MAX_CONFIG_BYTES}",
                    )
                ]
            )
        config = parse_config(text, str(file), expected_name=name)
        self._check_paths(config, text)
        if was is not None and self.config_text(name) != was:
            raise ImpError(f"{file} changed while it was being edited; nothing was written: try again")
        _write_atomic(file, text)
        return config

    def remove(self, name: str, *, purge: bool = False) -> list[Path]:
        """Remove the imp's imp.toml and its persona file (when inside its directory).

        The state dir (the imp's memory) is kept unless ``purge=True``, which removes the whole
        directory. Returns what was kept behind in the directory.
        """
        directory = self.path(name)
        file = directory / CONFIG_FILE
        if not file.is_file():
            raise self._not_found(name)
        if purge:
            shutil.rmtree(directory)
            return []
        persona_file: str | None = None
        try:
            persona_file = self.get(name).persona_file
        except ImpConfigError:
            persona_file = DEFAULT_PERSONA_FILE  # a broken config can still be removed
        file.unlink()  # first: from here on the imp no longer exists
        persona_path = (directory / persona_file) if persona_file else None
        if persona_path is not None and _inside(persona_path, directory):
            persona_path.unlink(missing_ok=True)
        kept = sorted(directory.iterdir()) if directory.is_dir() else []
        if not kept:
            directory.rmdir()
        return kept

    # -------------------------------------------------------------- reading the files an imp names

    def persona_status(self, config: ImpConfig) -> PersonaStatus:
        path = self._resolve(config, config.persona_file)
        try:
            text = self._read_text(path, "persona_file", MAX_PERSONA_CHARS * 4)
        except FileNotFoundError:
            return PersonaStatus(
                path, False, "", f"persona file {path} is missing: the imp has an empty persona"
            )
        if len(text) > MAX_PERSONA_CHARS:
            raise ImpConfigError(
                [
                    ConfigProblem(
                        str(path),
                        None,
                        "",
                        f"is {len(text)} characters; a persona may be at most {MAX_PERSONA_CHARS}",
                    )
                ]
            )
        return PersonaStatus(path, True, text)

    def persona(self, config: ImpConfig) -> str:
        """The persona text; a missing file is an empty persona (``show`` warns about it)."""
        return self.persona_status(config).text

    def news(self, config: ImpConfig) -> str | None:
        """The news file's text (bounded), or None when none is configured or the file does not exist."""
        if config.model.news_file is None:
            return None
        path = self._resolve(config, config.model.news_file)
        try:
            return self._read_text(path, "model.news_file", MAX_NEWS_BYTES)
        except FileNotFoundError:
            return None

    def imp_spec(self, config: ImpConfig) -> ImpSpec:
        """``config.imp_spec`` with the persona read from its file, and the vector length its embedding model was
        seen to give (``box_memory``)."""
        spec = config.imp_spec(self.persona(config), self.news(config))
        return spec.model_copy(update={"memory": self.box_memory(config, spec.memory)})

    # ------------------------------------------------------------ the embedding length learned (issue 33)

    def embedding_lengths(self, name: str) -> dict[str, int]:
        """The vector length each gateway embedding model gave this imp when it differed from the one asked
        (the model ignores ``dimensions``, as most local servers do), by model name; learned by the gateway."""
        try:
            raw = json.loads((self.path(name) / EMBEDDING_LENGTHS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(raw, dict):
            return {}
        low, high = EMBEDDING_LENGTH_BOUNDS
        return {
            str(model): length
            for model, length in raw.items()
            if isinstance(length, int) and not isinstance(length, bool) and low <= length <= high
        }

    def learn_embedding_length(self, name: str, model: str, length: int) -> bool:
        """Keep that ``model`` gives ``name`` vectors of ``length``; False if already known, or the imp has no
        directory (an imp that is not this home's)."""
        directory = self.path(name)
        known = self.embedding_lengths(name)
        if known.get(model) == length or not directory.is_dir():
            return False
        known[model] = length
        _write_atomic(directory / EMBEDDING_LENGTHS_FILE, json.dumps(known, indent=2, sort_keys=True) + "\n")
        return True

    def box_memory(self, config: ImpConfig, settings: MemorySettings | None = None) -> MemorySettings:
        """The memory settings the imp's boxes get: with the gateway embedder, the length its model really gives
        when the model was seen to ignore ``dimensions`` (issue 33), so its vectors are taken, not refused."""
        settings = settings or config.imp_spec().memory
        if settings.embedder != "gateway":
            return settings
        learned = self.embedding_lengths(config.name).get(settings.embedding_model)
        if learned is None or learned == settings.dimensions:
            return settings
        return settings.model_copy(update={"dimensions": learned})

    def token_status(self, config: ImpConfig) -> TokenStatus:
        """Whether the Discord token is there, and where from, without exposing it."""
        source = config.token_source()
        if config.discord.token_file:
            path = self._resolve(config, config.discord.token_file)
            try:
                mode = path.stat().st_mode
            except FileNotFoundError:
                return TokenStatus(
                    source, False, f"{path} does not exist: write the bot token into it (chmod 600)"
                )
            except OSError as exc:
                return TokenStatus(source, False, f"{path} cannot be read ({exc.strerror})")
            try:
                is_set = self.discord_token(config) is not None
            except ImpConfigError as exc:
                return TokenStatus(source, False, exc.reason)
            problem = None
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                problem = f"{path} is readable by other users: chmod 600 {path}"
            elif not is_set:
                problem = f"{path} is empty: write the bot token into it"
            return TokenStatus(source, is_set, problem)
        is_set = bool(os.environ.get(config.token_env, "").strip())
        return TokenStatus(
            source, is_set, None if is_set else f"set it with: export {config.token_env}=<bot token>"
        )

    def discord_token(self, config: ImpConfig) -> str | None:
        """The bot token from token_file (when set) or the environment; None when absent. Never logged."""
        if not config.discord.token_file:
            return os.environ.get(config.token_env, "").strip() or None
        path = self._resolve(config, config.discord.token_file)
        try:
            token = self._read_text(path, "discord.token_file", MAX_TOKEN_FILE_BYTES).strip()
        except FileNotFoundError:
            return None
        return token or None

    # -------------------------------------------------------------- helpers

    def _not_found(self, name: str) -> ImpNotFound:
        existing = [n for n in self.names() if NAME_PATTERN.match(n)]
        listed = f"imps here: {', '.join(existing)}" if existing else "there are no imps yet"
        return ImpNotFound(f"no imp named '{name}' ({listed}); create it with: impyard imp add {name}")

    def _resolve(self, config: ImpConfig, value: str) -> Path:
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.path(config.name) / path

    def _box_writable(self, path: Path) -> bool:
        """True for anything inside any imp's state dir (after resolving symlinks)."""
        try:
            relative = path.resolve().relative_to(self.root.resolve())
        except ValueError:
            return False
        return len(relative.parts) >= 2 and relative.parts[1] == STATE_DIR

    def _read_text(self, path: Path, key: str, limit: int) -> str:
        if self._box_writable(path):
            raise ImpConfigError(
                [
                    ConfigProblem(
                        str(path),
                        None,
                        key,
                        "lies in a box's state dir, which the box writes: refused; "
                        "move the file next to imp.toml",
                    )
                ]
            )
        try:
            with path.open("rb") as handle:
                data = handle.read(limit + 1)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise ImpConfigError(
                [ConfigProblem(str(path), None, key, f"cannot be read ({exc.strerror})")]
            ) from None
        if len(data) > limit:
            raise ImpConfigError([ConfigProblem(str(path), None, key, f"is larger than {limit} bytes")])
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ImpConfigError([ConfigProblem(str(path), None, key, "is not UTF-8 text")]) from None

    def _check_paths(self, config: ImpConfig, text: str | None) -> None:
        """Absolute paths into any box's state dir are refused at load, like relative ones."""
        problems = []
        for loc, value in (
            (("persona_file",), config.persona_file),
            (("model", "news_file"), config.model.news_file),
            (("discord", "token_file"), config.discord.token_file),
        ):
            if value and self._box_writable(self._resolve(config, value)):
                problems.append(
                    ConfigProblem(
                        str(self.config_path(config.name)),
                        locate(text, loc),
                        ".".join(loc),
                        f"{json.dumps(value)} lies in a box's state dir, which the box writes; "
                        "move the file next to imp.toml",
                    )
                )
        if problems:
            raise ImpConfigError(problems)


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.resolve().relative_to(directory.resolve())
    except ValueError:
        return False
    return True


def _write_temp(directory: Path, name: str, text: str) -> Path:
    """A fully written, synced temp file in ``directory`` (mode 600), ready to be renamed into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _write_atomic(path: Path, text: str, *, exclusive: bool = False) -> None:
    """Write via a temp file and rename (or hard-link, when ``exclusive``: never clobbers an existing file)."""
    tmp = _write_temp(path.parent, path.name, text)
    try:
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise ImpExists(f"an imp named '{path.parent.name}' already exists ({path})") from None
        else:
            os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


__all__ = [
    "ImpConfig",
    "ImpConfigError",
    "ImpError",
    "ImpExists",
    "ImpNameError",
    "ImpNotFound",
    "ImpStore",
    "MAX_PERSONA_CHARS",
    "PersonaStatus",
    "TokenStatus",
    "validate_name",
]
