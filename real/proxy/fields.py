"""Reading request bodies into typed values, and writing JSON that always encodes (no I/O).

``load_body`` turns raw bytes into a JSON object or a 400 ``ApiError``:
invalid JSON, ``NaN``/``Infinity`` (not JSON), nesting too deep for the
decoder (``too_deep``; code that later recurses over a body turns a
``RecursionError`` into the same 400), lone UTF-16 surrogates (which no tokenizer or UTF-8 writer can
take) and non-object bodies are all rejected, each naming the field. The
field getters (``string``, ``boolean``, ``integer``, ``number``, ``array``,
``mapping``) check one optional or required field of a JSON object and name it
(``where.name``) in their error.

``json_bytes`` writes UTF-8 JSON; text that cannot be encoded (a lone
surrogate a model produced) is escaped as ``\\uXXXX`` instead of failing, and
non-finite numbers are written as ``null``, so every body and every SSE event
the proxy writes is valid JSON in valid UTF-8.

Only the standard library is imported (``tests/proxy_parse`` runs without aiohttp).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal, overload

from gyre.real.proxy.request import ApiError, bad_request

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MISSING = object()
# built once: json.dumps with any option builds a new encoder on every call
_UNICODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_ASCII = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_LOADS = json.JSONDecoder(parse_constant=_constant)  # json.loads with an option builds one per call
_OTHER_UTF = (b"\xef", b"\xff", b"\xfe")  # first bytes of the BOMs json.loads detects (UTF-8, -16, -32)


def _surrogate_path(value: Any, where: str) -> str | None:
    if isinstance(value, str):
        return where if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _SURROGATE.search(key):
                return f"{where}.{key!a}" if where else repr(key)
            found = _surrogate_path(item, f"{where}.{key}" if where else key)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _surrogate_path(item, f"{where}.{index}" if where else str(index))
            if found:
                return found
    return None


def too_deep() -> ApiError:
    return bad_request("body: JSON nested too deeply", "body")


def load_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body; a 400 ``ApiError`` naming what is wrong otherwise."""
    try:
        body = _decode(raw)
    except RecursionError:
        raise too_deep() from None
    except ValueError as exc:
        raise bad_request(f"body: invalid JSON: {exc}", "body") from None
    if not isinstance(body, dict):
        raise bad_request("body: expected a JSON object", "body")
    if _SURROGATE_ESCAPE.search(raw):
        try:
            where = _surrogate_path(body, "")
        except RecursionError:
            raise too_deep() from None
        if where is not None:
            raise bad_request(f"{where}: contains a lone UTF-16 surrogate (not valid Unicode text)", where)
    return body


def _decode(raw: bytes) -> Any:
    """``json.loads(raw, parse_constant=_constant)``: the same values and errors, without a decoder built
    per call and the encoding detection for a body that is plainly UTF-8 (no BOM, no NUL in its first
    two bytes: a UTF-16 or -32 body of JSON has one)."""
    if raw[:1] in _OTHER_UTF or 0 in raw[:2]:
        return json.loads(raw, parse_constant=_constant)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return json.loads(raw, parse_constant=_constant)  # not UTF-8: json.loads names the problem
    return _LOADS.decode(text)


def json_bytes(value: Any) -> bytes:
    """UTF-8 JSON of ``value``; lone surrogates escaped, non-finite numbers as null."""
    try:
        return _UNICODE.encode(value).encode()
    except UnicodeEncodeError:
        return _ASCII.encode(value).encode()
    except ValueError:  # NaN or infinity somewhere: JSON has no such numbers
        return json_bytes(_finite(value))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# -- typed fields -------------------------------------------------------------------


def _path(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _get(body: dict[str, Any], name: str, required: bool, where: str, expected: str) -> Any:
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise bad_request(f"{_path(where, name)}: required {expected}")
        return _MISSING
    return value


MODEL_MAX_CHARS = 256  # ``model`` is echoed into every stream chunk and record: bounded


# ``string`` and ``integer`` never return None for a required field or one with a default: the overloads say so
@overload
def string(body: dict[str, Any], name: str, *, where: str = "", required: Literal[True],
           default: str | None = None, max_chars: int | None = None) -> str: ...
@overload
def string(body: dict[str, Any], name: str, *, where: str = "", required: bool = False,
           default: str, max_chars: int | None = None) -> str: ...
@overload
def string(body: dict[str, Any], name: str, *, where: str = "", required: bool = False,
           default: str | None = None, max_chars: int | None = None) -> str | None: ...
def string(body: dict[str, Any], name: str, *, where: str = "", required: bool = False,
           default: str | None = None, max_chars: int | None = None) -> str | None:
    """A string field; ``max_chars`` bounds one the proxy echoes (into every chunk and record)."""
    value = _get(body, name, required, where, "string")
    if value is _MISSING:
        return default
    if not isinstance(value, str):
        raise bad_request(f"{_path(where, name)}: must be a string, got {type(value).__name__}")
    if max_chars is not None and len(value) > max_chars:
        raise bad_request(f"{_path(where, name)}: at most {max_chars} characters, got {len(value)}")
    return value


def boolean(body: dict[str, Any], name: str, *, where: str = "", default: bool = False) -> bool:
    value = _get(body, name, False, where, "boolean")
    if value is _MISSING:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{_path(where, name)}: must be true or false, got {value!r:.40}")
    return value


@overload
def integer(body: dict[str, Any], name: str, *, where: str = "", required: Literal[True], default: int | None = None,
            minimum: int | None = None, maximum: int | None = None) -> int: ...
@overload
def integer(body: dict[str, Any], name: str, *, where: str = "", required: bool = False, default: int,
            minimum: int | None = None, maximum: int | None = None) -> int: ...
@overload
def integer(body: dict[str, Any], name: str, *, where: str = "", required: bool = False, default: int | None = None,
            minimum: int | None = None, maximum: int | None = None) -> int | None: ...
def integer(body: dict[str, Any], name: str, *, where: str = "", required: bool = False, default: int | None = None,
            minimum: int | None = None, maximum: int | None = None) -> int | None:
    value = _get(body, name, required, where, "integer")
    if value is _MISSING:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{_path(where, name)}: must be an integer, got {value!r:.40}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise bad_request(f"{_path(where, name)}: must be in [{minimum}, {maximum}], got {value}")
    return value


def number(body: dict[str, Any], name: str, *, low: float, high: float, low_open: bool = False,
           where: str = "") -> float | None:
    """An optional finite number in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    value = _get(body, name, False, where, "number")
    if value is _MISSING:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"{_path(where, name)}: must be a number, got {value!r:.40}")
    above = value > low if low_open else value >= low
    if not (above and value <= high):
        bracket = "(" if low_open else "["
        raise bad_request(f"{_path(where, name)}: must be in {bracket}{low}, {high}], got {value}")
    return float(value)


def array(body: dict[str, Any], name: str, *, where: str = "", required: bool = False,
          non_empty: bool = False) -> list[Any]:
    value = _get(body, name, required, where, "list")
    if value is _MISSING:
        return []
    if not isinstance(value, list):
        raise bad_request(f"{_path(where, name)}: must be a list, got {type(value).__name__}")
    if non_empty and not value:
        raise bad_request(f"{_path(where, name)}: must not be empty")
    return value


def mapping(body: dict[str, Any], name: str, *, where: str = "") -> dict[str, Any]:
    value = _get(body, name, False, where, "object")
    if value is _MISSING:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{_path(where, name)}: must be an object, got {type(value).__name__}")
    return value


def objects(items: list[Any], where: str) -> list[dict[str, Any]]:
    """``items`` when every entry is a JSON object; a 400 naming the first that is not."""
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_request(f"{where}.{index}: must be an object, got {type(item).__name__}")
    return items


def stop_list(body: dict[str, Any], name: str, *, limit: int = 16, one_string: bool = True) -> list[str]:
    """A list of non-empty strings, or (``one_string``: OpenAI ``stop``) one such string; Anthropic's
    ``stop_sequences`` must be a list, as its API requires."""
    value = body.get(name)
    if value is None:
        return []
    values = [value] if isinstance(value, str) and one_string else value
    if not isinstance(values, list) or not all(isinstance(s, str) and s for s in values):
        kinds = "a non-empty string or a list of non-empty strings" if one_string else "a list of non-empty strings"
        raise bad_request(f"{name}: must be {kinds}")
    if len(values) > limit:
        raise bad_request(f"{name}: at most {limit} stop sequences")
    return list(values)


__all__ = ["ApiError", "array", "boolean", "integer", "json_bytes", "load_body", "mapping",
           "number", "objects", "stop_list", "string", "too_deep"]
