"""Static files: WhiteNoise's storage and file server, answering in the ASGI app before Django.

One process is still the whole dashboard, without Django's ASGIStaticFilesHandler (documented
as unfit for production). WhiteNoise's own Django middleware is synchronous: under ASGI it would
put every request's middleware chain on a worker thread, so `StaticFilesApp` uses WhiteNoise's
file index and responses (hashed names cached for a year, precompressed gzip/brotli copies,
ETag and Range handling) at the ASGI level and passes everything else on unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

from whitenoise.middleware import WhiteNoiseMiddleware
from whitenoise.storage import CompressedManifestStaticFilesStorage

CHUNK_BYTES = 64 * 1024


class StaticFilesStorage(CompressedManifestStaticFilesStorage):
    """Hashed, compressed copies in STATIC_ROOT. The pages' ES modules import each other by their
    hashed names too (`import … from "./live.js"` → "./live.<hash>.js"), so a new release never
    mixes with modules cached from the last one.

    A `sourceMappingURL` comment is left as it is: vendored minified libraries name source maps that are not shipped (static/vendor/): the
    manifest storage would fail collectstatic on them; browsers only miss the map in dev tools.
    """

    support_js_module_import_aggregation = True
    patterns = tuple(
        (extension, tuple(p for p in patterns if "sourceMappingURL" not in str(p)))
        for extension, patterns in CompressedManifestStaticFilesStorage.patterns
    )


class StaticFilesApp:
    """ASGI: GET/HEAD under STATIC_URL from WhiteNoise, all else to the wrapped application."""

    def __init__(self, app: Any) -> None:
        self.app = app
        # Reads STATIC_URL, STATIC_ROOT and the WHITENOISE_* settings; indexes STATIC_ROOT now
        # (with DEBUG on it looks files up per request through the finders instead).
        self.whitenoise = WhiteNoiseMiddleware(get_response=None)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.whitenoise.static_prefix):
            static_file = await self._find(scope["path"])
            if static_file is not None:
                await self._serve(static_file, scope, send)
                return
        await self.app(scope, receive, send)

    async def _find(self, path: str) -> Any:
        if self.whitenoise.autorefresh:
            return await asyncio.to_thread(self.whitenoise.find_file, path)
        return self.whitenoise.files.get(path)

    @staticmethod
    async def _serve(static_file: Any, scope: dict, send: Any) -> None:
        # WhiteNoise reads request headers from a WSGI-style environ.
        environ = {
            "HTTP_" + name.decode("latin-1").upper().replace("-", "_"): value.decode("latin-1")
            for name, value in scope.get("headers") or ()
        }
        response = static_file.get_response(scope["method"], environ)
        await send({
            "type": "http.response.start",
            "status": int(response.status),
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers],
        })
        body = response.file
        if body is None:
            await send({"type": "http.response.body", "body": b""})
            return
        try:
            while True:
                chunk = await asyncio.to_thread(body.read, CHUNK_BYTES)
                if not chunk:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            body.close()
