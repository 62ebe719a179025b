"""Wrong readings of docs/protocol.md, each a small edit of ``reference.py``.

Every mutant is a plausible misreading of one sentence of the spec (or of the order between two
rules) that an implementer could make from the text; the vectors must contain a case that each of
them gets wrong. ``section`` says which rule it misreads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True)
class Mutant:
    name: str
    section: str
    reading: str  # the wrong reading, in words
    edits: tuple[tuple[str, str], ...]  # (text in reference.py, its replacement)

    def of(self, reading: ModuleType) -> ModuleType:
        """``reading`` (a module: the spec read correctly) with this mutant's edits made to its
        source, each to text that occurs there once, as a fresh module that finds the spec where
        ``reading`` does."""
        original = Path(reading.__file__).read_text()
        source = original
        for old, new in self.edits:
            assert source.count(old) == 1, f"{self.name}: the text to replace occurs {source.count(old)} times: {old!r}"
            source = source.replace(old, new)
        assert source != original, self.name
        module = ModuleType(f"{reading.__name__}_mutant_{self.name}")
        module.__file__, module.__package__ = reading.__file__, reading.__package__  # it reads the spec relative to itself
        exec(compile(source, f"<mutant {self.name}>", "exec"), module.__dict__)
        return module


def _m(name: str, section: str, reading: str, *edits: tuple[str, str]) -> Mutant:
    return Mutant(name, section, reading, edits)


MUTANTS = [
    # §3 canonical CBOR
    _m("depth-inclusive", "§3.1", "an array may lie inside 8 others (a data item inside 8 arrays is allowed)",
       ("len(open_items) - 1 >= MAX_DEPTH", "len(open_items) - 1 > MAX_DEPTH")),
    _m("depth-counts-scalars", "§3.1", "a scalar inside 8 arrays is too deep",
       ("len(open_items) - 1 >= MAX_DEPTH", "len(open_items) >= MAX_DEPTH")),
    _m("indefinite-malformed", "§3.2", "an indefinite length is malformed, not non_canonical",
       ('raise Refused("non_canonical")  # rule 1', 'raise Refused("malformed")  # rule 1')),
    _m("indefinite-last", "§3.2", "an indefinite length is reported only if nothing else is wrong",
       ('        if info == 31:\n            raise Refused("non_canonical")  # rule 1: an indefinite length or a break\n', ""),
       ('    if pos != len(data):\n        raise Refused("malformed")  # bytes after the data item',
        '    if pos != len(data):\n        raise Refused("malformed")  # bytes after the data item\n'
        '    if any(b & 31 == 31 for b in data):\n        raise Refused("non_canonical")'),
       ('        if info >= 28:', '        if 28 <= info <= 30:')),
    _m("key-type-before-indefinite", "§3.2", "a map key's type is judged before its indefinite length",
       ("        if info == 31:\n            raise Refused(\"non_canonical\")  # rule 1: an indefinite length or a break\n",
        "        if is_key and major != 3:\n            raise Refused(\"malformed\")\n"
        "        if info == 31:\n            raise Refused(\"non_canonical\")\n")),
    _m("depth-before-indefinite", "§3.2", "an array too deep is judged before its indefinite length",
       ("        if info == 31:\n            raise Refused(\"non_canonical\")  # rule 1: an indefinite length or a break\n",
        "        if major in (4, 5) and len(open_items) - 1 >= MAX_DEPTH:\n            raise Refused(\"malformed\")\n"
        "        if info == 31:\n            raise Refused(\"non_canonical\")\n")),
    _m("keys-any-type", "§3.1", "map keys may be of any type, sorted bytewise",
       ("        if is_key and major != 3:\n            raise Refused(\"malformed\")  # rule 4: map keys are text\n", "")),
    _m("tags-allowed", "§3.1", "tags decode as their values",
       ('raise Refused("malformed")  # rule 5: no tags', "top[0] += 1  # the tagged item follows")),
    _m("undefined-allowed", "§3.1", "undefined is a simple value like null",
       ("(20, 21, 22, 25, 26, 27)", "(20, 21, 22, 23, 25, 26, 27)")),
    _m("trailing-bytes-ignored", "§3.2", "a decoder reads one data item and ignores what follows",
       ('    if pos != len(data):\n        raise Refused("malformed")  # bytes after the data item\n', "")),
    _m("size-after-parse", "§3.2", "the size limit is checked once the item has been parsed",
       ('    if len(data) > max_size:\n        raise Refused("oversize")  # §3.2 step 1, before anything is parsed\n'
        '    scan_heads(data)\n', '    scan_heads(data)\n    if len(data) > max_size:\n        raise Refused("oversize")\n')),
    _m("size-exclusive", "§3.2", "the input must be shorter than the limit",
       ("    if len(data) > max_size:", "    if len(data) >= max_size:")),
    _m("re-encoding-skipped", "§3.2", "a well-formed item is canonical enough",
       ('    if encode(value) != data:\n        raise Refused("non_canonical")  # step 4\n', "")),
    # §5.2 decoding a message
    _m("kind-after-version", "§5.2", "the version is checked before the kind",
       ('    if type(kind) is not str or kind not in kinds:\n        raise Refused("kind")  # step 2\n', ""),
       ('        raise Refused("version")  # step 3\n',
        '        raise Refused("version")  # step 3\n    if type(kind) is not str or kind not in kinds:\n'
        '        raise Refused("kind")\n')),
    _m("version-by-value", "§5.2", "v equals 2 (a float 2.0 will do)",
       ('if type(value.get("v")) is not int or value["v"]', 'if value.get("v")')),
    _m("largest-limit-only", "§5.2", "a decoder expecting several kinds applies only the largest limit",
       ('    if len(data) > MAX_SIZE[kind]:\n        raise Refused("oversize")  # step 2: then the kind\'s own limit\n',
        "")),
    _m("run-format-in-schema", "§5.2", "the run format is one more field checked with the schema",
       ('    if kind == "manifest" and (type(value.get("format")) is not int or value["format"] != 2):\n'
        '        raise Refused("run_format")  # step 4\n', ""),
       ("    cross_field_rules(kind, value)  # step 6\n",
        '    if kind == "manifest" and value["format"] != 2:\n        raise Refused("run_format")\n'
        "    cross_field_rules(kind, value)  # step 6\n")),
    _m("missing-before-unknown", "§5.2", "missing fields are reported before unknown ones",
       ('    if any(name not in schema for name in value):\n        raise Refused("unknown_field")  # step 5\n'
        '    if any(name not in value and name not in OPTIONAL[kind] for name in schema):\n        raise Refused("missing_field")\n',
        '    if any(name not in value and name not in OPTIONAL[kind] for name in schema):\n        raise Refused("missing_field")\n'
        '    if any(name not in schema for name in value):\n        raise Refused("unknown_field")\n')),
    _m("type-before-presence", "§5.2", "each schema field is checked for presence and type in turn",
       ('    if any(name not in value and name not in OPTIONAL[kind] for name in schema):\n        raise Refused("missing_field")\n'
        '    if not all(type_ok(expr, value[name]) for name, expr in schema.items() if name in value):\n'
        '        raise Refused("wrong_type")\n',
        '    for name, expr in schema.items():\n        if name not in value and name not in OPTIONAL[kind]:\n'
        '            raise Refused("missing_field")\n'
        '        if name in value and not type_ok(expr, value[name]):\n            raise Refused("wrong_type")\n')),
    _m("optional-is-required", "§5.3", "a field marked ? must be present",
       ("    if any(name not in value and name not in OPTIONAL[kind] for name in schema):\n",
        "    if any(name not in value for name in schema):\n")),
    _m("bool-is-int", "§5.2", "true is the integer 1",
       ("    return type(x) is int and 0 <= x <= maximum", "    return isinstance(x, int) and 0 <= x <= maximum")),
    _m("scalars-allow-nan", "§5.3", "a scalar may be any float",
       ("        return math.isfinite(x)", "        return True")),
    _m("scalars-allow-bool", "§5.3", "a bool is a scalar (an int)",
       ("    if type(x) is int:\n        return -(2**64)", "    if isinstance(x, int):\n        return -(2**64)")),
    _m("scalar-keys-unbounded", "§5.3", "map keys of model and data have no length bound",
       ("type(k) is str and len(k.encode()) <= 256", "type(k) is str")),
    _m("signature-before-cross-field", "§5.2", "the signature is checked before the cross-field rules",
       ("    cross_field_rules(kind, value)  # step 6\n", ""),
       ('        raise Refused("bad_signature")  # step 7\n',
        '        raise Refused("bad_signature")  # step 7\n    cross_field_rules(kind, value)\n')),
    _m("device-any-case", "§5.2", "device classes are case-insensitive",
       ('DEVICE = re.compile(r"(cpu|cuda)/[a-z0-9_]{1,32}(-[a-z0-9_]{1,32})?")',
        'DEVICE = re.compile(r"(cpu|cuda)/[a-z0-9_]{1,32}(-[a-z0-9_]{1,32})?", re.I)')),
    _m("device-many-targets", "§5.2", "a device class may have several target parts",
       ("(-[a-z0-9_]{1,32})?\")", "(-[a-z0-9_]{1,32})*\")")),
    _m("device-long-parts", "§5.2", "a part is at most 64 characters",
       ("[a-z0-9_]{1,32}(-", "[a-z0-9_]{1,64}(-")),
    _m("device-prefix-match", "§5.2", "a device class matches up to the end of the line",
       ('not DEVICE.fullmatch(m["device"])', 'not re.match(DEVICE.pattern + "$", m["device"])')),
    _m("claim-device-unchecked", "§5.2", "a claim's device is free text (only attestations name a class)",
       ('    if kind == "claim" and "device" in m and DEVICE.fullmatch(m["device"]) is None:\n        raise Refused(code="device")',
        '    if False:\n        raise Refused(code="device")')),
    _m("claim-device-before-lease-order", "§5.2", "a claim's device is checked before its lease order",
       ('    if kind == "claim" and not m["lease_expiry"] > m["issued_at"]:\n        raise Refused("lease_order")\n'
        '    if kind == "claim" and "device" in m and DEVICE.fullmatch(m["device"]) is None:\n        raise Refused(code="device")',
        '    if kind == "claim" and "device" in m and DEVICE.fullmatch(m["device"]) is None:\n        raise Refused(code="device")\n'
        '    if kind == "claim" and not m["lease_expiry"] > m["issued_at"]:\n        raise Refused("lease_order")')),
    _m("device-wrong-type", "§5.2", "a device outside the grammar is a wrong_type",
       ('raise Refused("device")', 'raise Refused("wrong_type")')),
    _m("checkpoints-first", "§5.2 / run format", "checkpoints are checked before state hashes",
       ('        if m["steps"] < 1 or len(m["state_hashes"]) != m["steps"] + 1:\n            raise Refused("state_hashes")\n'
        '        if len(m["checkpoints"]) != m["steps"] + 1:\n            raise Refused("checkpoints")\n',
        '        if len(m["checkpoints"]) != m["steps"] + 1:\n            raise Refused("checkpoints")\n'
        '        if m["steps"] < 1 or len(m["state_hashes"]) != m["steps"] + 1:\n            raise Refused("state_hashes")\n')),
    _m("samples-before-witnesses", "§5.2 / run format", "samples are checked before witnesses",
       ('        if len(m["witnesses"]) != m["steps"]:\n            raise Refused("witnesses")\n'
        '        if m["samples"] < 1:\n            raise Refused("samples")\n',
        '        if m["samples"] < 1:\n            raise Refused("samples")\n'
        '        if len(m["witnesses"]) != m["steps"]:\n            raise Refused("witnesses")\n')),
    _m("zero-samples", "§5.2 / run format", "a run may have no samples",
       ('if m["samples"] < 1:', 'if m["samples"] < 0:')),
    _m("fingerprints-one-key", "§5.2 / run format §10.1", "fingerprints_root may come without fingerprints_blob",
       ('fingerprints != [None, None] and not all(', 'fingerprints != [None, None] and not any(')),
    _m("fingerprints-any-case", "§5.2 / run format §10.1", "the fingerprint hashes may be hex of either case",
       ('set(h) <= set("0123456789abcdef")', 'set(h.lower()) <= set("0123456789abcdef")')),
    _m("fingerprints-before-samples", "§5.2 / run format §10.1", "the fingerprint keys are checked before samples",
       ('        if m["samples"] < 1:\n            raise Refused("samples")\n        fingerprints = ',
        '        fingerprints = '),
       ('            raise Refused("fingerprints")\n',
        '            raise Refused("fingerprints")\n        if m["samples"] < 1:\n            raise Refused("samples")\n')),
    _m("zero-steps", "§5.2", "a manifest of 0 steps (one state hash) is allowed",
       ('if m["steps"] < 1 or len(m["state_hashes"])', 'if len(m["state_hashes"])')),
    _m("lease-may-be-empty", "§5.2", "lease_expiry may equal issued_at",
       ('not m["lease_expiry"] > m["issued_at"]', 'not m["lease_expiry"] >= m["issued_at"]')),
    # §5.4 Ed25519
    _m("s-reduced", "§5.4", "S is read mod L (no check that S < L)",
       ('    if int.from_bytes(sig[32:], "little") >= L:\n        return False  # rule 1\n', "")),
    _m("small-order-keys", "§5.4", "any key on the curve verifies (cofactorless equation only)",
       ("    if _y(key) in SMALL_ORDER_Y:\n        return False  # rule 3\n", "")),
    _m("order-8-forgotten", "§5.4", "small order means order 1, 2 or 4",
       ("SMALL_ORDER_Y = {0, 1, P - 1, Y8, P - Y8, P, P + 1}", "SMALL_ORDER_Y = {0, 1, P - 1, P, P + 1}")),
    _m("small-order-r", "§5.4", "R is only compared, never checked for small order",
       ("    if _y(sig[:32]) in SMALL_ORDER_Y:\n        return False  # rule 4\n", "")),
    _m("cofactored-equation", "§5.4 rule 5", "rule 5 is ZIP-215's cofactored equation (with the byte rules 1-4)",
       ("    return ed25519_equation.holds(key, message, sig)  # rule 5",
        "    return ed25519_equation.holds_cofactored(key, message, sig)")),
    _m("version-1-context", "§5.1", "the signing context keeps v1",
       ('b"open1b/v%d/sig\\0" % CONST["PROTOCOL_VERSION"]', 'b"open1b/v1/sig\\0"')),
    # §6.3 external trajectories
    _m("unicode-whitespace", "§6.3", "a blank line is one str.strip() empties",
       ('if not line.strip(" \\t\\r"):', "if not line.strip():")),
    _m("whole-float-steps", "§6.3", "a step written 1.0 is step 1",
       ('    if type(step) is not int or not 0 <= step <= 2**64 - 1:',
        '    step = int(step) if type(step) is float and step.is_integer() else step\n'
        '    if type(step) is not int or not 0 <= step <= 2**64 - 1:')),
    _m("unbounded-steps", "§6.3", "a step is any integer >= 0",
       ("not 0 <= step <= 2**64 - 1", "not 0 <= step")),
    _m("first-line-wins", "§6.3", "the first line of a step wins",
       ("            log[step] = digest  # the last line of a step wins", "            log.setdefault(step, digest)")),
    _m("last-line-needs-lf", "§6.3", "a line is what an LF ends: text after the last LF is not a line",
       ('        for line in data.decode("utf-8").split("\\n"):', '        for line in data.decode("utf-8").split("\\n")[:-1]:')),
    _m("keyless-lines-skipped", "§6.3", "a line without the step or state_hash key is not a state-hash line: skipped",
       ("            step, digest = parse_line(line)\n",
        "            try:\n                step, digest = parse_line(line)\n            except KeyError:\n"
        "                continue\n")),
    _m("lower-case-hex", "§6.3", "state hashes are lower-case hex",
       ('r"[0-9a-fA-F]{64}"', 'r"[0-9a-f]{64}"')),
    # §7 validation
    _m("future-before-unknown-run", "§7", "the date is checked before the run is looked up",
       ('        if run is None:\n            raise Refused("unknown_run", "ignore")\n'
        '        if m["issued_at"] > now + SKEW:\n            raise Refused("future", "ignore")\n',
        '        if m["issued_at"] > now + SKEW:\n            raise Refused("future", "ignore")\n'
        '        if run is None:\n            raise Refused("unknown_run", "ignore")\n')),
    _m("skew-exclusive", "§7", "a statement dated exactly at the skew allowance is in the future",
       ('        if m["issued_at"] > now + SKEW:', '        if m["issued_at"] >= now + SKEW:')),
    _m("manifest-skew-exclusive", "§7", "a manifest created exactly at the skew allowance is in the future",
       ('            if m["created_at"] > now + SKEW:', '            if m["created_at"] >= now + SKEW:')),
    _m("step-range-inclusive", "§7", "step <= steps", ('if not m["step"] < run["steps"]:', 'if not m["step"] <= run["steps"]:')),
    _m("verdict-before-pre-state", "§7", "the verdict is checked before the pre_state",
       ('        if m["pre_state"] != run["h"][m["step"]]:\n            raise Refused("pre_state")\n'
        '        if (m["verdict"] == "match") != (m["post_state"] == run["h"][m["step"] + 1]):\n'
        '            raise Refused("verdict")\n',
        '        if (m["verdict"] == "match") != (m["post_state"] == run["h"][m["step"] + 1]):\n'
        '            raise Refused("verdict")\n'
        '        if m["pre_state"] != run["h"][m["step"]]:\n            raise Refused("pre_state")\n')),
    _m("engine-before-verdict", "§7", "the engine is checked before the verdict",
       ('        if (m["verdict"] == "match") != (m["post_state"] == run["h"][m["step"] + 1]):\n'
        '            raise Refused("verdict")\n'
        '        if (m["engine"], m["engine_version"]) != (run["engine"], run["engine_version"]):\n'
        '            raise Refused("engine")\n',
        '        if (m["engine"], m["engine_version"]) != (run["engine"], run["engine_version"]):\n'
        '            raise Refused("engine")\n'
        '        if (m["verdict"] == "match") != (m["post_state"] == run["h"][m["step"] + 1]):\n'
        '            raise Refused("verdict")\n')),
    _m("step-range-after-future", "§7", "the run's rules, step range first, come before the date",
       ('        if m["issued_at"] > now + SKEW:\n            raise Refused("future", "ignore")\n        run_rules(m, run)\n',
        '        run_rules(m, run)\n        if m["issued_at"] > now + SKEW:\n            raise Refused("future", "ignore")\n')),
    _m("mismatch-unchecked", "§7", "only a match is compared with h_{step+1}",
       ('if (m["verdict"] == "match") != (m["post_state"] == run["h"][m["step"] + 1]):',
        'if m["verdict"] == "match" and m["post_state"] != run["h"][m["step"] + 1]:')),
    _m("engine-version-only", "§7", "the engine version identifies the engine",
       ('(m["engine"], m["engine_version"]) != (run["engine"], run["engine_version"])',
        'm["engine_version"] != run["engine_version"]')),
    _m("lease-length-exclusive", "§7", "a lease must be shorter than MAX_LEASE_SECONDS",
       ('<= CONST["MAX_LEASE_SECONDS"]', '< CONST["MAX_LEASE_SECONDS"]')),
    _m("external-reveals-pass", "§7", "a run without witness commitments has nothing to check a reveal against",
       ('        if run["witnesses"] is None:\n            raise Refused("witness")  # an external run commits to no witness\n'
        '        if b2(', '        if run["witnesses"] is not None and b2(')),
    _m("eval-state-zero", "§7", "state 0 is on every schedule (0 is a multiple of eval_every)",
       ('m["state"] >= 1 and m["state"] % every == 0', 'm["state"] % every == 0')),
    _m("eval-state-unbounded", "§7", "the schedule does not end at the run's last state",
       (' and m["state"] <= run["steps"]):', '):')),
    _m("eval-results-only-signer", "§7", "only a result's signer is checked (the publisher may check itself)",
       ('if (m["verdict"] == "result") != (m["signer"] == run["publisher"]):',
        'if m["verdict"] == "result" and m["signer"] != run["publisher"]:')),
    _m("eval-signer-before-state", "§7", "the signer rule comes before the schedule",
       ('    if not (m["state"] >= 1', '    if (m["verdict"] == "result") != (m["signer"] == run["publisher"]):\n'
        '        raise Refused("eval_signer")\n    if not (m["state"] >= 1')),
    _m("eval-mismatch-unchecked", "§5.3", "only a result or match is held to loss = claimed",
       ('(m["verdict"] == "mismatch") == (m["loss"] == m["claimed"])',
        'm["verdict"] != "mismatch" and m["loss"] != m["claimed"]')),
    _m("eval-device-first", "§5.2", "the device grammar is checked before the verdict rule",
       ('    if kind == "eval" and (m["verdict"] == "mismatch") == (m["loss"] == m["claimed"]):\n'
        '        raise Refused("eval_verdict")\n    if kind in ("attestation", "eval") and not DEVICE.fullmatch(m["device"]):\n'
        '        raise Refused("device")\n',
        '    if kind in ("attestation", "eval") and not DEVICE.fullmatch(m["device"]):\n        raise Refused("device")\n'
        '    if kind == "eval" and (m["verdict"] == "mismatch") == (m["loss"] == m["claimed"]):\n'
        '        raise Refused("eval_verdict")\n')),
    _m("eval-result-unchecked", "§5.3", "only a match and a mismatch are held to their loss rule",
       ('(m["verdict"] == "mismatch") == (m["loss"] == m["claimed"])',
        '((m["verdict"] == "match" and m["loss"] != m["claimed"]) or (m["verdict"] == "mismatch" and m["loss"] == '
        'm["claimed"]))')),
    _m("missing-v-is-missing-field", "§5.2 step 3", "a message without v is judged by the schema (missing_field)",
       ('if type(value.get("v")) is not int or value["v"] != CONST["PROTOCOL_VERSION"]:',
        'if "v" in value and (type(value["v"]) is not int or value["v"] != CONST["PROTOCOL_VERSION"]):')),
    _m("device-backend-alone", "§5.2", "a backend alone is a device class (the part is optional)",
       ('DEVICE = re.compile(r"(cpu|cuda)/[a-z0-9_]{1,32}(-[a-z0-9_]{1,32})?")',
        'DEVICE = re.compile(r"(cpu|cuda)(/[a-z0-9_]{1,32}(-[a-z0-9_]{1,32})?)?")')),
    # §10 claim records
    _m("record-lease-length", "§10", "a record whose lease is longer than MAX_LEASE_SECONDS is invalid",
       ('return c if claim_key(c["run"], c["step"], c["slot"]) == key else None',
        'return c if claim_key(c["run"], c["step"], c["slot"]) == key and '
        'c["lease_expiry"] - c["issued_at"] <= CONST["MAX_LEASE_SECONDS"] else None')),
    _m("older-round-wins", "§10", "an older lease round wins", ('(-(c["issued_at"] //', '((c["issued_at"] //')),
    _m("latest-in-round", "§10", "within a round the latest claim wins",
       ('CONST["LEASE_ROUND_SECONDS"]), c["issued_at"],', 'CONST["LEASE_ROUND_SECONDS"]), -c["issued_at"],')),
    _m("claimant-ignored", "§10", "equal times are broken by the encoded bytes alone",
       ('c["issued_at"], c["claimant"], c["encoded"])', 'c["issued_at"], c["encoded"])')),
    _m("claim-key-unchecked", "§10", "a record is valid if it decodes as a claim",
       ('return c if claim_key(c["run"], c["step"], c["slot"]) == key else None', "return c")),
    # §8.3 coverage
    _m("conviction-any-post-state", "§8.3 step 11", "a conviction of the publisher refutes its step whatever its trace reached",
       ('and c["guilty"] == run["publisher"]\n                         and c["post_state"] == h', 'and c["guilty"] == run["publisher"]')),
    _m("conviction-any-pre-state", "§8.3 step 1", "a conviction counts whatever state its traces start from",
       ('and c["pre_state"] == run["h"][c["step"]]]', ']')),
    _m("conviction-settles", "§8.3 step 7", "convicted keys take part in the first settlement",
       ("if K not in copied.keys() | convicted for p in posts(k, K)}", "if K not in copied for p in posts(k, K)}")),
    _m("conviction-flag-last", "§8.3 step 9", "a contradiction flag replaces a fraud flag",
       ("flags = {**copier_flags, **contradiction_flags, **fraud_flags}",
        "flags = {**copier_flags, **fraud_flags, **contradiction_flags}")),
    _m("conviction-any-guilty-refutes", "§8.3 step 11", "a conviction of any key refutes its step",
       ('and c["guilty"] == run["publisher"]\n', '\n')),
    _m("trusted-claims-only", "§8.3 step 1", "claims count over the counted keys only",
       ('    C = [c for c in _statements(claims, "claim", run) if c["issued_at"] <= now < c["lease_expiry"]]',
        '    C = [c for c in _statements(claims, "claim", run) if c["issued_at"] <= now < c["lease_expiry"]'
        ' and counts_key(c["claimant"])]')),
    _m("unflagged-claims-only", "§8.3 step 11", "claims of flagged keys do not count",
       ('claimants = {c["claimant"] for c in C if c["step"] == k}',
        'claimants = {c["claimant"] for c in C if c["step"] == k and c["claimant"] not in flags}')),
    _m("lease-end-inclusive", "§8.3 step 1", "a claim is live until lease_expiry, inclusive",
       ('c["issued_at"] <= now < c["lease_expiry"]', 'c["issued_at"] <= now <= c["lease_expiry"]')),
    _m("lease-start-ignored", "§8.3 step 1", "a claim is live until its lease ends, whenever issued",
       ('c["issued_at"] <= now < c["lease_expiry"]', 'now < c["lease_expiry"]')),
    _m("dates-judged", "§8.3 step 1", "coverage drops attestations dated in the future",
       ('    A = _statements(atts, "attestation", run)',
        '    A = [a for a in _statements(atts, "attestation", run) if a["issued_at"] <= now + SKEW]')),
    _m("other-runs-counted", "§8.3 step 1", "a statement that passes the rules counts whatever run it names",
       ('            if m["run"] != run["id"]:\n                continue\n', "")),
    _m("untrusted-unvalidated", "§8.3 step 2", "untrusted lists every key that attested, valid or not",
       ('    untrusted = {a["signer"] for a in A if not counts_key(a["signer"])}',
        '    untrusted = {a["signer"] for a in _statements(atts, "attestation", run, judged=False)'
        ' if not counts_key(a["signer"])}')),
    _m("trusted-reveals-only", "§8.3 step 3", "only reveals by counted keys reveal",
       ('    V = _statements(reveals, "reveal", run)',
        '    V = [r for r in _statements(reveals, "reveal", run) if counts_key(r["revealer"])]')),
    _m("unproven-key-dropped", "§8.3 step 6", "a key with an unproven match counts for nothing on that step",
       ('    Rep = [a for a in T if a["digest"] not in unbound_digests]',
        '    unproven = {(u["step"], u["signer"]) for u in unbound}\n'
        '    Rep = [a for a in T if a["digest"] not in unbound_digests and (a["step"], a["signer"]) not in unproven]')),
    _m("proof-excuses-copy", "§8.3 step 5", "a key that also proved the step is not a copier",
       ('        if any(p["signer"] != u["signer"] for p in proven if p["step"] == u["step"]):',
        '        if any(p["signer"] != u["signer"] for p in proven if p["step"] == u["step"]) and not any('
        'p["signer"] == u["signer"] for p in proven if p["step"] == u["step"]):')),
    _m("any-prover-flags", "§8.3 step 5", "a proven match by anyone, the key itself included, flags an unbound one",
       ('if any(p["signer"] != u["signer"] for p in proven', 'if any(True for p in proven'),
       ('others = [p for p in proven if p["step"] == k and p["signer"] != key]',
        'others = [p for p in proven if p["step"] == k]')),
    _m("untrusted-provers", "§8.3 step 5", "a proven match by any key, counted or not, flags a copier",
       ('    proven = [a for a in T if', '    proven = [a for a in A if')),
    _m("unbound-settles", "§8.3 step 6", "unbound matches still count when a step is settled",
       ('    Rep = [a for a in T if a["digest"] not in unbound_digests]', '    Rep = [a for a in T]')),
    _m("copier-highest-step", "§8.3 step 5", "a copier's evidence is at its latest copied step",
       ("        k = min(steps)", "        k = max(steps)")),
    _m("any-reveal-cited", "§8.3 step 3", "the reveal cited is the last one seen, not the lowest",
       ('    rev = {k: lowest([r for r in V if r["step"] == k])["digest"] for k in W}',
        '    rev = {r["step"]: r["digest"] for r in V}')),
    _m("copier-cites-copier", "§8.3 step 5", "a copier's conflicting statement is the lowest proven match, any key's",
       ('"conflicting": lowest(honest or others)["digest"]', '"conflicting": lowest(others)["digest"]')),
    _m("quorum-0-self", "§8.3 step 7", "quorum 0 still flags a key's two results for one step",
       ("    if quorum > 0:\n        s1 =", "    if True:\n        s1 =")),
    _m("copiers-vote", "§8.3 step 7", "copiers take part in the first settlement",
       ("for K in keys_of[k] if K not in copied.keys() | convicted for p in posts(k, K)}, quorum)",
        "for K in keys_of[k] for p in posts(k, K)}, quorum)")),
    _m("settle-ties", "§8.2", "the value most keys report settles, ties going to either",
       ("all(n > other for p, other", "all(n >= other for p, other")),
    _m("quorum-ignored", "§8.2", "two agreeing keys always settle a step", ("        if n >= quorum and", "        if n >= 2 and")),
    _m("self-before-settled", "§8.3 step 8", "two results of a key are judged before a settled result",
       ('                if s1[k] is not None and posts(k, K) - {s1[k]}:\n                    found[K] = (k, "a")\n'
        '                elif len(posts(k, K)) > 1:\n                    found[K] = (k, "b")\n',
        '                if len(posts(k, K)) > 1:\n                    found[K] = (k, "b")\n'
        '                elif s1[k] is not None and posts(k, K) - {s1[k]}:\n                    found[K] = (k, "a")\n')),
    _m("self-statement-highest", "§8.3 step 8", "a self-contradiction's statement is its higher digest",
       ('statement, conflicting = sorted(att(k, K, p)["digest"] for p in posts(k, K))[:2]',
        'conflicting, statement = sorted(att(k, K, p)["digest"] for p in posts(k, K))[:2]')),
    _m("contradiction-cites-flagged", "§8.3 step 8", "a contradiction cites the lowest backer, flagged or not",
       ("conflicting = lowest([att(k, J, s1[k]) for J in (honest or backers)])",
        "conflicting = lowest([att(k, J, s1[k]) for J in backers])")),
    _m("copier-no-fallback", "§8.3 step 5", "a copier flag cites only a prover that is not a copier",
       ('"conflicting": lowest(honest or others)["digest"]', '"conflicting": lowest(honest)["digest"]')),
    _m("copier-statement-highest", "§8.3 step 5", "a copier flag cites its latest (highest) unbound match",
       ('"statement": lowest([u for u in unbound if u["signer"] == key and u["step"] == k])["digest"]',
        '"statement": max([u for u in unbound if u["signer"] == key and u["step"] == k],'
        ' key=lambda m: m["digest"])["digest"]')),
    _m("contradiction-statement-highest", "§8.3 step 8", "case (a) cites the highest of the key's other results",
       ('statement = lowest([att(k, K, p) for p in posts(k, K) if p != s1[k]])["digest"]',
        'statement = max([att(k, K, p) for p in posts(k, K) if p != s1[k]], key=lambda m: m["digest"])["digest"]')),
    _m("contradiction-no-fallback", "§8.3 step 8", "case (a) cites only a backer that is not a contradictor",
       ("for J in (honest or backers)])", "for J in honest])")),
    _m("contradiction-fallback-without-self", "§8.3 step 8", "the fallback leaves the flagged key's own match out",
       ("for J in (honest or backers)])", "for J in (honest or [J for J in backers if J != K])])")),
    _m("contradiction-backers-include-copiers", "§8.3 step 8", "a copier's report of s1 may be cited",
       ("backers = [J for J in keys_of[k] if J not in copied.keys() | convicted and s1[k] in posts(k, J)]",
        "backers = [J for J in keys_of[k] if s1[k] in posts(k, J)]")),
    _m("copier-flag-wins", "§8.3 step 9", "a copier flag is kept over a contradiction",
       ("    flags = {**copier_flags, **contradiction_flags, **fraud_flags}",
        "    flags = {**contradiction_flags, **copier_flags, **fraud_flags}")),
    _m("settle-once", "§8.3 step 11", "refuted is decided by the first settlement",
       ("        s2 = settle({(K, p) for K in counted for p in posts(k, K)}, quorum) if quorum > 0 else None",
        "        s2 = s1[k] if quorum > 0 else None")),
    _m("claimed-over-verified", "§8.3 step 11", "a live claim makes a step claimed before a match verifies it",
       ('        elif auditors:\n            status = "verified"\n        elif claimants:\n            status = "claimed"\n',
        '        elif claimants:\n            status = "claimed"\n        elif auditors:\n            status = "verified"\n')),
    _m("all-mismatches-evidence", "§8.3 step 11", "evidence lists every mismatch attestation",
       ('evidence = sorted(att(k, K, p)["digest"] for K in counted for p in posts(k, K) if p != h)',
        'evidence = sorted(a["digest"] for a in Rep if a["step"] == k and a["signer"] in counted'
        ' and a["post_state"] != h)')),
    _m("devices-of-all-reports", "§8.3 step 11", "devices are those of every counted attestation of the step",
       ('a["step"] == k and a["post_state"] == h and a["signer"] in counted}',
        'a["step"] == k and a["signer"] in counted}')),
    _m("devices-of-all-matches", "§8.3 step 11", "devices are those of every match, counted or not",
       ('devices = sorted({a["device"] for a in Rep if', 'devices = sorted({a["device"] for a in A if')),
    _m("complete-by-auditors", "§8.3 step 12", "a step's attesters are its auditors",
       ('"attesters": len(set(auditors) | set(dissenters))', '"attesters": len(auditors)')),
    # §5.5 and §7 spot checks
    _m("spot-verdict-free", "§5.3", "a spotcheck's verdict and caught are independent",
       ('    if kind == "spotcheck" and (m["verdict"] == "pass") != (m["caught"] == "none"):\n'
        '        raise Refused("spot_verdict")\n', "")),
    _m("spot-challenge-any-key", "§7", "the challenge is any valid signature over (run, step)",
       ('signing_bytes("spotcheck-challenge", body), m["challenge"]):\n        raise Refused("challenge")',
        'signing_bytes("spotcheck-challenge", body), m["challenge"]):\n        pass')),
    _m("spot-counter-little-endian", "§5.5", "the chunk counter is u64 little-endian",
       ('b2(seed, i.to_bytes(8, "big"))', 'b2(seed, i.to_bytes(8, "little"))')),
    _m("spot-slot-from-seed", "§5.5", "the slot is the seed itself mod S",
       ('int.from_bytes(b2(b2(b"open1b/spotcheck/v1\\0", slot_challenge), b"slot"), "big") % slots',
        'int.from_bytes(b2(b"open1b/spotcheck/v1\\0", slot_challenge), "big") % slots')),
    _m("spot-slot-from-challenge", "§5.5", "the slot derives from the chunks' challenge (known to the trainer)",
       ('b2(b"open1b/spotcheck/v1\\0", slot_challenge), b"slot")', 'b2(b"open1b/spotcheck/v1\\0", challenge), b"slot")')),
    _m("spot-slot-unsigned", "§7", "the slot challenge is not checked",
       ('signing_bytes("spotcheck-slot", body), m["slot_challenge"]):\n        raise Refused("challenge")',
        'signing_bytes("spotcheck-slot", body), m["slot_challenge"]):\n        pass')),
    _m("spot-after-engine-first", "§7", "the engine rule comes before pre_state",
       ('    if m["pre_state"] != run["h"][m["step"]]:\n        raise Refused("pre_state")\n'
        '    if [m["engine"], m["engine_version"]] != [run["engine"], run["engine_version"]]:\n'
        '        raise Refused("engine")\n    body',
        '    if [m["engine"], m["engine_version"]] != [run["engine"], run["engine_version"]]:\n'
        '        raise Refused("engine")\n    if m["pre_state"] != run["h"][m["step"]]:\n'
        '        raise Refused("pre_state")\n    body')),
]

MUTANTS += [
    # §8.5 evaluations
    _m("eval-check-of-any-number", "§8.5 step 3", "a check counts whatever loss it claims",
       ('e["verdict"] != "result" and e["claimed"] == loss and counted(e["signer"])]',
        'e["verdict"] != "result" and counted(e["signer"])]')),
    _m("eval-mismatch-of-any-number", "§8.5 step 3", "a mismatch disputes whatever loss it claims",
       ('e["verdict"] != "result" and e["claimed"] == loss and counted(e["signer"])]',
        'e["verdict"] != "result" and (e["claimed"] == loss or e["verdict"] == "mismatch") and counted(e["signer"])]')),
    _m("eval-checks-any-key", "§8.5 step 3", "every key's check counts, whatever the policy",
       ('e["claimed"] == loss and counted(e["signer"])]', 'e["claimed"] == loss]')),
    _m("eval-certified-before-mismatch", "§8.5 step 4", "enough matches certify, whatever a mismatch says",
       ('status = "disputed" if mismatches else "certified" if len(checkers) >= m else "unchecked"  # 4.',
        'status = "certified" if len(checkers) >= m else "disputed" if mismatches else "unchecked"')),
    _m("eval-min-keys-exclusive", "§8.5 step 4", "more than m keys certify",
       ("if len(checkers) >= m else", "if len(checkers) > m else")),
    _m("eval-first-result-wins", "§8.5 step 2", "of two results, the lowest digest's loss stands",
       ('        losses = {e["loss"] for e in results}\n',
        '        losses = {min(results, key=lambda e: e["digest"])["loss"]} if results else set()\n')),
    # §8.6 leaderboard
    _m("board-best-loss", "§8.6", "a run is ranked at its best certified loss",
       ('latest = certified[-1] if certified else None  # the largest certified state',
        'latest = min(certified, key=lambda e: _f32(e["loss"])) if certified else None')),
    _m("board-last-finite", "§8.6 rule 2.2", "a NaN evaluation is passed over for the last finite one",
       ('latest = certified[-1] if certified else None  # the largest certified state',
        'finite = [e for e in certified if 0 <= _f32(e["loss"]) < math.inf]\n'
        '        latest = (finite or certified)[-1] if certified else None')),
    _m("board-refuted-ranked", "§8.6 rule 2.4", "only a disputed step keeps a run off the board (refuted is its own status)",
       ('disputed_steps = sum(s["status"] in ("disputed", "refuted") for s in cov["steps"])',
        'disputed_steps = sum(s["status"] == "disputed" for s in cov["steps"])')),
    _m("board-steps-before-evaluations", "§8.6 rule 2", "disputed steps are named before a disputed evaluation",
       ('        elif disputed:\n            reason = "disputed evaluation"\n        elif disputed_steps:\n'
        '            reason = "disputed steps"\n',
        '        elif disputed_steps:\n            reason = "disputed steps"\n        elif disputed:\n'
        '            reason = "disputed evaluation"\n')),
    _m("board-disputes-before-loss", "§8.6 rule 2", "a disputed evaluation is named before a bad loss",
       ('        elif not 0 <= _f32(latest["loss"]) < math.inf:\n            reason = "not a finite, non-negative loss"\n'
        '        elif disputed:\n            reason = "disputed evaluation"\n',
        '        elif disputed:\n            reason = "disputed evaluation"\n'
        '        elif not 0 <= _f32(latest["loss"]) < math.inf:\n            reason = "not a finite, non-negative loss"\n')),
    _m("board-one-ranking", "§8.6 rule 3", "ranks count over every run, whatever its evaluation set",
       ('        place[r["eval_set"]] = place.get(r["eval_set"], 0) + 1\n        r["rank"] = place[r["eval_set"]]\n',
        '        place[""] = place.get("", 0) + 1\n        r["rank"] = place[""]\n')),
    _m("board-ties-share", "§8.6 rule 3", "equal losses share a rank",
       ('    for r in ranked:\n        place[r["eval_set"]] = place.get(r["eval_set"], 0) + 1\n',
        '    for i, r in enumerate(ranked):\n        if not (i and r["eval_set"] == ranked[i - 1]["eval_set"]'
        ' and r["loss_bits"] == ranked[i - 1]["loss_bits"]):\n'
        '            place[r["eval_set"]] = place.get(r["eval_set"], 0) + 1\n')),
    _m("board-devices-of-every-step", "§8.6 rule 1", "devices are those of every step's counted matches",
       ('for s in cov["steps"] if s["status"] == "verified" for d in s["devices"]',
        'for s in cov["steps"] for d in s["devices"]')),
    # §8.7 spot coverage
    _m("spot-failed-not-caught", "§8.7 step 4", "a failed step counts as unchecked in the escape probability",
       ('caught = set(replayed) | {s["step"] for s in steps if s["status"] == "failed"}', "caught = set(replayed)")),
    _m("spot-refuted-not-caught", "§8.7 step 4", "only a verified step is replayed (r8's reading)",
       ('            if s["status"] in ("verified", "refuted")]', '            if s["status"] == "verified"]')),
    _m("spot-disputed-caught", "§8.7 step 4", "a disputed step is caught too",
       ('            if s["status"] in ("verified", "refuted")]', '            if s["status"] in ("verified", "refuted", "disputed")]')),
    _m("spot-failed-lists-no-checkers", "§8.7 step 2", "a failed step has no checkers",
       ('"status": status, "checkers": checkers,', '"status": status, "checkers": [] if fails else checkers,')),
    _m("spot-checks-are-statements", "§8.7 step 2", "n_k counts pass statements, not keys",
       ('else (1 - p) ** len(s["checkers"]) for s in steps]',
        'else (1 - p) ** sum(t["step"] == s["step"] and t["verdict"] == "pass" for t in S) for s in steps]')),
    _m("spot-any-key", "§8.7 step 1", "every key's spot checks count, whatever the policy",
       ('S = [s for s in _statements(spotchecks, "spotcheck", run) if counted(s["signer"])]',
        'S = _statements(spotchecks, "spotcheck", run)')),
    _m("spot-chunk-count-judged", "§8.7 step 1", "a spot check that names fewer chunks than a challenge opens is dropped",
       ('S = [s for s in _statements(spotchecks, "spotcheck", run) if counted(s["signer"])]',
        'S = [s for s in _statements(spotchecks, "spotcheck", run) if counted(s["signer"])'
        ' and s["chunks_total"] >= CONST["CHALLENGE_CHUNKS"]]')),
    _m("spot-links-repeated", "§8.7 step 2", "caught lists every fail's link",
       ('"caught": sorted({s["caught"] for s in fails})', '"caught": sorted(s["caught"] for s in fails)')),
    _m("spot-detection-per-rank", "§8.7 step 3", "one check catches a forged rank: p = 1 / ranks",
       ("Fraction(1, ranks * micro) if topology", "Fraction(1, ranks) if topology")),
    _m("spot-no-topology-certain", "§8.7 step 3", "without a topology a check is certain (p = 1)",
       ("if topology else Fraction(0)  # 3. detection", "if topology else Fraction(1)")),
    _m("spot-fraction-floor", "§8.7 step 5", "1% of the steps is rounded down (at least one)",
       ('max(1, math.ceil(Fraction(run["steps"], 100)))', 'max(1, run["steps"] // 100)')),
    _m("spot-escape-independent", "§8.7 step 5", "each forged step lands anywhere, independently: (mean x)^f",
       ("    return e[f] / math.comb(len(x), f)", "    return (sum(x) / len(x)) ** f")),
]

MUTANTS += [
    # docs/run-format.md §8.5 data proofs
    _m("data-malformed-when-read", "run format §8.5", "a malformed field fails only when a rule reads it",
       ('"tokens": _hexstr(s["tokens"]),', '"tokens": s["tokens"],'),
       ('        t = s["tokens"]\n', '        t = bytes.fromhex(s["tokens"])\n')),
    _m("data-hash-any-case", "run format §8.4", "hashes may be upper-case hex",
       ('    if type(v) is not str or len(v) != 64:\n        raise TypeError("not a hash")\n    return _hexstr(v)',
        '    if type(v) is not str or len(v) != 64:\n        raise TypeError("not a hash")\n    return bytes.fromhex(v)')),
    _m("data-whole-floats", "run format §8.4", "an integer may be written 2.0",
       ('def _int(v) -> int:\n    if type(v) is not int:',
        'def _int(v) -> int:\n    v = int(v) if type(v) is float and v.is_integer() else v\n    if type(v) is not int:')),
    _m("data-samples-do-not-overlap", "run format §8.1", "sample s holds tokens [s(L-1), (s+1)(L-1)): its last token is the next one's",
       ('first = -(-(start - c["sample_len"] + 1) // stride)', 'first = -(-start // stride)')),
    _m("data-last-token-exclusive", "run format §8.1", "the last sample is the one holding token end - 2",
       ('(end - 1) // stride + 1))', '(end - 2) // stride + 1))')),
    _m("data-draws-any-order", "run format §8.5 rule 6", "the draws are every draw, in any order",
       ('    if p["draws"] != expected:', '    if sorted(p["draws"]) != sorted(expected):')),
    _m("data-completeness-skipped", "run format §8.5 rule 6", "a verifier MAY skip completeness (r8's text)",
       ('    if p["draws"] != expected:\n        return "incomplete"  # rule 6\n', "")),
    _m("data-never-drawn-first-sample", "run format §8.5", "never drawn: no draw of the document's first sample",
       ('        return "drawn" if expected else "ok"  # never drawn, rule 2',
        '        return "drawn" if any(s == H.start for *_, s in expected) else "ok"')),
    _m("data-tokens-not-compared", "run format §8.5 rule 3", "a proven sample in the range holds the document",
       ('            return "sample"  # rule 3\n', '            pass\n')),
    _m("data-lower-only-anywhere", "run format §8.5 absent rule 4", "a lone lower neighbour may be any leaf",
       ('            adjacent = lower["index"] == c["document_count"] - 1', '            adjacent = True')),
]
