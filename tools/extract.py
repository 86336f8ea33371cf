"""Turn fetched bytes into a title + markdown text, and split text into numbered chunks.

- HTML: trafilatura (main content only: navigation, ads, sidebars, footers and cookie banners
  are dropped; tables kept as markdown tables), title from the page metadata. Pages where
  trafilatura finds no main content fall back to the visible body text.
- PDF: pypdf text of each page (up to `max_pdf_pages`), title from the document info.
- Plain text / markdown: decoded as declared (charset), else UTF-8, else detected.
Bodies that claim to be text but are binary are refused rather than shown as mojibake.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

from tools.base import ToolError

HTML_TYPES = ("text/html", "application/xhtml+xml")
TEXT_TYPES = ("text/plain", "text/markdown")
PDF_TYPES = ("application/pdf",)
DEFAULT_CONTENT_TYPES = HTML_TYPES + TEXT_TYPES + PDF_TYPES
MAX_EXTRACT_HTML_BYTES = 1_000_000
"""HTML beyond this is not given to the extractor (its run time grows with the input and cannot be stopped)."""


@dataclass
class Extracted:
    title: str
    text: str
    kind: str
    """`html`, `pdf` or `text`."""


def sniff_type(body: bytes) -> str:
    """Content type guessed from the first bytes, for responses without a Content-Type."""
    head = body[:512].lstrip().lower()
    if head.startswith(b"%pdf"):
        return "application/pdf"
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")) or b"<html" in head:
        return "text/html"
    return "text/plain"


def looks_binary(body: bytes) -> bool:
    """True when more than 10% of the first 4 KiB are control bytes (NUL, etc.) — not text."""
    sample = body[:4096]
    if not sample:
        return False
    controls = sum(1 for b in sample if b < 32 and b not in (9, 10, 12, 13))
    return b"\x00" in sample or controls / len(sample) > 0.10


def decode(body: bytes, charset: str | None) -> str:
    if charset:
        try:
            return body.decode(charset, errors="replace")
        except LookupError:
            pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        from trafilatura.utils import decode_file

        return decode_file(body)


def extract_html(html: str, url: str | None = None) -> Extracted:
    import trafilatura
    from trafilatura.metadata import extract_metadata

    text = trafilatura.extract(html, url=url, output_format="markdown", include_tables=True, include_links=False,
                               include_images=False, include_comments=False, with_metadata=False)
    if not text:
        text = trafilatura.html2txt(html) or ""
    meta = extract_metadata(html, default_url=url)
    title = (meta.title if meta is not None and meta.title else "") or _html_title(html)
    return Extracted(title=title.strip(), text=text.strip(), kind="html")


def _html_title(html: str) -> str:
    m = re.search(r"<title[^>]*>(.*?)</title>", html, flags=re.IGNORECASE | re.DOTALL)
    return " ".join(m.group(1).split()) if m else ""


def extract_pdf(body: bytes, max_pages: int = 200) -> Extracted:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(body))
        if reader.is_encrypted:
            raise ToolError("PDF is encrypted")
        pages = [page.extract_text() or "" for page in reader.pages[:max_pages]]
        title = (reader.metadata.title if reader.metadata and reader.metadata.title else "") or ""
    except ToolError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as e:
        raise ToolError(f"unreadable PDF: {type(e).__name__}: {e}") from e
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    return Extracted(title=str(title).strip(), text=text, kind="pdf")


def extract(body: bytes, content_type: str, charset: str | None = None, url: str | None = None) -> Extracted:
    """Title and markdown text of a response body of the given (lower-case, parameter-free) type."""
    ctype = content_type or sniff_type(body)
    if ctype in PDF_TYPES:
        return extract_pdf(body)
    if looks_binary(body):
        raise ToolError(f"body labelled '{ctype}' is binary, not text")
    text = decode(body, charset)
    if ctype in HTML_TYPES:
        return extract_html(text, url)
    return Extracted(title="", text=text.strip(), kind="text")


def chunk_text(text: str, chunk_chars: int = 4000, max_chunks: int = 10) -> tuple[list[str], bool]:
    """Split text into at most `max_chunks` chunks of about `chunk_chars` characters.

    Chunks break at paragraph boundaries when possible, else at sentence ends, else at spaces,
    so no chunk starts mid-word. Returns (chunks, truncated) — truncated when text was left over.
    """
    chunk_chars = max(200, chunk_chars)
    pieces: list[str] = []
    for para in re.split(r"\n\s*\n", text.strip()):
        para = para.strip()
        while len(para) > chunk_chars:
            cut = max(para.rfind(". ", 0, chunk_chars), para.rfind("\n", 0, chunk_chars))
            cut = cut + 1 if cut > chunk_chars // 2 else para.rfind(" ", 0, chunk_chars)
            cut = cut if cut > 0 else chunk_chars
            pieces.append(para[:cut].strip())
            para = para[cut:].strip()
        if para:
            pieces.append(para)
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current) + 2 + len(piece) > chunk_chars:
            chunks.append(current)
            current = piece
        else:
            current = f"{current}\n\n{piece}" if current else piece
    if current:
        chunks.append(current)
    return chunks[:max_chunks], len(chunks) > max_chunks
