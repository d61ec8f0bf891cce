"""Build the box image without a container registry (design §10).

The box's Python dependencies are installed on the host with the host's own pip
settings and copied into the build context, so `docker build` needs no network
and no RUN step. Where the base image cannot be pulled, a minimal Debian base is
built locally with debootstrap from the machine's configured mirror.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
import docker.errors
import docker.utils
import requests.exceptions

from impyard.errors import ImpyardError

__all__ = ["BoxImageError", "build_image", "content_hash", "debian_mirror", "expected_tag", "image_present"]

IMAGE_REPO = "impyard-box"
DEFAULT_BASE = "python:3.11-slim"
LOCAL_BASE = "impyard-base:bookworm-py311"
DEBIAN_SUITE = "bookworm"  # its python3 is 3.11, the box's floor and the .pyc's version
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PY_VERSION = "3.11"
PULL_TIMEOUT_S = 20  # an unreachable registry must not stall the fallback
APT_DIR = Path("/etc/apt")
HASH_LEN = 12
MANYLINUX_TAGS = ("manylinux_2_28", "manylinux_2_17", "manylinux2014")
MACHINE_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
# The image's interpreter, not the host's, decides which wheels fit.
PIP_INSTALL_ARGS = (
    "-m pip install --quiet --only-binary=:all: --implementation cp --no-compile"
    f" --python-version {PY_VERSION}"
)
# Trimmed from the debootstrap rootfs: nothing in a box reads them.
TRIM_GLOBS = (
    "var/lib/apt/lists/*", "var/cache/apt/*", "var/cache/debconf/*-old", "var/log/*", "usr/share/doc/*",
    "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*", "usr/share/lintian/*",
)  # fmt: skip

Progress = Callable[[str], None]


class BoxImageError(ImpyardError):
    """A one-line reason the box image cannot be built or found, with the fix."""


def _box_dir() -> Path:
    import box  # the package that runs inside the container

    return Path(box.__file__).parent


def _box_sources(box_dir: Path) -> list[Path]:
    """The files whose content defines the image: every file copied into it (modules, prompt templates, the
    Dockerfile, the requirements) — all but bytecode, which the build compiles afresh."""
    return sorted(
        p
        for p in box_dir.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    )


def content_hash(box_dir: Path | None = None) -> str:
    """12 hex digits over the box sources; also the image's org.impyard.box-hash label."""
    box_dir = box_dir or _box_dir()
    digest = hashlib.sha256()
    for path in _box_sources(box_dir):
        # Paths are hashed too, so a renamed module also means a new image.
        digest.update(path.relative_to(box_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:HASH_LEN]


def expected_tag(box_dir: Path | None = None) -> str:
    """The tag of the image built from the current box sources: `impyard-box:<hash>`."""
    return f"{IMAGE_REPO}:{content_hash(box_dir)}"


def _client(timeout: int | None = None) -> docker.DockerClient:
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        return docker.from_env(timeout=timeout) if timeout else docker.from_env()
    except docker.errors.DockerException as exc:
        if "PermissionError" in str(exc) or "Permission denied" in str(exc):
            raise BoxImageError(
                f"Docker engine at {where} refused this user: add it to the docker group or run as root"
            ) from None
        raise BoxImageError(
            f"Docker engine not reachable at {where}: start dockerd or install docker.io"
        ) from None


def image_present(tag: str) -> bool:
    """Whether the local engine has `tag`; BoxImageError where no engine answers."""
    try:
        _client().images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.APIError as exc:
        raise BoxImageError(f"Docker could not inspect image {tag}: {exc.explanation or exc}") from None
    return True


def _try_pull(ref: str, progress: Progress) -> str | None:
    """Pull `ref` with a short timeout; None (with the reason shown) where no registry answers."""
    progress(f"pulling {ref} (up to {PULL_TIMEOUT_S} s)")
    repo, tag = docker.utils.parse_repository_tag(ref)
    try:
        _client(timeout=PULL_TIMEOUT_S).images.pull(repo, tag=tag or "latest")
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        progress(f"could not pull {ref}: {str(exc).splitlines()[0][:200]}")
        return None
    return ref


def _run(cmd: list[str], what: str, fix: str, progress: Progress, *, stream: bool = False) -> None:
    """Run a tool; stream its lines to progress or keep them for the error message."""
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
    except FileNotFoundError:
        raise BoxImageError(f"{cmd[0]} not found: {fix}") from None
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            lines.append(line)
            if stream:
                progress(line)
    if proc.wait() != 0:
        # The first error line names the cause; later ones are usually advice.
        errors = [line for line in lines if line.startswith(("ERROR", "E:", "tar:"))]
        last = (errors or lines or ["no output"])[0 if errors else -1]
        raise BoxImageError(f"{what} failed (exit {proc.returncode}): {last} -- {fix}")


@contextmanager
def _temp_dir(prefix: str, parent: str | None = None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        _unmount_under(path)  # a killed debootstrap can leave /proc mounted in the rootfs
        shutil.rmtree(path, ignore_errors=True)


def _unmount_under(path: Path) -> None:
    try:
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return
    prefix = str(path.resolve()) + "/"
    for mount_point in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", mount_point], check=False, capture_output=True)


def _stage_context(ctx: Path, box_dir: Path, progress: Progress) -> None:
    shutil.copy2(box_dir / "Dockerfile", ctx / "Dockerfile")
    ignored = shutil.ignore_patterns("__pycache__", "*.py[co]", "Dockerfile", "requirements.txt")
    shutil.copytree(box_dir, ctx / "box", ignore=ignored)
    arch = MACHINE_ARCH.get(platform.machine().lower())
    if arch is None:
        raise BoxImageError(
            f"unsupported machine {platform.machine()}: the box image needs x86_64 or aarch64"
        )
    progress(f"installing box requirements for cp{PY_VERSION} {arch} (host pip settings)")
    # Each tag named: pip does not widen --platform to older manylinux tags (bookworm's glibc is 2.36).
    platforms = [arg for tag in MANYLINUX_TAGS for arg in ("--platform", f"{tag}_{arch}")]
    pip = [sys.executable, *PIP_INSTALL_ARGS.split(), *platforms, "--target", str(ctx / "site")]
    _run(
        [*pip, "-r", str(box_dir / "requirements.txt")],
        "pip install of box/requirements.txt",
        "check your pip index settings (pip config list)",
        progress,
    )
    if sys.version_info[:2] == tuple(int(p) for p in PY_VERSION.split(".")):
        progress("precompiling the box and its requirements")
        # unchecked-hash: the read-only container trusts these .pyc without stat-ing sources.
        compileall = [sys.executable, *"-m compileall -q --invalidation-mode unchecked-hash".split()]
        _run(
            [*compileall, str(ctx / "site"), str(ctx / "box")], "compileall", "report this as a bug", progress
        )
    for root, dirs, files in os.walk(ctx):  # uid 10001 must read everything, whatever the host umask
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


def debian_mirror(apt_dir: Path = APT_DIR) -> str:
    """The machine's Debian archive mirror from its apt sources (deb822 or one-line), else deb.debian.org."""
    candidates: list[str] = []
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in path.read_text(errors="replace").split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                key, sep, value = line.partition(":")
                if sep and not line.lstrip().startswith("#") and not line[:1].isspace():
                    fields[key.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() != "no" and "deb" in fields.get("types", "").split():
                candidates += fields.get("uris", "").split()
    for path in [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]:
        if path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                words = line.split("#", 1)[0].split()
                if words[:1] == ["deb"]:
                    words = [w for w in words[1:] if not w.startswith("[") and not w.endswith("]")]
                    candidates += words[:1]
    # The main archive's path ends in /debian (not debian-security, not a vendor repo).
    for uri in candidates:
        if uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    return DEFAULT_MIRROR


def _build_local_base(progress: Progress) -> str:
    debootstrap = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")
    if debootstrap is None:
        raise BoxImageError("debootstrap not found: apt-get install debootstrap (or pass --base IMAGE)")
    if os.geteuid() != 0:
        raise BoxImageError(
            "building the Debian base needs root (debootstrap): run as root or pass --base IMAGE"
        )
    mirror = debian_mirror()
    progress(f"building base image {LOCAL_BASE} with debootstrap from {mirror} (a few minutes)")
    # /var/tmp: /tmp is often noexec or a small tmpfs, and debootstrap chroots into the rootfs.
    with _temp_dir("impyard-base-", "/var/tmp" if os.path.isdir("/var/tmp") else None) as work:
        rootfs = work / "rootfs"
        _run(
            [debootstrap, "--variant=minbase", "--include=python3", DEBIAN_SUITE, str(rootfs), mirror],
            "debootstrap",
            f"check that {mirror} is reachable",
            progress,
            stream=True,
        )
        for pattern in TRIM_GLOBS:
            for path in rootfs.glob(pattern):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        progress(f"importing the rootfs as {LOCAL_BASE}")
        tarball = work / "rootfs.tar"
        # The engine provides /dev, /proc and /sys; debootstrap's device nodes stay out.
        excludes = ["--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*"]
        _run(
            ["tar", "--numeric-owner", *excludes, "-C", str(rootfs), "-cf", str(tarball), "."],
            "tar of the base rootfs",
            "check free disk space under /var/tmp",
            progress,
        )
        repo, _, tag = LOCAL_BASE.partition(":")
        try:
            _client().api.import_image_from_file(
                str(tarball),
                repository=repo,
                tag=tag,
                changes=[
                    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    'CMD ["python3"]',
                ],
            )
        except docker.errors.APIError as exc:
            raise BoxImageError(f"docker import of {LOCAL_BASE} failed: {exc.explanation or exc}") from None
    return LOCAL_BASE


def _resolve_base(base: str | None, progress: Progress) -> str:
    if base is not None:
        if image_present(base) or _try_pull(base, progress):
            return base
        raise BoxImageError(
            f"base image {base} is not present and could not be pulled: docker load it, "
            "or omit --base to build a local Debian base"
        )
    for candidate in (DEFAULT_BASE, LOCAL_BASE):
        if image_present(candidate):
            progress(f"using base image {candidate}")
            return candidate
    return _try_pull(DEFAULT_BASE, progress) or _build_local_base(progress)


def build_image(
    *, base: str | None = None, force: bool = False, progress: Progress = print, box_dir: Path | None = None
) -> str:
    """Build (or find) the box image for the current sources and return its tag."""
    box_dir = box_dir or _box_dir()
    digest = content_hash(box_dir)
    tag = f"{IMAGE_REPO}:{digest}"
    if not force and image_present(tag):
        progress(f"box image {tag} is up to date")
        return tag
    base_ref = _resolve_base(base, progress)
    with _temp_dir("impyard-box-ctx-") as ctx:
        progress(f"staging the build context for {tag}")
        _stage_context(ctx, box_dir, progress)
        progress(f"building {tag} on {base_ref}")
        try:
            for chunk in _client().api.build(
                path=str(ctx),
                tag=tag,
                buildargs={"BASE": base_ref, "BOX_VERSION": digest},
                labels={"org.impyard.box-hash": digest, "org.impyard.box-base": base_ref},
                rm=True,
                forcerm=True,
                decode=True,
            ):
                if "error" in chunk:
                    raise BoxImageError(f"docker build of {tag} failed: {chunk['error'].strip()}")
                for line in chunk.get("stream", "").splitlines():
                    if line.strip():
                        progress(line.rstrip())
        except docker.errors.APIError as exc:
            raise BoxImageError(f"docker build of {tag} failed: {exc.explanation or exc}") from None
    progress(f"built {tag}")
    return tag
