"""One serialiser for every result (serial.to_json): dataclass fields in order, what a field or a
class declares (a JSON name, a key left out where None or unless a flag is set, a value inlined,
a computed key), and orjson's walk (serial.dumps) writing the same bytes as to_json's values."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import orjson
import pytest

from bottleneck_oracle.serial import Computed, dumps, json_meta, to_json, to_json_object


@dataclass(frozen=True, slots=True)
class Inner:
    a: int
    b: tuple[float, float] | None = None


@dataclass(slots=True)
class Outer:
    inner: Inner = field(metadata=json_meta(inline=True))
    old: int = field(metadata=json_meta(key="from"))
    rows: list[Inner] = field(default_factory=list)
    maybe: str | None = field(default=None, metadata=json_meta(omit_none=True))
    asked: bool = field(default=False, metadata=json_meta(skip=True))
    answer: float | None = field(default=None, metadata=json_meta(when="asked"))
    by_rank: dict[int, Inner] = field(default_factory=dict)

    JSON_COMPUTED: ClassVar[tuple[Computed, ...]] = (Computed("first", "first_a", after=None), Computed("twice", "twice", after="old"))

    @property
    def twice(self) -> int:
        return 2 * self.old

    @property
    def first_a(self) -> int:
        return self.inner.a


def test_fields_in_order_with_what_each_declares():
    o = Outer(Inner(1, (0.5, 1.5)), 7, [Inner(2)], by_rank={3: Inner(4)})
    assert to_json(o) == {
        "first": 1,
        "a": 1,
        "b": [0.5, 1.5],
        "from": 7,
        "twice": 14,
        "rows": [{"a": 2, "b": None}],
        "by_rank": {3: {"a": 4, "b": None}},
    }
    assert list(to_json_object(o)) == ["first", "a", "b", "from", "twice", "rows", "by_rank"]
    o.maybe, o.asked = "x", True
    assert to_json_object(o)["maybe"] == "x" and to_json_object(o)["answer"] is None  # asked: the answer is there, even None
    assert "asked" not in to_json_object(o)


def test_orjsons_walk_writes_what_to_json_gives():
    options = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    o = Outer(
        Inner(1, (0.5, 1.5)), 7, [Inner(2), Inner(np.int64(3))], maybe="y", asked=True, answer=np.float64(0.25), by_rank={0: Inner(1)}
    )
    doc = {"steps": [o, o], "n": np.arange(3)}
    assert dumps(doc, options) == orjson.dumps(to_json(doc), option=options)
    assert json.loads(dumps(doc, options))["steps"][0]["from"] == 7


def test_only_a_dataclass_is_written():
    with pytest.raises(TypeError):
        dumps({"x": object()})
    with pytest.raises(TypeError):
        to_json_object([1, 2])
