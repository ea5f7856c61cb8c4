"""Text cleaning shared by every dataset: normalisation, deduplication keys, the
deterministic split bucket, and a prose filter."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import unicodedata


@dataclasses.dataclass
class Doc:
    """One document: the unit of the train/validation split. Paragraphs become lines."""

    id: str
    paragraphs: list


_WS = re.compile(r"\s+")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]")


def squash_spaces(s: str) -> str:
    """Runs of whitespace -> one space."""
    return _WS.sub(" ", s)


def normalize_text(s: str) -> str:
    """NFC, no control characters, single spaces (so a paragraph is one TSV-safe line)."""
    return _WS.sub(" ", _CONTROL.sub(" ", unicodedata.normalize("NFC", s))).strip()


def dedup_key(s: str) -> bytes:
    """Paragraphs equal up to case, punctuation and spacing share a key."""
    return hashlib.sha1(re.sub(r"[\W_]+", "", s.lower()).encode()).digest()[:12]


def bucket(key: str) -> int:
    """Deterministic 0..99 bucket of a key (sha256), used for every split."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100


def is_prose(p: str, min_words: int = 6) -> bool:
    """Keeps sentences, drops code, tables, menus and headings."""
    if len(p.split()) < min_words or ">>>" in p or not p.rstrip()[-1] in ".!?:;)\"'”’":
        return False
    letters = sum(ch.isalpha() or ch.isspace() for ch in p)
    return letters / len(p) >= 0.85


def sentences_to_paragraphs(text: str, max_chars: int = 1200) -> list[str]:
    """Groups sentences of an unbroken speech into paragraph-sized lines."""
    out, cur = [], ""
    for sent in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", text):
        cur = f"{cur} {sent}".strip()
        if len(cur) >= max_chars:
            out.append(cur)
            cur = ""
    return out + ([cur] if cur else [])
