"""Corpus documents that ground each design attempt in a theme.

In: JSONL files (field `text`, or `orig_doc`), directories of .txt/.md files, or the built-in
offline corpora `builtin:games` and `builtin:tool_use`.
Out: `Document(id, title, text)`; `Sampler` hands out one document per design attempt.
Guarantees: sampling is seeded and without replacement (a new pass over a reshuffled corpus
starts only when every document was used); texts are truncated to `max_words`; the built-in
corpora are generated on the spot from what every Python install carries (the standard
library's and the installed math/science packages' own documentation), so nothing is
downloaded and nothing copied is committed.

Built-in games corpus (the paper grounds games in math/science text): one document per
documented function or class of the installed math and science packages (sympy and mpmath,
which torch depends on, plus numpy, scipy, networkx where present: a few thousand documents on
number theory, combinatorics, geometry, probability, graphs, optimisation, physics) and of the
stdlib's mathematical and algorithmic modules. Which packages were present changes the corpus,
and every design record names its document by content hash. Tool-use corpus (the paper: code
documentation): the docs of API-shaped stdlib modules (json, csv, sqlite3, pathlib, datetime,
email, http, zipfile, ...), one document per class or function: tools, arguments, failure modes.
Point a recipe at a real corpus with `corpus = "path/to/docs.jsonl"` (one `{"text": ...}` a line).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import orjson

from stages.records import RecordError
from stages.shards import InputMissing

GAME_MODULES = ("math", "cmath", "statistics", "fractions", "decimal", "random", "heapq",
                "bisect", "itertools", "graphlib", "colorsys", "numbers", "calendar",
                # math and science packages: present wherever torch is (sympy, mpmath) or the
                # eval/report extras are (numpy, scipy, networkx); missing ones are skipped
                "sympy", "sympy.combinatorics", "sympy.ntheory", "sympy.geometry",
                "sympy.physics.mechanics", "sympy.physics.units", "sympy.stats",
                "sympy.logic", "sympy.sets", "sympy.solvers", "sympy.matrices",
                "sympy.polys", "sympy.series", "sympy.integrals", "sympy.functions",
                "mpmath", "numpy", "numpy.linalg", "numpy.random", "numpy.polynomial",
                "numpy.fft", "scipy.special", "scipy.stats", "scipy.optimize",
                "scipy.integrate", "scipy.linalg", "scipy.spatial", "scipy.sparse.csgraph",
                "scipy.signal", "scipy.interpolate", "scipy.constants", "scipy.cluster.hierarchy",
                "networkx", "networkx.algorithms", "networkx.generators")
TOOL_MODULES = ("json", "csv", "sqlite3", "pathlib", "datetime", "email.message", "http.client",
                "urllib.parse", "zipfile", "tarfile", "shutil", "logging", "argparse", "configparser",
                "hashlib", "secrets", "uuid", "smtplib", "ftplib", "imaplib", "mailbox",
                "tempfile", "filecmp", "fnmatch", "glob", "sched", "ipaddress", "mimetypes",
                "html.parser", "xml.etree.ElementTree", "wave", "gettext", "locale", "shelve",
                "dbm", "gzip", "bz2", "lzma", "plistlib", "netrc", "pprint", "reprlib", "enum",
                "dataclasses", "contextlib", "abc", "array", "weakref", "types", "copy", "io",
                "os.path", "stat", "platform", "errno", "socket", "selectors", "ssl", "asyncio",
                "concurrent.futures", "subprocess", "threading", "multiprocessing", "time",
                "zoneinfo", "calendar", "string", "textwrap", "difflib", "base64", "struct",
                "codecs", "unicodedata", "decimal", "fractions", "statistics", "random")
ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+")
BUILTINS = {"builtin:games": GAME_MODULES, "builtin:tool_use": TOOL_MODULES}


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str


def doc_id(text: str) -> str:
    return "doc_" + hashlib.sha256(text.encode()).hexdigest()[:16]


def truncate(text: str, max_words: int) -> str:
    words = text.split()
    return text if len(words) <= max_words else " ".join(words[:max_words]) + " ..."


def builtin_documents(modules: Iterable[str]) -> Iterator[Document]:
    """One document per public, documented function or class of each module."""
    seen: set[str] = set()
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue  # a stripped-down Python may lack a module; the corpus just shrinks
        members = sorted(vars(module).items())
        for name, member in members:
            if name.startswith("_") or not (inspect.isclass(member) or inspect.isroutine(member)):
                continue
            home = getattr(member, "__module__", None) or module_name
            if home.split(".")[0].lstrip("_") != module_name.split(".")[0]:
                continue
            text = _describe(member, name)
            if len(text.split()) < 25 or text in seen:
                continue
            seen.add(text)
            title = f"{module_name}.{name}"
            yield Document(doc_id(text), title, f"{title}\n\n{text}")


def _describe(member: object, name: str) -> str:
    """Signature and docstring; a class adds its public methods' first doc lines (the API
    shape a tool-use design borrows). inspect, not pydoc: pydoc renders whole class trees and
    takes minutes over thousands of members."""
    try:
        signature = str(inspect.signature(member))
    except (TypeError, ValueError):
        signature = ""
    lines = [f"{name}{signature}", "", inspect.getdoc(member) or ""]
    if inspect.isclass(member):
        for method_name, method in sorted(vars(member).items()):
            doc = inspect.getdoc(method) if inspect.isroutine(method) else None
            if doc and not method_name.startswith("_"):
                lines.append(f"\n{method_name}: {doc.splitlines()[0]}")
    # reprs like `<function f at 0x7f..>` in defaults differ per process: keep documents stable
    return ADDRESS_RE.sub("", "\n".join(lines)).strip()


def builtin_corpus(name: str) -> list[Document]:
    """A built-in corpus, built once per machine and package set, then read from the cache.

    Some docstrings are made at import time from random draws or set orderings (scipy's
    distribution examples), so two processes can render a few documents differently; every
    process reading the one cached file keeps design prompts identical across reruns."""
    modules = BUILTINS[name]
    versions = {}
    for top in sorted({m.split(".")[0] for m in modules}):
        try:
            versions[top] = importlib.metadata.version(top)
        except importlib.metadata.PackageNotFoundError:
            versions[top] = None
    key = hashlib.sha256(orjson.dumps([sys.version, modules, versions])).hexdigest()[:16]
    cache = Path(os.environ.get("SPADE_CACHE", Path.home() / ".cache" / "spade"))
    path = cache / f"corpus-{name.split(':')[1]}-{key}.jsonl"
    if not path.exists():
        from stages.shards import write_atomic

        path.parent.mkdir(parents=True, exist_ok=True)
        rows = (orjson.dumps(d.__dict__) + b"\n" for d in builtin_documents(modules))
        write_atomic(path, list(rows))
    return [Document(**orjson.loads(line)) for line in path.read_bytes().splitlines()]


def load(source: str, max_words: int = 6000) -> list[Document]:
    """Documents from a builtin name, a JSONL file, or a directory of text files."""
    if source in BUILTINS:
        docs = builtin_corpus(source)
    else:
        path = Path(source)
        if not path.exists():
            raise InputMissing(f"{source}: no such corpus file or directory")
        docs = list(_from_dir(path)) if path.is_dir() else list(_from_jsonl(path))
    return [Document(d.id, d.title, truncate(d.text, max_words)) for d in docs]


def _from_jsonl(path: Path) -> Iterator[Document]:
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise RecordError(f"invalid JSON: {exc}", f"{path}:{lineno}") from None
            text = row.get("text") or row.get("orig_doc") if isinstance(row, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise RecordError("field 'text': a corpus line needs a non-empty 'text' "
                                  "(or 'orig_doc') string", f"{path}:{lineno}")
            yield Document(row.get("id") or doc_id(text), row.get("title", ""), text)


def _from_dir(path: Path) -> Iterator[Document]:
    for file in sorted(path.rglob("*")):
        if file.suffix in (".txt", ".md", ".rst") and file.is_file():
            text = file.read_text(errors="replace")
            if text.strip():
                yield Document(doc_id(text), file.stem, text)


class Sampler:
    """Seeded sampling without replacement; reshuffles only after a full pass."""

    def __init__(self, documents: list[Document], seed: int = 0):
        if not documents:
            raise RecordError("the corpus has no documents")
        self.documents = documents
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def next(self) -> Document:
        if not self.order:
            self.order = list(range(len(self.documents)))
            self.rng.shuffle(self.order)
        return self.documents[self.order.pop()]
