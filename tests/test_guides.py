"""The user guides cannot drift from the code.

* every ``STREAMKIT_*`` client setting is in the settings table of
  ``docs/consumer.md`` with its real default, and nothing else is;
* every option of ``@app.stream_listener`` is in the consumer guide's options
  table with its real default;
* the routing vectors and the routing settings in ``docs/producer.md`` match
  ``shard_for_key`` and ``StreamKitSettings``;
* ``docs/getting-started.md`` shows the README's commands exactly;
* a newcomer following ``docs/getting-started.md`` literally reaches a handled
  message: its commands and snippets run in order in an empty home directory
  (the only test here that needs ``redis-server``).
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import assert_same_settings, setting_row, table_cells, table_rows
from pydantic_core import PydanticUndefined

from streamkit.app import StreamKit
from streamkit.routing import shard_for_key
from streamkit.settings import StreamKitSettings
from streamkit.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONSUMER = DOCS / "consumer.md"
PRODUCER = DOCS / "producer.md"
GETTING_STARTED = DOCS / "getting-started.md"
README = ROOT / "README.md"

_CLIENT_SETTING = re.compile(r"STREAMKIT_(?!SERVER_)[A-Z0-9_]+")


def _env(name: str) -> str:
    return f"STREAMKIT_{name.upper()}"


def _documented_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# -- the consumer guide's settings table ---------------------------------------------------


def _settings_rows() -> dict[str, list[str]]:
    return table_rows(CONSUMER, _CLIENT_SETTING)


def test_every_client_setting_is_in_the_consumer_guide() -> None:
    expected = [_env(name) for name in StreamKitSettings.model_fields]
    assert_same_settings(_settings_rows(), expected, "docs/consumer.md")


@pytest.mark.parametrize("name", sorted(StreamKitSettings.model_fields))
def test_client_setting_row_matches_the_code(name: str) -> None:
    page = "the settings table of docs/consumer.md"
    _, default, meaning = setting_row(_settings_rows(), _env(name), page, 3)
    assert meaning, f"{_env(name)} has no description"
    field = StreamKitSettings.model_fields[name]
    if field.default_factory is not None:
        assert default, f"{_env(name)}: describe the computed default"
        return
    assert field.default is not PydanticUndefined, f"{name} has no default"
    assert default == _documented_default(field.default), (
        f"{_env(name)}: docs say default {default!r}, settings.py has {field.default!r}"
    )


# -- the consumer guide's listener options ---------------------------------------------------

_LISTENER_OPTIONS = {
    name: parameter
    for name, parameter in inspect.signature(StreamKit.stream_listener).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("stream_prefix", "group")
}


def test_listener_options_are_known() -> None:
    # Guards the table check below against a signature it cannot see.
    assert {"concurrency", "batch_size", "ordered", "auto_ack"} <= set(_LISTENER_OPTIONS)


@pytest.mark.parametrize("name", sorted(_LISTENER_OPTIONS))
def test_listener_option_is_documented(name: str) -> None:
    rows = table_rows(CONSUMER, re.compile(re.escape(name)))
    assert name in rows, f"docs/consumer.md lacks a row for the listener option {name!r}"
    row = rows[name]
    assert len(row) == 3 and row[2], f"row of {name!r} should be: option | default | meaning"
    assert row[1] == repr(_LISTENER_OPTIONS[name].default), (
        f"{name}: docs say default {row[1]!r}, the code has {_LISTENER_OPTIONS[name].default!r}"
    )


# -- the producer guide ----------------------------------------------------------------------


def _vector_rows() -> dict[str, list[str]]:
    return table_rows(PRODUCER, re.compile(r'"[^"]*"'))


def test_routing_vectors_match_shard_for_key() -> None:
    rows = _vector_rows()
    header = next(
        table_cells(line)
        for line in PRODUCER.read_text(encoding="utf-8").splitlines()
        if line.startswith("| partition key |")
    )
    counts = [int(cell.split()[0]) for cell in header[1:]]
    assert counts == [3, 7, 8, 16, 100]
    assert len(rows) == 6, rows
    for cell, row in rows.items():
        key = ast.literal_eval(cell)
        expected = [shard_for_key(key, n) for n in counts]
        assert [int(c) for c in row[1:]] == expected, f"vector {cell}: {row[1:]} != {expected}"


@pytest.mark.parametrize("name", ["routing_refresh_interval", "routing_lease"])
def test_routing_settings_in_the_producer_guide(name: str) -> None:
    row = table_rows(PRODUCER, re.compile(re.escape(_env(name)))).get(_env(name))
    assert row is not None, f"docs/producer.md lacks {_env(name)}"
    assert row[1] == _documented_default(StreamKitSettings.model_fields[name].default)


# -- getting started -----------------------------------------------------------------------


def _bash_blocks(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return re.findall(r"^```bash\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def test_getting_started_shows_the_readme_commands_exactly() -> None:
    readme = _bash_blocks(README)
    assert len(readme) >= 2, "README.md should have the setup and the test command"
    guide = _bash_blocks(GETTING_STARTED)
    for block in readme:
        assert block in guide, f"docs/getting-started.md lacks README's command:\n{block}"


# -- getting started, followed literally ---------------------------------------------------

_DIRECTIVE = re.compile(r"<!-- guide: (?P<what>.*?) -->")
_BLOCK = re.compile(r"^```(?P<lang>\w+)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class GuideStep:
    lang: str
    source: str
    #: The ``<!-- guide: ... -->`` line right before the block, if any.
    directive: str


#: The guide's two walk-throughs, in the order a reader follows them.
_SECTIONS = (
    ("## Your first app, in one command", "## What the demo shows"),
    ("## How production runs", "## Where to go next"),
)


def _walkthrough(section: int) -> list[GuideStep]:
    """The bash and python blocks of one walk-through of the guide, in order."""
    text = GETTING_STARTED.read_text(encoding="utf-8")
    first, after = _SECTIONS[section]
    start = text.index(first)
    end = text.index(after)
    steps = []
    for match in _BLOCK.finditer(text, start, end):
        if match["lang"] not in ("bash", "python"):
            continue
        before = text[: match.start()].rstrip().splitlines()[-1]
        directive = _DIRECTIVE.fullmatch(before.strip())
        steps.append(
            GuideStep(match["lang"], match["body"], directive["what"] if directive else "")
        )
    return steps


def test_walkthrough_parser_sees_the_guide() -> None:
    local, production = _walkthrough(0), _walkthrough(1)
    assert local[0].directive == production[0].directive == "every-terminal"
    assert [s.directive for s in local if s.lang == "python"] == [
        "file myapp.py",
        "file publish.py",
    ]
    assert [s.directive for s in production if s.lang == "python"] == ["file publish_again.py"]
    assert sum(s.directive.startswith("background") for s in local) == 1
    assert sum(s.directive.startswith("background") for s in production) == 3


class _Walk:
    """Runs guide steps the way a reader would, in terminals sharing one home."""

    def __init__(self, home: Path, ports: dict[str, str]) -> None:
        self.home = home
        self.ports = ports
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("STREAMKIT_", "VIRTUAL_ENV"))
        }
        self.env["HOME"] = str(home)
        self.env["PYTHONUNBUFFERED"] = "1"
        self.terminal = ""  # the lines every terminal runs first
        self.background: list[tuple[subprocess.Popen[bytes], Path]] = []

    def text(self, source: str) -> str:
        # The guide's fixed ports may be taken on a shared machine.
        for literal, port in self.ports.items():
            source = source.replace(literal, port)
        return source

    def bash(self, source: str) -> str:
        script = f"set -e\n{self.terminal}\n{self.text(source)}"
        result = subprocess.run(
            ["bash", "-c", script], env=self.env, capture_output=True, text=True, timeout=120
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"step failed:\n{source}\n{output}"
        assert '"errorCode"' not in output, f"step answered an error:\n{source}\n{output}"
        return output

    def start(self, source: str, ready: str) -> tuple[subprocess.Popen[bytes], Path]:
        command = self.text(source).strip()
        log = self.home / f"terminal-{len(self.background)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", f"set -e\n{self.terminal}\n{command}"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.background.append((proc, log))
        self.wait_for(log, [ready], proc, what=command)
        return proc, log

    def wait_for(
        self, log: Path, needles: list[str], proc: subprocess.Popen[bytes], what: str
    ) -> None:
        deadline = time.monotonic() + 60
        while True:
            text = log.read_text(errors="replace")
            if all(n in text for n in needles):
                return
            assert proc.poll() is None, f"{what} exited ({proc.returncode}):\n{text}"
            assert time.monotonic() < deadline, f"{what}: no {needles} within 60 s:\n{text}"
            time.sleep(0.1)

    def stop_all(self) -> None:
        for proc, _ in reversed(self.background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


@pytest.mark.redis  # starts redis-server and streamkit-server as the guide says
@pytest.mark.skipif(
    not (ROOT / ".venv" / "bin" / "activate").exists(),
    reason="the guide activates the checkout's .venv; run scripts/setup.sh first",
)
def test_getting_started_followed_literally_handles_messages(tmp_path: Path) -> None:
    """Both walk-throughs, one after the other in one home: ``streamkit dev``,
    then the four processes of "How production runs" with the same files."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "streamkit").symlink_to(ROOT)  # the guide's ~/streamkit checkout
    walk = _Walk(home, {"6379": str(free_port()), "8080": str(free_port())})
    workdir = home / "hello-streamkit"
    try:
        dev = _walk_section(walk, 0, workdir)
        # "Stop it": Ctrl-C drains the app, then stops the coordinator and Redis.
        proc, log = dev
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()
        text = log.read_text()
        assert "left the group" in text and "stopped the app" in text, text
        assert not (workdir / ".env").exists(), "streamkit dev left its .env behind"
        _assert_ports_closed(text)
        listener = _walk_section(walk, 1, workdir)
        proc, log = listener
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 0, log.read_text()
        assert "left the group" in log.read_text()
        assert not (workdir / "dump.rdb").exists(), "the throwaway Redis wrote dump.rdb"
    finally:
        walk.stop_all()


def _walk_section(walk: _Walk, section: int, workdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Run one walk-through's steps; the listener process (left running)."""
    listener: tuple[subprocess.Popen[bytes], Path] | None = None
    for step in _walkthrough(section):
        if step.directive == "every-terminal":
            walk.bash(step.source)  # works on its own ...
            walk.terminal = walk.text(step.source)  # ... and starts every terminal
            if section == 0:
                assert workdir.is_dir() and not any(workdir.iterdir()), "not an empty directory"
        elif step.directive.startswith("file "):
            (workdir / step.directive.removeprefix("file ")).write_text(step.source)
        elif step.directive.startswith("background "):
            ready = shlex.split(step.directive.removeprefix("background "))[0]
            started = walk.start(step.source, ready)
            if "streamkit run" in step.source or "streamkit dev" in step.source:
                listener = started
        else:
            assert step.lang == "bash" and not step.directive, step
            output = walk.bash(step.source)
            _check_step(walk, step.source, output, listener)
    assert listener is not None, "the guide never runs a listener"
    return listener


def _check_step(
    walk: _Walk, source: str, output: str, listener: tuple[subprocess.Popen[bytes], Path] | None
) -> None:
    """What the guide says a command shows, it shows."""
    if "streamkit publish" in source or "python publish" in source:
        assert listener is not None, "the guide publishes before a listener runs"
    if "streamkit publish" in source:
        assert listener is not None and "published to greetings:" in output, output
        walk.wait_for(listener[1], ["hello, ada"], listener[0], "the listener")
    elif "python publish.py" in source:
        assert listener is not None and output.count("PublishResult(") == 3, output
        names = ["hello, ada", "hello, grace", "hello, linus"]
        walk.wait_for(listener[1], names, listener[0], "the listener")
    elif "python publish_again.py" in source:
        assert listener is not None
        walk.wait_for(listener[1], ["hello again, ada"], listener[0], "the listener")
    elif "streamkit status" in source:
        assert "shard 3 key=greetings:3" in output and "member " in output, output
    elif "streamkit stream create" in source:
        assert "created stream 'greetings' with 4 shards" in output, output
        assert "created group 'printer'" in output, output


def _assert_ports_closed(dev_log: str) -> None:
    """The private Redis and the coordinator ``streamkit dev`` announced are gone."""
    ports = re.findall(r"127\.0\.0\.1:(\d+)", dev_log.split("\n", 1)[0])
    assert len(ports) == 2, dev_log
    for port in ports:
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", int(port))) != 0, f"port {port} still open"
