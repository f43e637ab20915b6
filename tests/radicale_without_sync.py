"""Radicale as a CalDAV server without sync-collection (RFC 6578), as some older
servers are: the real Radicale application, served by ``wsgiref``, with every
sync-collection REPORT refused the way RFC 6578 says a server that does not
support it may (403, ``DAV:supported-report``). Everything else is Radicale's.

``python -m tests.radicale_without_sync CONFIG PORT`` serves on 127.0.0.1:PORT
until killed."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import radicale
import radicale.config

REFUSAL = (b'<?xml version="1.0" encoding="utf-8"?>\n'
           b'<D:error xmlns:D="DAV:"><D:supported-report/></D:error>')

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def without_sync_collection(app: App) -> App:
    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] == "REPORT":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length)
            if b"sync-collection" in body:
                start_response("403 Forbidden", [
                    ("Content-Type", "application/xml; charset=utf-8"),
                    ("Content-Length", str(len(REFUSAL)))])
                return [REFUSAL]
            environ["wsgi.input"] = io.BytesIO(body)
        return app(environ, start_response)
    return serve


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def main(config: str, port: int) -> None:
    configuration = radicale.config.load([(config, False)])
    app = without_sync_collection(radicale.Application(configuration))
    with make_server("127.0.0.1", port, app, server_class=_Server,
                     handler_class=_Quiet) as server:
        server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
