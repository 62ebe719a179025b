"""Field types for message schemas: each checks one decoded CBOR value or raises WrongTypeError.

Checks are exact: ``bool`` is not an ``int``, byte strings have fixed or bounded lengths, texts
and lists are bounded, so a validated message has a known maximum size in memory too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .errors import MissingFieldError, UnknownFieldError, WrongTypeError

UINT64_MAX = 2**64 - 1


class FieldType:
    def check(self, name: str, value: Any) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class UInt(FieldType):
    maximum: int = UINT64_MAX

    def check(self, name: str, value: Any) -> None:
        if type(value) is not int or not 0 <= value <= self.maximum:
            raise WrongTypeError(f"{name}: expected an integer in [0, {self.maximum}]")


@dataclass(frozen=True)
class Bytes(FieldType):
    size: int | None = None
    max_size: int | None = None

    def check(self, name: str, value: Any) -> None:
        if type(value) is not bytes:
            raise WrongTypeError(f"{name}: expected a byte string")
        if self.size is not None and len(value) != self.size:
            raise WrongTypeError(f"{name}: expected exactly {self.size} bytes")
        if self.max_size is not None and len(value) > self.max_size:
            raise WrongTypeError(f"{name}: more than {self.max_size} bytes")


@dataclass(frozen=True)
class Text(FieldType):
    max_length: int

    def check(self, name: str, value: Any) -> None:
        if type(value) is not str or len(value.encode("utf-8")) > self.max_length:
            raise WrongTypeError(f"{name}: expected text of at most {self.max_length} bytes")


@dataclass(frozen=True)
class Enum(FieldType):
    values: frozenset[str]

    def check(self, name: str, value: Any) -> None:
        if type(value) is not str or value not in self.values:
            raise WrongTypeError(f"{name}: expected one of {sorted(self.values)}")


@dataclass(frozen=True)
class ListOf(FieldType):
    item: FieldType
    max_length: int

    def check(self, name: str, value: Any) -> None:
        if type(value) is not list or len(value) > self.max_length:
            raise WrongTypeError(f"{name}: expected a list of at most {self.max_length} items")
        for index, item in enumerate(value):
            self.item.check(f"{name}[{index}]", item)


@dataclass(frozen=True)
class Scalars(FieldType):
    """A small text-keyed map of plain scalars (ints, finite floats, texts): configs, not data.
    Ints are those CBOR encodes without a tag (major types 0 and 1); text lengths are UTF-8 bytes."""

    max_entries: int
    max_text: int = 256

    def check(self, name: str, value: Any) -> None:
        if type(value) is not dict or len(value) > self.max_entries:
            raise WrongTypeError(f"{name}: expected a map of at most {self.max_entries} entries")
        for key, item in value.items():
            if type(key) is not str or len(key.encode("utf-8")) > self.max_text:
                raise WrongTypeError(f"{name}: keys must be short texts")
            if type(item) is int and -(2**64) <= item <= UINT64_MAX:
                continue
            if type(item) is float and item == item and abs(item) != float("inf"):
                continue
            if type(item) is str and len(item.encode("utf-8")) <= self.max_text:
                continue
            raise WrongTypeError(f"{name}.{key}: expected an int, a finite float or a short text")


@dataclass(frozen=True)
class Optional(FieldType):
    """A field a message may omit (added after the message was first specified, so that the
    messages signed before it stay valid). When present it must be ``item``; it is never null:
    an absent value is an absent key, so each message has one encoding."""

    item: FieldType

    def check(self, name: str, value: Any) -> None:
        self.item.check(name, value)


def check_map(schema: Mapping[str, FieldType], value: Any, what: str) -> None:
    """Check that ``value`` is a map with the schema's fields, each of the right type: every
    field that is not :class:`Optional`, and no field the schema does not name."""
    if type(value) is not dict:
        raise WrongTypeError(f"{what}: expected a map")
    unknown = [k for k in value if k not in schema]
    if unknown:
        raise UnknownFieldError(f"{what}: unknown field(s) {sorted(map(repr, unknown))}")
    missing = [k for k, kind in schema.items() if k not in value and not isinstance(kind, Optional)]
    if missing:
        raise MissingFieldError(f"{what}: missing field(s) {sorted(missing)}")
    for name, kind in schema.items():
        if name in value:
            kind.check(f"{what}.{name}", value[name])
