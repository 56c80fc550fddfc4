"""Code trees for benches that compare two commits in one run: this checkout, and a commit
checked out into a temporary `git worktree` (removed again afterwards).

    with checkout(args.base) as base:            # Path of the base commit's tree
        results = {args.base: measure(base), "this checkout": measure(ROOT)}

The server of either tree runs with this checkout's virtualenv (sys.executable): the commits
compared share their dependencies.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def short(commit: str) -> str:
    """The abbreviated hash of `commit` (a branch name, tag or hash)."""
    return subprocess.run(["git", "rev-parse", "--short", commit], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()


@contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """The tree of `commit` in a temporary detached worktree."""
    with tempfile.TemporaryDirectory(prefix="ctxlens-base-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
