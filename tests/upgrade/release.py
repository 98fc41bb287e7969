"""The previous release, built from a pinned commit of this repository.

``previous_release()`` exports the commit with ``git archive`` and gives it a
virtualenv of its own, cached under ``~/.cache/streamkit-upgrade/<commit>``
(``STREAMKIT_UPGRADE_CACHE`` moves it), so only the first run pays.  Two kinds:

* ``isolated=True``: the release installed with its server extra from PyPI, its
  dependencies resolved as its own pyproject asks (85 to 171 s on the
  2-core machine, once);
* ``isolated=False``: a virtualenv without pip whose only content is a path
  file naming this interpreter's site-packages, so the old code runs on the
  current dependency versions (a second).  The path file adds the directory
  without processing the path files inside it, so this checkout's editable
  install (a finder those files install) stays out of the old processes.

Either way its processes run from the export (``cwd`` and ``PYTHONPATH`` are
the export), never from this checkout: ``python -m`` puts the working
directory first on ``sys.path``, and a process started from this tree would
import the current code under the old name.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]

#: The release the current tree must run beside (N-1).  d5b0b31 is main on
#: 2026-12-02 at 11:37, the last commit before the wave that drew member
#: epochs from the clock, added the epoch's version to member records and the
#: rollback witnesses (a0c4930 and after), and redesigned the client's layout
#: (issue 33): the formats that wave touched are what an upgrade crosses.
#: It already has the timings registry with "bound until" entries (2e4c45e).
PREVIOUS: Final = os.environ.get(
    "STREAMKIT_PREVIOUS_RELEASE", "d5b0b31b9eb80f67e8b526ac1b0063a60fe63b61"
)


@dataclass(frozen=True)
class Release:
    commit: str
    source: Path  # the exported tree (its tests/ hold the recording apps of its time)
    python: Path  # the virtualenv's interpreter
    build_s: float  # 0.0 when the cached build was reused

    def env(self) -> dict[str, str]:
        """What a process of this release needs on top of the test's environment."""
        return {"PYTHONPATH": str(self.source)}


def cache_root() -> Path:
    default = Path.home() / ".cache" / "streamkit-upgrade"
    return Path(os.environ.get("STREAMKIT_UPGRADE_CACHE", default))


def available(commit: str = PREVIOUS) -> bool:
    """Whether this clone holds ``commit`` (a shallow clone may not)."""
    try:
        resolve(commit)
    except RuntimeError:
        return False
    return True


def resolve(commit: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"commit {commit} is not in this clone ({out.stderr.strip()}); fetch main's "
            "history or set STREAMKIT_PREVIOUS_RELEASE"
        )
    return out.stdout.strip()


def previous_release(commit: str = PREVIOUS, *, isolated: bool = False) -> Release:
    """The release at ``commit``, built once per machine (a lock serialises builders)."""
    full = resolve(commit)
    root = cache_root() / full
    root.mkdir(parents=True, exist_ok=True)
    source = root / "src"
    venv = root / ("venv" if isolated else "venv-shared")
    done = venv.with_name(venv.name + ".built")
    # What the build is for: the shared kind points at this interpreter's
    # packages, and another checkout's virtualenv must not be borrowed.
    stamp = f"{full} {'isolated' if isolated else sysconfig.get_path('purelib')}\n"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists() and done.read_text() == stamp:
            return Release(full, source, venv / "bin" / "python", 0.0)
        began = time.monotonic()
        if not (source / "pyproject.toml").exists():
            shutil.rmtree(source, ignore_errors=True)
            source.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", "--format=tar", full],
                capture_output=True,
                check=True,
            )
            subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
        shutil.rmtree(venv, ignore_errors=True)
        python = venv / "bin" / "python"
        if isolated:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", f"{source}[server]"], check=True
            )
        else:
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
            site = subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            ours = sysconfig.get_path("purelib")
            Path(site, "streamkit-upgrade-deps.pth").write_text(f"{ours}\n")
        done.write_text(stamp)
        return Release(full, source, python, time.monotonic() - began)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--isolated"]
    release = previous_release(args[0] if args else PREVIOUS, isolated="--isolated" in sys.argv)
    print(f"{release.commit} -> {release.python} (built in {release.build_s:.1f} s)")
