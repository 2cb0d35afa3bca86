"""One serialiser for every result: ``to_json(obj)`` turns a result (a dataclass, and the lists,
tuples and dicts of them it holds) into plain JSON values, the ``--json`` of its command.

A dataclass becomes an object of its fields, in their order, under their names. What differs
from that is said where the field is declared (``field(metadata=json_meta(...))``) or, for a
value computed from the fields, on the class (``JSON_COMPUTED``):

- ``key``: the JSON name, where the field's differs (``Resplit.old`` is ``"from"``);
- ``omit_none``: left out where None (keys only some steps have);
- ``when``: left out unless the named attribute is true (``Culprit.model_saving_us``: present,
  maybe None, where the graph network was asked);
- ``skip``: never written (caches, flags that only steer ``when``);
- ``inline``: the value's own keys, in its place (``StepBlame``: the blame's keys, then its own).

Numbers, strings and numpy values pass through unchanged (orjson writes them). ``dumps`` writes
the same bytes as orjson of ``to_json``'s values, without building them first (the CLI's
``--json``; a long step's critical path has hundreds of thousands of rows).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NamedTuple, TypeAlias, cast

import orjson

JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"
"""A JSON value (numbers may be numpy scalars, which orjson writes alike)."""
JSONObject: TypeAlias = "dict[str, JSON]"

_META = "bottleneck_oracle.json"


class Computed(NamedTuple):
    """A JSON key whose value is an attribute computed from the fields (a property), written
    after the field ``after`` (None: first)."""

    key: str
    attribute: str
    after: str | None


def json_meta(
    *, key: str | None = None, omit_none: bool = False, when: str | None = None, skip: bool = False, inline: bool = False
) -> Mapping[str, object]:
    """A dataclass field's ``metadata`` saying what ``to_json`` does differently for it (see the
    module's doc): ``x: int = field(metadata=json_meta(key="from"))``."""
    return {_META: {"key": key, "omit_none": omit_none, "when": when, "skip": skip, "inline": inline}}


_PLAIN = frozenset({str, int, float, bool, type(None)})  # written as they are (the common case: checked first)


def to_json(obj: object) -> JSON:
    """``obj`` as plain JSON values: dataclasses as objects (see the module's doc), tuples and lists
    as lists, dicts with their keys as they are (orjson writes int keys as strings)."""
    t = type(obj)
    if t in _PLAIN:
        return obj  # type: ignore[return-value]  # (one of JSON's scalars)
    if t is list or t is tuple:
        return [x if type(x) in _PLAIN else to_json(x) for x in obj]  # type: ignore[attr-defined]  # (a list or tuple)
    if t is dict:
        return {k: v if type(v) in _PLAIN else to_json(v) for k, v in obj.items()}  # type: ignore[attr-defined]  # (a dict)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _object(obj)
    if isinstance(obj, (list, tuple)):
        return [to_json(x) for x in obj]
    if isinstance(obj, Mapping):
        return {k: to_json(v) for k, v in obj.items()}
    return obj  # type: ignore[return-value]  # numpy scalars and arrays: orjson writes them


def to_json_object(obj: object) -> JSONObject:
    """``to_json`` of a dataclass instance: a JSON object."""
    out = to_json(obj)
    if not isinstance(out, dict):
        raise TypeError(f"{type(obj).__name__} is not written as a JSON object")
    return out


# per field: (attribute, JSON key or None to inline, left out where None, only when this attribute is true),
# then the computed keys written after it
_Plan = list[tuple[str, "str | None", bool, "str | None", tuple[Computed, ...]]]


@functools.cache
def _plan(cls: Hashable) -> tuple[tuple[Computed, ...], _Plan]:
    """How ``to_json`` writes a dataclass, worked out once per class."""
    computed: tuple[Computed, ...] = getattr(cls, "JSON_COMPUTED", ())
    plan: _Plan = []
    for f in dataclasses.fields(cast(Any, cls)):  # (a dataclass: the callers checked)
        spec = f.metadata.get(_META, {})
        after = tuple(c for c in computed if c.after == f.name)
        if spec.get("skip"):
            if after:
                plan.append((f.name, None, False, "", after))  # (when "": never written)
            continue
        key = None if spec.get("inline") else (spec.get("key") or f.name)
        plan.append((f.name, key, bool(spec.get("omit_none")), spec.get("when"), after))
    return tuple(c for c in computed if c.after is None), plan


@functools.cache
def _writer(cls: Hashable) -> Callable[[Any], dict[str, object]]:
    """A function writing one instance of ``cls`` as its JSON object (values not converted): the
    plan compiled to one ``attrgetter`` where no field is inlined (rows of a long critical path are
    written by the hundred thousand)."""
    first, plan = _plan(cls)
    if any(key is None and when != "" for _, key, _, when, _ in plan):  # a field inlined: the plan, field by field
        return functools.partial(_by_plan, first, plan)
    keys = [c.key for c in first]
    attrs = [c.attribute for c in first]
    drops: list[tuple[str, bool, str | None]] = []  # (key, left out where None, only when this attribute is true)
    for name, key, omit_none, when, after in plan:
        if key is not None:
            keys.append(key)
            attrs.append(name)
            if omit_none or when is not None:
                drops.append((key, omit_none, when))
        keys += [c.key for c in after]
        attrs += [c.attribute for c in after]
    many = operator.attrgetter(*attrs) if len(attrs) > 1 else None  # (one attribute: attrgetter gives it, not a tuple)

    def get(obj: Any) -> tuple[object, ...]:
        return many(obj) if many is not None else tuple(getattr(obj, a) for a in attrs)

    def write(obj: Any) -> dict[str, object]:
        out = dict(zip(keys, get(obj)))
        for key, omit_none, when in drops:
            if (omit_none and out[key] is None) or (when is not None and not getattr(obj, when)):
                del out[key]
        return out

    return write


def _by_plan(first: tuple[Computed, ...], plan: _Plan, obj: Any) -> dict[str, object]:
    out: dict[str, object] = {c.key: getattr(obj, c.attribute) for c in first}
    for name, key, omit_none, when, after in plan:
        if when != "" and (when is None or getattr(obj, when)):
            value = getattr(obj, name)
            if not (omit_none and value is None):
                if key is not None:
                    out[key] = value
                elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                    out.update(json_fields(value))
                else:
                    raise TypeError(f"{type(obj).__name__}.{name}: only a dataclass can be inlined (found {type(value).__name__})")
        for c in after:
            out[c.key] = getattr(obj, c.attribute)
    return out


def json_fields(obj: Any) -> dict[str, object]:
    """One dataclass instance as its JSON object, the values not converted: what ``to_json`` does for
    one level, and orjson's ``default`` for a dataclass (``dumps``), which converts the values itself."""
    return _writer(cast(Hashable, type(obj)))(obj)  # (typeshed: a class is not Hashable)


def _object(obj: Any) -> JSONObject:
    return {k: v if type(v) in _PLAIN else to_json(v) for k, v in json_fields(obj).items()}  # type: ignore[misc]  # (a plain value is JSON)


def dumps(obj: object, option: int = 0) -> bytes:
    """``obj`` as JSON bytes by orjson (``option``: orjson's), dataclasses as ``to_json`` writes them:
    orjson walks the lists, dicts and numbers in C and asks ``json_fields`` for each dataclass."""
    return orjson.dumps(obj, default=_default, option=option | orjson.OPT_PASSTHROUGH_DATACLASS)


def _default(obj: Any) -> object:
    return _writer(cast(Hashable, type(obj)))(obj)  # (not a dataclass: dataclasses.fields raises TypeError, as orjson wants)
