"""The workers as Ray actors (`--ray [ADDRESS]`)."""

from __future__ import annotations

from types import ModuleType

from ..errors import require

RAY_HINT = "--ray needs Ray: pip install 'trtbisect[ray]'"


def require_ray() -> ModuleType:
    return require("ray", RAY_HINT)
