"""Fuzzing what a node does with bytes from peers: gossip validation and ingestion into the
store, the sync stream (both ends), the blob stream (both ends) and the DHT claim-record
validator. No input may crash the node (only typed errors, which the p2p layer turns into a
reset stream or a rejection) or reach the store without passing validation."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from open1b.node.blobs import MAX_CHUNK, BlobCache, BlobError
from open1b.node.claim_records import ClaimRecords
from open1b.node.ledger import Ledger
from open1b.node.p2p import NetworkError
from open1b.node.sync import pull_attestations, pull_manifests, serve_runs, serve_sync
from open1b.protocol import (
    Claim,
    Open1bError,
    Outcome,
    ProtocolError,
    blake2b256,
    claim_key,
    encode,
    validate_attestation,
    validate_reveal,
)
from open1b.protocol.claims import claim_precedence

from ..node.fakes import make_ledger
from ..vectors import ROOT as VECTORS
from ..vectors import fixtures
from .budget import FUZZ
from .strategies import inputs_for, mutated, raw_cbor

RUN = fixtures.run_manifest()
ISSUED = int(time.time()) - 60  # ingest judges with the real clock: no statement from its future
GOOD = [fixtures.attestation(s, RUN, k, match=(s + k) % 3 != 0, issued_at=ISSUED) for s in (1, 2)
        for k in range(RUN.steps)]


class TooLong(NetworkError):
    """What the real stream raises for a frame over its limit (libp2p's MessageTooLarge, wrapped by
    ``p2p.Stream.receive`` as every failure of the peer's stream is)."""


class StreamClosed(NetworkError):
    """What the real stream raises when the peer closed it (libp2p's StreamEOF, wrapped)."""


class FakeStream:
    """A peer's side of a stream: frames it will deliver, frames we sent."""

    relayed = False  # a direct stream: the blob protocol refuses relayed ones before reading (node/relays.py)

    def __init__(self, incoming: list[bytes], peer_id: str = "fuzz-peer") -> None:
        self.incoming, self.sent, self.peer_id, self.closed = list(incoming), [], peer_id, False

    async def receive(self, max_size: int) -> bytes:
        if not self.incoming:
            raise StreamClosed("stream closed")
        frame = self.incoming.pop(0)
        if len(frame) > max_size:
            raise TooLong(f"{len(frame)} > {max_size}")
        return frame

    async def send(self, frame: bytes) -> None:
        self.sent.append(frame)

    async def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def daemon():
    with tempfile.TemporaryDirectory() as tmp:
        node = make_ledger(Path(tmp) / "node", RUN)
        yield node
        node.store.close()


def _stored_are_valid(node: Ledger) -> None:
    for att in node.store.attestations(RUN.run_id):
        assert validate_attestation(att.encoded, node.manifests.get, int(time.time())).accepted


def test_the_ingestion_path_under_fuzz_does_store_valid_statements():
    with tempfile.TemporaryDirectory() as tmp:
        node = make_ledger(Path(tmp) / "node", RUN)
        assert all(node.statements.ingest_attestation(a.encoded) for a in GOOD)
        assert not any(node.statements.ingest_attestation(a.encoded) for a in GOOD)  # a set: nothing twice
        assert len(node.store.attestations(RUN.run_id)) == len(GOOD)
        node.store.close()


any_attestation_bytes = st.one_of(inputs_for(GOOD[0], 1), inputs_for(GOOD[5], 2),
                                  st.sampled_from([a.encoded for a in GOOD]))


@FUZZ
@given(st.lists(any_attestation_bytes, max_size=8))
def test_gossip_validation_and_ingestion_store_only_valid_statements(daemon, messages):
    for raw in messages:
        before = {a.digest for a in daemon.store.attestations(RUN.run_id)}
        outcome = daemon.statements.validate_gossip_attestation("fuzz-peer", raw)
        assert isinstance(outcome, Outcome)
        added = daemon.statements.ingest_attestation(raw)
        after = {a.digest for a in daemon.store.attestations(RUN.run_id)}
        if added:
            assert outcome is Outcome.ACCEPT and after == before | {blake2b256(raw)}
        else:
            assert after == before
        assert isinstance(daemon.statements.validator("claim")("fuzz-peer", raw), Outcome)
    _stored_are_valid(daemon)


REVEALS = [fixtures.reveal(s, RUN, k, issued_at=ISSUED) for s in (1, 2) for k in range(RUN.steps)]


@FUZZ
@given(st.lists(st.one_of(inputs_for(REVEALS[0], 1), inputs_for(REVEALS[3], 2), any_attestation_bytes,
                          st.sampled_from([r.encoded for r in REVEALS])), max_size=8))
def test_reveal_gossip_and_sync_frames_store_only_valid_reveals(daemon, messages):
    for raw in messages:
        before = {r.digest for r in daemon.store.reveals(RUN.run_id)}
        outcome = daemon.statements.validator("reveal")("fuzz-peer", raw)
        assert isinstance(outcome, Outcome)
        added = trio.run(daemon.statements.ingest_synced, [raw], "fuzz-peer")  # either kind, told apart by its own bytes
        after = {r.digest for r in daemon.store.reveals(RUN.run_id)}
        assert after == (before | {blake2b256(raw)} if added and outcome is Outcome.ACCEPT else before)
    for reveal in daemon.store.reveals(RUN.run_id):
        assert validate_reveal(reveal.encoded, daemon.manifests.get, int(time.time())).accepted
    _stored_are_valid(daemon)


@FUZZ
@given(st.one_of(st.binary(max_size=300), raw_cbor(), mutated(encode({"run": RUN.run_id})),
                 st.just(encode({"run": RUN.run_id}))))
def test_sync_server_answers_or_raises_a_typed_error(request):
    stream = FakeStream([request])
    try:
        trio.run(serve_sync, stream, lambda run: GOOD if run == RUN.run_id else None)
    except (ProtocolError, TooLong):
        return
    assert stream.sent[-1] == b"" and stream.closed
    if request == encode({"run": RUN.run_id}):
        assert stream.sent[:-1] == [a.encoded for a in GOOD]


class FakeP2P:
    def __init__(self, stream: FakeStream) -> None:
        self.stream = stream

    async def open_stream(self, peer_id: str, protocol: str, *older: str) -> FakeStream:
        return self.stream


@FUZZ
@given(st.lists(any_attestation_bytes, max_size=10))
def test_sync_client_validates_every_frame(daemon, frames):
    stream = FakeStream(frames + [b""])

    async def ingest(frames):
        return daemon.statements.ingest_attestations(frames)

    try:
        new = trio.run(pull_attestations, FakeP2P(stream), "fuzz-peer", RUN.run_id, ingest)
    except (TooLong, StreamClosed):
        new = 0
    assert 0 <= new <= len(frames)
    _stored_are_valid(daemon)


BLOB = b"open1b blob " * 300


@pytest.fixture(scope="module")
def cache():
    with tempfile.TemporaryDirectory() as tmp:
        c = BlobCache(Path(tmp) / "cache", max_bytes=1 << 20)
        source = Path(tmp) / "src"
        source.write_bytes(BLOB)
        c.add_file(source, pin=True)
        yield c


def _request(digest: bytes, offset: int, length: int) -> bytes:
    return encode({"digest": digest, "offset": offset, "length": length})


@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=140), raw_cbor(), mutated(_request(blake2b256(BLOB), 0, 100)),
                          st.builds(_request, st.sampled_from([blake2b256(BLOB), bytes(32)]),
                                    st.integers(0, 2 * len(BLOB)), st.integers(-5, MAX_CHUNK + 5))), max_size=4))
def test_blob_server_answers_or_raises_a_typed_error(cache, requests):
    stream = FakeStream(requests)
    try:
        trio.run(cache.serve, stream)
    except (ProtocolError, TooLong):
        pass
    sent = list(stream.sent)
    while sent:  # a head frame, and after {"size"} one data frame: a piece of the blob
        head = sent.pop(0)
        assert head in (encode({"size": len(BLOB)}), encode({"error": "not found"}))
        if head != encode({"error": "not found"}):
            assert sent.pop(0) in BLOB


@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=120), raw_cbor(), st.just(encode({"size": len(BLOB)})),
                          st.just(BLOB[:1000]), st.just(encode({"error": "no"})),
                          st.integers(-1, 2**70).map(lambda n: encode({"size": n}))), max_size=6))
def test_blob_client_keeps_only_bytes_that_hash_to_the_digest(frames):
    digest = blake2b256(b"wanted content")
    with tempfile.TemporaryDirectory() as tmp:
        c = BlobCache(Path(tmp), max_bytes=1 << 20)
        try:
            path = trio.run(c.fetch, FakeP2P(FakeStream(frames)), digest, ["fuzz-peer"])
        except BlobError:
            assert not c.has(digest)
            return
        assert path.read_bytes() == b"wanted content"


@FUZZ
@given(st.lists(st.one_of(inputs_for(fixtures.claim(1, RUN, 1), 1), st.binary(max_size=80)), min_size=1, max_size=5))
def test_dht_claim_validator_and_selector(values):
    records = ClaimRecords()
    key = claim_key(RUN.run_id, 1, 0)
    for value in values:
        try:
            records.validate(key, value)
        except (Open1bError, ValueError):
            pass  # raising is how libp2p's DHT learns a record is invalid
    index = records.select(key, values)
    assert 0 <= index < len(values)
    claims = []
    for value in values:
        try:
            claims.append(Claim.decode(value))
        except ProtocolError:
            pass
    if claims:  # libp2p hands select() validated values; among claims, the protocol's order decides
        assert values[index] == min(claims, key=claim_precedence).encoded


def _want(ids: list[bytes]) -> bytes:
    return encode({"want": ids})


@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=120), raw_cbor(), st.just(encode({"runs": True})),
                          mutated(encode({"runs": True})), st.just(_want([RUN.run_id])),
                          st.builds(_want, st.lists(st.binary(min_size=32, max_size=32), max_size=20))),
                max_size=3))
def test_runs_sync_server_answers_or_raises_a_typed_error(requests):
    stream = FakeStream(requests)
    try:
        trio.run(serve_runs, stream, lambda: [RUN.run_id], lambda run: RUN.encoded if run == RUN.run_id else None)
    except (ProtocolError, TooLong, StreamClosed):
        return
    assert stream.closed and stream.sent[0] == encode([RUN.run_id])
    assert all(frame in (RUN.encoded, b"") for frame in stream.sent[1:])


@FUZZ
@given(st.one_of(raw_cbor(), st.just(encode([RUN.run_id])), st.just(encode([bytes(32), RUN.run_id]))),
       st.lists(st.one_of(st.just(RUN.encoded), mutated(RUN.encoded), st.binary(max_size=200)), max_size=3))
def test_runs_sync_client_validates_the_list_and_every_manifest(daemon, listing, frames):
    stream = FakeStream([listing] + frames)
    accepted = []

    async def ingest(data: bytes) -> bool:
        verdict = daemon.statements.judge_manifest(data)
        if verdict.accepted:
            accepted.append(verdict.message)
        return verdict.accepted

    try:
        new = trio.run(pull_manifests, FakeP2P(stream), "fuzz-peer", lambda run: False, ingest)
    except (ProtocolError, TooLong, StreamClosed):
        new = None
    assert all(m.encoded == RUN.encoded for m in accepted)  # the only validly signed manifest offered
    if new is not None:
        assert new == len(accepted) and len(stream.sent) == 2 and stream.closed


# -- the command line: whatever a file or the API holds, one line and exit code 1, never a traceback --
def _run_cli(argv: list[str]) -> tuple[int, str]:
    """``open1b-node argv`` in this process; an exception escaping ``main`` fails the test (it
    would print a traceback)."""
    import contextlib
    import io

    from open1b.node import cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(argv)
    return rc, err.getvalue()


def _one_line_error_or_success(rc: int, err: str, allowed: tuple[int, ...] = (0,)) -> None:
    assert rc in (1, *allowed), (rc, err)
    if rc == 1:
        last = err.strip().splitlines()[-1]
        assert last.startswith(("open1b-node: error: ", "open1b-node: invalid input: ")), err
        assert "Traceback" not in err


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64), st.floats(allow_nan=False),
                      st.text(max_size=12))
ANY_JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                        max_leaves=8)


def _shaped(shape):
    """Answers of ``shape`` (from :mod:`open1b.node.answers`), a leaf now and then of another type,
    a key now and then missing: what a daemon of another version might send."""
    if isinstance(shape, dict):
        full = st.fixed_dictionaries({k: _shaped(v) for k, v in shape.items()})
        return st.one_of(full, full.flatmap(lambda d: st.sampled_from(sorted(d)).map(
            lambda k: {x: v for x, v in d.items() if x != k})), ANY_JSON)
    if isinstance(shape, list):
        return st.one_of(st.lists(_shaped(shape[0]), max_size=3), ANY_JSON)
    kinds = shape if isinstance(shape, tuple) else (shape,)
    leaves = {str: st.text(max_size=70), int: st.integers(-10**9, 10**9), bool: st.booleans(),
              float: st.floats(allow_nan=False), type(None): st.none()}
    return st.one_of(*(leaves[k] for k in kinds), JSON_LEAF)


def _api_commands():
    from open1b.node import answers

    return [(["status"], answers.STATUS), (["peers"], answers.PEERS), (["runs"], answers.RUNS),
            (["coverage", "ab"], answers.COVERAGE), (["claims"], answers.CLAIMS),
            (["attestations", "ab"], answers.ATTESTATIONS), (["doctor"], answers.STATUS)]


@FUZZ
@given(st.data())
def test_every_api_command_renders_any_answer_or_says_in_one_line_that_it_is_malformed(monkeypatch_module, data):
    from open1b.node import client

    argv, shape = data.draw(st.sampled_from(_api_commands()))
    answer = data.draw(_shaped(shape))
    monkeypatch_module.setattr(client, "_request", lambda api, path, method, timeout, token: answer)
    for json_flag in ([], ["--json"]):
        rc, err = _run_cli([*argv, "--api", "127.0.0.1:1", *json_flag])
        _one_line_error_or_success(rc, err)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@FUZZ
@given(st.one_of(mutated(RUN.encoded), st.just(RUN.encoded), st.binary(max_size=200)))
def test_commands_that_read_a_run_directory_refuse_a_broken_one_in_one_line(tmp_path_factory, manifest_bytes):
    from open1b.deterministic.runfile import MANIFEST_FILE

    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / MANIFEST_FILE).write_bytes(manifest_bytes)
    for argv in (["replay", str(run_dir), "--step", "0"], ["samples", str(run_dir), "--step", "0"],
                 ["reveal", str(run_dir), "--api", "127.0.0.1:1"]):
        _one_line_error_or_success(*_run_cli(argv), allowed=())


HANDOFF = VECTORS / "gensyn_handoff" / "handoff-hsdp"
HANDOFF_FILES = ("meta.json", "model.safetensors", "optimizer.safetensors", "gradients.safetensors",
                 "batch_hasher.rank_1.bin")


@FUZZ
@given(st.sampled_from(HANDOFF_FILES), st.data())
def test_verify_handoff_answers_any_broken_file_in_one_line(tmp_path_factory, name, data):
    import shutil

    directory = tmp_path_factory.mktemp("handoff") / "h"
    shutil.copytree(HANDOFF, directory)
    original = (HANDOFF / name).read_bytes()
    broken = data.draw(st.one_of(mutated(original), st.binary(max_size=64),
                                 st.integers(0, len(original)).map(lambda n: original[:n])))
    (directory / name).write_bytes(broken)
    log = VECTORS / "gensyn_handoff" / "handoff-hsdp.state_hashes.jsonl"
    rc, err = _run_cli(["verify-handoff", str(directory), "--state-hashes", str(log)])
    _one_line_error_or_success(rc, err, allowed=(0, 2))


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode),
                 mutated(b'{"step": 7, "state_hash": "' + b"ab" * 32 + b'"}\n')))
def test_verify_handoff_answers_any_state_hash_log_in_one_line(tmp_path_factory, log_bytes):
    log = tmp_path_factory.mktemp("log") / "log.jsonl"
    log.write_bytes(log_bytes)
    rc, err = _run_cli(["verify-handoff", str(HANDOFF), "--state-hashes", str(log)])
    _one_line_error_or_success(rc, err, allowed=(0, 2))


@FUZZ
@given(st.data())
def test_publish_follows_any_job_answer_or_says_in_one_line_that_it_is_malformed(monkeypatch_module,
                                                                                 tmp_path_factory, data):
    from open1b.node import answers, client

    run_dir = tmp_path_factory.mktemp("run")
    first = data.draw(_shaped(answers.PUBLICATION))
    final = data.draw(st.fixed_dictionaries({**{k: _shaped(v) for k, v in answers.PUBLICATION.items()},
                                             "state": st.sampled_from(["done", "failed"])}))
    answers_given = iter([first, final])
    monkeypatch_module.setattr(client, "_request", lambda api, path, method, timeout, token: next(answers_given, final))
    monkeypatch_module.setattr(client, "PUBLISH_POLL_S", 0)
    _one_line_error_or_success(*_run_cli(["publish", str(run_dir), "--api", "127.0.0.1:1"]))


@FUZZ
@given(st.one_of(st.binary(max_size=64), st.binary(min_size=32, max_size=32)))
def test_key_show_reads_any_key_file_or_says_why_not_in_one_line(tmp_path_factory, key):
    from open1b.node.identity_file import key_path

    data_dir = tmp_path_factory.mktemp("data")
    key_path(data_dir).parent.mkdir(parents=True)
    key_path(data_dir).write_bytes(key)
    _one_line_error_or_success(*_run_cli(["key", "show", "--data-dir", str(data_dir)]))


@FUZZ
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                 st.dictionaries(st.sampled_from(["node", "other"]), st.one_of(JSON_LEAF, st.dictionaries(
                     st.sampled_from(["redundancy", "listen", "bootstrap", "trust_policy", "lease_s", "x"]),
                     st.one_of(JSON_LEAF, st.lists(JSON_LEAF, max_size=2)), max_size=3)), max_size=2).map(
                     lambda d: "\n".join(_toml(d)))))
def test_config_toml_either_loads_or_is_one_config_error(tmp_path_factory, text):
    """What ``daemon`` and ``doctor`` read first: anything but a valid config is a ConfigError."""
    from open1b.node.config import ConfigError, load_config

    data_dir = tmp_path_factory.mktemp("data")
    (data_dir / "config.toml").write_text(text, errors="surrogateescape")
    try:
        load_config(data_dir)
    except ConfigError as exc:
        assert "\n" not in str(exc).strip()


def _toml(table: dict) -> list[str]:
    import json

    lines = []
    for section, body in table.items():
        if isinstance(body, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in body.items() if v is not None]
        elif body is not None:
            lines.append(f"{section} = {json.dumps(body)}")
    return lines
