"""Write ``docs/api.md`` from the coordinator's real OpenAPI document.

Run from the repository root after changing an endpoint or a wire model::

    .venv/bin/python scripts/gen_api_docs.py          # rewrite docs/api.md
    .venv/bin/python scripts/gen_api_docs.py --check  # exit 1 if it is out of date

The app is built in-process with ``streamkit_server.create_app``; nothing
connects to Redis (that only happens in the app's lifespan, which is never
started here). ``tests/test_docs.py`` fails when the committed page differs
from what this script produces, so the reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "api.md"

_METHOD_ORDER = ("get", "post", "put", "patch", "delete")


def build_app() -> Any:
    """The FastAPI app with placeholder secrets; Redis is never contacted."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from streamkit_server import ServerSettings, create_app

    # Only defaults that do not depend on the environment appear in the output.
    settings = ServerSettings.model_construct()
    return create_app(settings, admin_password="unused", token_secret=b"unused")


# -- access rules, from the access matrix ---------------------------------


def _access(route: Any, operation: dict[str, Any]) -> str:
    # The one matrix every route consults (streamkit_server/auth/access.py).
    from streamkit_server.auth.access import ROUTE_ROLES
    from streamkit_server.auth.security import Role

    role = ROUTE_ROLES[route.operation_id]
    if role is Role.MEMBER:
        return (
            "Basic or Bearer, role `MEMBER` (open only with the unsafe "
            "`STREAMKIT_SERVER_INSECURE_MEMBER_API=true`)"
        )
    if role is not None:
        return f"Basic or Bearer, role `{role}`"
    if operation.get("security") == []:
        return "none"
    return "none (credentials are optional)"


def _api_routes(routes: Iterable[Any]) -> Iterable[Any]:
    """Every ``APIRoute``, also inside included routers (newer FastAPI keeps
    them wrapped instead of copying them into ``app.routes``)."""
    from fastapi.routing import APIRoute

    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif getattr(route, "original_router", None) is not None:
            yield from _api_routes(route.original_router.routes)
        elif getattr(route, "routes", None) is not None:
            yield from _api_routes(route.routes)


def _access_rules(app: Any) -> dict[str, str]:
    """operationId -> who may call it."""
    schema = app.openapi()
    operations = {
        op["operationId"]: op
        for item in schema["paths"].values()
        for op in item.values()
        if isinstance(op, dict) and "operationId" in op
    }
    rules: dict[str, str] = {}
    for route in _api_routes(app.routes):
        operation = operations.get(route.operation_id or "")
        if operation is not None:
            rules[route.operation_id] = _access(route, operation)
    missing = sorted(set(operations) - set(rules))
    if missing:
        raise RuntimeError(f"no route found for operations {missing}; update _api_routes")
    return rules


# -- schema rendering -----------------------------------------------------------------


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _link(name: str) -> str:
    return f"[`{name}`](#{name.lower()})"


def type_of(schema: dict[str, Any] | None, *, link: bool = True) -> str:
    """A short, human type for a JSON schema fragment."""
    if not schema:
        return "any JSON"
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return _link(name) if link else f"`{name}`"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [type_of(s, link=link) for s in schema[key]]
            return " or ".join(dict.fromkeys(parts))
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return type_of(schema["allOf"][0], link=link)
    if "enum" in schema:
        return "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {type_of(schema.get('items'), link=link)}"
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return f"object of {type_of(extra, link=link)}"
        return "object"
    if kind == "null":
        return "null"
    if kind is None:
        return "any JSON"
    text = f"`{kind}`"
    if "format" in schema:
        text += f" ({schema['format']})"
    return text


def _constraints(schema: dict[str, Any]) -> str:
    notes = []
    for key, label in (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("minLength", "min length"),
        ("maxLength", "max length"),
    ):
        if key in schema:
            notes.append(f"{label} {_scalar(schema[key])}")
    for option in schema.get("anyOf", ()):
        if isinstance(option, dict) and option.get("type") != "null":
            notes.extend(n for n in _constraints(option).split("; ") if n)
    if "default" in schema:
        notes.append(f"default `{_scalar(schema['default'])}`")
    return "; ".join(dict.fromkeys(notes))


def _scalar(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# -- page ---------------------------------------------------------------------------------


HEADER = """\
# HTTP API reference

<!-- Generated by scripts/gen_api_docs.py from the coordinator's OpenAPI
document. Do not edit by hand: change the code, then run
`.venv/bin/python scripts/gen_api_docs.py`. tests/test_docs.py fails when this
page and the code disagree. -->

This page is generated from the OpenAPI document of `streamkit_server`
(title *{title}*, version `{version}`). A running coordinator serves the same
document live at `/openapi.json`, with an interactive explorer at `/docs`
when `STREAMKIT_SERVER_API_EXPLORER=true` (it loads scripts from a CDN);
both are unauthenticated, like `/healthz`, `/livez` and `/readyz`; these and
`/metrics` (role `READ`) are left out
of the document.

Conventions that hold for every operation below:

- Paths, `operationId`s, JSON field names (camelCase) and enum values are those
  of the `/coord/v1` contract of the JVM coordinator, so clients of either
  server work against both.
- Every error body is an [`ErrorResponse`](#errorresponse):
  `{{"status": "<HTTP code as a string>", "errorCode": ..., "message": ...}}`.
  The error codes are listed in
  [Coordinator operations](operations.md#error-codes).
- A request that fails validation is answered `400` with errorCode
  `INVALID_REQUEST` (or `MALFORMED_JSON`), and the document declares that
  `400` (FastAPI's default `422 HTTPValidationError` is removed). A `422` is
  only sent as an `ErrorResponse` for the rule refusals listed per operation.
- *Access* is from the endpoint → role matrix (`streamkit_server/auth/access.py`):
  the role a caller needs,
  sent as HTTP Basic credentials or as a bearer token from
  `loginCoordinatorApi`. See
  [authentication](operations.md#authentication).
"""


def render(app: Any) -> str:
    schema = app.openapi()
    access = _access_rules(app)
    out: list[str] = [
        HEADER.format(title=schema["info"]["title"], version=schema["info"]["version"])
    ]

    # Operations grouped by their first tag, in the order the app declares them.
    groups: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in schema["paths"].items():
        for method in _METHOD_ORDER:
            operation = item.get(method)
            if operation is not None:
                tag = (operation.get("tags") or ["Other"])[0]
                groups.setdefault(tag, []).append((method, path, operation))

    out.append("## Operations\n")
    out.append("| tag | method | path | operationId |")
    out.append("|---|---|---|---|")
    for tag, operations in groups.items():
        for method, path, operation in operations:
            out.append(f"| {tag} | `{method.upper()}` | `{path}` | `{operation['operationId']}` |")
    out.append("")

    for tag, operations in groups.items():
        out.append(f"## {tag}\n")
        for method, path, operation in operations:
            out.extend(_operation(method, path, operation, access[operation["operationId"]]))

    out.append("## Schemas\n")
    out.append(
        "Every component schema of the document, in alphabetical order. "
        "*required* marks fields a body must carry.\n"
    )
    for name, component in sorted(schema.get("components", {}).get("schemas", {}).items()):
        out.extend(_component(name, component))
    return "\n".join(out).rstrip() + "\n"


def _operation(method: str, path: str, op: dict[str, Any], access: str) -> list[str]:
    lines = [f"### `{op['operationId']}`\n", f"`{method.upper()} {path}`\n"]
    if op.get("summary"):
        lines.append(f"{op['summary']}.\n")
    lines.append("| | |")
    lines.append("|---|---|")
    lines.append(f"| operationId | `{op['operationId']}` |")
    lines.append(f"| access | {_cell(access)} |")
    body = op.get("requestBody")
    if body is not None:
        body_schema = body.get("content", {}).get("application/json", {}).get("schema")
        required = "required" if body.get("required") else "optional"
        lines.append(f"| request body | {type_of(body_schema)} ({required}) |")
    else:
        lines.append("| request body | none |")
    lines.append("")

    params = op.get("parameters", [])
    if params:
        lines.append("| parameter | in | type | required | constraints |")
        lines.append("|---|---|---|---|---|")
        for param in params:
            p_schema = param.get("schema", {})
            lines.append(
                f"| `{param['name']}` | {param['in']} | {_cell(type_of(p_schema))} | "
                f"{'yes' if param.get('required') else 'no'} | "
                f"{_cell(_constraints(p_schema)) or ' '} |"
            )
        lines.append("")

    lines.append("| status | body | description |")
    lines.append("|---|---|---|")
    for status, response in sorted(op.get("responses", {}).items()):
        content = response.get("content", {}).get("application/json")
        shape = type_of(content.get("schema")) if content is not None else "none"
        lines.append(f"| `{status}` | {_cell(shape)} | {_cell(response.get('description', ''))} |")
    lines.append("")
    return lines


def _component(name: str, component: dict[str, Any]) -> list[str]:
    lines = [f"### {name}\n"]
    title = component.get("title")
    if title and title != name:
        lines.append(f"Schema title: `{title}`.\n")
    if "enum" in component:
        lines.append("Enum: " + ", ".join(f"`{v}`" for v in component["enum"]) + ".\n")
        return lines
    properties = component.get("properties", {})
    if not properties:
        lines.append(f"Type: {type_of(component)}.\n")
        return lines
    required = set(component.get("required", ()))
    lines.append("| field | type | required | constraints |")
    lines.append("|---|---|---|---|")
    for field, field_schema in properties.items():
        lines.append(
            f"| `{field}` | {_cell(type_of(field_schema))} | "
            f"{'yes' if field in required else 'no'} | "
            f"{_cell(_constraints(field_schema)) or ' '} |"
        )
    if component.get("additionalProperties") not in (None, False):
        lines.append("")
        lines.append("Additional fields are allowed.")
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is out of date")
    args = parser.parse_args(argv)
    text = render(build_app())
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date; run scripts/gen_api_docs.py")
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
