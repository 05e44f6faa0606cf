"""attnres: a teaching companion for attention resolution (Sun et al. 2022, xPos).

The names below come from the teaching core (``metric``, ``encodings``), imported on first use (PEP 562)
so that the command line's ``--help`` and usage errors answer without importing torch."""

import importlib

_EXPORTS = {  # public name -> the module that defines it
    "DESIGN_CURVES": "encodings",
    "default_params": "encodings",
    "resolution_pair": "encodings",
    "score_curve": "encodings",
    "BOUNDARIES": "metric",
    "HEAD_MODES": "metric",
    "ScoreAccumulator": "metric",
    "average_resolution": "metric",
    "expected_scores": "metric",
    "layer_resolution": "metric",
    "resolution": "metric",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
