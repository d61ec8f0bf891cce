"""The box image builder: content-addressed tags, mirror discovery, clear errors (design §10)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import box
from impyard.backends import image as boximage
from impyard.backends.image import BoxImageError, build_image, debian_mirror, expected_tag, image_present

TAG_RE = re.compile(r"^impyard-box:[0-9a-f]{12}$")
REAL_BOX_DIR = Path(box.__file__).parent


@pytest.fixture
def box_dir(tmp_path: Path) -> Path:
    """A small stand-in for the box package: what the tag is computed over."""
    root = tmp_path / "box"
    (root / "protocol").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "__main__.py").write_text("print('box')\n")
    (root / "protocol" / "models.py").write_text("VERSION = 1\n")
    (root / "Dockerfile").write_text("ARG BASE\nFROM ${BASE}\n")
    (root / "requirements.txt").write_text("anyio>=4.4\n")
    return root


# --- expected_tag -------------------------------------------------------------------------


def test_real_box_sources_give_a_well_formed_stable_tag() -> None:
    assert TAG_RE.match(expected_tag())
    assert expected_tag() == expected_tag(REAL_BOX_DIR)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: (d / "__main__.py").write_text("print('changed')\n"), id="module"),
        pytest.param(lambda d: (d / "protocol" / "models.py").write_text("VERSION = 2\n"), id="subpackage"),
        pytest.param(lambda d: (d / "protocol" / "new.py").write_text(""), id="new-module"),
        pytest.param(lambda d: (d / "__main__.py").rename(d / "main2.py"), id="renamed-module"),
        pytest.param(
            lambda d: (d / "Dockerfile").write_text("ARG BASE\nFROM ${BASE}\nUSER 1\n"), id="dockerfile"
        ),
        pytest.param(lambda d: (d / "requirements.txt").write_text("anyio>=4.5\n"), id="requirements"),
        pytest.param(lambda d: (d / "protocol" / "reply.txt").write_text("[reply]\nHello\n"), id="template"),
    ],
)
def test_a_changed_box_means_a_new_tag(box_dir: Path, edit) -> None:
    before = expected_tag(box_dir)
    edit(box_dir)
    after = expected_tag(box_dir)
    assert TAG_RE.match(before) and TAG_RE.match(after)
    assert after != before


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(
            lambda d: ((d / "__pycache__").mkdir(), (d / "__pycache__" / "x.pyc").write_bytes(b"\0")),
            id="bytecode",
        ),
        pytest.param(lambda d: (d / "protocol" / "models.pyc").write_bytes(b"\0"), id="stray-bytecode"),
    ],
)
def test_files_that_do_not_reach_the_image_keep_the_tag(box_dir: Path, edit) -> None:
    before = expected_tag(box_dir)
    edit(box_dir)
    assert expected_tag(box_dir) == before


def test_the_tag_does_not_depend_on_where_the_box_lives(box_dir: Path, tmp_path: Path) -> None:
    moved = shutil.copytree(box_dir, tmp_path / "elsewhere" / "box")
    assert expected_tag(moved) == expected_tag(box_dir)


# --- the Dockerfile -----------------------------------------------------------------------


def test_dockerfile_builds_without_network_or_runc() -> None:
    instructions = [
        line.split(None, 1)
        for line in (REAL_BOX_DIR / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#") and not line.startswith(" ")
    ]
    keywords = [words[0].upper() for words in instructions]
    assert "RUN" not in keywords  # a RUN step needs runc and, usually, the network
    assert keywords[:2] == ["ARG", "FROM"] and instructions[1][1].strip() == "${BASE}"
    user = dict((w[0].upper(), w[1].strip()) for w in instructions)["USER"]
    assert not user.startswith(("0", "root"))
    assert (
        dict((w[0].upper(), w[1].strip()) for w in instructions)["ENTRYPOINT"]
        == '["python3", "-P", "-s", "-S", "-m", "box"]'
    )


# --- debian_mirror ------------------------------------------------------------------------


BOOKWORM_DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example.org/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example.org/debian-security
Suites: bookworm-security
Components: main
"""
SECURITY_FIRST_DEB822 = """\
Types: deb
URIs: http://security.debian.org/debian-security
Suites: bookworm-security

Types: deb deb-src
URIs: https://ftp.example.net/debian
Suites: bookworm
"""
DISABLED_DEB822 = """\
Enabled: no
Types: deb
URIs: http://disabled.example.org/debian

Types: deb-src
URIs: http://src-only.example.org/debian
"""
VENDOR_DEB822 = """\
Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
"""


@pytest.mark.parametrize(
    ("files", "mirror"),
    [
        pytest.param(
            {"sources.list.d/debian.sources": BOOKWORM_DEB822},
            "http://mirror.example.org/debian",
            id="deb822",
        ),
        pytest.param(
            {"sources.list.d/debian.sources": SECURITY_FIRST_DEB822},
            "https://ftp.example.net/debian",
            id="deb822-security-first",
        ),
        pytest.param(
            {"sources.list.d/a.sources": DISABLED_DEB822},
            boximage.DEFAULT_MIRROR,
            id="deb822-disabled-and-source-only",
        ),
        pytest.param(
            {"sources.list.d/nodesource.sources": VENDOR_DEB822},
            boximage.DEFAULT_MIRROR,
            id="vendor-repo-only",
        ),
        pytest.param(
            {
                "sources.list": "# deb http://commented.example/debian bookworm main\n"
                "deb [signed-by=/k.gpg arch=amd64] http://one.example/debian bookworm main\n"
            },
            "http://one.example/debian",
            id="one-line-with-options",
        ),
        pytest.param(
            {"sources.list.d/debian.list": "deb http://list.example/debian/ bookworm main\n"},
            "http://list.example/debian",
            id="one-line-in-list-d",
        ),
        pytest.param(
            {"sources.list.d/x.list.disabled": "deb http://off.example/debian bookworm main\n"},
            boximage.DEFAULT_MIRROR,
            id="disabled-file-ignored",
        ),
        pytest.param({}, boximage.DEFAULT_MIRROR, id="no-apt-config"),
    ],
)
def test_debian_mirror_comes_from_the_apt_sources(tmp_path: Path, files: dict[str, str], mirror: str) -> None:
    (tmp_path / "sources.list.d").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert debian_mirror(tmp_path) == mirror


# --- errors -------------------------------------------------------------------------------


def test_unreachable_docker_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    for attempt in (
        lambda: image_present("impyard-box:000000000000"),
        lambda: build_image(progress=lambda _: None),
    ):
        with pytest.raises(BoxImageError) as caught:
            attempt()
        message = str(caught.value)
        assert "\n" not in message
        assert "not reachable at unix:///nonexistent/docker.sock" in message
        assert "start dockerd" in message


def test_a_failed_build_leaves_no_temp_dirs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, box_dir: Path
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(boximage, "image_present", lambda tag: tag == "some/base:1")  # no engine needed
    (box_dir / "requirements.txt").write_text(
        "this is not a requirement !!\n"
    )  # pip fails before any network
    with pytest.raises(BoxImageError, match=r"^pip install of box/requirements.txt failed"):
        build_image(base="some/base:1", progress=lambda _: None, box_dir=box_dir)
    assert list(scratch.iterdir()) == []


# --- against a real engine, where the image is already built -------------------------------


def _built_image() -> str:
    try:
        tag = expected_tag()
        if image_present(tag):
            return tag
    except BoxImageError as exc:
        pytest.skip(str(exc))
    pytest.skip(f"box image {tag} not built: run `impyard box build`")


@pytest.mark.docker
def test_build_image_returns_the_present_image_without_rebuilding() -> None:
    tag = _built_image()
    said: list[str] = []
    assert build_image(progress=said.append) == tag
    assert said == [f"box image {tag} is up to date"]


@pytest.mark.docker
def test_built_image_runs_locked_down_with_its_requirements() -> None:
    tag = _built_image()
    probe = "import sys, pydantic, anyio, box, os; print(sys.version_info[:2], os.getuid())"
    result = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--user",
            "10001:10001",
            "--entrypoint",
            "python3",
            tag,
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(3, 11) 10001"
