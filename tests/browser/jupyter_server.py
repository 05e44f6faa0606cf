"""A throwaway JupyterLab server for the browser tests.

Everything it could write (config, runtime, workspaces, user settings, IPython profile)
lives in one temporary folder; it listens on 127.0.0.1 with a random port and a token.
The settings below keep the page quiet and read-only: no news toast, no update check,
no autosave (outputs must never be written back into a notebook), and no cell windowing
(every cell stays in the DOM, so locators find cells below the fold).
"""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_lab_settings(settings_dir):
    """Pre-write LAB_SETTINGS as JupyterLab user settings under settings_dir."""
    for relative_path, values in LAB_SETTINGS.items():
        path = Path(settings_dir) / relative_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


class JupyterLab:
    """JupyterLab serving root_dir; use as a context manager (the server always stops).

    extra_pythonpath goes in front of PYTHONPATH for the server and so for its kernels;
    extra_env is added to the environment of both; extra_args go on the server's command line.
    """

    def __init__(self, root_dir, state_dir, extra_pythonpath=(), extra_env=None, start_timeout_s=60.0, extra_args=()):
        self.root_dir = Path(root_dir)
        self.state_dir = Path(state_dir)
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.state_dir / "jupyterlab.log"
        self._extra_pythonpath = [str(p) for p in extra_pythonpath]
        self._extra_env = dict(extra_env or {})
        self._start_timeout_s = start_timeout_s
        self._extra_args = list(extra_args)
        self._process = None
        self._log_file = None

    def url(self, path):
        """The browser URL of a file under root_dir, opened with a fresh layout."""
        return f"{self.base_url}/lab/tree/{path}?reset&token={self.token}"

    def log_tail(self, n_chars=4000):
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-n_chars:]

    def _environment(self):
        env = dict(os.environ)
        for name in ("config", "runtime", "data", "ipython"):
            (self.state_dir / name).mkdir(parents=True, exist_ok=True)
        env["JUPYTER_CONFIG_DIR"] = str(self.state_dir / "config")
        env["JUPYTER_RUNTIME_DIR"] = str(self.state_dir / "runtime")
        env["JUPYTER_DATA_DIR"] = str(self.state_dir / "data")
        env["IPYTHONDIR"] = str(self.state_dir / "ipython")
        env["PYTHONPATH"] = os.pathsep.join(self._extra_pythonpath + [p for p in [env.get("PYTHONPATH")] if p])
        env.update(self._extra_env)
        return env

    def _command(self):
        command = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--port-retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--LabApp.workspaces_dir={self.state_dir / 'workspaces'}",
            f"--LabApp.user_settings_dir={self.state_dir / 'settings'}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.news_url=None",
            *self._extra_args,
        ]
        if not any(arg.startswith("--ServerApp.root_dir=") for arg in self._extra_args):
            command.append(f"--ServerApp.root_dir={self.root_dir}")  # the process runs in root_dir either way
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.append("--allow-root")  # it exits at once as root without this
        return command

    def start(self):
        write_lab_settings(self.state_dir / "settings")
        (self.state_dir / "workspaces").mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "wb")
        self._process = subprocess.Popen(
            self._command(),
            env=self._environment(),
            cwd=self.root_dir,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + self._start_timeout_s
        status_url = f"{self.base_url}/api/status?token={self.token}"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with code {self._process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(status_url, timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer within {self._start_timeout_s:.0f} s:\n{self.log_tail()}")

    def shutdown_kernels(self):
        """Ask the server to stop its kernels (they run in their own process groups)."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/api/kernels?token={self.token}", timeout=5) as response:
                kernels = json.load(response)
            for kernel in kernels:
                urllib.request.urlopen(
                    urllib.request.Request(
                        f"{self.base_url}/api/kernels/{kernel['id']}?token={self.token}", method="DELETE"
                    ),
                    timeout=10,
                ).close()
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            pass  # the server is going down anyway; SIGTERM below still cleans up

    def stop(self):
        if self._process is not None and self._process.poll() is None:
            self.shutdown_kernels()
            for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self._process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self._process.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()
