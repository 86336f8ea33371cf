"""Decryption (and, for building test rows, encryption) of the encrypted deep-search benchmarks.

xBench-DeepSearch and BrowseComp publish their questions and answers XOR-ed with a key derived
from a "canary" string stored in the same row, then base64-encoded, so that the plaintext does
not end up in web crawls and training sets. Decryption here happens in memory only; nothing in
this module (or in `eval.loaders`) writes a file.

    xBench   (xbench-ai/xbench-evals, xbench_evals.py `xor_decrypt`):
        c      = base64decode(field)
        key    = canary.encode("utf-8")
        plain  = bytes(c[i] ^ key[i % len(key)] for i in range(len(c))).decode("utf-8")

    BrowseComp   (openai/simple-evals, browsecomp_eval.py `derive_key` / `decrypt`):
        c      = base64decode(field)
        digest = sha256(canary.encode("utf-8")).digest()            # 32 bytes
        key    = digest * (len(c) // 32) + digest[:len(c) % 32]     # = digest[i % 32]
        plain  = bytes(a ^ b for a, b in zip(c, key)).decode("utf-8")

Encryption is the same XOR applied to the UTF-8 bytes, then standard padded base64.

Decryption is strict where the references are lenient: whitespace inside the base64 is ignored,
but any other non-alphabet character is an error (the references silently drop it), and so is
plaintext that is not UTF-8 or that contains control characters other than tab/newline/CR.
Those two checks catch many wrong canaries, not all: XOR-ing ASCII text with two different ASCII
keys often still gives printable ASCII. Errors are `ValueError`s that say what is wrong without
quoting the ciphertext or any decrypted bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

__all__ = ["decrypt_browsecomp", "decrypt_xbench", "encrypt_browsecomp", "encrypt_xbench"]

_ALLOWED_CONTROLS = frozenset("\t\n\r")


def _xor(data: bytes, key: bytes) -> bytes:
    """`data` XOR-ed with `key` repeated cyclically (key byte i % len(key) for data byte i)."""
    if not key:
        raise ValueError("empty canary: cannot derive a key")
    if not data:
        return b""
    stream = (key * (len(data) // len(key) + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(len(data), "big")


def _b64decode(text: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"ciphertext must be a base64 string, got {type(text).__name__}")
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"not valid base64 ({e})") from None


def _text(plain: bytes) -> str:
    try:
        text = plain.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("does not decrypt to UTF-8 text (wrong canary?)") from None
    if any(ch < " " and ch not in _ALLOWED_CONTROLS or ch == "\x7f" for ch in text):
        raise ValueError("decrypts to text with control characters (wrong canary?)")
    return text


def _xbench_key(canary: str) -> bytes:
    return canary.encode("utf-8")


def _browsecomp_key(canary: str) -> bytes:
    return hashlib.sha256(canary.encode("utf-8")).digest()


def decrypt_xbench(ciphertext_b64: str, canary: str) -> str:
    """Decrypt one xBench field: base64-decode, XOR with the canary's UTF-8 bytes, decode UTF-8.

    Raises ValueError for bad base64, an empty canary, or bytes that are not clean UTF-8 text.
    """
    return _text(_xor(_b64decode(ciphertext_b64), _xbench_key(canary)))


def encrypt_xbench(text: str, canary: str) -> str:
    """The inverse of `decrypt_xbench`: base64 of the UTF-8 text XOR-ed with the canary's bytes."""
    return base64.b64encode(_xor(text.encode("utf-8"), _xbench_key(canary))).decode("ascii")


def decrypt_browsecomp(ciphertext_b64: str, canary: str) -> str:
    """Decrypt one BrowseComp field: base64-decode, XOR with SHA-256(canary) repeated, decode UTF-8.

    Raises ValueError for bad base64 or bytes that are not clean UTF-8 text.
    """
    return _text(_xor(_b64decode(ciphertext_b64), _browsecomp_key(canary)))


def encrypt_browsecomp(text: str, canary: str) -> str:
    """The inverse of `decrypt_browsecomp`: base64 of the UTF-8 text XOR-ed with SHA-256(canary)."""
    return base64.b64encode(_xor(text.encode("utf-8"), _browsecomp_key(canary))).decode("ascii")
