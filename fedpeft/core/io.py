"""Writing files so that a kill never leaves half of one behind."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save to ``path`` through a temporary file, so a kill never leaves half a checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        torch.save(obj, handle, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)
