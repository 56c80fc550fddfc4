"""Request bodies inflated with a cap: `Content-Encoding: gzip | deflate | identity`.

The cap applies to the inflated size and is enforced while inflating, a chunk at a time, so a
small gzip bomb costs at most `limit` bytes of memory before it is refused.
"""

from __future__ import annotations

import zlib

CHUNK = 1 << 20
FIRST_FEED = 16 << 10
MAX_MEMBERS = 10_000  # an exporter sends one; thousands of empty ones are an attack
GZIP_OR_ZLIB = 32 + zlib.MAX_WBITS  # zlib detects a gzip or a zlib header by itself
RAW_DEFLATE = -zlib.MAX_WBITS


class BodyTooLarge(ValueError):
    pass


class UnsupportedEncoding(ValueError):
    pass


class CorruptBody(ValueError):
    pass


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    """Every member of `body`, one after another (RFC 1952 allows several gzip members back to back).

    A member ends at zlib's end of stream, not when its input runs out: at the end of a member
    read with a max_length, CPython leaves the rest of the body in `unconsumed_tail` as well as in
    `unused_data`, and feeding that tail back decoded nothing for ever (a two-member body whose
    first member inflates past one chunk hung the process). Input is fed at most CHUNK bytes at
    a time from a position in the body, so what zlib hands back is never more than a chunk and
    many small members cost linear time (copying the rest of the body after each member was
    quadratic: 4 MiB of empty members took 14 s); past MAX_MEMBERS the body is refused. Each
    pass yields output (at most `limit` bytes in all) or consumes input, so the loop ends.
    """
    out = bytearray()
    view = memoryview(body)
    pos = members = 0
    while pos < len(view):
        members += 1
        if members > MAX_MEMBERS:
            raise CorruptBody(f"compressed body has more than {MAX_MEMBERS} members")
        inflater = zlib.decompressobj(wbits)
        feed = FIRST_FEED  # grows while the member goes on: zlib copies what follows a member's end
        while not inflater.eof:
            if pos >= len(view):
                raise CorruptBody("compressed body is truncated")
            piece: bytes | memoryview = view[pos:pos + feed]
            pos += len(piece)
            feed = min(CHUNK, feed * 2)
            while piece and not inflater.eof:
                before = len(piece)
                chunk = inflater.decompress(piece, CHUNK)
                out += chunk
                if len(out) > limit:
                    raise BodyTooLarge(f"body inflates to more than {limit} bytes")
                piece = inflater.unconsumed_tail
                if not chunk and not inflater.eof and len(piece) == before:
                    raise CorruptBody("compressed body is truncated")
        pos -= len(inflater.unused_data)  # what followed the member's end in the last piece fed
        if wbits != RAW_DEFLATE:
            pos = _past_zero_padding(view, pos)  # gzip allows it between members (as gzip.decompress does)
    return bytes(out)


def _past_zero_padding(view: memoryview, pos: int) -> int:
    while pos < len(view):
        block = bytes(view[pos:pos + CHUNK])
        rest = block.lstrip(b"\0")
        pos += len(block) - len(rest)
        if rest:
            break
    return pos


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
    except (zlib.error, CorruptBody) as exc:
        if encoding == "deflate":  # some clients send raw deflate without the zlib header
            try:  # (whose first bytes may even pass for a zlib header, then fail as truncated)
                return _inflate(body, RAW_DEFLATE, limit)
            except (zlib.error, CorruptBody):
                pass
        if isinstance(exc, CorruptBody):
            raise
        raise CorruptBody(f"body is not valid {encoding} data ({exc})") from None
