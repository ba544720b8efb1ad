"""Corpus documents that ground each design attempt in a theme.

In: JSONL files (field `text`, or `orig_doc`), directories of .txt/.md files, or the built-in
offline corpora `builtin:games` and `builtin:tool_use`.
Out: `Document(id, title, text)`; `Sampler` hands out one document per design attempt.
Guarantees: sampling is seeded and without replacement (a new pass over a reshuffled corpus
starts only when every document was used); texts are truncated to `max_words`; the built-in
corpora are generated on the spot from what every Python install carries (the standard
library's own documentation), so nothing is downloaded and nothing copied is committed.

Built-in games corpus: the docs of the stdlib's mathematical, algorithmic and text-processing
modules (math, statistics, fractions, heapq, graphlib, difflib, ...), one document per function
or class: mechanics to borrow (orderings, graphs, number theory, edit distances). Tool-use
corpus: the docs of API-shaped stdlib modules (json, csv, sqlite3, pathlib, datetime, email,
http, zipfile, ...), one document per class or function: tools, arguments, failure modes.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import pydoc
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import orjson

from stages.records import RecordError
from stages.shards import InputMissing

GAME_MODULES = ("math", "cmath", "statistics", "fractions", "decimal", "random", "heapq",
                "bisect", "itertools", "graphlib", "difflib", "textwrap", "string", "collections",
                "functools", "operator", "calendar", "colorsys", "zlib", "binascii", "unicodedata",
                "re", "sched", "queue", "turtle", "datetime", "ipaddress", "array", "struct",
                "numbers", "wave", "time", "zoneinfo", "enum", "tokenize", "keyword",
                "hashlib", "secrets", "base64", "codecs")
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
            text = pydoc.plaintext.document(member, name)
            # reprs like `<function f at 0x7f..>` differ per process: keep documents stable
            text = ADDRESS_RE.sub("", pydoc.plain(text)).strip()
            if len(text.split()) < 25 or text in seen:
                continue
            seen.add(text)
            title = f"{module_name}.{name}"
            yield Document(doc_id(text), title, f"{title}\n\n{text}")


def load(source: str, max_words: int = 6000) -> list[Document]:
    """Documents from a builtin name, a JSONL file, or a directory of text files."""
    if source in BUILTINS:
        docs = list(builtin_documents(BUILTINS[source]))
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
