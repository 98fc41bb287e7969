"""``streamkit docs TARGET``: the app's AsyncAPI 3.0 document, written or served."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from streamkit.cli.common import fail
from streamkit.cli.target import load_app

__all__ = ["docs"]


def docs(
    target: Annotated[
        str,
        typer.Argument(help="The app: 'module:attribute' (myapp.py here is 'myapp:app')."),
    ],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the JSON document here (default: stdout)."),
    ] = None,
    html: Annotated[
        Path | None, typer.Option(help="Also write the document as one static HTML page here.")
    ] = None,
    serve: Annotated[
        bool, typer.Option("--serve", help="Show the page at http://HOST:PORT/ until Ctrl-C.")
    ] = False,
    host: Annotated[str, typer.Option(help="Where --serve listens.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="--serve's port (0: any).")] = 8000,
    title: Annotated[
        str | None, typer.Option(help="The document's title (default: the target).")
    ] = None,
    version: Annotated[str, typer.Option(help="The document's info.version.")] = "0.0.0",
) -> None:
    """Write the app's AsyncAPI 3.0 document: a channel per stream, an operation per
    listener and publisher, payload schemas from its pydantic types.

    Nothing connects: the document comes from the app's declarations.
    """
    app = load_app(target, "docs")
    from streamkit.asyncapi import asyncapi_document

    document = asyncapi_document(app, title=title or target, version=version)
    text = json.dumps(document, indent=2) + "\n"
    if output is not None:
        _write(output, text)
    elif not serve:
        sys.stdout.write(text)
    page = None
    if html is not None or serve:
        from streamkit.asyncapi_html import render_html

        page = render_html(document)
        if html is not None:
            _write(html, page)
    if serve and page is not None:
        _serve(page, text, host, port)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc} (pick a writable path)")


def _serve(page: str, document: str, host: str, port: int) -> None:
    from http.server import BaseHTTPRequestHandler, HTTPServer

    routes = {
        "/": ("text/html; charset=utf-8", page.encode()),
        "/asyncapi.json": ("application/json", document.encode()),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            content_type, body = routes.get(self.path, ("text/plain", b"not found"))
            self.send_response(200 if self.path in routes else 404)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # quiet: the one line below says where to look

    try:
        server = HTTPServer((host, port), Handler)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} (pass another --port)")
    bound_host, bound_port = server.server_address[:2]
    print(
        f"serving the AsyncAPI page at http://{bound_host!s}:{bound_port}/ (Ctrl-C stops)",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
