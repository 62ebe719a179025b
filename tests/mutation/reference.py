"""A second reading of docs/protocol.md, written from its text alone: the codec (§3), message
decoding and strict Ed25519 (§5), external trajectories (§6.3), validation (§7), coverage (§8.3),
evaluations and the leaderboard (§8.5, §8.6), spot coverage (§8.7) and claim records (§10);
and, from docs/run-format.md, the data proofs (§8.5).

It imports nothing from ``open1b``: the constants and the message schemas are read from the
spec itself (the §2 table and the §5.3 CDDL), and every rule is a line below that says which
sentence it implements. ``mutants.py`` rewrites those lines into wrong readings of the text; the
vectors must reject every one of them (``test_mutation.py``). Keep each rule on lines of its own,
so that a mutant can replace exactly one reading.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from fractions import Fraction
from pathlib import Path

import cbor2

from . import ed25519_equation

SPEC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
CONST = {name: int(value) for name, value in re.findall(r"^\| `(\w+)` \| (\d+) \|", SPEC, re.M)}
MAX_DEPTH = CONST["MAX_DEPTH"]
SKEW = CONST["MAX_CLOCK_SKEW_SECONDS"]
SIGNING_CONTEXT = b"open1b/v%d/sig\0" % CONST["PROTOCOL_VERSION"]
SIGNER = {"manifest": "publisher", "external_manifest": "publisher", "claim": "claimant", "attestation": "signer",
          "reveal": "revealer", "eval": "signer", "spotcheck": "signer"}
MAX_SIZE = {"manifest": CONST["MAX_MANIFEST_SIZE"], "external_manifest": CONST["MAX_MANIFEST_SIZE"],
            "claim": CONST["MAX_CLAIM_SIZE"], "attestation": CONST["MAX_ATTESTATION_SIZE"],
            "reveal": CONST["MAX_REVEAL_SIZE"], "eval": CONST["MAX_EVAL_SIZE"],
            "spotcheck": CONST["MAX_SPOTCHECK_SIZE"]}


class Refused(Exception):
    def __init__(self, code: str, outcome: str = "reject") -> None:
        super().__init__(code)
        self.code, self.outcome = code, outcome


def b2(*parts: bytes) -> bytes:
    return hashlib.blake2b(b"".join(parts), digest_size=32).digest()


# -- §3 canonical CBOR -------------------------------------------------------------------------

def encode(value) -> bytes:
    return cbor2.dumps(value, canonical=True)


def scan_heads(data: bytes) -> None:
    """§3.2 step 2: heads in byte order; the first defect decides."""
    pos, open_items = 0, [[1, False]]  # items left in each open container, and whether it is a map
    while open_items:
        top = open_items[-1]
        if top[0] == 0:
            open_items.pop()
            continue
        is_key = top[1] and top[0] % 2 == 0
        top[0] -= 1
        if pos >= len(data):
            raise Refused("malformed")  # the input ends before the data item
        major, info = data[pos] >> 5, data[pos] & 31
        pos += 1
        if info == 31:
            raise Refused("non_canonical")  # rule 1: an indefinite length or a break
        if info >= 28:
            raise Refused("malformed")  # rule 2: reserved
        argument = info
        if info >= 24:
            width = 1 << (info - 24)
            if pos + width > len(data):
                raise Refused("malformed")  # rule 3
            argument = int.from_bytes(data[pos:pos + width], "big")
            pos += width
        if is_key and major != 3:
            raise Refused("malformed")  # rule 4: map keys are text
        if major == 6:
            raise Refused("malformed")  # rule 5: no tags
        if major == 7 and info not in (20, 21, 22, 25, 26, 27):
            raise Refused("malformed")  # rule 6: false, true, null and floats only
        if major in (2, 3):
            pos += argument
            if pos > len(data):
                raise Refused("malformed")  # rule 7
        if major in (4, 5):
            if len(open_items) - 1 >= MAX_DEPTH:
                raise Refused("malformed")  # rule 8: it would lie inside MAX_DEPTH others
            open_items.append([argument * 2 if major == 5 else argument, major == 5])
    if pos != len(data):
        raise Refused("malformed")  # bytes after the data item


def decode(data: bytes, max_size: int):
    if len(data) > max_size:
        raise Refused("oversize")  # §3.2 step 1, before anything is parsed
    scan_heads(data)
    try:
        value = cbor2.loads(data)
    except Exception:
        raise Refused("malformed")  # step 3: text that is not UTF-8
    if encode(value) != data:
        raise Refused("non_canonical")  # step 4
    return value


# -- §5.3 schemas, read from the CDDL ------------------------------------------------------------

def read_cddl() -> tuple[dict[str, str], dict[str, list[tuple[str, str]]]]:
    """The CDDL block of §5.3: its type aliases, and each message's (field, type) in order."""
    block = re.search(r"```cddl\n(.*?)```", SPEC, re.S).group(1)
    aliases, messages, current = {}, {}, None
    for raw in block.splitlines():
        line = raw.split(";")[0].rstrip()
        if not line.strip():
            continue
        if current is None:
            name, expr = (part.strip() for part in line.split("=", 1))
            if expr == "{":
                current = messages.setdefault(name, [])
            else:
                aliases[name] = expr
        elif line.strip() == "}":
            current = None
        else:
            optional, field, expr = re.fullmatch(r'\s*(\? )?"(\w+)": (.*?),?', line).groups()
            current.append((field, f"? {expr}" if optional else expr))
    return aliases, messages


def _is_uint(x, maximum: int) -> bool:
    return type(x) is int and 0 <= x <= maximum


def _is_scalar(x) -> bool:  # CDDL scalar: ints as in §3.1, finite floats, short texts
    if type(x) is int:
        return -(2**64) <= x <= 2**64 - 1
    if type(x) is float:
        return math.isfinite(x)
    return type(x) is str and len(x.encode()) <= 256


def type_ok(expr: str, x) -> bool:
    if m := re.fullmatch(r"bstr \.size (\d+)", expr):
        return type(x) is bytes and len(x) == int(m.group(1))
    if m := re.fullmatch(r"uint \.le (\d+)", expr):
        return _is_uint(x, int(m.group(1)))
    if m := re.fullmatch(r"tstr \.size \(0\.\.(\d+)\)", expr):
        return type(x) is str and len(x.encode()) <= int(m.group(1))
    if re.fullmatch(r'"\w+"( / "\w+")*', expr):
        return type(x) is str and x in re.findall(r'"(\w+)"', expr)
    if re.fullmatch(r"\d+", expr):
        return type(x) is int and x == int(expr)
    if m := re.fullmatch(r"\[0\*(\d+) (\w+)\]", expr):  # a list of at most N items of an alias's type
        item = _ALIASES.get(m.group(2), m.group(2))
        return type(x) is list and len(x) <= int(m.group(1)) and all(type_ok(item, h) for h in x)
    if m := re.fullmatch(r"\{ 0\*(\d+) scalar-key => scalar \}", expr):
        return type(x) is dict and len(x) <= int(m.group(1)) and all(
            type(k) is str and len(k.encode()) <= 256 and _is_scalar(v) for k, v in x.items())
    raise AssertionError(f"no reading of the CDDL type {expr!r}")


_ALIASES, _MESSAGES = read_cddl()
SCHEMAS = {kind: {field: _ALIASES.get(expr, expr) for field, expr in fields} for kind, fields in _MESSAGES.items()}
# "? field": the message may omit it (§5.3); when present it has the type after "? "
OPTIONAL = {kind: {f for f, expr in fields.items() if expr.startswith("? ")} for kind, fields in SCHEMAS.items()}
SCHEMAS = {kind: {f: _ALIASES.get(expr.removeprefix("? "), expr.removeprefix("? ")) for f, expr in fields.items()}
           for kind, fields in SCHEMAS.items()}
DEVICE = re.compile(r"(cpu|cuda)/[a-z0-9_]{1,32}(-[a-z0-9_]{1,32})?")


# -- §5.4 Ed25519 ------------------------------------------------------------------------------

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
Y8 = 2707385501144840649318225287225658788936804267575313519463743609750303402022
SMALL_ORDER_Y = {0, 1, P - 1, Y8, P - Y8, P, P + 1}


def _y(point: bytes) -> int:
    return int.from_bytes(point, "little") & ((1 << 255) - 1)


def ed25519_valid(key: bytes, message: bytes, sig: bytes) -> bool:
    if int.from_bytes(sig[32:], "little") >= L:
        return False  # rule 1
    if _y(key) >= P:
        return False  # rule 2
    if _y(key) in SMALL_ORDER_Y:
        return False  # rule 3
    if _y(sig[:32]) in SMALL_ORDER_Y:
        return False  # rule 4
    return ed25519_equation.holds(key, message, sig)  # rule 5


def signing_bytes(kind: str, body: dict) -> bytes:
    return SIGNING_CONTEXT + kind.encode() + b"\0" + encode(body)


# -- §5.2 decoding a message -------------------------------------------------------------------

def decode_message(data: bytes, kinds) -> dict:
    value = decode(data, max(MAX_SIZE[k] for k in kinds))  # step 1: the largest limit
    kind = value.get("kind") if type(value) is dict else None
    if type(kind) is not str or kind not in kinds:
        raise Refused("kind")  # step 2
    if len(data) > MAX_SIZE[kind]:
        raise Refused("oversize")  # step 2: then the kind's own limit
    if type(value.get("v")) is not int or value["v"] != CONST["PROTOCOL_VERSION"]:
        raise Refused("version")  # step 3
    if kind == "manifest" and (type(value.get("format")) is not int or value["format"] != 2):
        raise Refused("run_format")  # step 4
    schema = SCHEMAS[kind]
    if any(name not in schema for name in value):
        raise Refused("unknown_field")  # step 5
    if any(name not in value and name not in OPTIONAL[kind] for name in schema):
        raise Refused("missing_field")
    if not all(type_ok(expr, value[name]) for name, expr in schema.items() if name in value):
        raise Refused("wrong_type")
    cross_field_rules(kind, value)  # step 6
    body = {k: v for k, v in value.items() if k != "sig"}
    if not ed25519_valid(value[SIGNER[kind]], signing_bytes(kind, body), value["sig"]):
        raise Refused("bad_signature")  # step 7
    return {**value, "digest": b2(data), "encoded": data}


def cross_field_rules(kind: str, m: dict) -> None:
    if kind == "manifest":
        if m["steps"] < 1 or len(m["state_hashes"]) != m["steps"] + 1:
            raise Refused("state_hashes")
        if len(m["checkpoints"]) != m["steps"] + 1:
            raise Refused("checkpoints")
        if len(m["witnesses"]) != m["steps"]:
            raise Refused("witnesses")
        if m["samples"] < 1:
            raise Refused("samples")
        fingerprints = [m["data"].get(k) for k in ("fingerprints_root", "fingerprints_blob")]
        if fingerprints != [None, None] and not all(
                type(h) is str and len(h) == 64 and set(h) <= set("0123456789abcdef") for h in fingerprints):
            raise Refused("fingerprints")
    if kind == "external_manifest" and m["steps"] < 1:
        raise Refused("state_hashes")
    if kind == "claim" and not m["lease_expiry"] > m["issued_at"]:
        raise Refused("lease_order")
    if kind == "claim" and "device" in m and DEVICE.fullmatch(m["device"]) is None:
        raise Refused(code="device")  # optional (r21): checked when present
    if kind == "eval" and (m["verdict"] == "mismatch") == (m["loss"] == m["claimed"]):
        raise Refused("eval_verdict")
    if kind in ("attestation", "eval") and not DEVICE.fullmatch(m["device"]):
        raise Refused("device")
    if kind == "spotcheck" and (m["verdict"] == "pass") != (m["caught"] == "none"):
        raise Refused("spot_verdict")
    if kind == "spotcheck" and DEVICE.fullmatch(m["device"]) is None:
        raise Refused(code="device")  # the same rule as above, for the kind §5.3 added in r6


# -- §6.3 external trajectories ----------------------------------------------------------------

def merkle_root(leaves: list[bytes]) -> bytes:
    if len(leaves) == 1:
        return b2(b"\0", leaves[0])
    k = 1 << ((len(leaves) - 1).bit_length() - 1)  # the largest power of 2 below n
    return b2(b"\1", merkle_root(leaves[:k]), merkle_root(leaves[k:]))


def _no_duplicates(pairs):
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError("duplicate key")
    return dict(pairs)


def _not_json(name):
    raise ValueError(name)


def parse_line(line: str):
    row = json.loads(line, object_pairs_hook=_no_duplicates, parse_constant=_not_json)
    step, digest = row["step"], row["state_hash"]
    if type(step) is not int or not 0 <= step <= 2**64 - 1:
        raise ValueError("step")
    if type(digest) is not str or not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
        raise ValueError("state_hash")
    return step, bytes.fromhex(digest)


def trajectory_log(data: bytes) -> dict[int, bytes]:
    log = {}
    try:
        for line in data.decode("utf-8").split("\n"):
            line = line[:-1] if line.endswith("\r") else line
            if not line.strip(" \t\r"):
                continue  # spaces, tabs and CRs only
            step, digest = parse_line(line)
            log[step] = digest  # the last line of a step wins
    except (ValueError, KeyError, TypeError, RecursionError):
        raise Refused("trajectory_format")
    return log


def resolve_external(m: dict, data: bytes) -> dict:
    if len(data) != m["trajectory_size"] or b2(data) != m["trajectory_digest"]:
        raise Refused("trajectory_digest")
    log = trajectory_log(data)
    window = range(m["first_step"], m["first_step"] + m["steps"] + 1)
    if any(s not in log for s in window):
        raise Refused("trajectory_window")
    hashes = [log[s] for s in window]
    if merkle_root(hashes) != m["trajectory_root"]:
        raise Refused("trajectory_root")
    return {"id": m["digest"], "steps": m["steps"], "h": hashes, "engine": m["engine"],
            "engine_version": m["engine_version"], "witnesses": None, "data": m["data"], "publisher": m["publisher"],
            "model": m["model"]}


def load_run(manifest: bytes, trajectory: bytes | None = None) -> dict:
    m = decode_message(manifest, {"manifest", "external_manifest"})
    if trajectory is not None:
        return resolve_external(m, trajectory)
    return {"id": m["digest"], "steps": m["steps"], "h": m["state_hashes"], "engine": m["engine"],
            "engine_version": m["engine_version"], "witnesses": m["witnesses"], "data": m["data"],
            "publisher": m["publisher"], "model": m["model"]}


def eval_rules(m: dict, run: dict) -> None:
    every, root = run["data"].get("eval_every"), run["data"].get("eval_root")
    if type(every) is not int or every < 1 or type(root) is not str:
        raise Refused("no_eval")
    if not (m["state"] >= 1 and m["state"] % every == 0 and m["state"] <= run["steps"]):
        raise Refused("eval_state")
    if m["engine"] != run["engine"] or m["engine_version"] != run["engine_version"]:
        raise Refused("engine")
    if (m["verdict"] == "result") != (m["signer"] == run["publisher"]):
        raise Refused("eval_signer")


def spot_challenge(challenge: bytes, slot_challenge: bytes, slots: int, total: int) -> tuple[int, list[int]]:
    """§5.5: the slot the slot challenge derives and the chunks the challenge derives."""
    slot = int.from_bytes(b2(b2(b"open1b/spotcheck/v1\0", slot_challenge), b"slot"), "big") % slots
    seed = b2(b"open1b/spotcheck/v1\0", challenge)
    chunks, i = [], 0
    while len(chunks) < min(CONST["CHALLENGE_CHUNKS"], total):
        c = int.from_bytes(b2(seed, i.to_bytes(8, "big")), "big") % total
        if c not in chunks:
            chunks.append(c)
        i += 1
    return slot, sorted(chunks)


def spotcheck_rules(m: dict, run: dict) -> None:
    if m["pre_state"] != run["h"][m["step"]]:
        raise Refused("pre_state")
    if [m["engine"], m["engine_version"]] != [run["engine"], run["engine_version"]]:
        raise Refused("engine")
    body = {"run": m["run"], "step": m["step"]}
    if not ed25519_valid(m["signer"], signing_bytes("spotcheck-challenge", body), m["challenge"]):
        raise Refused("challenge")
    if not ed25519_valid(m["signer"], signing_bytes("spotcheck-slot", body), m["slot_challenge"]):
        raise Refused("challenge")
    ranks, micro = run["model"].get("ranks"), run["model"].get("micro_batches")
    if type(ranks) is not int or type(micro) is not int or ranks < 1 or micro < 1 or m["chunks_total"] < 1:
        raise Refused("challenge_derivation")
    derived = spot_challenge(m["challenge"], m["slot_challenge"], ranks * micro, m["chunks_total"])
    if [m["slot"], list(m["chunks"])] != list(derived):
        raise Refused("challenge_derivation")


# -- §7 validation -----------------------------------------------------------------------------

def run_rules(m: dict, run: dict) -> None:
    if m["kind"] == "eval":
        return eval_rules(m, run)
    if not m["step"] < run["steps"]:
        raise Refused("step_range")
    if m["kind"] == "attestation":
        if m["pre_state"] != run["h"][m["step"]]:
            raise Refused("pre_state")
        if (m["verdict"] == "match") != (m["post_state"] == run["h"][m["step"] + 1]):
            raise Refused("verdict")
        if (m["engine"], m["engine_version"]) != (run["engine"], run["engine_version"]):
            raise Refused("engine")
    if m["kind"] == "spotcheck":
        return spotcheck_rules(m, run)
    if m["kind"] == "claim" and not m["lease_expiry"] - m["issued_at"] <= CONST["MAX_LEASE_SECONDS"]:
        raise Refused("lease_length")
    if m["kind"] == "reveal":
        if run["witnesses"] is None:
            raise Refused("witness")  # an external run commits to no witness
        if b2(b"open1b/witness-commit/v1\0", m["witness"]) != run["witnesses"][m["step"]]:
            raise Refused("witness")


TOPIC_KINDS = {"attestation": {"attestation"}, "claim": {"claim"}, "reveal": {"reveal"},
               "manifest": {"manifest", "external_manifest"}, "sync": {"attestation", "reveal", "spotcheck"}, "eval": {"eval"},
               "spotcheck": {"spotcheck"}}


def validate(topic: str, data: bytes, runs: dict, now: int) -> tuple[str, str]:
    try:
        m = decode_message(data, TOPIC_KINDS[topic])
        if topic == "manifest":
            if m["created_at"] > now + SKEW:
                raise Refused("future", "ignore")
            return "accept", "ok"
        run = runs.get(m["run"])
        if run is None:
            raise Refused("unknown_run", "ignore")
        if m["issued_at"] > now + SKEW:
            raise Refused("future", "ignore")
        run_rules(m, run)
    except Refused as exc:
        return exc.outcome, exc.code
    return "accept", "ok"


# -- §10 claim records -------------------------------------------------------------------------

def claim_key(run: bytes, step: int, slot: int) -> str:
    digest = b2(b"open1b/claim-key/v1\0", run, step.to_bytes(8, "little"), bytes([slot]))
    return "/open1b/c/" + digest[:16].hex()


def claim_record(key: str, value: bytes) -> dict | None:
    try:
        c = decode_message(value, {"claim"})
    except Refused:
        return None
    return c if claim_key(c["run"], c["step"], c["slot"]) == key else None


def claim_rank(c: dict):
    return (-(c["issued_at"] // CONST["LEASE_ROUND_SECONDS"]), c["issued_at"], c["claimant"], c["encoded"])


# -- §8.3 coverage -----------------------------------------------------------------------------

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def peer_id(key: bytes) -> str:
    raw = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20]) + key
    n, out = int.from_bytes(raw, "big"), ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(raw) - len(raw.lstrip(b"\0"))) + out


def _statements(encoded: list[bytes], kind: str, run: dict, judged: bool = True) -> list[dict]:
    """Step 1: the statements of ``kind`` that decode, name the run and (``judged``) pass its rules."""
    out = []
    for data in encoded:
        try:
            m = decode_message(data, {kind})
            if m["run"] != run["id"]:
                continue
            if judged:
                run_rules(m, run)
        except Refused:
            continue
        out.append(m)
    return out


def lowest(statements):
    return min(statements, key=lambda m: m["digest"])


def settle(pairs: set[tuple[bytes, bytes]], quorum: int):
    counts: dict[bytes, int] = {}
    for _, post in pairs:
        counts[post] = counts.get(post, 0) + 1
    for post, n in counts.items():
        if n >= quorum and all(n > other for p, other in counts.items() if p != post):
            return post
    return None


def coverage(run: dict, atts: list[bytes], claims: list[bytes], reveals: list[bytes], now: int, redundancy: int,
             policy: dict, convictions: list[dict] = ()) -> dict:
    quorum = policy["quorum"]
    counts_key = (lambda key: True) if policy["name"] == "open" else (lambda key: peer_id(key) in policy["roots"])
    # 1. statements
    A = _statements(atts, "attestation", run)
    C = [c for c in _statements(claims, "claim", run) if c["issued_at"] <= now < c["lease_expiry"]]
    V = _statements(reveals, "reveal", run)
    Conv = [c for c in convictions if c["run"] == run["id"] and c["step"] < run["steps"]
            and c["pre_state"] == run["h"][c["step"]]]
    convicted = {c["guilty"] for c in Conv}
    # 2. trust
    untrusted = {a["signer"] for a in A if not counts_key(a["signer"])}
    T = [a for a in A if counts_key(a["signer"])]
    # 3. revealed witnesses
    W = {r["step"]: r["witness"] for r in V}
    rev = {k: lowest([r for r in V if r["step"] == k])["digest"] for k in W}
    # 4. bindings
    def binding(a):
        return b2(b"open1b/witness-binding/v1\0", run["id"], a["step"].to_bytes(8, "little"), a["signer"], W[a["step"]])
    proven = [a for a in T if a["verdict"] == "match" and a["step"] in W and a["witness"] == binding(a)]
    unbound = [a for a in T if a["verdict"] == "match" and a["step"] in W and a["witness"] != binding(a)]
    # 5. copiers
    copied = {}  # key -> steps it copied
    for u in unbound:
        if any(p["signer"] != u["signer"] for p in proven if p["step"] == u["step"]):
            copied.setdefault(u["signer"], set()).add(u["step"])
    copier_flags = {}
    for key, steps in copied.items():
        k = min(steps)
        others = [p for p in proven if p["step"] == k and p["signer"] != key]
        honest = [p for p in others if p["signer"] not in copied]
        copier_flags[key] = {"signer": peer_id(key), "step": k, "kind": "copier",
                             "statement": lowest([u for u in unbound if u["signer"] == key and u["step"] == k])["digest"],
                             "conflicting": lowest(honest or others)["digest"], "reveal": rev[k]}
    # 6. reports
    unbound_digests = {u["digest"] for u in unbound}
    Rep = [a for a in T if a["digest"] not in unbound_digests]
    def posts(k, key):
        return {a["post_state"] for a in Rep if a["step"] == k and a["signer"] == key}
    def att(k, key, p):
        return lowest([a for a in Rep if a["step"] == k and a["signer"] == key and a["post_state"] == p])
    keys_of = [{a["signer"] for a in Rep if a["step"] == k} for k in range(run["steps"])]
    # 7-8. contradictions
    contradiction_flags = {}
    if quorum > 0:
        s1 = [settle({(K, p) for K in keys_of[k] if K not in copied.keys() | convicted for p in posts(k, K)}, quorum)
              for k in range(run["steps"])]
        found = {}  # key -> (step, case)
        for k in range(run["steps"]):
            for K in keys_of[k]:
                if K in found:
                    continue
                if s1[k] is not None and posts(k, K) - {s1[k]}:
                    found[K] = (k, "a")
                elif len(posts(k, K)) > 1:
                    found[K] = (k, "b")
        for K, (k, case) in found.items():
            if case == "a":
                statement = lowest([att(k, K, p) for p in posts(k, K) if p != s1[k]])["digest"]
                backers = [J for J in keys_of[k] if J not in copied.keys() | convicted and s1[k] in posts(k, J)]
                honest = [J for J in backers if J not in found]
                conflicting = lowest([att(k, J, s1[k]) for J in (honest or backers)])["digest"]
            else:
                statement, conflicting = sorted(att(k, K, p)["digest"] for p in posts(k, K))[:2]
            contradiction_flags[K] = {"signer": peer_id(K), "step": k, "kind": "contradiction",
                                      "statement": statement, "conflicting": conflicting, "reveal": None}
    # 9. flags
    fraud_flags = {}
    for K in convicted:
        k = min(c["step"] for c in Conv if c["guilty"] == K)
        fraud_flags[K] = {"signer": peer_id(K), "step": k, "kind": "fraud", "reveal": None, "conflicting": b"",
                          "statement": min(c["proof"] for c in Conv if c["guilty"] == K and c["step"] == k)}
    flags = {**copier_flags, **contradiction_flags, **fraud_flags}
    # 10-11. steps
    steps = []
    for k in range(run["steps"]):
        h = run["h"][k + 1]
        counted = [K for K in keys_of[k] if K not in flags]
        auditors = [K for K in counted if h in posts(k, K)]
        dissenters = [K for K in counted if posts(k, K) - {h}]
        evidence = sorted(att(k, K, p)["digest"] for K in counted for p in posts(k, K) if p != h)
        devices = sorted({a["device"] for a in Rep if a["step"] == k and a["post_state"] == h and a["signer"] in counted})
        claimants = {c["claimant"] for c in C if c["step"] == k}
        s2 = settle({(K, p) for K in counted for p in posts(k, K)}, quorum) if quorum > 0 else None
        frauds = sorted({c["proof"] for c in Conv if c["step"] == k and c["guilty"] == run["publisher"]
                         and c["post_state"] == h})
        if frauds or (s2 is not None and s2 != h):
            status = "refuted"
        elif dissenters:
            status = "disputed"
        elif auditors:
            status = "verified"
        elif claimants:
            status = "claimed"
        else:
            status = "unaudited"
        steps.append({"step": k, "status": status, "auditors": sorted(map(peer_id, auditors)),
                      "dissenters": sorted(map(peer_id, dissenters)), "claimants": sorted(map(peer_id, claimants)),
                      "evidence": evidence, "devices": devices, "fraud_proofs": frauds,
                      "attesters": len(set(auditors) | set(dissenters))})
    # 12. run
    return {"complete": all(s["attesters"] >= redundancy for s in steps), "steps": steps,
            "flagged": sorted(flags.values(), key=lambda f: f["signer"]), "untrusted": sorted(map(peer_id, untrusted))}


# -- §8.5 evaluations ----------------------------------------------------------------------------

def _counts(policy: dict):
    return (lambda key: True) if policy["name"] == "open" else (lambda key: peer_id(key) in policy["roots"])


def _schedule(run: dict) -> list[int]:
    every, root = run["data"].get("eval_every"), run["data"].get("eval_root")
    if type(every) is not int or every < 1 or type(root) is not str:
        return []
    return list(range(every, run["steps"] + 1, every))


def evaluations(run: dict, evals: list[bytes], policy: dict, m: int) -> list[dict]:
    counted = _counts(policy)
    E = _statements(evals, "eval", run)  # 1. statements: decoded, of the run, §7's rules (dates not judged)
    out = []
    for k in _schedule(run):
        at = [e for e in E if e["state"] == k]
        results = [e for e in at if e["verdict"] == "result"]
        losses = {e["loss"] for e in results}
        if len(losses) != 1:  # 2. none: unchecked; two or more: disputed, the results as evidence
            out.append({"state": k, "status": "disputed" if losses else "unchecked", "loss": None, "checkers": [],
                        "dissenters": [], "evidence": sorted(e["digest"] for e in results), "devices": []})
            continue
        loss = losses.pop()
        checks = [e for e in at if e["verdict"] != "result" and e["claimed"] == loss and counted(e["signer"])]  # 3.
        matches = [e for e in checks if e["verdict"] == "match"]
        mismatches = [e for e in checks if e["verdict"] == "mismatch"]
        checkers = sorted({peer_id(e["signer"]) for e in matches})
        status = "disputed" if mismatches else "certified" if len(checkers) >= m else "unchecked"  # 4.
        out.append({"state": k, "status": status, "loss": loss, "checkers": checkers,
                    "dissenters": sorted({peer_id(e["signer"]) for e in mismatches}),
                    "evidence": sorted(e["digest"] for e in mismatches), "devices": sorted({e["device"] for e in matches})})
    return out


# -- §8.6 leaderboard ----------------------------------------------------------------------------

def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def leaderboard(runs: list[dict], atts: list[bytes], evals: list[bytes], now: int, policy: dict, m: int) -> list[dict]:
    rows = []
    for run in runs:
        if not _schedule(run):
            continue
        cov = coverage(run, atts, [], [], now, 1, policy)
        evs = evaluations(run, evals, policy, m)
        certified = [e for e in evs if e["status"] == "certified"]
        latest = certified[-1] if certified else None  # the largest certified state
        disputed = sum(e["status"] == "disputed" for e in evs)
        disputed_steps = sum(s["status"] in ("disputed", "refuted") for s in cov["steps"])
        if latest is None:
            reason = "no certified evaluation"
        elif not 0 <= _f32(latest["loss"]) < math.inf:
            reason = "not a finite, non-negative loss"
        elif disputed:
            reason = "disputed evaluation"
        elif disputed_steps:
            reason = "disputed steps"
        else:
            reason = ""
        rows.append({"run": run["id"], "eval_set": run["data"]["eval_root"], "rank": None,
                     "loss_bits": latest["loss"] if latest else None, "eval_state": latest["state"] if latest else None,
                     "evaluations": {"certified": len(certified), "disputed": disputed,
                                     "unchecked": len(evs) - len(certified) - disputed},
                     "verified_steps": sum(s["status"] == "verified" for s in cov["steps"]), "steps": run["steps"],
                     "disputed_steps": disputed_steps,
                     "devices": sorted({d for s in cov["steps"] if s["status"] == "verified" for d in s["devices"]}),
                     "reason": reason})
    ranked = sorted((r for r in rows if not r["reason"]), key=lambda r: (r["eval_set"], _f32(r["loss_bits"]), r["run"]))
    place: dict[str, int] = {}
    for r in ranked:
        place[r["eval_set"]] = place.get(r["eval_set"], 0) + 1
        r["rank"] = place[r["eval_set"]]
    return ranked + sorted((r for r in rows if r["reason"]), key=lambda r: (r["eval_set"], r["run"]))


# -- §8.7 spot coverage --------------------------------------------------------------------------

def escape(x: list[Fraction], f: int) -> Fraction:
    """e_f(x) / C(N, f), exactly."""
    e = [Fraction(1)] + [Fraction(0)] * f
    for xk in x:
        for j in range(f, 0, -1):
            e[j] += e[j - 1] * xk
    return e[f] / math.comb(len(x), f)


def spot_coverage(run: dict, spotchecks: list[bytes], replayed: list[int], policy: dict) -> dict:
    counted = _counts(policy)
    S = [s for s in _statements(spotchecks, "spotcheck", run) if counted(s["signer"])]  # 1. (dates not judged)
    steps = []
    for k in range(run["steps"]):
        at = [s for s in S if s["step"] == k]
        fails = [s for s in at if s["verdict"] == "fail"]
        checkers = sorted({peer_id(s["signer"]) for s in at if s["verdict"] == "pass"})  # 2. passes, any status
        status = "failed" if fails else "spot_checked" if checkers else "unchecked"
        steps.append({"step": k, "status": status, "checkers": checkers, "caught": sorted({s["caught"] for s in fails}),
                      "evidence": sorted({s["digest"] for s in fails})})
    ranks, micro = run["model"].get("ranks"), run["model"].get("micro_batches")
    topology = type(ranks) is int and type(micro) is int and ranks >= 1 and micro >= 1
    p = Fraction(1, ranks * micro) if topology else Fraction(0)  # 3. detection
    caught = set(replayed) | {s["step"] for s in steps if s["status"] == "failed"}  # 4. caught steps
    x = [Fraction(0) if s["step"] in caught else (1 - p) ** len(s["checkers"]) for s in steps]  # 5. escape
    return {"steps": steps, "detection": p, "escape_one": escape(x, 1),
            "escape_fraction": escape(x, max(1, math.ceil(Fraction(run["steps"], 100))))}


def replayed_steps(run: dict, atts: list[bytes], now: int, policy: dict) -> list[int]:
    """§8.7's ``replayed``: the steps replay coverage decided, verified or refuted."""
    return [s["step"] for s in coverage(run, atts, [], [], now, 1, policy)["steps"]
            if s["status"] in ("verified", "refuted")]


# -- docs/run-format.md §8.5 data proofs ---------------------------------------------------------

def merkle_verify(leaf: bytes, index: int, size: int, path: list[bytes], root: bytes) -> bool:
    """An RFC 6962 audit path, leaf level first (RFC 9162 §2.1.3.2)."""
    if not 0 <= index < size:
        return False
    h, fn, sn = b2(b"\0", leaf), index, size - 1
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            h = b2(b"\1", p, h)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            h = b2(b"\1", h, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and h == root


def _int(v) -> int:
    if type(v) is not int:
        raise TypeError("not an integer")
    return v


def _hexstr(v) -> bytes:
    if type(v) is not str or not set(v) <= set("0123456789abcdef"):
        raise TypeError("not lowercase hex")
    return bytes.fromhex(v)


def _hash(v) -> bytes:
    if type(v) is not str or len(v) != 64:
        raise TypeError("not a hash")
    return _hexstr(v)


def _entry(e: dict) -> dict:
    return {"index": _int(e["index"]), "start": _int(e["start"]), "end": _int(e["end"]), "path": [_hash(h) for h in e["path"]]}


def parse_data_proof(p: dict) -> dict:
    """§8.4's JSON, every field read and typed before any rule (§8.5: else `malformed`)."""
    if p["kind"] == "included":
        return {"kind": "included", "entry": _entry(p["entry"]),
                "samples": [{"index": _int(s["index"]), "tokens": _hexstr(s["tokens"]), "path": [_hash(h) for h in s["path"]]}
                            for s in p["samples"]],
                "draws": [[_int(v) for v in d] for d in p["draws"] if len(d) == 5 or _int(None)]}
    if p["kind"] == "never_drawn":
        return {"kind": "never_drawn", "entry": _entry(p["entry"])}
    if p["kind"] == "absent":
        side = lambda s: None if s is None else {"digest": _hash(s["digest"]), "index": _int(s["index"]),  # noqa: E731
                                                 "path": [_hash(h) for h in s["path"]]}
        return {"kind": "absent", "lower": side(p["lower"]), "upper": side(p["upper"])}
    raise ValueError("no such kind")


def draw_index(c: dict, k: int, r: int, mu: int, j: int) -> int:
    digest = b2(b"open1b/data/v2\0", struct.pack("<QQIII", c["seed"], k, r, mu, j))
    return int.from_bytes(digest[:8], "little") % c["samples"]


def held(c: dict, start: int, end: int) -> range:
    """§8.1: the samples holding at least one token of [start, end)."""
    stride = c["sample_len"] - 1
    first = -(-(start - c["sample_len"] + 1) // stride)
    return range(max(0, first), min(c["samples"], (end - 1) // stride + 1))


def data_proof(c: dict, x: bytes, proof: dict) -> str:
    """The code of §8.5 (``ok`` when the proof holds)."""
    try:
        p = parse_data_proof(proof)
        return _data_rules(c, x, p)
    except (KeyError, TypeError, ValueError, AttributeError):
        return "malformed"


def _data_rules(c: dict, x: bytes, p: dict) -> str:
    d = b2(b"open1b/document/v1\0", x)
    if p["kind"] == "absent":
        lower, upper = p["lower"], p["upper"]
        if lower is None and upper is None:
            return "neighbours"  # rule 1
        for s in (lower, upper):
            if s is not None and not merkle_verify(s["digest"], s["index"], c["document_count"], s["path"],
                                                   c["document_set_root"]):
                return "neighbours"  # rule 2
        if (lower is not None and not lower["digest"] < d) or (upper is not None and not d < upper["digest"]):
            return "order"  # rule 3
        if lower is not None and upper is not None:
            adjacent = upper["index"] == lower["index"] + 1
        elif upper is not None:
            adjacent = upper["index"] == 0
        else:
            adjacent = lower["index"] == c["document_count"] - 1
        return "ok" if adjacent else "adjacent"  # rule 4
    e = p["entry"]
    if not (0 <= e["start"] < e["end"] < 2**64 and e["end"] - e["start"] == len(x)) or not merkle_verify(
            struct.pack("<QQ", e["start"], e["end"]) + d, e["index"], c["document_count"], e["path"], c["documents_root"]):
        return "entry"  # rule 1
    H = held(c, e["start"], e["end"])
    rows = [(k, r, mu, j) for k in range(c["steps"]) for r in range(c["ranks"]) for mu in range(c["micro_batches"])
            for j in range(c["micro_batch_size"])]
    expected = [[*row, s] for row in rows if (s := draw_index(c, *row)) in H]
    if p["kind"] == "never_drawn":
        return "drawn" if expected else "ok"  # never drawn, rule 2
    stride, tokens = c["sample_len"] - 1, {}
    for s in p["samples"]:
        t = s["tokens"]
        if s["index"] not in H or s["index"] in tokens or len(t) != c["sample_len"] or not merkle_verify(
                b2(b"open1b/sample/v1\0", b"\1", t), s["index"], c["samples"], s["path"], c["samples_root"]):
            return "sample"  # rule 2
        lo, hi = max(e["start"], s["index"] * stride), min(e["end"], s["index"] * stride + c["sample_len"])
        if t[lo - s["index"] * stride:hi - s["index"] * stride] != x[lo - e["start"]:hi - e["start"]]:
            return "sample"  # rule 3
        tokens[s["index"]] = t
    for k, r, mu, j, s in p["draws"]:
        if not (0 <= k < c["steps"] and 0 <= r < c["ranks"] and 0 <= mu < c["micro_batches"]
                and 0 <= j < c["micro_batch_size"]) or s not in tokens or draw_index(c, k, r, mu, j) != s:
            return "draw"  # rule 4
    if not p["draws"]:
        return "draw"  # rule 5
    if p["draws"] != expected:
        return "incomplete"  # rule 6
    return "ok"
