"""The pages a synthesis run draws from, and the links between them.

`PageStore.open(path)` indexes a JSONL file without holding its text: one pass records, per url,
the title and the byte offsets of its rows, and a page is read from disk when asked for. Rows are
pages (`{url, contents}` with the title as the first line, as the world and ASearcher's
Wikipedia pages have, or `{url, title, text}`) or passages of a search corpus (`{title, contents}`,
several rows per page, joined in file order; `url` defaults to the title).

Links (`link_source`):
- `mentions`: a page links to every page whose title it mentions (whole words, titles of up to eight
  words), found lazily per page; for corpora up to `FULL_SCAN_PAGES` pages the reverse links (pages
  that mention this one) are computed once at open, so a neighbour can be found in both directions.
- `file`: a JSONL `{url, links: [url, ...]}` (ASearcher's links file has `links` and `in_links`;
  both are read).

A malformed row raises DataError naming the file and line.
"""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from agent.qa import DataError

FULL_SCAN_PAGES = 200_000
MAX_TITLE_WORDS = 8
_WORD = re.compile(r"[\w'’.-]+")


@dataclass
class Page:
    url: str
    title: str
    text: str


def _title_and_text(row: dict, where: str) -> tuple[str, str]:
    text = row.get("contents", row.get("text"))
    if not isinstance(text, str):
        raise DataError(f"{where}: a page row needs a 'contents' or 'text' string (keys: {', '.join(sorted(row))})")
    title = row.get("title")
    if isinstance(title, str) and title.strip():
        first, _, rest = text.partition("\n")
        if first.strip().strip('"') == title.strip():
            text = rest  # a passage that repeats its title on the first line (the Search-R1/FlashRAG layout)
        return title.strip(), text.strip()
    first, _, rest = text.partition("\n")
    return first.strip().strip('"'), rest.strip()


class PageStore:
    """Pages by url, read lazily from a JSONL file, with titles and links (see module docstring)."""

    def __init__(self, path: Path, offsets: dict[str, list[int]], titles: dict[str, str]):
        self.path = path
        self.offsets = offsets
        self.titles = titles
        self.by_title = {t: u for u, t in titles.items()}
        self.urls = sorted(offsets)
        self._links: dict[str, list[str]] = {}
        self._reverse: dict[str, set[str]] | None = None
        self._file_links: dict[str, list[str]] | None = None

    @classmethod
    def open(cls, path: str | Path, links: str | Path | None = None) -> PageStore:
        """Index a pages (or passages) JSONL file; `links`: an optional links JSONL (`link_source: file`)."""
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: no such corpus file")
        offsets: dict[str, list[int]] = defaultdict(list)
        titles: dict[str, str] = {}
        with open(path, "rb") as fh:
            pos, line_no = 0, 0
            for raw in fh:
                line_no += 1
                where = f"{path}:{line_no}"
                if raw.strip():
                    try:
                        row = json.loads(raw)
                    except ValueError as e:
                        raise DataError(f"{where}: not valid JSON ({e})") from None
                    if not isinstance(row, dict):
                        raise DataError(f"{where}: expected a JSON object")
                    title, _ = _title_and_text(row, where)
                    url = str(row.get("url") or title)
                    offsets[url].append(pos)
                    titles.setdefault(url, title)
                pos += len(raw)
        if not offsets:
            raise DataError(f"{path}: no pages")
        store = cls(path, dict(offsets), titles)
        if links:
            store._file_links = _read_links(Path(links))
        elif len(store.urls) <= FULL_SCAN_PAGES:
            store._reverse = defaultdict(set)
            for url in store.urls:
                for other in store.mentions(url):
                    store._reverse[other].add(url)
        return store

    def __len__(self) -> int:
        return len(self.urls)

    def page(self, url: str) -> Page:
        """The page at `url` (its rows joined)."""
        parts, title = [], self.titles[url]
        with open(self.path, "rb") as fh:
            for off in self.offsets[url]:
                fh.seek(off)
                parts.append(_title_and_text(json.loads(fh.readline()), f"{self.path}@{off}")[1])
        return Page(url, title, "\n\n".join(p for p in parts if p))

    def mentions(self, url: str) -> list[str]:
        """Urls of the other pages whose titles this page's text mentions, in order of first mention."""
        if url not in self._links:
            text = self.page(url).text
            words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
            found: list[str] = []
            for i in range(len(words)):
                for j in range(min(len(words), i + MAX_TITLE_WORDS), i, -1):
                    candidate = text[words[i][0]:words[j - 1][1]].rstrip(".")
                    other = self.by_title.get(candidate)
                    if other is not None and other != url and other not in found:
                        found.append(other)
                        break
            self._links[url] = found
        return self._links[url]

    def neighbours(self, url: str) -> list[str]:
        """Linked pages in both directions where known (file links, or mentions plus reverse mentions)."""
        if self._file_links is not None:
            return [u for u in self._file_links.get(url, []) if u in self.offsets and u != url]
        out = list(self.mentions(url))
        if self._reverse is not None:
            out += sorted(u for u in self._reverse.get(url, ()) if u not in out)
        return out

    def sample(self, rng: random.Random) -> str:
        """A seed page url: uniform over pages that have at least one neighbour (tried up to 50 draws)."""
        for _ in range(50):
            url = rng.choice(self.urls)
            if self.neighbours(url):
                return url
        return rng.choice(self.urls)


def _read_links(path: Path) -> dict[str, list[str]]:
    if not path.is_file():
        raise DataError(f"{path}: no such links file")
    out: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise DataError(f"{path}:{i}: not valid JSON ({e})") from None
            if not isinstance(row, dict) or not isinstance(row.get("url"), str):
                raise DataError(f"{path}:{i}: a links row needs 'url' and 'links'")
            links = [*row.get("links", []), *row.get("in_links", [])]
            if not all(isinstance(u, str) for u in links):
                raise DataError(f"{path}:{i}: 'links' must be a list of urls")
            out[row["url"]] = list(dict.fromkeys(links))
    return out
