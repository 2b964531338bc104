"""A real `tensorboard` process for the tests, the tab's browser tests, scripts/screenshots.py and bench/.

`python -m tensorboard.main` from this interpreter (so the plugin installed here is the one served), on
127.0.0.1 and a free port, in its own process group: stopping it stops the Rust data server it starts too.
Its stderr goes to a file (nobody drains a pipe while it runs), or nowhere with `log_path=None`.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Callable, Dict, Iterator, List, Optional, Tuple

PLUGIN_API = "/data/plugin/layergrad/"


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _decoded(body: bytes, headers) -> bytes:
    """A body as sent, decompressed if it was gzipped."""
    return gzip.decompress(body) if headers.get("Content-Encoding", "") == "gzip" else body


class TensorBoardProcess:
    """`python -m tensorboard.main --logdir LOGDIR` in its own process group; `stop()` it when done."""

    def __init__(
        self,
        logdir: str,
        log_path: Optional[str],
        *,
        load_fast: Optional[str] = None,
        extra: Optional[List[str]] = None,
        reload_interval: int = 1,
    ) -> None:
        """`load_fast`: "true" (the Rust data server), "false" (the Python loader), None (TensorBoard's
        default). `reload_interval` 0 loads the logdir once. `extra`: more command-line flags."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        args = [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            logdir,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--reload_interval",
            str(reload_interval),
        ]
        if load_fast is not None:
            args += ["--load_fast", load_fast]
        args += list(extra or [])
        self._log = open(log_path, "wb") if log_path else None
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=self._log or subprocess.DEVNULL,
            start_new_session=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )

    def log_tail(self) -> str:
        if not self.log_path:
            return ""
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-3000:]

    def get(self, path: str, timeout: float = 10.0, gzip_ok: bool = False) -> Tuple[int, bytes, str]:
        """(status, body, content type) of a GET of `path` (an HTTP error is an answer, not an exception).
        `gzip_ok`: accept a gzipped body, as a browser does (the body returned is the decompressed one)."""
        request = urllib.request.Request(self.base + path, headers={"Accept-Encoding": "gzip"} if gzip_ok else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return r.status, _decoded(r.read(), r.headers), r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            return e.code, _decoded(e.read(), e.headers), e.headers.get("Content-Type", "")

    def get_json(self, path: str, timeout: float = 10.0):
        """The JSON of a 200 answer (anything else raises ValueError)."""
        status, body, _ = self.get(path, timeout)
        if status != 200:
            raise ValueError(f"{path}: HTTP {status}: {body[:300]!r}")
        return json.loads(body)

    def wait_until(
        self,
        predicate: Callable[["TensorBoardProcess"], bool],
        what: str,
        timeout: float = 90.0,
        interval: float = 0.25,
    ) -> None:
        """Poll `predicate(self)` until it holds; it may raise OSError, ValueError or KeyError meanwhile."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tensorboard exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                if predicate(self):
                    return
            except (OSError, ValueError, KeyError) as e:
                last = e
            time.sleep(interval)
        raise TimeoutError(f"tensorboard ({self.base}) never got {what}; last error {last!r}\n{self.log_tail()}")

    def wait_for_runs(self, last_steps: Dict[str, int], timeout: float = 60.0, interval: float = 0.25) -> dict:
        """Poll until the tab is listed and the `runs` route shows every run up to its last step; returns that answer."""
        found: Dict[str, dict] = {}

        def loaded(p: "TensorBoardProcess") -> bool:
            if "layergrad" not in p.get_json("/data/plugins_listing"):
                return False
            found["body"] = body = p.get_json(PLUGIN_API + "runs")
            have = {r["run"]: r for r in body["runs"]}
            return all(r in have and (have[r]["max_step"] or -1) >= s for r, s in last_steps.items())

        self.wait_until(loaded, f"the runs {last_steps}", timeout, interval)
        return found["body"]

    def terminate(self) -> None:
        """SIGTERM to the whole process group (tensorboard and its Rust data server)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        """Terminate, then kill what is left of the group; close the log."""
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        # The leader may be gone while its data-server child lingers in the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()


@contextlib.contextmanager
def tensorboards(logdir: str, configs: List[Tuple[str, List[str]]], log_dir: str) -> Iterator[List[TensorBoardProcess]]:
    """Start several TensorBoards at once, `(load_fast, extra flags)` each (start-up overlaps); stop them all after.

    `log_dir` holds their stderr logs; keep it outside `logdir`.
    """
    procs: List[TensorBoardProcess] = []
    try:
        for load_fast, extra in configs:
            log_path = os.path.join(log_dir, f"tensorboard-{len(procs)}-load_fast_{load_fast}.log")
            procs.append(TensorBoardProcess(logdir, log_path, load_fast=load_fast, extra=extra))
        yield procs
    finally:
        for p in procs:  # signal all first: they shut down in parallel
            p.terminate()
        for p in procs:
            p.stop()
