"""The recipe knowledge base and BM25 retrieval over it (offline, no model download)."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.files import read_yaml

_TOKEN = re.compile(r"[a-z0-9]+")
FIELDS = ("id", "title", "when", "keywords", "explanation", "remedy", "assumes", "edits", "knobs", "references")


@dataclass(frozen=True, slots=True)
class Recipe:
    id: str
    title: str
    when: dict[str, float]
    keywords: str
    explanation: str
    remedy: str
    assumes: str
    edits: tuple[str, ...]
    references: tuple[str, ...]
    knobs: tuple[str, ...] = ()
    """Configuration changes (``whatif --set`` syntax) the remedy makes, replayed after the edits."""

    @property
    def text(self) -> str:
        return " ".join([self.id.replace("-", " "), self.title, self.keywords, self.explanation, self.remedy, " ".join(self.when)])


def tokens(text: str) -> list[str]:
    """Lower-case word pieces; snake_case and :: names split (``all_reduce`` -> all, reduce, allreduce)."""
    words = _TOKEN.findall(text.lower())
    joined = ["".join(words[i : i + 2]) for i in range(len(words) - 1)]
    return words + joined


def load_recipes(path: str | Path | None = None) -> list[Recipe]:
    """The shipped knowledge base (llm/recipes.yaml), or another file in the same format."""
    p = Path(path) if path else Path(str(resources.files("bottleneck_oracle.llm") / "recipes.yaml"))
    raw = read_yaml(p, "recipe file")
    if not isinstance(raw, list):
        raise OracleError(f"{p}: expected a list of recipes")
    out = []
    for i, r in enumerate(raw):
        if not isinstance(r, dict) or set(r) - set(FIELDS) or not {"id", "title", "when", "edits", "remedy"} <= set(r):
            raise OracleError(f"{p}: recipe {i + 1} must have id, title, when, edits, remedy (and only {', '.join(FIELDS)})")
        if (
            not isinstance(r["when"], dict)
            or not isinstance(r["edits"], list)
            or not isinstance(r.get("references", []), list)
            or not isinstance(r.get("knobs", []), list)
        ):
            raise OracleError(f"{p}: recipe {i + 1}: when must be a mapping, edits, knobs and references lists")
        try:
            when = {str(k): float(v) for k, v in r["when"].items()}
        except (TypeError, ValueError):
            raise OracleError(f"{p}: recipe {i + 1}: every threshold under when must be a number") from None
        out.append(
            Recipe(
                id=str(r["id"]),
                title=str(r["title"]),
                when=when,
                keywords=str(r.get("keywords", "")),
                explanation=str(r.get("explanation", "")),
                remedy=str(r["remedy"]),
                assumes=str(r.get("assumes", "")),
                edits=tuple(str(e) for e in r["edits"]),
                references=tuple(str(x) for x in r.get("references", [])),
                knobs=tuple(str(k) for k in r.get("knobs", [])),
            )
        )
    return out


class BM25:
    """Okapi BM25 (k1 = 1.5, b = 0.75) over the recipes' text."""

    def __init__(self, recipes: list[Recipe], k1: float = 1.5, b: float = 0.75) -> None:
        self.recipes = recipes
        self.docs = [Counter(tokens(r.text)) for r in recipes]
        self.len = [sum(d.values()) for d in self.docs]
        self.avg = sum(self.len) / max(len(self.len), 1)
        df = Counter(t for d in self.docs for t in d)
        n = len(self.docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self.k1, self.b = k1, b

    def scores(self, query: str) -> list[float]:
        q = tokens(query)
        out = []
        for d, length in zip(self.docs, self.len):
            s = 0.0
            for t in q:
                f = d.get(t, 0)
                if f:
                    s += self.idf[t] * f * (self.k1 + 1) / (f + self.k1 * (1 - self.b + self.b * length / self.avg))
            out.append(s)
        return out

    def top(self, query: str, k: int = 8) -> list[tuple[Recipe, float]]:
        s = self.scores(query)
        order = sorted(range(len(s)), key=lambda i: (-s[i], self.recipes[i].id))
        return [(self.recipes[i], s[i]) for i in order[:k]]
