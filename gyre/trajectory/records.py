"""TITO records: one model call, token in / token out (docs/trajectories.md#proxy-and-tito).

A ``ModelCall`` is what the proxy records for every request of an execution:
the exact input token ids, the output token ids, the behaviour log-probability
of each output token, per-token provenance and metadata. Records are immutable
and never recomputed; the trajectory tree and the loss reuse them as stored.

Invariants (checked on construction; every error names its field):
- ``execution_id`` and ``request_id`` are non-empty strings of
  ``[A-Za-z0-9._:-]`` (an execution id names its storage file);
- ``input_ids`` is non-empty (a model call always has a prompt); all token ids
  are integers in ``[0, 2**31)``;
- ``output_logprobs`` has one finite value ``<= 0`` per output token;
- ``input_provenance`` is ``None`` (all EXTERNAL) or one value per input token,
  each EXTERNAL or EVALUATOR: an input token is never "sampled" by itself, the
  tree decides when a prior output reappears in a later input;
- ``output_provenance`` is ``None`` (all SAMPLED) or one Provenance per output
  token (e.g. tokens forced by the proxy are EXTERNAL);
- ``policy_version >= 0``; ``finished_at >= started_at`` (proxy clock; gyre
  never reads a clock itself);
- arrays are read-only; ``role_hints`` maps str to str; every tool-call payload
  is a dict with a string ``id``.

Provenance order EXTERNAL < SAMPLED < EVALUATOR is meaningful: where several
requests cover one token the tree keeps the maximum (see ``tree.py``).
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Mapping

import numpy as np

TOKEN_ID_LIMIT = 2**31
_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]+$")
_HEADER = struct.Struct("<I")
_HEADER_JSON = json.JSONEncoder(separators=(",", ":"))  # = json.dumps(..., separators=...), built once
# arrays up to this size are checked in Python (a list's min or all(): well under a numpy reduction's
# ~2 us fixed cost, and a proxy call's output is mostly that short); longer ones by numpy reductions
SMALL_ARRAY = 64


class Provenance(IntEnum):
    """Where a token came from; only SAMPLED tokens can ever be targets."""

    EXTERNAL = 0  # system/user prompt, tool result, harness-injected text
    SAMPLED = 1  # sampled by the engine in this context: trainable
    EVALUATOR = 2  # evaluator critique fed back to the policy: never a target


class RecordError(ValueError):
    """A malformed TITO record; the message names the offending field."""


def _check_id(name: str, value: Any) -> None:
    if not isinstance(value, str) or not _ID_PATTERN.match(value):
        raise RecordError(f"{name} must be a non-empty string of [A-Za-z0-9._:-], got {value!r}")


def _token_array(name: str, values: Any, *, allow_empty: bool) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise RecordError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        if not allow_empty:
            raise RecordError(f"{name} must not be empty")
        return _frozen(np.zeros(0, dtype=np.int32))
    if array.dtype.kind not in "iu":  # = np.issubdtype(dtype, np.integer), a tenth of its cost
        raise RecordError(f"{name} must hold integer token ids, got dtype {array.dtype}")
    # an int32 array (what the proxy builds) cannot exceed the limit: one reduction instead of two
    if array.size <= SMALL_ARRAY:
        values = array.tolist()
        low, high = min(values), max(values)
    else:
        low, high = array.min(), (array.max() if array.dtype != np.int32 else 0)
    if low < 0 or high >= TOKEN_ID_LIMIT:
        raise RecordError(f"{name} holds a token id outside [0, 2**31)")
    return _frozen(array.astype(np.int32, copy=False))


def _provenance_array(name: str, values: Any, length: int, allowed: tuple[Provenance, ...]) -> np.ndarray:
    array = np.asarray(values)
    if array.shape != (length,):
        raise RecordError(f"{name} must have one value per token ({length}), got shape {array.shape}")
    if length and not np.isin(array, [int(p) for p in allowed]).all():
        names = "/".join(p.name for p in allowed)
        raise RecordError(f"{name} may only contain {names}")
    return _frozen(array.astype(np.uint8))


def _frozen(array: np.ndarray) -> np.ndarray:
    array = array.view()
    array.setflags(write=False)
    return array


@dataclass(frozen=True, kw_only=True, eq=False)
class ModelCall:
    """One recorded model call (TITO record); see the module invariants."""

    execution_id: str
    request_id: str
    input_ids: np.ndarray
    output_ids: np.ndarray
    output_logprobs: np.ndarray
    policy_version: int
    engine_id: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    role_hints: Mapping[str, str] = field(default_factory=dict)
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    input_provenance: np.ndarray | None = None
    output_provenance: np.ndarray | None = None

    def __post_init__(self) -> None:
        _check_id("execution_id", self.execution_id)
        _check_id("request_id", self.request_id)
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        put("input_ids", _token_array("input_ids", self.input_ids, allow_empty=False))
        put("output_ids", _token_array("output_ids", self.output_ids, allow_empty=True))
        put("output_logprobs", self._checked_logprobs())
        if self.input_provenance is not None:
            allowed = (Provenance.EXTERNAL, Provenance.EVALUATOR)
            put("input_provenance",
                _provenance_array("input_provenance", self.input_provenance, len(self.input_ids), allowed))
        if self.output_provenance is not None:
            put("output_provenance",
                _provenance_array("output_provenance", self.output_provenance, len(self.output_ids), tuple(Provenance)))
        self._check_metadata()
        put("role_hints", dict(self.role_hints))
        put("tool_calls", tuple(dict(call) for call in self.tool_calls))

    def _checked_logprobs(self) -> np.ndarray:
        logprobs = np.asarray(self.output_logprobs, dtype=np.float64)
        if logprobs.shape != self.output_ids.shape:
            got = logprobs.shape[0] if logprobs.ndim == 1 else logprobs.shape
            raise RecordError(f"output_logprobs must have one value per output token: "
                              f"{got} logprobs for {len(self.output_ids)} tokens")
        # min and max propagate NaN, which fails both comparisons: finite and <= 0 in two reductions;
        # a short array value by value (NaN fails the chained comparison as well)
        if logprobs.size <= SMALL_ARRAY:
            bad = not all(-math.inf < value <= 0 for value in logprobs.tolist())
        else:
            bad = not (logprobs.min() > -np.inf and logprobs.max() <= 0)
        if bad:
            raise RecordError("output_logprobs must be finite and <= 0")
        return _frozen(logprobs)

    def _check_metadata(self) -> None:
        version = self.policy_version
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
            raise RecordError(f"policy_version must be an integer >= 0, got {self.policy_version!r}")
        if not isinstance(self.engine_id, str):
            raise RecordError(f"engine_id must be a string, got {self.engine_id!r}")
        for name in ("started_at", "finished_at"):
            if not isinstance(getattr(self, name), (int, float)) or not math.isfinite(getattr(self, name)):
                raise RecordError(f"{name} must be a finite number")
        if self.finished_at < self.started_at:
            raise RecordError("finished_at must not precede started_at")
        hints = self.role_hints
        # a dict whose keys and values are all exactly str (what the proxy builds) needs no walk
        if not (type(hints) is dict and {*map(type, hints), *map(type, hints.values())} <= {str}) and (
                not isinstance(hints, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                          for k, v in hints.items())):
            raise RecordError("role_hints must map str to str")
        if not isinstance(self.tool_calls, (tuple, list)):
            raise RecordError("tool_calls must be a tuple of payload dicts")
        for call in self.tool_calls:
            if not isinstance(call, Mapping) or not isinstance(call.get("id"), str):
                raise RecordError("every tool_calls payload must be a dict with a string 'id'")
        try:
            if self.tool_calls:
                json.dumps(list(self.tool_calls))
        except (TypeError, ValueError) as exc:
            raise RecordError(f"tool_calls payloads must be JSON-serializable: {exc}") from None

    # -- derived views -----------------------------------------------------

    @property
    def sequence(self) -> np.ndarray:
        """Input ids followed by output ids (the request's full token path)."""
        return np.concatenate([self.input_ids, self.output_ids])

    @property
    def provenance(self) -> np.ndarray:
        """Provenance of every token of ``sequence``."""
        inputs = self.input_provenance
        if inputs is None:
            inputs = np.full(len(self.input_ids), Provenance.EXTERNAL, dtype=np.uint8)
        outputs = self.output_provenance
        if outputs is None:
            outputs = np.full(len(self.output_ids), Provenance.SAMPLED, dtype=np.uint8)
        return np.concatenate([inputs, outputs])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ModelCall):
            return NotImplemented
        return _metadata(self) == _metadata(other) and all(
            _same_array(getattr(self, name), getattr(other, name)) for name in _ARRAY_FIELDS
        )

    __hash__ = None  # type: ignore[assignment]

    # -- binary codec (used by storage.py) ---------------------------------

    def to_bytes(self, *, base: ModelCall | None = None, shared: int = 0) -> bytes:
        """Header length, JSON metadata, then the arrays little-endian.

        With ``base``, the first ``shared`` input ids are left out: they equal the
        first ``shared`` tokens of ``base.sequence`` (checked), and decoding needs
        ``base`` again (``from_bytes(payload, bases)``).
        """
        meta = _metadata(self)
        if base is None:
            shared = 0
        else:
            _check_shared(self, base, shared)
            meta["base"] = [base.request_id, shared]
        meta["lengths"] = [len(self.input_ids) - shared, len(self.output_ids)]
        meta["has_provenance"] = [self.input_provenance is not None, self.output_provenance is not None]
        header = _HEADER_JSON.encode(meta).encode()
        parts = [_HEADER.pack(len(header)), header, _little(self.input_ids[shared:], "<i4"),
                 _little(self.output_ids, "<i4"), _little(self.output_logprobs, "<f8")]
        parts += [p.tobytes() for p in (self.input_provenance, self.output_provenance) if p is not None]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, payload: bytes, bases: Mapping[str, ModelCall] | None = None) -> ModelCall:
        """Inverse of ``to_bytes``; raises RecordError on any inconsistency."""
        try:
            (header_len,) = _HEADER.unpack_from(payload, 0)
            meta = json.loads(payload[4 : 4 + header_len])
            n_in, n_out = meta.pop("lengths")
            has_in, has_out = meta.pop("has_provenance")
            base_id, shared = meta.pop("base", (None, 0))
        except (struct.error, ValueError, KeyError, TypeError) as exc:
            raise RecordError(f"record header is malformed: {exc}") from exc
        sizes = [("input_ids", "<i4", n_in), ("output_ids", "<i4", n_out), ("output_logprobs", "<f8", n_out)]
        sizes += [("input_provenance", "u1", shared + n_in)] if has_in else []
        sizes += [("output_provenance", "u1", n_out)] if has_out else []
        offset = 4 + header_len
        expected = offset + sum(np.dtype(dtype).itemsize * n for _, dtype, n in sizes)
        if expected != len(payload):
            raise RecordError(f"record payload has {len(payload)} bytes, header announces {expected}")
        for name, dtype, count in sizes:
            meta[name] = np.frombuffer(payload, dtype=dtype, count=count, offset=offset)
            offset += np.dtype(dtype).itemsize * count
        if base_id is not None:
            meta["input_ids"] = np.concatenate([_shared_prefix(bases, base_id, shared), meta["input_ids"]])
        meta["tool_calls"] = tuple(meta.get("tool_calls", ()))
        try:
            return cls(**meta)
        except TypeError as exc:
            raise RecordError(f"record has unexpected fields: {exc}") from exc


def _little(array: np.ndarray, dtype: str) -> bytes:
    """``array.astype(dtype).tobytes()`` without the copy ``astype`` makes when the array has that dtype."""
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def _check_shared(call: ModelCall, base: ModelCall, shared: int) -> None:
    sequence = base.sequence
    if not 0 <= shared <= min(len(call.input_ids), len(sequence)) or not np.array_equal(
            sequence[:shared], call.input_ids[:shared]):
        raise RecordError(f"record {call.request_id} does not share {shared} input tokens with {base.request_id}")


def _shared_prefix(bases: Mapping[str, ModelCall] | None, base_id: str, shared: int) -> np.ndarray:
    base = (bases or {}).get(base_id)
    if base is None:
        raise RecordError(f"record refers to base record {base_id!r}, which was not read before it")
    sequence = base.sequence
    if not 0 <= shared <= len(sequence):
        raise RecordError(f"record shares {shared} tokens with {base_id!r}, which has only {len(sequence)}")
    return sequence[:shared]


_ARRAY_FIELDS = ("input_ids", "output_ids", "output_logprobs", "input_provenance", "output_provenance")


def _metadata(call: ModelCall) -> dict[str, Any]:
    return {
        "execution_id": call.execution_id,
        "request_id": call.request_id,
        "policy_version": int(call.policy_version),
        "engine_id": call.engine_id,
        "started_at": float(call.started_at),
        "finished_at": float(call.finished_at),
        "role_hints": dict(call.role_hints),
        "tool_calls": [dict(c) for c in call.tool_calls],
    }


def _same_array(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(np.array_equal(a, b))
