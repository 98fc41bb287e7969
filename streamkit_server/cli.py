"""``streamkit-server`` / ``python -m streamkit_server``.

Every setting is an environment variable ``STREAMKIT_SERVER_<NAME>`` and a flag
``--<name>`` (flags win).  Start-up fails fast, with one line on stderr and
exit status 1, when Redis is unreachable or lacks a command we rely on.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import re
import secrets
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from streamkit.version import package_version

if TYPE_CHECKING:
    from streamkit_server.settings import ServerSettings

__all__ = ["main", "parse_settings"]

log = logging.getLogger("streamkit_server")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")


def _plain(markdown: str) -> str:
    """A setting's description (markdown, shared with docs/operations.md) for a terminal."""
    return _LINK.sub(r"\1", markdown).replace("`", "")


def option_help(name: str) -> str:
    """The ``--help`` line of a setting: what it does, its variable and its default."""
    from streamkit_server.settings import ServerSettings

    field = ServerSettings.model_fields[name]
    default: Any = field.default
    if default is None:
        generated = name in {"admin_password", "token_secret"}
        default = "generated at start-up" if generated else "none"
    elif isinstance(default, bool):
        default = str(default).lower()
    where = f"env STREAMKIT_SERVER_{name.upper()}; default {default}"
    return f"{_plain(field.description or '')} ({where})"


def _metavar(name: str, annotation: Any) -> str:
    if annotation is bool:
        return "BOOL"
    if name.endswith("_ms"):
        return "MS"
    if annotation is int:
        return "N"
    return {"url": "URL", "file": "PATH", "host": "HOST"}.get(name.rsplit("_", 1)[-1], "TEXT")


def parse_settings(argv: Sequence[str] | None = None) -> ServerSettings:
    from streamkit_server.settings import ServerSettings

    parser = argparse.ArgumentParser(
        prog="streamkit-server",
        description="Run the streamkit coordinator (KIP-848-style, sharded Redis Streams).",
        epilog="Every option is also an environment variable; flags win. The settings table "
        "of the operations guide (docs/operations.md) has the same texts. Subcommands: "
        "streamkit-server hash-password, streamkit-server revoke-tokens USERNAME.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    for name, field in ServerSettings.model_fields.items():
        metavar = _metavar(name, field.annotation)
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if field.annotation is bool else {}
        parser.add_argument(
            _flag(name), dest=name, default=None, metavar=metavar, help=option_help(name), **extra
        )
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if v is not None}
    return ServerSettings(**overrides)


def _hash_password() -> int:
    """``streamkit-server hash-password``: a hash for a principals document."""
    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline()
    password = password.rstrip("\n")
    if not password.strip():
        print("streamkit-server: the password must not be blank", file=sys.stderr)
        return 2
    from streamkit_server.auth.principals import hash_password

    print(hash_password(password))
    return 0


def _revoke_tokens(argv: Sequence[str]) -> int:
    """``streamkit-server revoke-tokens USER [settings flags]``: on every process at once."""
    if not argv or argv[0].startswith("-"):
        print("usage: streamkit-server revoke-tokens USERNAME [--redis-url ...]", file=sys.stderr)
        return 2
    import asyncio

    from pydantic import ValidationError
    from redis.exceptions import RedisError

    from streamkit_server.serve import revoke_tokens

    try:
        settings = parse_settings(argv[1:])
        version = asyncio.run(revoke_tokens(settings, argv[0]))
    except (ValidationError, RedisError, OSError) as exc:
        print(f"streamkit-server: cannot revoke: {type(exc).__name__}", file=sys.stderr)
        return 1
    print(f"revoked the tokens of {argv[0]!r} (token version now {version})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:  # at once: without the settings model (pydantic)
        print(f"streamkit-server {package_version()}")
        return 0
    if args[:1] == ["hash-password"]:
        return _hash_password()
    if args[:1] == ["revoke-tokens"]:
        return _revoke_tokens(args[1:])
    from pydantic import ValidationError

    try:
        settings = parse_settings(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        where = f"invalid setting {field}" if field else "invalid settings"
        print(f"streamkit-server: {where}: {message}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if settings.admin_password is not None:
        password = settings.admin_password.get_secret_value()
    else:
        password = secrets.token_urlsafe(18)
        print(
            f"streamkit-server: generated admin password for user "
            f"{settings.admin_username!r}: {password} "
            "(set STREAMKIT_SERVER_ADMIN_PASSWORD to choose one)",
            flush=True,
        )
    secret: bytes | None = None
    if settings.token_secret is not None:
        secret = settings.token_secret.get_secret_value().encode()
    else:
        log.info(
            "STREAMKIT_SERVER_TOKEN_SECRET is not set: bearer tokens are signed with the "
            "secret shared through Redis (created once, used by every coordinator process)"
        )
    if settings.insecure_member_api:
        log.warning(
            "INSECURE: --insecure-member-api is on; anyone who reaches this port can "
            "heartbeat, join or leave for any member id. Use it for local development only"
        )
    from streamkit_server.serve import serve  # uvicorn, FastAPI, redis-py: only to serve

    return serve(settings, password, secret)
