"""Set up Django for a bench script on a throw-away SQLite database and artifact sandbox."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def django_in_temp_dir() -> Path:
    """Point Django at a fresh temporary SQLite database and the local-memory cache, set it up,
    and return the temporary directory (the caller migrates what it needs)."""
    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="ctxlens-bench-"))
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=f"sqlite:///{work / 'bench.sqlite3'}",
        CTXLENS_ARTIFACT_DIR=str(work / "artifacts"),
        LOG_LEVEL="WARNING",
    )
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    return work
