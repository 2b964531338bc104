"""The public API, pinned: its names and signatures change only by editing this file, a deliberate act (and, from
1.0 on, a major release: CHANGELOG.md). Every public function and class documents Args / Returns / Raises and
gives one example, and every example runs as written."""

from __future__ import annotations

import inspect
import re

import pytest

import tb_layergrad

# Every public name (README, "What it writes, the API, the docs") -> its signature without annotations. The
# summary ops' signatures are pinned beside their behaviour in tests/summary/test_summary_api.py.
SIGNATURES = {
    "capture": "(model, layers=None, weights=False, *, tape=None, activations=False, per_example=False)",
    "Capture": "(model, layers=None, weights=False, tape=None, activations=False, per_example=False)",
    "GradientMap": (
        "(entries, target, variable_gradients=None, replicas=1, activations=None, target_value=None, per_example=None)"
    ),
    "timestep_probe": "(model, layers=None, *, tape=None)",
    "GradientLogger": (
        "(log_dir, layers=None, update_freq=1, weights=False, activations=False, timesteps=False, targets=None, "
        "per_example=False, max_elements=0, on_nonfinite='log')"
    ),
    "NonFiniteError": "(origin)",
    "load": "(logdir, runs=None, *, layers=None, steps=None, columns=None)",
    "distribute.merge": "(grads, strategy=None)",
    "distribute.create_file_writer": "(logdir, strategy=None, **kwargs)",
    "distribute.is_chief": "(strategy=None)",
}
METHODS = {
    "Capture.gradients": "(self, tape, target, name='loss')",
    "Capture.activations": "(self)",
    "Capture.per_example_norms": "(self, tape, loss, name='loss')",
    "GradientMap.nonfinite_origin": "(self, step=None)",
}
MODULES = {"summary": ["activations", "gradients", "histogram_and_stats", "timesteps"], "distribute": None}
# Classes users receive or raise, not call for a value: no "Returns:" section.
CLASSES = {"Capture", "GradientMap", "GradientLogger", "NonFiniteError"}


def _resolve(dotted: str):
    obj = tb_layergrad
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _plain(obj) -> str:
    sig = inspect.signature(obj)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def test_the_top_level_names_are_the_documented_ones():
    documented = {name.split(".")[0] for name in SIGNATURES} | set(MODULES) | {"__version__"}
    assert set(tb_layergrad.__all__) == documented
    assert dir(tb_layergrad) == sorted(tb_layergrad.__all__)
    # The former shortcuts to internal modules are gone (their modules stay importable by path, as private).
    for name in ("reductions", "anomalies", "report", "targets", "rnn_probe", "fused_kernel"):
        with pytest.raises(AttributeError):
            getattr(tb_layergrad, name)


def test_the_submodules_export_what_is_documented():
    assert sorted(tb_layergrad.summary.__all__) == MODULES["summary"]
    assert sorted(tb_layergrad.distribute.__all__) == sorted(n.split(".")[1] for n in SIGNATURES if "." in n)


@pytest.mark.parametrize("name", sorted({**SIGNATURES, **METHODS}))
def test_signature(name):
    assert _plain(_resolve(name)) == {**SIGNATURES, **METHODS}[name]


def test_the_logger_has_as_few_arguments_as_keras_own_callbacks():
    assert len(inspect.signature(tb_layergrad.GradientLogger).parameters) <= 10


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_docstring_sections(name):
    doc = inspect.getdoc(_resolve(name)) or ""
    sections = ["Args:", "Raises:", "```python"] + ([] if name in CLASSES else ["Returns:"])
    if name == "NonFiniteError":
        sections.remove("Raises:")  # it is what fit() raises
    missing = [s for s in sections if s not in doc]
    assert not missing, f"{name}'s docstring lacks {missing}"


def _examples(doc: str) -> list:
    return re.findall(r"```python\n(.*?)```", doc, flags=re.S)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in SIGNATURES if not n.startswith("distribute.")))
def test_the_example_runs(name, tmp_path):
    """Each documented example, as written, its /tmp paths moved into tmp_path; `load`'s reads what the
    `capture` example wrote."""
    code = _examples(inspect.getdoc(_resolve(name)))
    assert len(code) == 1, f"{name}: one example"
    if name == "load":
        writing = _examples(inspect.getdoc(tb_layergrad.capture))[0].replace("/tmp/", f"{tmp_path}/")
        exec(compile(writing, "capture example", "exec"), {})
    scope: dict = {}
    exec(compile(code[0].replace("/tmp/", f"{tmp_path}/"), f"{name} example", "exec"), scope)  # our own docstring
    if name == "load":
        assert set(scope["df"].layer) >= {"mlp/hidden"} and len(scope["loss_grads"]) > 0
