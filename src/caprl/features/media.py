"""The media files a features job reads: every one must be there before any is read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from caprl.errors import CaprlError


def require_media(records: Sequence[Mapping[str, Any]], root: Path, source: str, noun: str = "image",
                  id_name: str = "image") -> None:
    """Every record's ``file`` must exist under ``root``; else a CaprlError naming the first
    missing one (``noun``: image, GIF; ``id_name``: image, video) and how many of the shard are missing."""
    missing = [r for r in records if not (root / r["file"]).is_file()]
    if missing:
        first = missing[0]
        raise CaprlError(
            f"{root / first['file']}: {noun} not found ({id_name} id {first['id']} in "
            f"{source}); {len(missing)} of {len(records)} {noun}s of this shard are missing under {root}: restore "
            "them (re-download, or re-run caprl synthesize) or pass the right --image-root"
        )
