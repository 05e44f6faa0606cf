"""The command line's parser, by what a user does: the verbs ``attnres --help`` lists, each shared flag
declared once (:data:`FLAGS`), the old names as hidden aliases for one round, and the argument types.

Nothing here imports torch: ``--help`` and usage errors answer without it, for every verb (``train``'s
options are read from the source of ``model.py``, ``train.py`` and ``experiments/specs.py`` with
:mod:`ast`, as the configurations' names are read from ``hf/configurations.py``). What each verb does
is in ``__main__.py``, one function per subcommand, given here as ``commands``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from .torchrun import check_device

PROG = "attnres"
PACKAGE = Path(__file__).parent
SHIPPED_CONFIGURED_MODEL = "smollm2-135m-instruct"  # the model of plan v4's shipped configurations store


# ---- argument types --------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _train_len(text: str) -> int:
    value = int(text)
    if value < 2:  # BCA's blocks are L/2 tokens, and a store's train_len is at least 2
        raise argparse.ArgumentTypeError(f"must be >= 2, got {value}")
    return value


def _threads(text: str) -> int:
    """A thread count in [0, 4 × the CPU count] (0: torch's default); more would only crash torch."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    most = 4 * (os.cpu_count() or 1)
    if value > most:
        raise argparse.ArgumentTypeError(f"must be at most {most} (4 x the {os.cpu_count() or 1} CPUs), got {value}")
    return value


def _lengths(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be numbers separated by commas, e.g. 1,2; got {text!r}") from None
    if not all(0 < v <= 64 for v in values):
        raise argparse.ArgumentTypeError(f"each length multiple must be in (0, 64], got {text!r}")
    return values


def _device(text: str) -> str:
    """A device torch can use here (:func:`torchrun.check_device`), refused as the arguments are read."""
    try:
        check_device(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _source(*parts: str) -> ast.Module:
    return ast.parse(PACKAGE.joinpath(*parts).read_text())


def _first_arguments(tree: ast.Module, call: str) -> list[str]:
    """The first literal argument of every call of ``call`` in ``tree``: a registry's names, in order."""
    return [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == call and node.args
    ]


def _literal(node: ast.expr):
    """A literal, or a module's constant named as ``module.NAME`` (a top-level literal of that package module)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        for statement in _source(f"{node.value.id}.py").body:
            if isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                if any(getattr(t, "id", None) == node.attr for t in targets):
                    return ast.literal_eval(statement.value)
    return ast.literal_eval(node)


def _configuration_names(text: str) -> list[str]:
    """NAME,... of the configurations registry (attnres_helpers/hf/configurations.py), checked without torch."""
    known = _first_arguments(_source("hf", "configurations.py"), "Configuration")
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        wrong = ", ".join(unknown) or repr(text)
        raise argparse.ArgumentTypeError(f"unknown configuration {wrong}; known: {', '.join(known)}")
    return names


def _study(text: str) -> str:
    if text not in STUDIES:
        raise argparse.ArgumentTypeError(f"unknown study {text!r}; known: {', '.join(STUDIES)}")
    return text


# ---- the shared flags, each declared once --------------------------------------------------------------

FLAGS: dict[str, tuple[str, dict]] = {
    "threads": ("--threads", dict(type=_threads, default=0, help="torch CPU threads; 0: torch's default")),
    "jobs": ("--jobs", dict(type=_positive_int, default=2, help="models trained at once (one thread each on a CPU)")),
    "device": ("--device", dict(type=_device, default="cpu", help="cpu, or cuda when available")),
    "windows": ("--windows", dict(type=_positive_int, default=None, help="held-out windows per length (at most)")),
    "store": ("--store", dict(default=None, help="keep the profiles in this store (without it, records are printed)")),
    "json": ("--json", dict(action="store_true", help="print every record as JSON")),
    "lengths": ("--lengths", dict(type=_lengths, default=None, help="multiples of L, e.g. 0.125,1,2")),
    "configuration": (
        "--configuration",
        dict(type=_configuration_names, default=None, help="NAME[,NAME...] of attnres_helpers/hf/configurations.py"),
    ),
    "work": ("--work", dict(default=None, help="the folder of resumable window work (default under runs/)")),
    "quiet": ("--quiet", dict(action="store_true", help="no progress bar")),
    "boundary": ("--boundary", dict(choices=("zero", "drop"), default="zero", help="R's boundary convention")),
    "bca": ("--bca", dict(type=_lengths, default=(), help="multiples of L also measured with BCA (blocks of L/2)")),
    "train_len": (
        "--train-len",
        dict(type=_train_len, default=None, help="L, the trained context (default: the config's context length)"),
    ),
    "method": ("--method", dict(choices=("fft", "explicit"), default="fft", help="how ŝ is computed from the capture")),
    "bos": (
        "--bos",
        dict(
            choices=("first", "none", "both"),
            default=None,
            help="with --store: BOS first in every window, none, or both forms (default: the registry's policy; none)",
        ),
    ),
    "per_head_up_to": (
        "--per-head-up-to",
        dict(type=_positive_int, default=2048, help="with --store: every head up to this length, the head mean beyond"),
    ),
    "log": ("--log", dict(default=None, help="append one line per finished window to this file")),
    "build_only": ("--build-only", dict(action="store_true", help="build the store from the finished windows only")),
    "drop": (
        "--drop",
        dict(action="append", default=[], metavar="RUN", help="take this run out of the store (repeatable)"),
    ),
    "extra_seeds": ("--extra-seeds", dict(action="store_true", help="also seeds 3 and 4 of RoPE-base and xPos-B")),
    "measure_only": ("--measure-only", dict(action="store_true", help="measure the finished runs only; train nothing")),
    "distributed": (
        "--distributed",
        dict(action="store_true", help="under torchrun --nproc-per-node N: each process its share of the runs (gloo)"),
    ),
    "length": ("--length", dict(type=_positive_int, default=512, help="tokens per window")),
    "at": ("--at", dict(type=_positive_int, default=100, help="the position the first token is moved to")),
    "names": (
        "--model",
        dict(
            dest="names", action="append", default=[], metavar="NAME", help="a registry model (repeatable; default all)"
        ),
    ),
}


def _add(p: argparse.ArgumentParser, *names: str, **changes) -> None:
    """The shared flags ``names`` on ``p``; ``changes`` replace one setting of every flag added (a default)."""
    for name in names:
        flag, settings = FLAGS[name]
        p.add_argument(flag, **{**settings, **changes})


# ---- measure: what each kind of MODEL takes ---------------------------------------------------------------

MEASURE_TAKES = {
    "checkpoints": {"lengths", "windows", "boundary", "json", "threads", "quiet"},
    "run": {"lengths", "windows", "boundary", "json", "threads", "quiet"},
    "transformers": {"lengths", "windows", "bca", "train_len", "method", "threads", "store", "work", "bos"}
    | {"per_head_up_to", "json", "quiet"},
    "configured": {"configuration", "windows", "threads", "device", "store", "work", "log", "build_only"}
    | {"json", "quiet"},
}
KIND_WORDS = {
    "checkpoints": "the shipped checkpoints",
    "run": "a run trained here",
    "transformers": "a transformers model",
    "configured": "--configuration",
}
MEASURE_FLAGS = [  # in the order --help lists them
    "lengths",
    "windows",
    "configuration",
    "store",
    "work",
    "json",
    "quiet",
    "threads",
    "device",
    "boundary",
    "bca",
    "train_len",
    "method",
    "bos",
    "per_head_up_to",
    "log",
    "build_only",
]
KIND_DEFAULTS = {"transformers": {"lengths": (1.0, 2.0), "windows": 4}, "configured": {"windows": 8}}


def model_kind(model: str | None, configuration: list[str] | None) -> str:
    """What ``attnres measure`` measures: the shipped checkpoints (no MODEL), a run trained here (a folder whose
    config.json is this project's: ``model`` and ``train``), a `transformers` model (a registry name, a
    folder, a hub name), or one under ``--configuration``."""
    if configuration:
        return "configured"
    if model is None:
        return "checkpoints"
    config = Path(model).expanduser() / "config.json"
    try:  # read only to choose the path, and only if small and regular; the path itself checks it again
        if not config.is_symlink() and config.is_file() and config.stat().st_size < 1 << 20:
            keys = json.loads(config.read_text())
            if isinstance(keys, dict) and {"model", "train"} <= keys.keys():
                return "run"
    except (OSError, ValueError):
        pass
    return "transformers"


# ---- reproduce: every shipped store and checkpoint, by study ----------------------------------------------

STUDIES = {  # study: (what it makes, the flags it takes)
    "default": ("the 15 shipped checkpoints and data/results/default.safetensors", {"jobs", "device", "drop"}),
    "family": ("notebook 05's family v1 (400 steps, exploratory)", {"jobs", "device", "drop"}),
    "family-v2": (
        "notebook 05's v2 family (plan v2)",
        {"jobs", "device", "drop", "extra_seeds", "measure_only", "distributed"},
    ),
    "hf": ("notebook 06's Llama, BLOOM and GPT-2, and data/hf_checkpoints/", {"jobs", "device"}),
    "pretrained": ("the real models' stores of notebook 07 (hours)", {"names", "threads"}),
    "configurations": (
        "plan v4: SmolLM2 under the configurations at L and 2L (hours)",
        {"configuration", "windows", "threads", "device", "work", "log", "quiet", "build_only"},
    ),
    "sinks": ("notebook 07's moved first token (minutes)", {"length", "at", "windows", "threads"}),
    "copy-control": ("the copy probe's scrambled control on notebook 03's checkpoints", {"threads"}),
    "figures": ("the explorers' default pictures in data/figures/", set()),
}
REPRODUCE_FLAGS = sorted(set().union(*(takes for _, takes in STUDIES.values())))
STUDY_WINDOWS = 8  # plan v4's windows, and the sinks'


# ---- the old names, hidden for one round: old name -> (the new command, the study or verb whose flags it takes)
ALIASES = {
    "family": ("reproduce family", "family"),
    "family-v2": ("reproduce family-v2", "family-v2"),
    "hf-train": ("reproduce hf", "hf"),
    "measure-pretrained": ("reproduce pretrained", "pretrained"),
    "configurations": (
        "reproduce configurations` or `attnres measure MODEL --configuration NAME,...",
        "configurations",
    ),
    "sinks": ("reproduce sinks", "sinks"),
    "copy-control": ("reproduce copy-control", "copy-control"),
    "figures": ("reproduce figures", "figures"),
    "measure-hf": ("measure MODEL", "measure-hf"),
    "fetch-pretrained": ("fetch", "fetch"),
}


# ---- train's options, read without torch ------------------------------------------------------------------


def train_options() -> dict:
    """What ``train``'s options need, from the source: ModelConfig's fields (name, type, default), the presets'
    names, the trainable encodings, and train()'s defaults with the shipped TRAINING over them."""
    model, assigned = _source("model.py"), {}
    for node in model.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelConfig":
            for field in node.body:
                if isinstance(field, ast.AnnAssign) and field.value is not None:
                    default = _literal(field.value)
                    kind = type(default) if default is not None else {"float": float}[field.annotation.left.id]
                    assigned[field.target.id] = (kind, default)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PRESETS":
            presets = {key.value: call for key, call in zip(node.value.keys, node.value.values)}
    default_preset = {k.arg: _literal(k.value) for k in presets["default"].keywords}
    train_def = next(n for n in _source("train.py").body if isinstance(n, ast.FunctionDef) and n.name == "train")
    arguments = train_def.args.args[-len(train_def.args.defaults) :]
    defaults = {a.arg: _literal(d) for a, d in zip(arguments, train_def.args.defaults)}
    specs = _source("experiments", "specs.py")
    training = next(
        ast.literal_eval(n.value) for n in specs.body if isinstance(n, ast.Assign) and n.targets[0].id == "TRAINING"
    )
    return {
        "fields": assigned,
        "presets": list(presets),
        "default_preset": {name: default_preset.get(name, d) for name, (_, d) in assigned.items()},
        "encodings": _first_arguments(_source("encoding_registry.py"), "TrainableEncoding"),
        "defaults": defaults | training,  # the shipped models' training over train()'s own defaults
    }


def _add_train(subparsers, func: Callable) -> None:
    p = subparsers.add_parser(
        "train", help="train one model on the shipped corpus", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    options = train_options()
    defaults = options["defaults"]
    p.add_argument("--preset", choices=options["presets"], default="default", help="model preset")
    p.add_argument("--seed", type=int, default=defaults["seed"], help="weight init and batch order")
    p.add_argument("--steps", type=int, default=defaults["steps"], help="optimiser steps")
    p.add_argument("--batch-tokens", type=int, default=defaults["batch_tokens"], help="tokens a step")
    p.add_argument("--lr", type=float, default=defaults["lr"], help="peak learning rate")
    p.add_argument("--warmup", type=int, default=defaults["warmup"], help="linear warmup steps")
    p.add_argument("--weight-decay", type=float, default=defaults["weight_decay"], help="AdamW, matrices only")
    p.add_argument("--checkpoint-every", type=int, default=defaults["checkpoint_every"], help="0: never")
    p.add_argument("--out", default=None, help="run directory; None: runs/<preset>-<encoding>-L<len>-seed<seed>")
    p.add_argument(
        "--no-resume", action="store_true", help="start afresh even if --out holds a checkpoint or a finished run"
    )
    _add(p, "device", "threads", "quiet")
    model = p.add_argument_group("model config (overrides the preset)")
    for name, (kind, _) in options["fields"].items():
        if name != "vocab_size":
            model.add_argument(
                f"--{name.replace('_', '-')}",
                type=kind,
                default=argparse.SUPPRESS,
                choices=options["encodings"] if name == "encoding" else None,
                help=f"the preset's if omitted (default preset: {options['default_preset'][name]})",
            )
    p.set_defaults(func=func)


# ---- the parser -------------------------------------------------------------------------------------------


class OneLineErrorParser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit status 2 (``--help`` still prints the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _add_measure(subparsers, func: Callable) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "measure",
        help="measure a model: the shipped checkpoints, a run, a registry model, a transformers folder",
        description="Measure MODEL at lengths and print its records (or, with --store, keep its profiles). "
        "MODEL: none for the shipped checkpoints (verified, measured again as the shipped store keeps them); a run "
        "folder trained here (attnres train); a registry name (attnres_helpers/hf/models.py, fetched by attnres "
        "fetch); a transformers folder or a hub name; with --configuration, a RoPE model under those training-free "
        "configurations at L and 2L (window files under --work, resumable). Defaults by MODEL: --lengths 1,2,4 and "
        "--windows 32 for ours, 1,2 and 4 for a transformers model, L and 2L and 8 with --configuration.",
    )
    p.add_argument("model", nargs="?", default=None, metavar="MODEL", help="what to measure (see above)")
    _add(p, *MEASURE_FLAGS)
    p.set_defaults(func=func)
    return p


def _add_reproduce(subparsers, func: Callable) -> argparse.ArgumentParser:
    studies = "; ".join(f"{name}: {what}" for name, (what, _) in STUDIES.items())
    p = subparsers.add_parser(
        "reproduce",
        help="train and measure every shipped store and checkpoint, by study (resumable)",
        description=f"Make the shipped stores and checkpoints of each STUDY again (default: default). {studies}.",
    )
    p.add_argument("studies", nargs="*", type=_study, metavar="STUDY", help=", ".join(STUDIES))
    for name in REPRODUCE_FLAGS:
        takers = ", ".join(study for study, (_, takes) in STUDIES.items() if name in takes)
        _add(p, name, help=f"{FLAGS[name][1]['help']} ({takers})")
    p.set_defaults(func=func, windows=STUDY_WINDOWS, model=SHIPPED_CONFIGURED_MODEL, store=None)
    return p


def _add_alias(subparsers, old: str, commands: Mapping[str, Callable]) -> None:
    """An old name: its own flags as before, and one line on stderr that names the new command."""
    new, like = ALIASES[old]
    p = subparsers.add_parser(old)  # no help: not listed by --help
    if like == "measure-hf":
        p.add_argument("--model", required=True, help="a registry model, a local model folder, or a hub name")
        _add(p, *[n for n in MEASURE_FLAGS if n in MEASURE_TAKES["transformers"]])
        p.set_defaults(func=commands["measure-hf"], **KIND_DEFAULTS["transformers"])
    elif like == "fetch":
        _add_fetch_arguments(p)
        p.set_defaults(func=commands["fetch"])
    else:
        takes = sorted(STUDIES[like][1] - {"names", "configuration"})
        _add(p, *takes)
        if like == "pretrained":
            p.add_argument("names", nargs="*", metavar="NAME", help="registry names (default: all)")
        if like == "configurations":
            p.add_argument("--model", default=SHIPPED_CONFIGURED_MODEL, help="a registry name or a transformers folder")
            _add(p, "store")
            p.add_argument(
                "--only", dest="configuration", type=_configuration_names, help="NAME,...: as --configuration"
            )
        p.set_defaults(windows=STUDY_WINDOWS)
        p.set_defaults(func=commands[like], threads=1 if like == "copy-control" else 0)
    p.set_defaults(alias=f"`attnres {old}` is now `attnres {new}`; the old name goes after this round")


def _add_fetch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "names", nargs="*", metavar="NAME", help="registry names, e.g. gemma-3-270m (hf/models.py; default: all)"
    )
    p.add_argument("--force", action="store_true", help="convert again, replacing a converted folder that is there")


def parser(commands: Mapping[str, Callable]) -> tuple[argparse.ArgumentParser, dict]:
    """The parser, and each subcommand's parser by name; ``commands``: the function of each verb, study
    (reproduce's), and ``measure-hf`` (the transformers path of measure)."""
    main = OneLineErrorParser(prog=PROG, description="Attention resolution: train, measure, reproduce, read results.")
    subparsers = main.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands", parser_class=OneLineErrorParser
    )
    _add_train(subparsers, commands["train"])
    _add_measure(subparsers, commands["measure"])
    p = subparsers.add_parser("results", help="the records of a measurement store (no model is loaded)")
    p.add_argument("path", nargs="?", default=None, metavar="STORE", help="default data/results/default.safetensors")
    _add(p, "json", "boundary")
    _add(p, "store", help=argparse.SUPPRESS, dest="old_store")  # STORE's old spelling, for one round
    p.set_defaults(func=commands["results"])
    p = subparsers.add_parser("fetch", help="fetch and convert registry models into the model cache (once)")
    _add_fetch_arguments(p)
    p.set_defaults(func=commands["fetch"])
    _add_reproduce(subparsers, commands["reproduce"])
    p = subparsers.add_parser("design-time", help="design-time R per layer under configurations (seconds)")
    p.add_argument("--model", default=SHIPPED_CONFIGURED_MODEL, help="a registry name or a transformers folder")
    what = p.add_mutually_exclusive_group(required=True)  # print a configuration's R, or write the store
    _add(what, "configuration")
    _add(what, "store", help="write the design-time store here (data/results/design_time.safetensors is shipped)")
    _add(p, "lengths", help="multiples of L, each >= 1 (default 1,2)", default=(1.0, 2.0))
    p.add_argument("--pass-len", type=_positive_int, default=None, help="tokens of the pass as trained (default L)")
    _add(p, "threads")
    p.set_defaults(func=commands["design-time"])
    for old in ALIASES:
        _add_alias(subparsers, old, commands)
    return main, subparsers.choices


def _check_flags(p: argparse.ArgumentParser, args: argparse.Namespace, names, takes: set, what: str) -> None:
    """A flag given (not at its default) that ``what`` does not take is a usage error."""
    wrong = [
        FLAGS[n][0] for n in names if n not in takes and getattr(args, n) != p.get_default(FLAGS[n][1].get("dest", n))
    ]
    if wrong:
        p.error(f"{', '.join(wrong)} {'does' if len(wrong) == 1 else 'do'} not apply to {what}")


def parse(argv: list[str], commands: Mapping[str, Callable]) -> argparse.Namespace:
    """The arguments of ``argv``, every usage error answered (one line, status 2) before any command runs."""
    main, subparsers = parser(commands)
    args = main.parse_args(argv)
    p = subparsers[args.command]
    if args.command == "measure":
        args.kind = model_kind(args.model, args.configuration)
        _check_flags(p, args, MEASURE_FLAGS, MEASURE_TAKES[args.kind], KIND_WORDS[args.kind])
        for name, value in KIND_DEFAULTS.get(args.kind, {}).items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    elif args.command == "reproduce":
        args.studies = list(dict.fromkeys(args.studies or ["default"]))
        takes = set().union(*(STUDIES[s][1] for s in args.studies))
        _check_flags(
            p,
            args,
            REPRODUCE_FLAGS,
            takes,
            ("the study " if len(args.studies) == 1 else "the studies ") + ", ".join(args.studies),
        )
    elif args.command == "results":
        if args.old_store is not None and args.path is not None:
            p.error("give the store once: STORE (--store is its old spelling)")
        if args.old_store is not None:
            args.path, args.alias = args.old_store, "`attnres results --store STORE` is now `attnres results STORE`"
    if getattr(args, "alias", None):
        print(args.alias, file=sys.stderr)
    return args
