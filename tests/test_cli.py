"""The command line: every subcommand parses and prints its help, warning-free; as a real process
(``python -m attnres_helpers``), a command runs, a user error is one line, and help and usage errors answer
without importing torch (every behaviour is tested in-process through ``main(argv)``, in each module's own
tests)."""

import subprocess
import sys
import warnings

import pytest
from helpers import ROOT

COMMANDS = (
    "train",
    "reproduce",
    "measure",
    "results",
    "family",
    "family-v2",
    "hf-train",
    "measure-hf",
    "fetch-pretrained",
    "figures",
    "design-time",
    "configurations",
    "sinks",
    "measure-pretrained",
    "copy-control",
)


def run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "attnres_helpers", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_prints_its_help_and_nothing_else(command, cli):
    """In-process (a process for each would import torch again for train): stdout is the usage, stderr
    empty, and no warning is raised (a process would print one on stderr)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = cli(command, "--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m attnres_helpers " + command), out.stderr
    assert out.stderr == "" and [str(w.message) for w in caught] == []


def test_results_runs_as_a_process_and_a_user_error_is_one_line(tmp_path, cli):
    # a small shipped store: what is tested is the process
    shipped = run("results", "--store", "data/results/hf.safetensors")
    assert shipped.returncode == 0 and "hf-llama-s0" in shipped.stdout and shipped.stderr == ""
    # in-process, as the interpreter exits on sys.exit(message): status 1, the message on stderr
    missing = cli("results", "--store", str(tmp_path / "none.safetensors"))
    assert missing.returncode == 1 and missing.stderr.splitlines() == [
        f"error: measurement store {tmp_path / 'none.safetensors'} is missing"
    ]
    usage = run("results", "--boundary", "middle")
    assert usage.returncode == 2 and len(usage.stderr.splitlines()) == 1 and "(see --help)" in usage.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["results", "--help"],
        ["measure-hf", "--lengths", "x"],
        ["measure-hf", "--model", "m", "--train-len", "1"],
        ["design-time", "--help"],
        ["design-time", "--configuration", "yarn-3"],
        ["design-time", "--configuration", "yarn-2", "--lengths", "0.5"],
        ["configurations", "--help"],
        ["configurations", "--only", "yarn-3"],
    ],
)
def test_help_and_usage_errors_answer_without_importing_torch(argv):
    """Only the command that runs imports torch (and train, whose options come from ModelConfig)."""
    code = (
        "import sys\nfrom attnres_helpers.__main__ import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "sys.exit('torch was imported' if 'torch' in sys.modules else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" or "--help" not in argv  # help, as a process, prints nothing on stderr
