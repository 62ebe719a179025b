"""The project's one error root, and the typed errors of the protocol.

Every error open1b raises on purpose derives from :class:`Open1bError`. Errors about bytes
that came from somewhere else derive from :class:`ProtocolError` and carry the *outcome* a
network validator must apply to the sender:

* ``REJECT`` — the input is provably bad (malformed, badly signed, impossible): drop it and
  penalise whoever sent it.
* ``IGNORE`` — the input cannot be judged yet (unknown run, stale, duplicate): drop it
  without blaming the sender.

Each error also carries a ``code``: a short, stable reason name that the spec lists beside the
rule it enforces and the validation test vectors expect, so another implementation can check
that it rejects the same input *for the same reason*. A subclass has a default code; a raise
site that enforces one particular rule passes that rule's code.
"""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    ACCEPT = "accept"
    REJECT = "reject"
    IGNORE = "ignore"


class Open1bError(Exception):
    """Root of every error open1b raises on purpose."""


class ProtocolError(Open1bError):
    """Bytes or a statement that violate the protocol. ``outcome`` says how to treat the sender."""

    outcome: Outcome = Outcome.REJECT
    code: str = "invalid"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class DecodeError(ProtocolError):
    """Bytes that are not a valid encoding of the expected message."""

    code = "malformed"


class OversizeError(DecodeError):
    """Input longer than the limit for its kind; nothing was parsed."""

    code = "oversize"


class NonCanonicalError(DecodeError):
    """Well-formed CBOR that is not in canonical form (key order, lengths, indefinite items)."""

    code = "non_canonical"


class SchemaError(DecodeError):
    """Canonical CBOR whose shape does not match the message schema."""

    code = "schema"


class UnknownFieldError(SchemaError):
    """A map carried a field the schema does not define."""

    code = "unknown_field"


class MissingFieldError(SchemaError):
    """A map lacked a field the schema requires."""

    code = "missing_field"


class WrongTypeError(SchemaError):
    """A field held a value of the wrong type or outside its bounds."""

    code = "wrong_type"


class SignatureError(ProtocolError):
    """A signature that does not verify under the claimed key and domain."""

    code = "bad_signature"


class InvalidStatementError(ProtocolError):
    """A well-formed, well-signed statement that contradicts what it refers to."""

    code = "invalid"


class UnjudgeableError(ProtocolError):
    """A statement that cannot be judged yet (unknown run, from the future, duplicate)."""

    outcome = Outcome.IGNORE
    code = "unjudgeable"
