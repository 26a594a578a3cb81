"""Files two processes share: written whole (temporary name, then rename) and read whole (a
JSON-lines file's last line counts once its newline is there)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["read_json_lines", "write_atomically"]


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees no file or all of it, never a part."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSON-lines file another process appends to ([] if none yet)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    complete = data[: data.rfind(b"\n") + 1].decode("utf-8", errors="replace")
    return [json.loads(line) for line in complete.splitlines() if line.strip()]
