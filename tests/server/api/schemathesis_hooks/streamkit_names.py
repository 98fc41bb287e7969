"""Schemathesis hooks (``SCHEMATHESIS_HOOKS=streamkit_names``) for the stateful run.

Random path parameters are almost never valid stream or group names (the
server refuses braces, whitespace, control characters, '/', '%' and ':' in a
group), so nearly every create would be a 400 and no link would be followed.
Names are cleaned into valid ones; whatever else is generated stays as drawn.
The stateless run fuzzes names as they are.
"""

from __future__ import annotations

import re
from typing import Any

import schemathesis

_FORBIDDEN = re.compile(r"[\s{}/%:\x00-\x1f\x7f]")


@schemathesis.hook
def map_path_parameters(ctx: Any, path_parameters: dict[str, Any] | None) -> Any:
    if not path_parameters:
        return path_parameters
    for name in ("streamPrefix", "consumerGroup"):
        value = path_parameters.get(name)
        if isinstance(value, str):
            path_parameters[name] = _FORBIDDEN.sub("", value)[:200] or "s"
    return path_parameters
