"""Build the byte-level English corpus from text that every CPython install carries.

Sources (both under the PSF License, like CPython itself):
  1. ``pydoc_data.topics.topics``: the reference-manual topics behind ``help()``, in sorted key order;
  2. docstrings of standard-library modules: each module's own docstring, then the docstrings of its
     public classes and functions (those defined in that module), then of their public methods.

Module names come from ``sys.stdlib_module_names`` (fixed for a Python version), plus the submodules of
the stdlib packages, all sorted, minus the ones with side effects on import or no English in them
(``SKIP_MODULES``). A module that fails to import on this machine is skipped and reported. Exact
duplicate docstrings are kept once. The output is deterministic for a given CPython version and build.

    python scripts/build_corpus.py            # writes data/corpus/corpus.txt.gz, prints its sha256

The sha256 is of the uncompressed UTF-8 text (gzip's bytes depend on the zlib version);
``attnres_helpers.data.CORPUS_SHA256`` must be updated if the corpus is rebuilt on a different Python.
"""

import argparse
import contextlib
import gzip
import hashlib
import importlib
import inspect
import io
import pkgutil
import platform
import sys
import warnings
from pathlib import Path

# Top-level modules or packages (and everything under them) left out: GUI/side effects on import
# (antigravity opens a browser, this prints, idlelib/tkinter/turtle need a display), the test suite,
# codec tables with no prose (encodings), deprecated trees, packaging helpers, and pydoc_data itself
# (added directly as source 1).
SKIP_MODULES = frozenset(
    {
        "antigravity",
        "this",
        "idlelib",
        "tkinter",
        "turtle",
        "turtledemo",
        "test",
        "lib2to3",
        "encodings",
        "ensurepip",
        "venv",
        "pydoc_data",
    }
)
# Submodules with one of these parts in their dotted name are skipped (test suites), as are private
# parts ("_x", "__main__": script entry points that run on import).
SKIP_PARTS = frozenset({"test", "tests"})

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "data" / "corpus" / "corpus.txt.gz"


def stdlib_module_names() -> list[str]:
    """Sorted public stdlib modules and their submodules, minus SKIP_MODULES and SKIP_PARTS."""
    top = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in SKIP_MODULES)
    names = []
    for name in top:
        names.append(name)
        module = _quiet_import(name)
        if module is not None and hasattr(module, "__path__"):
            subs = pkgutil.walk_packages(module.__path__, name + ".", onerror=lambda _: None)
            names.extend(s.name for s in subs)
    return sorted(
        n for n in set(names) if not SKIP_PARTS & set(n.split(".")) and not any(p.startswith("_") for p in n.split("."))
    )


def _quiet_import(name: str):
    """Import a module with stdout silenced; None if it fails to import."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return importlib.import_module(name)
    except Exception:  # ImportError, OSError, platform-specific failures: all mean "not on this machine"
        return None


def module_docstrings(module) -> list[str]:
    """The module's docstring, then its own public classes/functions, then their public methods."""
    docs = [module.__doc__]
    for attr, obj in sorted(vars(module).items()):
        if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        docs.append(obj.__doc__)
        if inspect.isclass(obj):
            docs.extend(
                member.__doc__
                for name, member in sorted(vars(obj).items())
                if not name.startswith("_") and (inspect.isroutine(member) or isinstance(member, property))
            )
    return [inspect.cleandoc(d) for d in docs if isinstance(d, str) and d.strip()]


def build_corpus() -> tuple[str, list[str], list[str]]:
    """Returns (text, modules used, modules skipped because they failed to import)."""
    from pydoc_data.topics import topics

    documents = [topics[key].strip() for key in sorted(topics)]
    used, failed = [], []
    with warnings.catch_warnings():  # deprecated modules warn on import or attribute access
        warnings.simplefilter("ignore")
        for name in stdlib_module_names():
            module = _quiet_import(name)
            if module is None:
                failed.append(name)
                continue
            used.append(name)
            documents.extend(module_docstrings(module))
    unique = list(dict.fromkeys(documents))  # drop exact duplicates, keep first-seen order
    return "\n\n".join(unique) + "\n", used, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output .txt.gz path")
    args = parser.parse_args()

    text, used, failed = build_corpus()
    raw = text.encode("utf-8")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as gz:
        gz.write(raw)
    print(f"python {platform.python_implementation()} {platform.python_version()} ({sys.platform})")
    print(f"modules used: {len(used)}; failed to import (skipped): {', '.join(failed) or 'none'}")
    print(f"wrote {args.out}: {len(raw):,} bytes uncompressed, {args.out.stat().st_size:,} bytes gzip")
    print(f"sha256 (uncompressed): {hashlib.sha256(raw).hexdigest()}")


if __name__ == "__main__":
    main()
