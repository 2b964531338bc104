"""GradientLogger on generated `train_step`s: the rule of docs/FIT.md ("Custom `train_step`: what is logged") checked
on compositions the gallery (tests/test_fit_gallery.py) does not hold.

**The space.** A step is a `StepSpec`: a subclassed model `gen` holding 1-3 sub-models (`net_a`, `net_b`, `net_c`:
`Sequential` Dense(5, tanh) -> [LayerNormalization | BatchNormalization] -> Dense(4) (tanh after a
BatchNormalization), each 4 -> 4, so any run of them chains, always called in training mode, so a BatchNormalization
updates its moving statistics at each call), built with an `Input` or without one (built inside the first step: the
model's `call` runs them in training mode only, so Keras 3's fit(), which calls it in inference to build it, does
not build them first); 1-4 tapes, each persistent or not, with 1-4 `gradient()` calls (several: a persistent
tape), one of them possibly in a Python loop (`for _ in range(2)`), one possibly holding a nested tape (a gradient
penalty on inputs, `inner.gradient(p, xi)`, added to its first loss); each call's loss runs x through a chain of
sub-models (`net_a` -> `net_b`, ...) and asks for the weights of all the model (`self.trainable_weights`), of one
sub-model, of several, or of one layer of a sub-model; its gradients are applied at once by one of 1-4 SGD
optimizers (each always on the same weights, as Keras 3 requires), by a manual `assign_sub`, or accumulated and
applied by its optimizer after the last tape; a user-named target of the model's prediction asked for or not
(`targets={"first_unit": lambda y_pred: y_pred[:, 0]}`): then some tapes (at least one) compute their first loss from
the model's own call, `self(x, training=True)`, and the others do not; numpy arrays or a `tf.data` dataset; eager,
graph or XLA; `steps_per_execution` 1 or 2; `update_freq` 1, 2 or 3; `targets={"penalty": "inputs"}` asked for or not
where a penalty exists. 4 batches of 8.

**The examples.** A fixed list (`EXAMPLES`, 21 from SEED): the main dimensions (sub-models, optimizers, most calls per
tape, persistent, loop, nested penalty, built inside the first step, the normalization layer, the named target,
input, mode, steps_per_execution, update_freq) as a greedy pairwise covering array — every feasible pair of levels of two
dimensions in some example (`test_the_examples_cover_the_space` checks it, and that every ask and apply kind occurs)
— the rest of each step (its other tapes, asks, chains, optimizers) drawn from a generator seeded per example.
Constraints: more than one call on a tape needs a persistent one; `steps_per_execution=2` under XLA or eagerly only
with `update_freq=2` (there Keras hands out the last step of each execution only: docs/FIT.md).

**The checks,** for each example, from two fit()s of the same seeded model, one with GradientLogger(update_freq,
weights=True) beside Keras' `TensorBoard(update_freq=1)`:
(a) training bitwise unchanged, BatchNormalization's moving statistics included (XLA: bitwise up to the first execution that differs, which is within the derived
    bound of the same math from equal weights; the runs are not compared after it);
(b) the records at the steps `s % update_freq == 0`, which are Keras' TensorBoard batch steps
    (`steps_per_execution=1`; both read back through TensorBoard's readers), nothing the plain fit lacks warned
    but, with the named target, the one warning that names the calls of the tapes that do not call the model;
(c) the targets of each logged step are exactly the names the rule gives, computed here from the StepSpec: one
    per `gradient()` call that asks for a trainable weight (`loss` for all of them, else the top-level sub-model
    owning what it asks, several joined by `+`, `#k` for the k-th of a name in one step), plus `penalty`, `#k`
    per inner call where asked, and `first_unit`, `#k` per tape that calls the model where asked;
(d) each target's loss value, layer-output gradients and weight gradients equal an independent re-run of the
    same step: the generated source executed eagerly with the test's own `tf.GradientTape` subclass (each
    sub-model run layer by layer, every output watched on every tape recording it, numbered per tape), on the
    weights saved before the batch, its SGD updates replayed (the named target: differentiated on the tape's
    first call, w.r.t. every trainable weight and the outputs it recorded); within `chain_rtol(float32, length)`, `length` the
    step's reduction path up to that call (tests/tolerances.py).
A failing example raises with its reproduction: its StepSpec and the generated model source, runnable as is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
import textwrap
import traceback
import warnings
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

import tb_layergrad

tf = pytest.importorskip("tensorflow")
keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1, Keras 3 otherwise, as in fit_helpers
layers = keras.layers
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # trains: left to CI by the quick loop

SEED = 12
ROOT = "gen"
SUBS = ("net_a", "net_b", "net_c")
FEATURES, HIDDEN, BATCH, BATCHES = 4, 5, 8, 4
LRS = (0.05, 0.04, 0.03, 0.02)  # the optimizers' SGD learning rates
MANUAL_LR = 0.01  # a manual `assign_sub`'s
PENALTY = "penalty"  # the name the inner (input) calls are asked for under
NAMED = "first_unit"  # a user-named target of the model's prediction (`named_target`), its name
NAMED_SOURCE = "lambda y_pred: y_pred[:, 0]"  # as the reproduction writes it
PASSES = 4  # passes through every weight of one call: forward, backward; the penalty's forward and its backward

# -- the space ------------------------------------------------------------------------------------------------
# Main dimensions, covered pairwise (the levels' order is the order they are shown in).
DIMENSIONS: Dict[str, Tuple] = {
    "subs": (1, 2, 3),
    "optimizers": (1, 2, 3, 4),
    "calls": (1, 2, 3, 4),  # the most gradient() calls on one tape
    "persistent": (False, True),  # the tape with the most calls
    "loop": (False, True),  # one tape in `for _ in range(2)`
    "penalty": (False, True),  # one tape holds a nested tape w.r.t. inputs
    "lazy": (False, True),  # the sub-models built inside the first step
    "norm": ("none", "layer", "batch"),  # a LayerNormalization or BatchNormalization between the two Dense layers
    "named": (False, True),  # targets={NAMED: fn(y_pred)} asked for, some tapes calling the model itself
    "data": ("numpy", "dataset"),
    "mode": ("eager", "graph", "xla"),
    "steps_per_execution": (1, 2),
    "update_freq": (1, 2, 3),
}
ASK_KINDS = ("all", "one", "several", "layer")
APPLY_KINDS = ("optimizer", "assign_sub", "later")


def feasible(row: Dict) -> bool:
    if row["calls"] > 1 and not row["persistent"]:
        return False
    if row["steps_per_execution"] > 1 and row["mode"] != "graph" and row["update_freq"] != 2:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class CallSpec:
    """One `tape.gradient(loss, asked)` call."""

    ask: str  # "all" | "net_a" | "net_a+net_b" | "net_a[0]" (the first layer of net_a)
    chain: Tuple[int, int]  # the loss runs x through SUBS[lo..hi]
    apply: str  # "optimizer" | "assign_sub" | "later" (by its optimizer, after the last tape)
    opt: int = -1  # the optimizer (apply "optimizer" / "later")


@dataclasses.dataclass(frozen=True)
class TapeSpec:
    calls: Tuple[CallSpec, ...]
    persistent: bool
    loop: int = 1  # 2: the tape and its calls in `for _ in range(2)`
    penalty: bool = False  # a nested tape on inputs, its penalty added to the first call's loss
    model_call: bool = False  # its first loss is of the model's own prediction, `self(x, training=True)`


@dataclasses.dataclass(frozen=True)
class StepSpec:
    index: int
    subs: int
    optimizers: int
    tapes: Tuple[TapeSpec, ...]
    lazy: bool
    norm: str  # "none" | "layer" | "batch"
    named: bool  # targets={NAMED: fn}
    data: str
    mode: str
    steps_per_execution: int
    update_freq: int
    ask_inputs: bool  # targets={PENALTY: "inputs"}

    @property
    def id(self) -> str:
        return f"{self.index:02d}-{self.mode}"


# -- the generator ----------------------------------------------------------------------------------------------


def _pairs(row: Dict) -> set:
    return {((a, row[a]), (b, row[b])) for a, b in itertools.combinations(DIMENSIONS, 2)}


CONSTRAINED = ("calls", "persistent", "steps_per_execution", "mode", "update_freq")  # what `feasible` reads


def _random_row(r: random.Random) -> Dict:
    while True:
        row = {name: r.choice(levels) for name, levels in DIMENSIONS.items()}
        if feasible(row):
            return row


def feasible_pairs() -> set:
    """The pairs of levels some feasible step holds (completions searched over the constrained dimensions only)."""
    out = set()
    for a, b in itertools.combinations(DIMENSIONS, 2):
        for va, vb in itertools.product(DIMENSIONS[a], DIMENSIONS[b]):
            rest = [d for d in CONSTRAINED if d not in (a, b)]
            for values in itertools.product(*(DIMENSIONS[d] for d in rest)):
                row = {d: DIMENSIONS[d][0] for d in DIMENSIONS}
                row.update(zip(rest, values))
                row.update({a: va, b: vb})
                if feasible(row):
                    out.add(((a, va), (b, vb)))
                    break
    return out


def covering_rows(seed: int = SEED, candidates: int = 150) -> List[Dict]:
    """A pairwise covering array of DIMENSIONS (greedy: each row the candidate covering most uncovered pairs)."""
    uncovered = feasible_pairs()
    r = random.Random(seed)
    chosen = []
    while uncovered:
        best = max((_random_row(r) for _ in range(candidates)), key=lambda row: len(_pairs(row) & uncovered))
        if not _pairs(best) & uncovered:  # unlucky sample: a row holding the first uncovered pair
            (a, va), (b, vb) = sorted(uncovered, key=repr)[0]
            best = {**_random_row(r), a: va, b: vb}
            while not feasible(best):
                best = {**_random_row(r), a: va, b: vb}
        chosen.append(best)
        uncovered -= _pairs(best)
    return chosen


def _asks(subs: int) -> Dict[str, List[str]]:
    names = SUBS[:subs]
    several = ["+".join(c) for n in range(2, subs) for c in itertools.combinations(names, n)]
    return {"all": ["all"], "one": list(names), "several": several, "layer": [f"{s}[0]" for s in names]}


def _ask_subs(ask: str, subs: int) -> List[int]:
    if ask == "all":
        return list(range(subs))
    return [SUBS.index(part.split("[")[0]) for part in ask.split("+")]


def _chain(r: random.Random, ask: str, subs: int) -> Tuple[int, int]:
    asked = _ask_subs(ask, subs)
    return r.randint(0, min(asked)), r.randint(max(asked), subs - 1)


def make_spec(index: int, row: Dict) -> StepSpec:
    """A StepSpec with `row`'s main dimensions, the rest drawn from a generator seeded by the example's index."""
    r = random.Random(SEED * 1000 + index)
    subs = row["subs"]
    asks = [a for kind in ASK_KINDS for a in _asks(subs)[kind]]
    # calls per tape: the first tape has `calls`; others (1-2 calls) until there is one call per optimizer
    sizes = [row["calls"]]
    while sum(sizes) < row["optimizers"] or (len(sizes) < 3 and r.random() < 0.3):
        sizes.append(r.randint(1, min(2, row["calls"])))
    order = list(range(sum(sizes)))
    r.shuffle(order)
    opt_ask = [r.choice(asks) for _ in range(row["optimizers"])]
    calls = []
    for position in range(sum(sizes)):
        if position in order[: row["optimizers"]]:  # every optimizer applies at least one call
            opt = order.index(position)
        elif r.random() < 0.6:
            opt = r.randrange(row["optimizers"])
        else:
            ask = r.choice(asks)
            calls.append(CallSpec(ask, _chain(r, ask, subs), "assign_sub"))
            continue
        ask = opt_ask[opt]
        calls.append(CallSpec(ask, _chain(r, ask, subs), r.choice(("optimizer", "later")), opt))
    if {i for c in calls for i in range(c.chain[0], c.chain[1] + 1)} != set(range(subs)):
        # every sub-model runs in the step: one it never runs would stay unbuilt in a lazy model, which changes
        # what "all of the model's trainable weights" is
        calls[0] = dataclasses.replace(calls[0], chain=(0, subs - 1))
    loop_at = r.randrange(len(sizes)) if row["loop"] else -1
    penalty_at = r.randrange(len(sizes)) if row["penalty"] else -1
    model_calls = [False] * len(sizes)
    if row["named"]:  # some tapes call the model itself (at least one: else the targets are refused), some may not
        model_calls = [r.random() < 0.5 for _ in sizes]
        model_calls[r.randrange(len(sizes))] = True
    tapes, start = [], 0
    for t, size in enumerate(sizes):
        persistent = row["persistent"] if t == 0 else (size > 1 or r.random() < 0.3)
        own = list(calls[start : start + size])
        if model_calls[t]:  # its first loss is of the model's prediction: all the sub-models, in order
            own[0] = dataclasses.replace(own[0], chain=(0, subs - 1))
        tapes.append(TapeSpec(tuple(own), persistent, 2 if t == loop_at else 1, t == penalty_at, model_calls[t]))
        start += size
    return StepSpec(
        index,
        subs,
        row["optimizers"],
        tuple(tapes),
        row["lazy"],
        row["norm"],
        row["named"],
        row["data"],
        row["mode"],
        row["steps_per_execution"],
        row["update_freq"],
        ask_inputs=row["penalty"] and r.random() < 0.6,
    )


EXAMPLES = [make_spec(i, row) for i, row in enumerate(covering_rows())]


def features(spec: StepSpec) -> Dict[str, object]:
    """The main dimensions as the spec realizes them (what the covering is checked on)."""
    most = max(spec.tapes, key=lambda t: len(t.calls))
    return {
        "subs": spec.subs,
        "optimizers": len({c.opt for t in spec.tapes for c in t.calls if c.opt >= 0}),
        "calls": len(most.calls),
        "persistent": most.persistent,
        "loop": any(t.loop > 1 for t in spec.tapes),
        "penalty": any(t.penalty for t in spec.tapes),
        "lazy": spec.lazy,
        "norm": spec.norm,
        "named": spec.named,
        "data": spec.data,
        "mode": spec.mode,
        "steps_per_execution": spec.steps_per_execution,
        "update_freq": spec.update_freq,
    }


def ask_kind(ask: str, subs: int) -> str:
    return next(kind for kind, asks in _asks(subs).items() if ask in asks)


# -- the rule, from the spec --------------------------------------------------------------------------------------


def rule_name(ask: str, subs: int) -> str:
    """docs/FIT.md: `loss` for all of the model's trainable weights, else the top-level sub-model(s) owning them."""
    owners = sorted(set(_ask_subs(ask, subs)))
    if ask == "all" or (owners == list(range(subs)) and "[" not in ask):
        return "loss"
    return "+".join(SUBS[i] for i in owners)


STEP, INPUTS, NAMED_KIND = "step", "inputs", "named"  # a target's kind: a weight call, an input call, targets=fn


def expected_targets(spec: StepSpec) -> List[Tuple[str, str]]:
    """(name, kind) of each target of one step, in the order the step makes its calls."""
    out, seen = [], {}

    def add(base: str, kind: str) -> None:
        seen[base] = seen.get(base, 0) + 1
        out.append((base if seen[base] == 1 else f"{base}#{seen[base]}", kind))

    for tape in spec.tapes:
        for _ in range(tape.loop):
            if tape.penalty and spec.ask_inputs:
                add(PENALTY, INPUTS)
            if tape.model_call and spec.named:  # computed once per tape, from its call of the model
                add(NAMED, NAMED_KIND)
            for call in tape.calls:
                add(rule_name(call.ask, spec.subs), STEP)
    return out


def unnamed_calls(spec: StepSpec) -> List[str]:
    """The weight calls of the tapes under which the step does not call the model: targets=fn are not computed
    there, which the logger warns about, naming them (docs/FIT.md); [] without targets=fn."""
    if not spec.named:
        return []
    names, out = iter(n for n, kind in expected_targets(spec) if kind == STEP), []
    for tape in spec.tapes:
        for _ in range(tape.loop):
            mine = [next(names) for _ in tape.calls]
            out += [] if tape.model_call else mine
    return out


# -- the generated source ---------------------------------------------------------------------------------------


def _variables(ask: str) -> str:
    if ask == "all":
        return "self.trainable_weights"
    parts = []
    for part in ask.split("+"):
        sub, _, layer = part.partition("[")
        parts.append(f"self.{sub}.layers[{layer[:-1]}].trainable_weights" if layer else f"self.{sub}.trainable_weights")
    return " + ".join(parts)


def _forward(chain: Tuple[int, int], x: str = "x", training: str = "True") -> str:
    """The sub-models of `chain` run on `x`, in training mode (a BatchNormalization updates its statistics)."""
    for i in range(chain[0], chain[1] + 1):
        x = f"self.{SUBS[i]}({x}, training={training})"
    return x


NORM_LAYERS = {"layer": "LayerNormalization", "batch": "BatchNormalization"}


def model_source(spec: StepSpec) -> str:
    """The generated model: its sub-models, optimizers and `train_step`, as a user would write them."""
    init = []
    for i in range(spec.subs):
        name, letter = SUBS[i], SUBS[i][-1]
        stack = [] if spec.lazy else [f"keras.Input(({FEATURES},))"]
        # after a BatchNormalization a tanh Dense: the batch mean of its output is beta, so the sum over the batch of
        # a linear function of it (a target, a penalty's inner gradient) would be constant, its gradients rounding only
        last = '"tanh"' if spec.norm == "batch" else "None"
        for j, (units, act) in enumerate(((HIDDEN, '"tanh"'), (FEATURES, last))):
            init_seed = 100 * (i + 1) + j
            if j == 1 and spec.norm != "none":
                stack.append(f'layers.{NORM_LAYERS[spec.norm]}(name="{letter}n")')
            stack.append(
                f'layers.Dense({units}, activation={act}, name="{letter}{j}", '
                f"kernel_initializer=keras.initializers.GlorotUniform(seed={init_seed}), "
                f"bias_initializer=keras.initializers.RandomNormal(stddev=0.1, seed={init_seed + 50}))"
            )
        init.append(f"self.{name} = keras.Sequential([\n    " + ",\n    ".join(stack) + f'\n], name="{name}")')
    init += [f"self.opt_{k} = keras.optimizers.SGD({LRS[k]})" for k in range(spec.optimizers)]

    body = ["x, y = data", "later = []"]
    for t, tape in enumerate(spec.tapes, 1):
        block = [f"with tf.GradientTape(persistent={tape.persistent}) as tape_{t}:"]
        inner = []
        if tape.penalty:
            first = SUBS[tape.calls[0].chain[0]]
            inner += [
                f"xi_{t} = 0.5 * x + 0.25",
                f"with tf.GradientTape() as inner_{t}:",
                f"    inner_{t}.watch(xi_{t})",
                f"    p_{t} = self.{first}(xi_{t}, training=True)",
                f"gx_{t} = inner_{t}.gradient(p_{t}, xi_{t})",
                f"penalty_{t} = tf.reduce_mean(tf.square(tf.sqrt(tf.reduce_sum(tf.square(gx_{t}), axis=1) + 1e-3) - 1.0))",
            ]
        for c, call in enumerate(tape.calls, 1):
            extra = f" + 0.1 * penalty_{t}" if tape.penalty and c == 1 else ""
            scale = f"{1 - 0.1 * (c - 1):.1f} * " if c > 1 else ""  # each call its own loss
            prediction = "self(x, training=True)" if tape.model_call and c == 1 else _forward(call.chain)
            inner.append(f"loss_{t}_{c} = tf.reduce_mean(tf.square({prediction} - {scale}y)){extra}")
        block += ["    " + line for line in inner]
        for c, call in enumerate(tape.calls, 1):
            variables = _variables(call.ask)
            block.append(f"grads = tape_{t}.gradient(loss_{t}_{c}, {variables})")
            if call.apply == "optimizer":
                block.append(f"self.opt_{call.opt}.apply_gradients(zip(grads, {variables}))")
            elif call.apply == "later":
                block.append(f"later.append((self.opt_{call.opt}, grads, {variables}))")
            else:
                block += [f"for v, g in zip({variables}, grads):", f"    v.assign_sub({MANUAL_LR} * g)"]
        if tape.loop > 1:
            block = [f"for _ in range({tape.loop}):"] + ["    " + line for line in block]
        body += block
    body += [
        "for opt, grads, variables in later:",
        "    opt.apply_gradients(zip(grads, variables))",
        'return {"loss": loss_1_1}',
    ]
    chain = _forward((0, spec.subs - 1), training="training")
    call = (
        # fit() builds a model by calling it, in inference: this one runs no sub-model then, so they are left to be
        # built by the step
        ["if not training:", "    return x", f"return {chain}"] if spec.lazy else [f"return {chain}"]
    )
    return "\n".join(
        [
            "class Step(keras.Model):",
            "    def __init__(self):",
            f'        super().__init__(name="{ROOT}")',
            textwrap.indent("\n".join(init), " " * 8),
            "",
            "    def call(self, x, training=None):",
            textwrap.indent("\n".join(call), " " * 8),
            "",
            "    def train_step(self, data):",
            textwrap.indent("\n".join(body), " " * 8),
        ]
    )


def _namespace(tf_module) -> dict:
    return {"tf": tf_module, "keras": keras, "layers": layers}


def build(spec: StepSpec) -> keras.Model:
    namespace = _namespace(tf)
    exec(model_source(spec), namespace)  # noqa: S102 - the generated step, shown on failure
    model = namespace["Step"]()
    model.compile(
        run_eagerly=spec.mode == "eager",
        jit_compile=spec.mode == "xla",
        steps_per_execution=spec.steps_per_execution,
    )
    return model


def data() -> Tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(SEED)
    x = r.normal(size=(BATCH * BATCHES, FEATURES)).astype(np.float32)
    return x, np.tanh(x[:, ::-1] * 0.8).astype(np.float32)


def named_target(y_pred):
    """targets={NAMED: named_target}: the first unit of the model's prediction, one value per example."""
    return y_pred[:, 0]


def logger_kwargs(spec: StepSpec) -> dict:
    targets = {**({PENALTY: "inputs"} if spec.ask_inputs else {}), **({NAMED: named_target} if spec.named else {})}
    return {"targets": targets} if targets else {}


def reproduction(spec: StepSpec) -> str:
    """What a failing example prints: a script that builds and fits it."""
    fit_args = "tf.data.Dataset.from_tensor_slices((x, y)).batch(8)" if spec.data == "dataset" else "x, y, batch_size=8"
    targets = [f"{PENALTY!r}: 'inputs'"] * spec.ask_inputs + [f"{NAMED!r}: {NAMED_SOURCE}"] * spec.named
    return "\n".join(
        [
            f"# {spec!r}",
            "import numpy as np, tensorflow as tf, tb_layergrad",
            "keras, layers = tf.keras, tf.keras.layers",
            model_source(spec),
            "",
            "model = Step()",
            f"model.compile(run_eagerly={spec.mode == 'eager'}, jit_compile={spec.mode == 'xla'}, "
            f"steps_per_execution={spec.steps_per_execution})",
            f"r = np.random.default_rng({SEED})",
            f"x = r.normal(size=({BATCH * BATCHES}, {FEATURES})).astype(np.float32)",
            "y = np.tanh(x[:, ::-1] * 0.8).astype(np.float32)",
            f"logger = tb_layergrad.GradientLogger('logs', update_freq={spec.update_freq}, weights=True"
            + (f", targets={{{', '.join(targets)}}}" if targets else "")
            + ")",
            f"model.fit({fit_args}, epochs=1, shuffle=False, verbose=0, callbacks=[logger])",
            "targets = sorted(tb_layergrad.load('logs')['target'].unique())",
            "print(targets)  # the rule's: " + repr([name for name, _ in expected_targets(spec)]),
        ]
    )


# -- the fit()s ---------------------------------------------------------------------------------------------------


def weight_table(root, trainable: bool = False) -> Dict[str, object]:
    """{"gen/net_a/a0/kernel": variable} for every sub-model's weights (the paths GradientLogger writes): a
    BatchNormalization's moving statistics too (the step updates them), unless `trainable`."""
    out = {}
    for name in SUBS:
        sub = getattr(root, name, None)
        for layer in [] if sub is None else sub.layers:
            for v in layer.trainable_weights if trainable else layer.weights:
                out[f"{ROOT}/{name}/{layer.name}/{v.name.split('/')[-1].split(':')[0]}"] = v
    return out


class Snapshots(keras.callbacks.Callback):
    """The weights (by path) before each execution, keyed by the count of its first batch, and after each one, by
    the count of its last: the weights before the next one (Keras passes the first batch's index at the end of an
    execution in some versions, its last in others), and at the end of training."""

    def __init__(self) -> None:
        super().__init__()
        self.before: Dict[int, Dict[str, np.ndarray]] = {}
        self.after: Dict[int, Dict[str, np.ndarray]] = {}

    def _weights(self) -> Dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in weight_table(self.model).items()}

    def on_train_batch_begin(self, batch, logs=None):
        self.before[batch + 1] = self._weights()
        if batch > 0:
            self.after[batch] = self.before[batch + 1]

    def on_train_end(self, logs=None):
        self.after[BATCHES] = self._weights()


def fit(fit_helpers, spec: StepSpec, log_dir: str, logged: bool):
    keras.utils.set_random_seed(SEED)
    model = build(spec)
    snapshots = Snapshots()
    callbacks = [snapshots, keras.callbacks.TensorBoard(log_dir, update_freq=1)]
    if logged:
        callbacks.append(
            tb_layergrad.GradientLogger(
                log_dir, update_freq=spec.update_freq, weights=True, max_elements=fit_helpers.MAX, **logger_kwargs(spec)
            )
        )
    x, y = data()
    inputs = (
        {"x": tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)}
        if spec.data == "dataset"
        else {"x": x, "y": y, "batch_size": BATCH}
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(**inputs, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return model, snapshots, {str(w.message) for w in caught}


# -- the independent re-run -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Call:
    """One gradient() call of the re-run: what it differentiated."""

    weights: Dict[str, np.ndarray]  # of the trainable weights it asked for, by path
    value: float  # the loss; for an input call the sum of what it differentiates
    outputs: Dict[str, Optional[np.ndarray]]  # by layer path, numbered per tape; None: the value does not reach it
    length: int  # the reduction path from the weights saved last (tests/tolerances.py)
    kind: str = STEP  # STEP: it asked for weights; INPUTS: for inputs only; NAMED_KIND: targets=fn on its tape


class Reference:
    """The step re-run eagerly: the same generated source, its `tf.GradientTape` the test's own subclass."""

    def __init__(self, tolerances, spec: StepSpec, x_batch: np.ndarray) -> None:
        namespace = _namespace(tf)
        exec(model_source(spec), namespace)  # noqa: S102
        self.model = namespace["Step"]()
        for name in SUBS[: spec.subs]:  # build what a lazy model builds in its first step
            getattr(self.model, name)(tf.zeros((1, FEATURES)))
        self.table = weight_table(self.model)
        self.keys = {id(v): k for k, v in self.table.items()}
        self.calls: List[Call] = []
        self.since_reset = 0
        owner = self
        norms = 2 * x_batch.shape[0] * HIDDEN * spec.subs if spec.norm != "none" else 0  # the norm layers' moments
        base = PASSES * tolerances.reduction_path_length(
            self.model, x_batch, target_terms=2 * x_batch.size, other=norms
        )
        self.base = base

        class RecordingTape(tf.GradientTape):
            active: List["RecordingTape"] = []

            def __init__(self, persistent=False, **kwargs):
                super().__init__(persistent=True, **kwargs)  # targets=fn are differentiated beside the step's call
                self.outputs: Dict[str, tf.Tensor] = {}
                self.counts: Dict[str, int] = {}
                self.named: Optional[tf.Tensor] = None  # targets=fn of the model's first prediction while it recorded
                self.answered = False

            def __enter__(self):
                RecordingTape.active.append(super().__enter__())
                return self

            def __exit__(self, *exc):
                RecordingTape.active.remove(self)
                return super().__exit__(*exc)

            def gradient(self, target, sources, output_gradients=None, **kwargs):
                flat = tf.nest.flatten(sources)
                keys = list(self.outputs)
                if spec.named and self.named is not None and not self.answered:  # once per tape, at its first call
                    variables = owner.model.trainable_weights
                    g_var, g_out = super().gradient(self.named, (variables, [self.outputs[k] for k in keys]))
                    owner.calls.append(
                        Call(
                            {owner.keys[id(v)]: g.numpy() for v, g in zip(variables, g_var)},
                            float(self.named),
                            {k: None if g is None else g.numpy() for k, g in zip(keys, g_out)},
                            (owner.since_reset + 1) * base,
                            NAMED_KIND,
                        )
                    )
                self.answered = True
                g_src, g_out = super().gradient(
                    target, (flat, [self.outputs[k] for k in keys]), output_gradients=output_gradients, **kwargs
                )
                owner.since_reset += 1
                value = target if output_gradients is None else target * output_gradients
                owner.calls.append(
                    Call(
                        {owner.keys[id(s)]: g.numpy() for s, g in zip(flat, g_src) if id(s) in owner.keys},
                        float(tf.reduce_sum(value)),
                        {k: None if g is None else g.numpy() for k, g in zip(keys, g_out)},
                        owner.since_reset * base,
                        STEP if any(id(s) in owner.keys for s in flat) else INPUTS,
                    )
                )
                return tf.nest.pack_sequence_as(sources, g_src)

        def keep(path: str, tensor: tf.Tensor) -> None:
            for tape in RecordingTape.active:
                n = tape.counts[path] = tape.counts.get(path, 0) + 1
                tape.watch(tensor)
                tape.outputs[path if n == 1 else f"{path}#{n}"] = tensor

        class Recorded:
            """A sub-model run layer by layer, each output (and the sub-model's) kept on every recording tape."""

            def __init__(self, sub) -> None:
                self.sub, self.layers, self.trainable_weights = sub, sub.layers, sub.trainable_weights

            def __call__(self, h, training=None):
                for layer in self.sub.layers:
                    h = layer(h, training=training)
                    keep(f"{ROOT}/{self.sub.name}/{layer.name}", h)
                keep(f"{ROOT}/{self.sub.name}", h)
                return h

        class StepSelf:
            """What `self` is to the re-run step; calling it is the model's call: every sub-model, in order."""

            def __call__(self, x, training=None):
                for name in SUBS[: spec.subs]:
                    x = getattr(self, name)(x, training=training)
                for tape in RecordingTape.active:  # summed over the batch, as the logger's: computed on the tape
                    tape.named = tf.reduce_sum(named_target(x)) if tape.named is None else tape.named
                return x

        self.self = StepSelf()
        for name in SUBS[: spec.subs]:
            setattr(self.self, name, Recorded(getattr(self.model, name)))
        for k in range(spec.optimizers):
            setattr(self.self, f"opt_{k}", getattr(self.model, f"opt_{k}"))
        self.self.trainable_weights = self.model.trainable_weights
        shim = type("TF", (), {"GradientTape": RecordingTape, "__getattr__": lambda _, n: getattr(tf, n)})()
        ref_namespace = _namespace(shim)
        exec(model_source(spec), ref_namespace)  # noqa: S102
        self.train_step = ref_namespace["Step"].train_step

    def load(self, weights: Dict[str, np.ndarray]) -> None:
        for key, value in weights.items():
            self.table[key].assign(value)
        self.since_reset = 0

    def step(self, batch: Tuple[np.ndarray, np.ndarray]) -> List[Call]:
        self.calls = []
        self.train_step(self.self, tuple(tf.constant(a) for a in batch))
        return self.calls

    def weights(self) -> Dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in self.table.items()}


# -- the checks ---------------------------------------------------------------------------------------------------


def _check_target(fit_helpers, series, name: str, step: int, call: Call) -> None:
    infos = {(info.source, info.layer): info for info, _ in series.values() if info.target == name}
    loss = [layer for source, layer in infos if source == "target"]
    assert len(loss) == 1, f"{name}: target records {loss}"
    fit_helpers.assert_close(
        fit_helpers.stat(fit_helpers.one(series, f"{name}/target/{loss[0]}/stats", step), "mean"),
        call.value,
        f"{name}'s value",
        call.length,
    )
    logged = {layer for source, layer in infos if source == "output"}
    assert logged == set(call.outputs), (
        f"{name} at step {step}: outputs logged {sorted(logged)}, re-run {sorted(call.outputs)}"
    )
    for path in sorted(logged):
        no_gradient = fit_helpers.stat(fit_helpers.one(series, f"{name}/output/{path}/stats", step), "no_gradient")
        assert no_gradient == (call.outputs[path] is None), f"{name} {path} at step {step}: no_gradient {no_gradient}"
        if call.outputs[path] is not None:
            got = fit_helpers.one(series, f"{name}/output/{path}/tensor", step)
            fit_helpers.assert_close(
                got,
                fit_helpers.bounded(call.outputs[path], fit_helpers.MAX),
                f"{name} {path} at step {step}",
                call.length,
            )
    weights = {layer for source, layer in infos if source == "weight"}
    assert weights == set(call.weights), (
        f"{name} at step {step}: weights logged {sorted(weights)}, asked {sorted(call.weights)}"
    )
    for path in sorted(weights):
        got = fit_helpers.one(series, f"{name}/weight/{path}/tensor", step)
        fit_helpers.assert_close(
            got,
            fit_helpers.bounded(call.weights[path], fit_helpers.MAX),
            f"{name} weight {path} at step {step}",
            call.length,
        )


def _same_calls(
    fit_helpers, tolerances, series, step: int, matched: List[Tuple[str, Call]], findings: "Findings"
) -> Dict[str, Call]:
    """Where the names differ from the rule's: which of the rule's calls each logged target is (by its loss value,
    each call's its own), noted as a finding; the logged targets that are the rule's call of the same name."""
    values = {
        info.target: fit_helpers.stat(by_step[step][0], "mean")
        for info, by_step in series.values()
        if info.source == "target" and info.kind == "stats" and step in by_step
    }
    same, seen, notes = {}, [], []
    for logged, value in sorted(values.items()):
        hits = [
            name
            for name, call in matched
            if abs(value - call.value)
            <= tolerances.TWO_SIDES * tolerances.chain_rtol(np.float32, [call.length]) * abs(call.value)
        ]
        seen += hits
        if hits == [logged]:
            same[logged] = dict(matched)[logged]
        else:
            notes.append(f"{logged!r} is the rule's {' or '.join(map(repr, hits)) if hits else 'none'}")
    missing = [name for name, _ in matched if name not in seen]
    notes += [f"the rule's {missing} not logged"] if missing else []
    if notes:
        findings.failed.append(f"[names] at step {step}: " + "; ".join(notes))
    return same


class Findings:
    """The example's checks, each run to its end: a failing one is noted and the others still run, so that a
    failing example says everything that is wrong with it."""

    def __init__(self) -> None:
        self.failed: List[str] = []

    @contextlib.contextmanager
    def check(self, what: str):
        try:
            yield
        except Exception as error:  # noqa: BLE001 - a KeyError (a record missing) is a finding too
            self.failed.append(f"[{what}] {type(error).__name__}: {str(error).strip()}")

    def report(self) -> List[str]:
        """Each check's first failure, with how many steps it failed at."""
        first: Dict[str, str] = {}
        count: Dict[str, int] = {}
        for line in self.failed:
            what = line.split("]")[0] + "]"
            first.setdefault(what, line)
            count[what] = count.get(what, 0) + 1
        return [line + (f" (and {count[w] - 1} more)" if count[w] > 1 else "") for w, line in first.items()]


def check(fit_helpers, tb_reading, tolerances, spec: StepSpec, tmp_path) -> List[str]:
    """The example's failed checks (none: it passes)."""
    findings = Findings()
    _, plain_snaps, plain_warnings = fit(fit_helpers, spec, str(tmp_path / "plain"), logged=False)
    _, snaps, logged_warnings = fit(fit_helpers, spec, str(tmp_path / "logged"), logged=True)
    x, y = data()
    batches = [(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(BATCHES)]
    reference = Reference(tolerances, spec, batches[0][0])
    expected = expected_targets(spec)
    step_length = reference.base * sum(1 for _, kind in expected if kind == STEP)

    # (a) training unchanged: bitwise, batch by batch. Under XLA (docs/DESIGN.md, "XLA neutrality") the first
    # execution that differs started from equal weights, so it is within the same math's any-order bound; after it
    # the two trainings are two runs, with nothing more to compare. A bitwise first execution does not make the
    # later ones so: LayerNormalization's first update multiplies by gamma = 1 and adds beta = 0, exact in any order.
    with findings.check("training"):
        assert sorted(snaps.after) == sorted(plain_snaps.after), (sorted(snaps.after), sorted(plain_snaps.after))
        before = 0  # the batch count at the last snapshot where both trainings were bitwise equal
        for s in sorted(snaps.after):
            equal = all(np.array_equal(plain_snaps.after[s][k], v) for k, v in snaps.after[s].items())
            if spec.mode == "xla" and not equal:
                for key, want in plain_snaps.after[s].items():
                    tolerances.assert_same_float32_math(
                        snaps.after[s][key], want, step_length * (s - before), f"{key} after {s} (XLA)"
                    )
                break
            for key, want in plain_snaps.after[s].items():
                np.testing.assert_array_equal(snaps.after[s][key], want, err_msg=f"{key} after batch {s}")
            before = s

    # (b) the steps: the schedule, which are Keras' TensorBoard's batch steps
    logged_steps = [s for s in range(1, BATCHES + 1) if s % spec.update_freq == 0]
    series = fit_helpers.read_series(str(tmp_path / "logged"))
    with findings.check("steps"):
        assert series, "nothing logged"
        wrong = {
            f"{info.target}/{info.source}/{info.layer}/{info.kind}": sorted(by_step)
            for info, by_step in series.values()
            if sorted(by_step) != logged_steps
        }
        assert not wrong, (
            f"steps {sorted(set(map(tuple, wrong.values())))} (want {logged_steps}) in {sorted(wrong)[:4]}"
        )
        if spec.steps_per_execution == 1:
            scalars = tb_reading.scalars(str(tmp_path / "logged"))["train"]
            keras_steps = sorted({s for tag, points in scalars.items() if tag.startswith("batch_") for s in points})
            if keras_steps != [0]:  # Keras 3.3's TensorBoard writes every batch_* scalar at step 0
                assert keras_steps == list(range(1, BATCHES + 1)), f"Keras' TensorBoard batch steps {keras_steps}"
    with findings.check("messages"):  # every step here is logged whole: nothing to warn about but what is not
        new = sorted(logged_warnings - plain_warnings)
        unnamed = unnamed_calls(spec)
        if unnamed:  # targets=fn on the tapes that do not call the model: not computed there, and said so
            assert (
                len(new) == 1
                and f"did not call the model itself under the tapes of {', '.join(unnamed)}, so" in (new[0])
            ), f"warned: {new}, not about the targets of {unnamed} only"
        else:
            assert not new, f"warned: {new}"

    # (c) the targets the rule names
    logged_targets = {info.target for info, _ in series.values()}
    names_right = logged_targets == {n for n, _ in expected}
    with findings.check("targets"):
        assert names_right, f"logged {sorted(logged_targets)}, the rule's {[n for n, _ in expected]}"

    # (d) each target's numbers against the re-run
    for s, batch in enumerate(batches, 1):
        before = snaps.before.get(s, {})
        # the weights fit() had before this batch, where it had built them all (a lazy model: from batch 2; a
        # sub-model the step never runs stays unbuilt there)
        if before and set(before) == set(snaps.after[max(snaps.after)]):
            reference.load(before)
        calls = reference.step(batch)
        matched = []
        for kind in (STEP, INPUTS, NAMED_KIND):  # each kind's calls in the order the step makes them
            names, made = [n for n, k in expected if k == kind], [c for c in calls if c.kind == kind]
            if kind == STEP or kind == NAMED_KIND or spec.ask_inputs:
                assert len(made) == len(names), f"the re-run's {kind} calls are not the spec's: {len(made)}, {names}"
                matched += list(zip(names, made))
        if s in logged_steps:
            same = dict(matched)
            if not names_right:  # the values of the targets that are the rule's call of that name only
                same = _same_calls(fit_helpers, tolerances, series, s, matched, findings)
            for name, call in matched:
                if name in same:
                    with findings.check(f"values {name}"):
                        _check_target(fit_helpers, series, name, s, call)
        if s in snaps.after:  # the re-run replays the step's updates: it reaches the weights fit() left
            with findings.check("re-run"):
                _check_replay(tolerances, reference, snaps.after[s], s)
    return findings.report()


def _check_replay(tolerances, reference: Reference, after: Dict[str, np.ndarray], s: int) -> None:
    for key, want in after.items():
        got = reference.weights()[key]
        tolerances.assert_same_float32_math(got, want, reference.since_reset * reference.base, f"{key} after batch {s}")


# What tf_keras' own code brings to a generated step: its train function (the mode, steps per execution), its data
# adapter, its batch count (update_freq) and building a model in the first step. The rest of a step (sub-models,
# optimizers, tapes, calls, loop, penalty, the normalization layer, the named target, whose prediction the logger
# takes from the model's own `call`) is the step's own code, observed through TensorFlow's tape.
KERAS_SIDE = ("mode", "steps_per_execution", "update_freq", "data", "lazy")


def _levels(f: Dict) -> set:
    """Every level of every dimension, and every pair of levels of two KERAS_SIDE dimensions, that `f` holds."""
    return {(d, f[d]) for d in DIMENSIONS} | {((a, f[a]), (b, f[b])) for a, b in itertools.combinations(KERAS_SIDE, 2)}


def keras_side_cover() -> List[int]:
    """The examples that hold every pair of KERAS_SIDE levels and every level of the other dimensions that the
    examples hold (greedy: each the example adding most; of equals, the one with fewest `gradient()` calls, the
    cheapest to trace). The oldest tf_keras leg runs these only (.ci/run says why)."""
    realized = [(spec, features(spec)) for spec in EXAMPLES]
    uncovered = set().union(*(_levels(f) for _, f in realized))
    kept = []
    while uncovered:
        spec, f = max(
            realized,
            key=lambda item: (len(_levels(item[1]) & uncovered), -sum(len(t.calls) * t.loop for t in item[0].tapes)),
        )
        kept.append(spec.index)
        uncovered -= _levels(f)
    return sorted(kept)


def _param(spec: StepSpec):
    elsewhere = spec.index not in keras_side_cover()
    return pytest.param(spec, id=spec.id, marks=[pytest.mark.keras_side_repeated] if elsewhere else [])


@pytest.mark.parametrize("spec", [_param(spec) for spec in EXAMPLES])
def test_generated_step(tmp_path, spec: StepSpec, fit_helpers, tb_reading, tolerances):
    try:
        failed = check(fit_helpers, tb_reading, tolerances, spec, tmp_path)
    except Exception:
        failed = [f"[raised] {traceback.format_exc(limit=-4)}"]
    if failed:
        pytest.fail("\n".join(failed) + f"\n\nReproduction:\n{reproduction(spec)}", pytrace=False)


def test_the_examples_cover_the_space():
    """Every feasible pair of levels of two main dimensions occurs in some example, as the example realizes it;
    every ask kind and apply kind occurs, input targets both asked and not, and the named target with every tape
    calling the model and with some not, and on a persistent tape asked several times."""
    realized = [features(spec) for spec in EXAMPLES]
    covered = set().union(*(_pairs(f) for f in realized))
    assert feasible_pairs() <= covered, sorted(feasible_pairs() - covered, key=repr)[:5]
    calls = [(spec, c) for spec in EXAMPLES for t in spec.tapes for c in t.calls]
    assert {ask_kind(c.ask, spec.subs) for spec, c in calls} == set(ASK_KINDS)
    assert {c.apply for _, c in calls} == set(APPLY_KINDS)
    assert {spec.ask_inputs for spec in EXAMPLES if any(t.penalty for t in spec.tapes)} == {False, True}
    named = [spec for spec in EXAMPLES if spec.named]
    assert {bool(unnamed_calls(spec)) for spec in named} == {False, True}
    assert any(t.model_call and len(t.calls) > 1 for spec in named for t in spec.tapes)
    for spec in EXAMPLES:
        assert all(len(t.calls) == 1 or t.persistent for t in spec.tapes), spec
        assert feasible(features(spec)), spec
    kept = [features(spec) for spec in EXAMPLES if spec.index in keras_side_cover()]
    assert set().union(*(_levels(f) for f in kept)) == set().union(*(_levels(f) for f in realized))


def test_a_failure_prints_a_runnable_reproduction(tmp_path):
    """The reproduction a failing example prints runs as it is (here: its model builds, its step traces)."""
    spec = next(
        s for s in EXAMPLES if any(t.penalty for t in s.tapes) and any(t.loop > 1 for t in s.tapes) and not s.lazy
    )
    source = reproduction(spec).replace("'logs'", repr(str(tmp_path / "logs")))
    namespace: dict = {}
    exec(source, namespace)  # noqa: S102
    assert namespace["targets"], "the reproduction logged nothing"
    assert int(namespace["model"].opt_0.iterations.numpy()) > 0  # it trained
