"""Writing a file whole or not at all, without following what another process left in its way.

Offers: ``write_text_atomically(path, text) -> Path``: ``text`` goes to a new temporary file
created beside ``path`` (``mkstemp``: a fresh random name, created exclusively; the file keeps
its mode 0600), is fsynced, then renamed over ``path``. A reader sees the old file or the new one,
never a torn one. A fixed temporary name (``summary.json.tmp``) would be opened through a symlink
planted under it, and the write would land in the symlink's target; a fresh exclusive name
cannot be planted beforehand, and the rename replaces a symlink at ``path`` itself instead of
writing through it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomically(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (module doc); its directory is created."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
