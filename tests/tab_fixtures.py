"""Helpers for the tab's browser tests and for scripts/screenshots.py.

- `write_tab_logdir(d)` writes, with the real `tb_layergrad.summary` ops, the logdir the
  end-to-end tests browse, and returns what was written so the tests can compute every
  number the tab shows with numpy.
- The real `tensorboard` process is `tensorboard_process.TensorBoardProcess` (its `wait_for_runs`).
- Every number is checked against `numpy_reference.numpy_stats` (within `shown_atol`).
- `Browser` is headless Debian Chromium driven by Playwright, collecting console errors,
  page errors, CSP violations and dialogs from every frame.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import urllib.parse
import zlib
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from numpy_reference import numpy_stats  # noqa: F401 (the tests' tf_.numpy_stats)

PLUGIN = "layergrad"
TAB_NAME = "Layer gradients"
IFRAME = f'iframe[src*="plugin_entry.html?name={PLUGIN}"]'
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

# -- the test logdir -----------------------------------------------------------------------------

HOSTILE_RUN = "<img src=x onerror=alert(1)>"
HOSTILE_LAYER = "net/<img src=y onerror=alert(2)>"
# Attribute breakouts, a closing </script>, a `javascript:` URL: as a run, as layers and as a target.
# (Each alert has its own number: a dialog in a failing test says which name ran.)
HOSTILE_ATTR_RUN = '" autofocus onfocus="alert(3)'
HOSTILE_ATTR_LAYERS = ["net/'><svg onload=alert(4)>", "net/</script><script>alert(5)</script>", "javascript:alert(6)"]
HOSTILE_TARGET = '"><svg onload=alert(7)>'  # a second target of HOSTILE_ATTR_LAYERS[0]
HOSTILE_JS_RUN = "javascript:alert(8)"
HOSTILE_RUNS = (HOSTILE_RUN, HOSTILE_ATTR_RUN, HOSTILE_JS_RUN)
# The layers of each hostile run, (path, model index), and the names the tab must show as text.
HOSTILE_RUN_LAYERS = {
    HOSTILE_RUN: [("net/first", 1), (HOSTILE_LAYER, 2)],
    HOSTILE_ATTR_RUN: [(p, i + 1) for i, p in enumerate(HOSTILE_ATTR_LAYERS)],
    HOSTILE_JS_RUN: [("net/first", 1)],
}
HOSTILE_NAMES = [HOSTILE_RUN, HOSTILE_LAYER, HOSTILE_ATTR_RUN, *HOSTILE_ATTR_LAYERS, HOSTILE_TARGET, HOSTILE_JS_RUN]
# (path, model index). Alphabetical order differs from model order on purpose.
LAYERS = [("net/zeta_embed", 1), ("net/dense", 2), ("net/lstm", 3), ("net/alpha_head", 4)]
WEIGHTS = [("net/dense/kernel", 2), ("net/dense/bias", 2)]
TENSOR_LAYER = "net/dense"
RNN_LAYER = "net/lstm"
AUX_TARGET = "aux"  # a second target for net/dense
NAN_LAYER = "net/dense"
NAN_STEP = 7
STEPS = list(range(20))
EVAL_STEPS = list(range(0, 20, 2))
TENSOR_MAX_ELEMENTS = 48
BUCKETS = 12
TIMESTEPS = 6

# (run, target, source, layer) -> {step: array written}
Key = Tuple[str, str, str, str]


def layer_array(run: str, target: str, layer: str, step: int) -> np.ndarray:
    """The deterministic float32 'gradient' of one (run, target, layer, step)."""
    rng = np.random.default_rng(zlib.crc32(f"{run}|{target}|{layer}|{step}".encode()))
    shape = {"net/dense": (4, 3, 4), "net/dense/kernel": (8, 6), "net/dense/bias": (6,)}.get(layer, (5, 7))
    scale = {"net/zeta_embed": 1e-5, "net/dense": 1e-2, "net/lstm": 1e-1, "net/alpha_head": 1.0}.get(layer, 1e-2)
    x = rng.normal(scale=scale * (1 + 0.05 * step), size=shape).astype(np.float32)
    x.reshape(-1)[1] = 0.0
    if run == "train" and target == "loss" and layer == NAN_LAYER and step == NAN_STEP:
        flat = x.reshape(-1)
        flat[0] = np.nan
        flat[5] = np.inf
    return x


def timestep_norms(run: str, step: int) -> np.ndarray:
    rng = np.random.default_rng(7000 + step + (0 if run == "train" else 100))
    return np.sort(rng.uniform(0.1, 2.0, size=TIMESTEPS))


def has_tensor(layer: str, step: int) -> bool:
    """Raw tensors of TENSOR_LAYER are written every 5 steps and at the NaN step."""
    return layer == TENSOR_LAYER and (step % 5 == 0 or step == NAN_STEP)


@dataclasses.dataclass
class Written:
    logdir: str
    arrays: Dict[Key, Dict[int, np.ndarray]]
    timesteps: Dict[str, Dict[int, np.ndarray]]  # run -> {step: norms}

    def expected_stats(
        self, run: str, layer: str, step: int, target: str = "loss", source: str = "output"
    ) -> Dict[str, float]:
        return numpy_stats(self.arrays[(run, target, source, layer)][step])


TABLE_DIGITS = 4  # frontend/format.js DIGITS: every number the tab prints (exact: data-value, the CSV)


def shown_atol(x: np.ndarray, stat: str, digits: Optional[int] = None) -> float:
    """How far a shown statistic of float32 array x may lie from numpy_stats(x)[stat].

    The written value: sums of the n finite elements in float32 at worst (TensorFlow's path), any
    order, within tol = gamma(n + 1) of the sum of |terms| (tests/tolerances.py; the model of
    reference_checks.check_stats), the float64 reference within 2 u64. Shown with
    `digits` significant digits: half a unit in the last digit more.
    """
    from tolerances import gamma, unit_roundoff

    want = numpy_stats(x)
    n = int(want["elements"] - want["nan"] - want["pos_inf"] - want["neg_inf"])
    tol = gamma(n + 1, np.float32) + 2 * unit_roundoff(np.float64)
    if stat in ("mean_abs", "norm"):
        err = tol * want[stat]
    elif stat == "rms":  # the norm, divided by sqrt(n) in float64 (2 roundings)
        err = (tol + 2 * unit_roundoff(np.float64)) * want[stat]
    elif stat == "mean":  # relative to the mean of |x|: the sum may cancel
        err = tol * want["mean_abs"]
    elif stat == "std":  # the one-pass variance within 3 tol + tol^2 + 3 u of the mean square (check_stats)
        ms = want["std"] ** 2 + want["mean"] ** 2
        var_err = (3 * tol + tol**2 + 3 * unit_roundoff(np.float32) + 3 * unit_roundoff(np.float64)) * ms
        err = min(var_err / want["std"], var_err**0.5) if want["std"] > 0 else var_err**0.5
    elif stat == "zero_frac":  # a float64 division of the same counts
        err = 2 * unit_roundoff(np.float64) * want[stat]
    else:  # min, max (float32 values, exact in float64) and counts
        err = 0.0
    if digits is not None:
        err += 0.5 * 10.0 ** (1 - digits) * (abs(want[stat]) + err)
    return err


def _series(run: str, layers_for_run) -> List[Tuple[str, int, str, List[str]]]:
    """(layer, index, source, targets) of a run, in the order they are written (not model order)."""
    out = []
    for layer, index in reversed(layers_for_run):  # reversed: the tab must sort by index itself
        targets = ["loss", AUX_TARGET] if (run == "train" and layer == "net/dense") else ["loss"]
        if run == HOSTILE_ATTR_RUN and layer == HOSTILE_ATTR_LAYERS[0]:
            targets = ["loss", HOSTILE_TARGET]
        out.append((layer, index, "output", targets))
    if run == "train":
        for layer, index in WEIGHTS:
            out.append((layer, index, "weight", ["loss"]))
    return out


def write_tab_logdir(
    logdir: str, runs: Tuple[str, ...] = ("train", "eval", *HOSTILE_RUNS), steps: Optional[List[int]] = None
) -> Written:
    """Write the test runs (see the constants above) with tb_layergrad.summary."""
    import tensorflow as tf

    from tb_layergrad import summary

    written = Written(logdir, {}, {})
    for run in runs:
        run_steps = steps if steps is not None else (EVAL_STEPS if run == "eval" else STEPS)
        layers = HOSTILE_RUN_LAYERS.get(run, LAYERS)
        writer = tf.summary.create_file_writer(os.path.join(logdir, run))
        with writer.as_default():
            for step in run_steps:
                for layer, index, source, targets in _series(run, layers):
                    for target in targets:
                        x = layer_array(run, target, layer, step)
                        summary.ops.write_tensor(
                            layer,
                            tf.constant(x),
                            step=step,
                            buckets=BUCKETS,
                            target=target,
                            source=source,
                            index=index,
                            max_elements=TENSOR_MAX_ELEMENTS if has_tensor(layer, step) else 0,
                        )
                        written.arrays.setdefault((run, target, source, layer), {})[step] = x
                if run not in HOSTILE_RUNS:
                    norms = timestep_norms(run, step)
                    summary.ops.write_timesteps(RNN_LAYER, tf.constant(norms), step=step, index=dict(LAYERS)[RNN_LAYER])
                    written.timesteps.setdefault(run, {})[step] = norms
        writer.close()
    return written


def append_steps(logdir: str, run: str, steps: List[int]) -> None:
    """More steps for `run` in a new event file (as a resumed training would write)."""
    import tensorflow as tf

    from tb_layergrad import summary

    writer = tf.summary.create_file_writer(os.path.join(logdir, run), filename_suffix=".more")
    with writer.as_default():
        for step in steps:
            for layer, index, source, targets in _series(run, LAYERS):
                for target in targets:
                    x = layer_array(run, target, layer, step)
                    summary.ops.write_tensor(
                        layer,
                        tf.constant(x),
                        step=step,
                        buckets=BUCKETS,
                        target=target,
                        source=source,
                        index=index,
                    )
    writer.close()


# -- a headless browser -----------------------------------------------------------------------------

# Runs in every frame before its own scripts: records CSP violations.
INIT_SCRIPT = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI);
  console.error('CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI);
});
"""


class Browser:
    """Headless Chromium (Debian's) with one persistent profile; collects problems from every frame."""

    def __init__(self, profile_dir: str, poll_ms: Optional[int] = None, viewport=(1400, 1000)) -> None:
        """`poll_ms`: the tab's refresh interval, as a user sets it (`lg_refresh`, whole seconds) in every URL
        `open` opens; None: the tab's own."""
        from playwright.sync_api import sync_playwright

        self.refresh = None if poll_ms is None else max(1, round(poll_ms / 1000))
        self._pw = sync_playwright().start()
        self.context = self._pw.chromium.launch_persistent_context(
            profile_dir,
            executable_path=CHROMIUM,
            args=CHROMIUM_FLAGS,
            headless=True,
            viewport={"width": viewport[0], "height": viewport[1]},
            accept_downloads=True,
        )
        self.context.add_init_script(INIT_SCRIPT)
        self.errors: List[str] = []
        self.dialogs: List[str] = []
        self.page = self.context.pages[0] if self.context.pages else self.context.new_page()
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("dialog", self._dialog)

    def _console(self, msg) -> None:
        if msg.type == "error":
            loc = msg.location or {}
            self.errors.append(f"console.error: {msg.text} ({loc.get('url')}:{loc.get('lineNumber')})")

    def _dialog(self, dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def open(self, base: str, state: Optional[Dict[str, str]] = None):
        """Open TensorBoard on the tab (with `lg_*` state in the hash); returns the tab's Frame."""
        hash_ = PLUGIN
        if self.refresh is not None:
            state = {**(state or {}), "refresh": self.refresh}
        if state:
            hash_ += "&" + "&".join(f"lg_{k}={urllib.parse.quote(str(v), safe='')}" for k, v in state.items())
        self.page.goto("about:blank")  # a new document, not a same-page hash change
        self.page.goto(f"{base}/#{hash_}")
        return self.frame()

    def frame(self, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        left = lambda: max(0.1, deadline - time.monotonic()) * 1000  # noqa: E731
        while True:
            # The iframe element's own frame: `page.frames` can lag behind (seen here, about 1 open in 20 on a
            # loaded machine: the only child entry kept url '' although the iframe had loaded the tab).
            el = self.page.wait_for_selector(IFRAME, state="attached", timeout=left())
            f = el.content_frame()
            if f is not None and f"plugin_entry.html?name={PLUGIN}" in f.url:
                f.wait_for_selector(".lg-root", state="attached", timeout=left())
                return f
            if time.monotonic() > deadline:
                raise TimeoutError("the tab's iframe never loaded")
            time.sleep(0.05)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.context.close()
        with contextlib.suppress(Exception):
            self._pw.stop()


@contextlib.contextmanager
def served(
    logdir: str,
    work,
    last_steps: Dict[str, int],
    write: Callable[[], object],
    *,
    poll_ms: Optional[int] = None,
    write_first: bool = False,
    timeout: float = 60.0,
    **tensorboard,
):
    """A real `tensorboard` on `logdir` and a headless browser: yields (tensorboard, browser, what `write` returned).

    TensorBoard starts (~3 s) while `write` writes the runs (it picks them up as they appear), unless
    `write_first` (a TensorBoard that loads once, `reload_interval=0`); ready once every run of
    `last_steps` is listed up to its last step. Both are stopped after.
    """
    from tensorboard_process import TensorBoardProcess

    written = write() if write_first else None
    tb = TensorBoardProcess(logdir, str(work / "tensorboard.log"), **tensorboard)
    browser = None
    try:
        if not write_first:
            written = write()
        tb.wait_for_runs(last_steps, timeout=timeout)
        browser = Browser(str(work / "profile"), **({} if poll_ms is None else {"poll_ms": poll_ms}))
        yield tb, browser, written
    finally:
        if browser is not None:
            browser.close()
        tb.stop()


def assert_no_browser_errors(browser: "Browser") -> None:
    """After a test: no dialog opened and no script error; cleared, so one failing test does not fail the next."""
    dialogs, errors = list(browser.dialogs), list(browser.errors)
    browser.dialogs.clear()
    browser.errors.clear()
    assert dialogs == [], f"a dialog opened (script ran?): {dialogs}"
    assert errors == [], "errors in the browser:\n" + "\n".join(errors)


def parent_state(page) -> Dict[str, str]:
    """The tab's `lg_*` keys in TensorBoard's URL hash."""
    frag = urllib.parse.urlparse(page.url).fragment
    out = {}
    for part in frag.split("&"):
        if "=" in part:
            k, v = part.split("=", 1)
            if k.startswith("lg_") and k != "lg_refresh":  # the test's refresh interval (`Browser.open`), not a view's
                out[k[3:]] = urllib.parse.unquote(v)
    return out


# Elements and attributes that only an injected name would create (names are always text in the tab).
INJECTED_JS = r"""() => {
  const bad = [];
  for (const el of document.querySelectorAll('*')) {
    for (const a of el.attributes) {
      if (/^on/i.test(a.name) || a.name === 'autofocus') bad.push(`${el.tagName} ${a.name}=${a.value}`);
      if (['href', 'src', 'action', 'formaction', 'xlink:href'].includes(a.name) && /^\s*javascript:/i.test(a.value)) bad.push(`${el.tagName} ${a.name}=${a.value}`);
    }
    if (el.tagName === 'SCRIPT' && /alert\(/.test(el.textContent)) bad.push('script: ' + el.textContent.slice(0, 80));  // the payloads'
    if (el.tagName === 'IMG' || el.tagName === 'IFRAME' && !el.src.includes('plugin_entry.html')) bad.push(`${el.tagName} ${el.getAttribute('src')}`);
  }
  return bad;
}"""


def assert_nothing_injected(b: "Browser", frame) -> None:
    """No element, handler or script came out of a name, in TensorBoard's page or the tab's frame."""
    for f in (b.page, frame):
        assert f.evaluate(INJECTED_JS) == [], f.url
    assert frame.evaluate("() => window.__cspViolations") == []
    assert b.dialogs == []
