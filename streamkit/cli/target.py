"""``module:attribute`` -> the ``StreamKit`` app it names, or one line saying why not."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from streamkit.errors import StreamkitError

if TYPE_CHECKING:
    from streamkit.app import StreamKit

__all__ = ["TargetError", "load_app", "parse_target"]


class TargetError(StreamkitError):
    """``module:app`` does not name a StreamKit app, or importing it failed."""


def parse_target(target: str, command: str = "run") -> tuple[str, str]:
    """``(module, attribute)`` of ``module:attribute``, checked without importing
    anything: a file name or a module that is not there fails here, before a
    command starts what the app needs (``streamkit dev``).

    ``command`` is only used in the hint for a file name (``streamkit run x:app``).
    """
    module_name, _, attribute = target.partition(":")
    attribute = attribute or "app"
    if module_name.endswith(".py") or "/" in module_name:
        # A file name, as for `python myapp.py`: say which import path it means.
        dotted = module_name.removesuffix(".py").strip("./").replace("/", ".")
        raise TargetError(
            f"{target!r} is a file name; name the module and its app instead: "
            f"streamkit {command} {dotted}:{attribute}"
        )
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise TargetError(f"{target!r} is not an import path; expected 'module:app'")
    if str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    top = module_name.split(".")[0]
    if top not in sys.modules and importlib.util.find_spec(top) is None:
        raise TargetError(
            f"cannot import module {module_name!r}: No module named {top!r} (run from the "
            "directory that holds it, or put that directory on PYTHONPATH)"
        )
    return module_name, attribute


def load_app(target: str, command: str = "run") -> StreamKit:
    """Import ``module:attribute`` (the current directory is importable)."""
    module_name, attribute = parse_target(target, command)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + ".")
        ):
            raise TargetError(
                f"cannot import module {module_name!r}: {exc} (run from the directory that "
                "holds it, or put that directory on PYTHONPATH)"
            ) from None
        raise _import_failed(module_name, exc) from exc
    except Exception as exc:
        raise _import_failed(module_name, exc) from exc
    from streamkit.app import StreamKit

    app: object = module
    for part in attribute.split("."):
        try:
            app = getattr(app, part)
        except AttributeError:
            raise TargetError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(app, StreamKit):
        raise TargetError(
            f"{target!r} is a {type(app).__name__}, not a streamkit.StreamKit application"
        )
    return app


def _import_failed(module_name: str, exc: BaseException) -> TargetError:
    """Importing the target raised: where in the user's code, and what.

    A streamkit error (a listener the framework cannot call, an invalid
    setting) carries its own fix; anything else is the module's own bug, for
    which ``STREAMKIT_DEBUG=1`` shows the traceback.
    """
    where = _user_frame(exc)
    prefix = f"{where}: " if where else f"importing {module_name!r}: "
    if isinstance(exc, StreamkitError):
        return TargetError(f"{prefix}{exc}")
    if isinstance(exc, SyntaxError):
        location = f"{_shown(exc.filename or '?')}:{exc.lineno}"
        return TargetError(f"{location}: {exc.msg} (importing {module_name!r})")
    return TargetError(
        f"{prefix}{type(exc).__name__}: {exc} (importing {module_name!r} failed; "
        "STREAMKIT_DEBUG=1 shows the traceback)"
    )


def _user_frame(exc: BaseException) -> str:
    """``file:line`` of the deepest frame outside Python, installed packages and
    streamkit (the user's line that declared or did what failed), if any."""
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.add(str(Path(__file__).resolve().parents[1]))  # the streamkit package
    library = tuple(str(Path(d).resolve()) + os.sep for d in dirs)
    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.startswith("<"):
            continue
        if not str(Path(frame.filename).resolve()).startswith(library):
            found = f"{_shown(frame.filename)}:{frame.lineno}"
    return found


def _shown(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path
