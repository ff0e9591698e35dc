"""Framework-neutral optimizers on NumPy against written-out references of their papers' formulas;
hyperparameter validation; learning-rate schedules; a submission's own optimizer file."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import textwrap
from typing import ClassVar

import numpy as np
import pytest

from d500.errors import ConfigError, UsageError
from d500.training.optimizers import (
    OPTIMIZERS,
    Hyper,
    Optimizer,
    load_optimizer,
    make,
    native,
    schedule,
)

STEPS = 30


# -- a small fixed problem: a tanh MLP 8 -> 6 -> 3 with softmax cross-entropy ------------------
def problem(dtype: type = np.float64) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(32, 8))
    y = rng.integers(0, 3, size=32)
    params = {"w1": rng.normal(size=(8, 6)) * 0.5, "b1": rng.normal(size=6) * 0.1,
              "w2": rng.normal(size=(6, 3)) * 0.5, "b2": np.zeros(3)}  # b2 = 0: a zero norm
    return {k: v.astype(dtype) for k, v in params.items()}, x.astype(dtype), y


def grads_of(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Analytic gradient of the mean cross-entropy."""
    h = np.tanh(x @ p["w1"] + p["b1"])
    z = h @ p["w2"] + p["b2"]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    g = e / e.sum(axis=1, keepdims=True)
    g[np.arange(len(y)), y] -= 1
    g /= len(y)
    da = (g @ p["w2"].T) * (1 - h * h)
    return {"w1": x.T @ da, "b1": da.sum(0), "w2": h.T @ g, "b2": g.sum(0)}


LR = schedule("cosine", floor=0.1, warmup_steps=5)  # a varying lr exercises lr handling


# -- written-out references, one parameter at a time, straight from the formulas ----------------
def reference(name: str, hp: dict, steps: int = STEPS) -> dict[str, np.ndarray]:
    o = make(name, **hp)  # only for the defaults; the arithmetic below is independent
    p, x, y = problem()
    s1 = {k: np.zeros_like(v) for k, v in p.items()}
    s2 = {k: np.full_like(v, getattr(o, "initial_accumulator_value", 0.0)) for k, v in p.items()}
    for t in range(1, steps + 1):
        lr = o.lr * LR(t - 1, steps)
        grads = grads_of(p, x, y)
        for k in p:
            w, g = p[k], grads[k]
            excluded = getattr(o, "exclude_1d", False) and w.ndim <= 1
            wd = 0.0 if excluded else o.weight_decay
            if name in ("sgd", "momentum", "nesterov"):
                g = g + wd * w
                if o.momentum:
                    s1[k] = g if t == 1 else o.momentum * s1[k] + g  # torch's first step
                    g = g + o.momentum * s1[k] if o.nesterov else s1[k]
                p[k] = w - lr * g
            elif name in ("adam", "adamw"):
                if name == "adamw":
                    w = w * (1 - lr * wd)
                else:
                    g = g + wd * w
                s1[k] = o.beta1 * s1[k] + (1 - o.beta1) * g
                s2[k] = o.beta2 * s2[k] + (1 - o.beta2) * g * g
                mhat, vhat = s1[k] / (1 - o.beta1 ** t), s2[k] / (1 - o.beta2 ** t)
                p[k] = w - lr * mhat / (np.sqrt(vhat) + o.eps)
            elif name == "adagrad":
                g = g + wd * w
                s2[k] = s2[k] + g * g
                p[k] = w - lr / (1 + (t - 1) * o.lr_decay) * g / (np.sqrt(s2[k]) + o.eps)
            elif name == "lars":  # You et al. 2017, Algorithm 1
                wn, gn = np.linalg.norm(w), np.linalg.norm(g)
                trust = (o.eta * wn / (gn + wd * wn + o.eps)
                         if wn > 0 and gn > 0 and not excluded else 1.0)
                s1[k] = o.momentum * s1[k] + lr * trust * (g + wd * w)
                p[k] = w - s1[k]
            elif name == "lamb":  # You et al. 2020, Algorithm 2
                s1[k] = o.beta1 * s1[k] + (1 - o.beta1) * g
                s2[k] = o.beta2 * s2[k] + (1 - o.beta2) * g * g
                r = (s1[k] / (1 - o.beta1 ** t)) / (np.sqrt(s2[k] / (1 - o.beta2 ** t)) + o.eps)
                u = r + wd * w
                wn, un = np.linalg.norm(w), np.linalg.norm(u)
                ratio = wn / un if wn > 0 and un > 0 and not excluded else 1.0
                p[k] = w - lr * ratio * u
    return p


def neutral_numpy(name: str, hp: dict, dtype: type = np.float64,
                  steps: int = STEPS) -> dict[str, np.ndarray]:
    opt = make(name, **hp)
    p, x, y = problem(dtype)
    state = opt.init(p, "numpy")
    for t in range(steps):
        opt.step(p, grads_of(p, x, y), state, opt.lr * LR(t, steps))
    return p


CASES = [
    ("sgd", {"lr": 0.5}),
    ("sgd", {"lr": 0.5, "weight_decay": 0.01}),
    ("momentum", {"lr": 0.2, "weight_decay": 0.01}),
    ("nesterov", {"lr": 0.2, "momentum": 0.8, "weight_decay": 0.01}),
    ("adam", {"lr": 0.02}),
    ("adam", {"lr": 0.02, "weight_decay": 0.05}),
    ("adamw", {"lr": 0.02, "weight_decay": 0.1}),
    ("adagrad", {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.01,
                 "initial_accumulator_value": 0.1}),
    ("lars", {"lr": 1.0, "eta": 0.02, "weight_decay": 5e-4}),
    ("lars", {"lr": 20.0, "weight_decay": 5e-4, "exclude_1d": False, "eps": 1e-9}),
    ("lamb", {"lr": 0.02, "weight_decay": 0.01}),
    ("lamb", {"lr": 0.02, "weight_decay": 0.01, "exclude_1d": False}),
]


@pytest.mark.parametrize(("name", "hp"), CASES, ids=[f"{n}-{i}" for i, (n, _) in
                                                     enumerate(CASES)])
def test_numpy_matches_written_out_formula(name, hp):
    ref = reference(name, hp)
    got = neutral_numpy(name, hp)
    start, _, _ = problem()
    for k in ref:
        assert got[k].dtype == np.float64
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-10, atol=1e-12, err_msg=k)
        assert not np.allclose(ref[k], start[k]), k  # it moved


def test_float32_stays_float32_and_tracks_float64():
    for name, hp in CASES:
        got = neutral_numpy(name, hp, np.float32)
        ref = reference(name, hp)
        for k in got:
            assert got[k].dtype == np.float32
            scale = np.max(np.abs(ref[k])) or 1.0
            assert np.max(np.abs(got[k] - ref[k])) <= 1e-5 * scale, (name, k)


def test_every_name_is_built_and_trains():
    p, x, y = problem(np.float32)
    for name in OPTIMIZERS:
        q = {k: v.copy() for k, v in p.items()}
        opt = make(name, lr={"lars": 2.0, "sgd": 0.5, "momentum": 0.2,
                             "nesterov": 0.2}.get(name, 0.02))
        state = opt.init(q, "reference")
        for _ in range(60):
            opt.step(q, grads_of(q, x, y), state, opt.lr)
        h = np.tanh(x @ q["w1"] + q["b1"]) @ q["w2"] + q["b2"]
        loss = np.mean(np.log(np.exp(h).sum(1)) - h[np.arange(32), y])
        h0 = np.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        loss0 = np.mean(np.log(np.exp(h0).sum(1)) - h0[np.arange(32), y])
        assert loss < 0.9 * loss0, name


# -- hyperparameters ------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "hp", "field"), [
    ("adamw", {"beta1": 1.5}, "beta1"),
    ("adamw", {"beta2": -0.1}, "beta2"),
    ("sgd", {"lr": 0.0}, "lr"),
    ("sgd", {"lr": float("nan")}, "lr"),
    ("sgd", {"lr": "0.1"}, "lr"),
    ("momentum", {"momentum": 1.0}, "momentum"),
    ("nesterov", {"nesterov": "yes"}, "nesterov"),
    ("sgd", {"nesterov": True}, "nesterov"),  # needs momentum
    ("lars", {"eta": 0}, "eta"),
    ("lamb", {"weight_decay": -1}, "weight_decay"),
    ("adagrad", {"eps": True}, "eps"),
    ("adam", {"betas": (0.9, 0.99)}, "betas"),  # unknown: torch's name is not d500's
])
def test_bad_hyperparameter_is_a_config_error_naming_it(name, hp, field):
    with pytest.raises(ConfigError, match=f"'{name}'.*'{field}'"):
        make(name, **hp)


def test_defaults_and_attributes():
    opt = make("adamw")
    assert opt.hp == {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                      "weight_decay": 0.01}
    assert opt.beta2 == 0.999 and "adamw" in repr(type(opt)).lower()
    assert make("nesterov").nesterov is True and make("momentum", momentum=0).momentum == 0.0
    assert make("sgd", lr=1).lr == 1.0 and isinstance(make("sgd", lr=1).lr, float)
    with pytest.raises(ConfigError, match="unknown optimizer 'adamax'.*adamw"):
        make("adamax")


def test_step_names_a_missing_gradient_and_init_an_unknown_framework():
    p, _, _ = problem()
    opt = make("sgd")
    state = opt.init(p, "numpy")
    with pytest.raises(UsageError, match="'b2'"):
        opt.step(p, {k: v for k, v in p.items() if k != "b2"}, state, 0.1)
    with pytest.raises(UsageError, match="mxnet"):
        opt.init(p, "mxnet")
    with pytest.raises(UsageError, match="no parameters"):
        opt.init({}, "numpy")


def test_native_refuses_what_has_no_twin():
    with pytest.raises(ConfigError, match="'lars' has no torch-native twin"):
        native("torch", "lars", [])
    with pytest.raises(ConfigError, match="'lamb' has no torch-native twin"):
        native("torch", "lamb", [])
    with pytest.raises(ConfigError, match="no framework-native optimizers for 'mxnet'"):
        native("mxnet", "sgd", [])
    with pytest.raises(ConfigError, match="'lars' has no jax-native twin"):
        native("jax", "lars", [])
    with pytest.raises(ConfigError, match="'adagrad' has no optax twin .*lr_decay"):
        native("jax", "adagrad", [], lr_decay=0.01)
    with pytest.raises(ConfigError, match="'beta1'"):  # validated before any framework import
        native("torch", "adam", [], beta1=2)


def test_importing_the_package_imports_no_framework():
    code = ("import sys, d500.training.optimizers as o; o.make('lamb'); o.schedule('cosine');"
            "print(sorted(m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


# -- schedules ----------------------------------------------------------------------------------
def test_schedule_shapes():
    assert schedule()(17, 100) == 1.0
    step = schedule("step", milestones=[0.5, 0.75], gamma=0.1)
    assert [step(s, 100) for s in (0, 49, 50, 74, 75, 99)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01, 0.01])
    cos = schedule("cosine", floor=0.2)
    assert cos(0, 100) == 1.0 and cos(50, 100) == pytest.approx(0.6)
    assert cos(100, 100) == pytest.approx(0.2) and cos(10**6, 100) == pytest.approx(0.2)
    poly = schedule("polynomial", power=2.0)
    assert poly(0, 10) == 1.0 and poly(5, 10) == pytest.approx(0.25)
    values = [cos(s, 100) for s in range(100)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_linear_warmup_composes_with_any_shape():
    # Goyal et al.: rise linearly to the base lr over the warm-up, then the base schedule
    s = schedule("cosine", warmup_steps=10)
    assert [s(i, 110) for i in range(10)] == pytest.approx([(i + 1) / 10 for i in range(10)])
    assert s(10, 110) == 1.0 and s(60, 110) == pytest.approx(0.5)  # cosine over the 100 after
    s = schedule("step", milestones=[0.5], gamma=0.5, warmup=0.1, warmup_start=0.5)
    assert s(0, 100) == pytest.approx(0.55) and s(9, 100) == 1.0
    assert s(10, 100) == 1.0 and s(55, 100) == 0.5
    s = schedule("constant", warmup_steps=1000)  # longer than the run: warm-up throughout
    assert s(99, 100) == pytest.approx(0.1)
    assert schedule("polynomial", warmup=0.0)(0, 10) == 1.0


@pytest.mark.parametrize(("name", "params", "field"), [
    ("step", {}, "milestones"),
    ("step", {"milestones": [0.5, 0.3]}, "milestones"),
    ("step", {"milestones": [1.5]}, "milestones"),
    ("step", {"milestones": [0.5], "gamma": 0}, "gamma"),
    ("cosine", {"floor": 1.5}, "floor"),
    ("polynomial", {"power": -1}, "power"),
    ("cosine", {"warmup": 1.0}, "warmup"),
    ("cosine", {"warmup_steps": 2.5}, "warmup_steps"),
    ("cosine", {"warmup_start": -0.1}, "warmup_start"),
    ("cosine", {"gamma": 0.1}, "gamma"),  # not a cosine parameter
    ("constant", {"warmup": 0.1, "warmup_steps": 3}, "warmup"),
])
def test_bad_schedule_is_a_config_error_naming_the_parameter(name, params, field):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        schedule(name, **params)


def test_unknown_schedule_and_bad_total():
    with pytest.raises(ConfigError, match="unknown schedule 'exp'"):
        schedule("exp")
    with pytest.raises(ConfigError, match="total_steps"):
        schedule("cosine")(0, 0)


# -- a submission's own optimizer ---------------------------------------------------------------
SIGN_SGD = textwrap.dedent('''
    """A submission's optimizer: sign descent with momentum (signum)."""
    from d500.training.optimizers import Hyper, Optimizer


    class Signum(Optimizer):
        name = "signum"
        hyperparameters = {**Optimizer.hyperparameters, "lr": Hyper(0.01),
                           "momentum": Hyper(0.5, "fraction")}

        def init_state(self, ops, params, names):
            return {"m": ops.zeros_like(params)}

        def update(self, ops, params, grads, state, lr, t):
            ops.lerp_(state["m"], grads, 1 - self.momentum)
            ops.add_(params, ops.sign(state["m"]), -lr)
''')


def test_load_optimizer_from_a_submission_file(tmp_path):
    path = tmp_path / "signum.py"
    path.write_text(SIGN_SGD)
    cls = load_optimizer(path, "Signum")
    assert issubclass(cls, Optimizer)
    opt = cls(lr=0.05, momentum=0.5)
    p, x, y = problem(np.float32)
    expect = {k: v.copy() for k, v in p.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    state = opt.init(p, "numpy")
    for _ in range(5):
        opt.step(p, grads_of(p, x, y), state, 0.05)
        g = grads_of(expect, x, y)
        m = {k: 0.5 * mk + 0.5 * g[k] for k, mk in m.items()}  # the same rule written out
        expect = {k: expect[k] - 0.05 * np.sign(m[k]) for k in expect}
        for k in p:
            np.testing.assert_allclose(p[k], expect[k], rtol=1e-6, atol=1e-7)
    with pytest.raises(ConfigError, match="'momentum'"):
        cls(momentum=2)


@pytest.mark.parametrize(("text", "class_name", "message"), [
    (None, "Signum", "not found"),
    ("class Signum(:\n", "Signum", r"signum\.py:1: syntax error"),
    ("import no_such_module_d500\n", "Signum", "importing it failed: ModuleNotFoundError"),
    (SIGN_SGD, "Adam", "no class 'Adam'"),
    ("class Signum:\n    pass\n", "Signum", "not a subclass"),
    ("from d500.training.optimizers import Optimizer\nclass Signum(Optimizer):\n    pass\n",
     "Signum", "does not define update"),
    (SIGN_SGD.replace('Hyper(0.5, "fraction")', 'Hyper(5.0, "fraction")'), "Signum",
     "'momentum' must be"),
    (SIGN_SGD.replace('"momentum": Hyper', '"step": Hyper'), "Signum", "hide Optimizer.step"),
    (SIGN_SGD.replace('{**Optimizer.hyperparameters, "lr": Hyper(0.01),', "{"), "Signum", "'lr'"),
])
def test_load_optimizer_errors_name_the_file(tmp_path, text, class_name, message):
    path = tmp_path / "signum.py"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_optimizer(path, class_name)
    assert str(path) in str(err.value)


def test_hyper_kinds_are_checked():
    class Odd(Optimizer):
        name = "odd"
        hyperparameters: ClassVar[dict[str, Hyper]] = {**Optimizer.hyperparameters,
                                                       "k": Hyper(1.0, "prime")}

        def update(self, ops, params, grads, state, lr, t):
            pass

    with pytest.raises(ConfigError, match="unknown kind 'prime'"):
        Odd()
    assert math.isclose(make("lars").eta, 0.001)
