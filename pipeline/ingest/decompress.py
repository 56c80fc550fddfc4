"""Request bodies inflated with a cap: `Content-Encoding: gzip | deflate | identity`.

The cap applies to the inflated size and is enforced while inflating, a chunk at a time, so a
small gzip bomb costs at most `limit` bytes of memory before it is refused.
"""

from __future__ import annotations

import zlib

CHUNK = 1 << 20
GZIP_OR_ZLIB = 32 + zlib.MAX_WBITS  # zlib detects a gzip or a zlib header by itself
RAW_DEFLATE = -zlib.MAX_WBITS


class BodyTooLarge(ValueError):
    pass


class UnsupportedEncoding(ValueError):
    pass


class CorruptBody(ValueError):
    pass


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    out = bytearray()
    data = body
    while data:
        inflater = zlib.decompressobj(wbits)
        pending = data
        while pending:
            out += inflater.decompress(pending, CHUNK)
            if len(out) > limit:
                raise BodyTooLarge(f"body inflates to more than {limit} bytes")
            pending = inflater.unconsumed_tail
        out += inflater.flush()
        if len(out) > limit:
            raise BodyTooLarge(f"body inflates to more than {limit} bytes")
        if not inflater.eof:
            raise CorruptBody("compressed body is truncated")
        data = inflater.unused_data  # gzip allows several members back to back
    return bytes(out)


def decompress(body: bytes, content_encoding: str, limit: int) -> bytes:
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("identity", ""):
        if len(body) > limit:
            raise BodyTooLarge(f"body is larger than {limit} bytes")
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise UnsupportedEncoding(f"Content-Encoding {encoding[:40]!r} is not supported; use gzip or deflate")
    try:
        return _inflate(body, GZIP_OR_ZLIB, limit)
    except zlib.error as exc:
        if encoding == "deflate":  # some clients send raw deflate without the zlib header
            try:
                return _inflate(body, RAW_DEFLATE, limit)
            except zlib.error:
                pass
        raise CorruptBody(f"body is not valid {encoding} data ({exc})") from None
