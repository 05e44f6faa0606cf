"""The command line: ``attnres --help`` lists the user's verbs and not the old names; every subcommand (verb
or hidden alias) prints its help, warning-free, and answers a usage error in one line, both without importing
torch; an old name says in one line on stderr which command it now is; ``attnres measure FOLDER`` measures a
`transformers` folder. As a real process (``python -m attnres_helpers``): a command runs, and a user error is
one line (every behaviour is tested in-process through ``main(argv)``, in each module's own tests)."""

import dataclasses
import inspect
import json
import re
import subprocess
import sys
import warnings

import pytest
from helpers import ROOT, tiny_llama_folder

from attnres_helpers import cli as cli_module

VERBS = ("train", "measure", "results", "fetch", "reproduce", "design-time")
ALIASES = tuple(cli_module.ALIASES)  # the old names, hidden for one round
COMMANDS = VERBS + ALIASES
# one usage error of each subcommand, answered by the parser
USAGE_ERRORS = {
    "train": ["--encoding", "rotary"],
    "measure": ["--bca", "2"],  # the shipped checkpoints are measured causal and with BCA at every length
    "results": ["--boundary", "middle"],
    "fetch": ["--force=yes"],
    "reproduce": ["sinks", "--jobs", "3"],  # sinks trains nothing
    "design-time": ["--configuration", "yarn-3"],
    "family": ["--device", "tpu"],
    "family-v2": ["--jobs", "0"],
    "hf-train": ["--jobs", "0"],
    "measure-pretrained": ["--threads", "-1"],
    "configurations": ["--only", "yarn-3"],
    "sinks": ["--at", "0"],
    "copy-control": ["--threads", "x"],
    "figures": ["--jobs", "1"],
    "measure-hf": ["--model", "m", "--train-len", "1"],
    "fetch-pretrained": ["--force=yes"],
}


def run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "attnres_helpers", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def without_torch(*argv: str) -> subprocess.CompletedProcess:
    """``main(argv)`` in a fresh interpreter, which exits 3 if torch was imported."""
    code = (
        "import sys\nfrom attnres_helpers.__main__ import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as exit_:\n    print('exit', exit_.code)\n"
        "sys.exit(3 if 'torch' in sys.modules else 0)"
    )
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_every_subcommand_is_in_the_lists_here(cli):
    main, subparsers = cli_module.parser(dict.fromkeys(["measure-hf", *cli_module.STUDIES, *VERBS], print))
    assert sorted(subparsers) == sorted(COMMANDS) == sorted(USAGE_ERRORS)


def test_help_lists_the_verbs_and_not_the_old_names(cli):
    out = cli("--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: attnres ")
    listed = [
        line.split()[0]
        for line in out.stdout.split("COMMAND\n", 1)[1].splitlines()
        if line[4:5].strip() and not line[:4].strip()
    ]
    assert listed == list(VERBS)
    assert not [old for old in ALIASES if "-" in old and old in out.stdout]  # nor in the usage line


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_prints_its_help_and_nothing_else(command, cli):
    """In-process: stdout is the usage, stderr empty, and no warning is raised (a process would print one on
    stderr)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = cli(command, "--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: attnres " + command), out.stderr
    assert out.stderr == "" and [str(w.message) for w in caught] == []


@pytest.mark.parametrize("command", COMMANDS)
def test_help_and_a_usage_error_answer_without_importing_torch(command):
    helped = without_torch(command, "--help")
    assert helped.returncode == 0 and helped.stderr == "" and helped.stdout.endswith("exit 0\n"), helped.stderr
    wrong = without_torch(command, *USAGE_ERRORS[command])
    assert wrong.returncode == 0 and wrong.stdout == "exit 2\n", wrong.stderr
    assert len(wrong.stderr.splitlines()) == 1 and wrong.stderr.startswith("attnres") and ": error: " in wrong.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["measure", "m", "--boundary", "drop"], "--boundary does not apply to a transformers model"),
        (
            ["measure", "m", "--configuration", "yarn-2", "--lengths", "1"],
            "--lengths does not apply to --configuration",
        ),
        (["measure", "--store", "s"], "--store does not apply to the shipped checkpoints"),
        (["reproduce", "default", "--extra-seeds"], "--extra-seeds does not apply to the study default"),
        (["reproduce", "nothing"], "argument STUDY: unknown study 'nothing'"),
        (["results", "a", "--store", "b"], "give the store once: STORE (--store is its old spelling)"),
    ],
)
def test_a_flag_that_does_not_apply_is_a_usage_error_without_torch(argv, message):
    out = without_torch(*argv)
    assert out.returncode == 0 and len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stdout == "exit 2\n" and message in out.stderr


def test_an_old_name_says_in_one_line_which_command_it_now_is(cli, tmp_path, monkeypatch):
    from attnres_helpers.hf import fetch

    monkeypatch.setattr(fetch, "ensure", lambda entry, force: tmp_path / entry.name)
    out = cli("fetch-pretrained", "smollm2-135m-instruct")
    assert out.returncode == 0 and out.stdout == f"{tmp_path / 'smollm2-135m-instruct'}\n"
    assert out.stderr.splitlines() == [
        "`attnres fetch-pretrained` is now `attnres fetch`; the old name goes after this round"
    ]
    assert cli("fetch", "smollm2-135m-instruct").stderr == ""
    for old, (new, _) in cli_module.ALIASES.items():
        assert f"`attnres {new}`" in cli_module.parser(
            dict.fromkeys(["measure-hf", *cli_module.STUDIES, *VERBS], print)
        )[1][old].get_default("alias")
    out = cli("results", "--store", str(tmp_path / "none.safetensors"))
    assert out.returncode == 1 and out.stderr.splitlines() == [
        "`attnres results --store STORE` is now `attnres results STORE`",
        f"error: measurement store {tmp_path / 'none.safetensors'} is missing",
    ]


def test_train_options_read_without_torch_are_the_model_and_trainer_s(cli):
    """The option list cli reads from the source equals the objects: ModelConfig's fields and types, the
    presets, the encodings, and train()'s defaults with the shipped TRAINING over them (issue 43 item 6)."""
    from attnres_helpers.experiments.specs import TRAINING
    from attnres_helpers.model import MODEL_ENCODINGS, PRESETS, ModelConfig
    from attnres_helpers.train import train

    options = cli_module.train_options()
    fields = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    assert {name: default for name, (_, default) in options["fields"].items()} == fields
    assert all(isinstance(d, kind) for kind, d in options["fields"].values() if d is not None)
    assert options["presets"] == list(PRESETS) and options["encodings"] == list(MODEL_ENCODINGS)
    assert options["default_preset"] == dataclasses.asdict(PRESETS["default"])
    signature = {name: p.default for name, p in inspect.signature(train).parameters.items() if name != "cfg"}
    assert options["defaults"] == signature | TRAINING
    assert options["defaults"]["steps"] == 1600 and options["defaults"]["warmup"] == 100  # the shipped training


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A random one-layer Llama of context 64 as a `transformers` folder (tests/helpers.tiny_llama_folder)."""
    pytest.importorskip("transformers")
    return tiny_llama_folder(tmp_path_factory.mktemp("tiny") / "tiny-llama", 64)


def test_measure_a_transformers_folder_prints_its_records(llama_folder, cli):
    out = cli("measure", str(llama_folder), "--lengths", "1,2", "--windows", "1", "--json")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    records = json.loads(out.stdout)
    assert {(r["run"], r["eval_len"], r["bca"]) for r in records} == {
        ("tiny-llama", 64, False),
        ("tiny-llama", 128, False),
    }
    assert {r["layer"] for r in records} == {0, "mean"}  # one layer
    # the old name measures the same, with its one line
    old = cli("measure-hf", "--model", str(llama_folder), "--lengths", "1,2", "--windows", "1", "--json")
    assert json.loads(old.stdout) == records
    assert old.stderr.splitlines() == [
        "`attnres measure-hf` is now `attnres measure MODEL`; the old name goes after this round"
    ]


def test_measure_a_run_trained_here_prints_its_records_as_the_runner_measures_it(hf_run, cli):
    out = cli("measure", str(hf_run), "--lengths", "1,2", "--windows", "1", "--json")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    records = json.loads(out.stdout)
    assert {(r["run"], r["eval_len"]) for r in records} == {("hf-llama-s0", 16), ("hf-llama-s0", 32)}
    wrong = cli("measure", str(hf_run), "--train-len", "16")  # a run records its L
    assert wrong.returncode == 2 and wrong.stderr.splitlines() == [
        "attnres measure: error: --train-len does not apply to a run trained here (see --help)"
    ]


def test_measure_a_folder_under_a_configuration_prints_records_and_keeps_only_its_window_files(cli, tmp_path):
    """Context 1024: a passkey trial needs room at L."""
    folder = tiny_llama_folder(tmp_path / "llama-1024", 1024)
    work = tmp_path / "work"
    args = ("measure", str(folder), "--configuration", "pi-2", "--windows", "1", "--work", str(work))
    out = cli(*args, "--json")
    assert out.returncode == 0, out.stderr
    records = json.loads(out.stdout)
    assert {(r["configuration"], r["eval_len"]) for r in records} == {("pi-2", 1024), ("pi-2", 2048)}
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*.safetensors")) == [
        "pi-2/1024/window-0.safetensors",
        "pi-2/2048/window-0.safetensors",
    ]  # the store was temporary; the window files are kept for a rerun
    kept = cli(*args, "--store", str(tmp_path / "s.safetensors"), "--quiet")
    assert kept.returncode == 0 and kept.stdout == f"{tmp_path / 's.safetensors'}\n", kept.stderr
    assert json.loads(cli("results", str(tmp_path / "s.safetensors"), "--json").stdout) == records


def test_measure_under_a_configuration_on_a_gpu_torch_does_not_see_is_one_line(cli, tmp_path, llama_folder):
    """--device cuda where torch sees no GPU: refused in one line as the arguments are read, nothing written."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here: the refusal is for machines without one")
    work = tmp_path / "work"
    out = cli("measure", str(llama_folder), "--configuration", "yarn-2", "--device", "cuda", "--work", str(work))
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "attnres measure: error: argument --device: device cuda: torch sees no CUDA device here (see --help)"
    ]
    assert not work.exists()


@pytest.mark.parametrize(
    "how, T",
    [
        (["--configuration", "yarn-2"], 2**31),
        (["--lengths", "1"], 2**30),
        (["--lengths", "0.5", "--bca", "0.5"], 2**29),
    ],
)
def test_measure_past_the_machines_memory_is_one_line(cli, tmp_path, llama_folder, how, T):
    """A model whose context makes its windows far larger than any machine holds (a 2^30 context): refused
    in one line, with the estimate, before any weight is read (its weights file is junk); nothing written."""
    import shutil

    big = tmp_path / "tiny-llama-long"
    shutil.copytree(llama_folder, big)
    config = json.loads((big / "config.json").read_text())
    (big / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2**30}))
    (big / "model.safetensors").write_bytes(b"not read")  # loading it would fail: the refusal comes first
    work = tmp_path / "work"
    out = cli("measure", str(big), *how, "--work", str(work), "--windows", "1")
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1, out.stderr
    assert re.fullmatch(
        rf"error: T = {T} tokens needs about \d+\.\d GiB a window by a rough estimate "
        r"\(attnres_helpers/hf/memory\.py\), more than the \d+\.\d GiB cpu has available: "
        r"measure a model with a shorter context",
        out.stderr.strip(),
    ), out.stderr
    assert not work.exists()


def test_results_runs_as_a_process_and_a_user_error_is_one_line(tmp_path, cli):
    # a small shipped store: what is tested is the process
    shipped = run("results", "data/results/hf.safetensors")
    assert shipped.returncode == 0 and "hf-llama-s0" in shipped.stdout and shipped.stderr == ""
    # in-process, as the interpreter exits on sys.exit(message): status 1, the message on stderr
    missing = cli("results", str(tmp_path / "none.safetensors"))
    assert missing.returncode == 1 and missing.stderr.splitlines() == [
        f"error: measurement store {tmp_path / 'none.safetensors'} is missing"
    ]
    usage = run("results", "--boundary", "middle")
    assert usage.returncode == 2 and len(usage.stderr.splitlines()) == 1 and "(see --help)" in usage.stderr
