"""What the entry's process sends cannot run code in the judge's (d500.untrusted): an optimizer
that sends the supervisor a pickle whose loading would call `exec` (patching the judge's clock,
reading its held-out data) has its run fail with one line naming the object, and nothing ran;
the same for an operator host's reply at level 0 and for rank 0's messages to the level-3 judge;
the hand-overs d500 itself sends (arrays, numbers, text, RankStats) still load."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest

from d500 import untrusted

from . import entries

# On import (in the worker), finds the pipe to its supervisor and sends down it a message whose
# unpickling calls exec: the code would run in the supervisor, beside its clock and held-out data.
EXEC = '''
import gc, os
from multiprocessing.connection import Connection
from d500.training.optimizers import Optimizer

CODE = "open(%r, 'w').write(str(__import__('os').getpid()))" % os.environ["D500_PWNED"]


class Payload:
    def __reduce__(self):
        return (exec, (CODE,))


for obj in gc.get_objects():
    if isinstance(obj, Connection) and not obj.closed:
        obj.send(("ready", Payload()))


class Plain(Optimizer):
    name = "plain"

    def update(self, ops, params, grads, state, lr, t):
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow  # a real training run: 20 s at load 13
def test_a_worker_sending_a_pickle_that_calls_exec_runs_nothing_in_the_supervisor(
        home, tmp_path, monkeypatch):
    pwned = tmp_path / "pwned"
    monkeypatch.setenv("D500_PWNED", str(pwned))
    result = entries.run(entries.entry(tmp_path, EXEC, "Plain"))
    assert not pwned.exists(), f"code ran in process {pwned.read_text()}"
    assert result.status == "failed"
    assert "builtins.exec" in result.error and "\n" not in result.error.strip(), result.error
    assert result.error.startswith("the worker sent an object d500 does not accept")


def _sent(value) -> bytes:
    return bytes(ForkingPickler.dumps(value))


def test_what_d500_hands_over_loads_and_nothing_callable_does():
    import ml_dtypes

    from d500.distributed.figures import RankStats
    state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.int64(3),
             "s": np.array(["a"]), "o": np.array([1, "x"], dtype=object),
             "bf16": np.ones(2, dtype=ml_dtypes.bfloat16)}  # a bf16 operator's output
    message = ("trained", [np.float32(0.5), 1.0], state, False, "", {"keys": ["k"]},
               RankStats(rank=1, host="h", pid=2), complex(1, 2), {1}, frozenset({2}),
               b"b", bytearray(b"c"), None)
    back = untrusted.loads(_sent(message))
    assert back[0] == "trained" and back[6] == RankStats(rank=1, host="h", pid=2)
    assert all(np.array_equal(back[2][k], v) for k, v in state.items())

    class Call:
        def __init__(self, fn, *args):
            self.fn, self.args = fn, args

        def __reduce__(self):
            return (self.fn, self.args)

    import os
    import subprocess
    for payload, name in ((Call(exec, "x = 1"), "builtins.exec"),
                          (Call(os.system, "true"), "posix.system"),
                          (Call(subprocess.Popen, ["true"]), "subprocess.Popen"),
                          (Call(getattr, "s", "upper"), "builtins.getattr")):
        with pytest.raises(untrusted.Forbidden, match=rf"\({name}\)"):
            untrusted.loads(_sent(("tick", 0, {"x": [payload]})))
    with pytest.raises(untrusted.Forbidden, match="not a pickle"):
        untrusted.loads(b"\x80\x04garbage")
    assert pickle.loads(_sent(("ok",))) == untrusted.loads(_sent(("ok",)))


# Level 0: an operator whose forward returns, in place of its output, a pickle that calls exec.
OPERATOR = '''
import os
import numpy as np
from d500.operators import CustomOperator

CODE = "open(%r, 'w').write(str(__import__('os').getpid()))" % os.environ["D500_PWNED"]


class Payload:
    def __reduce__(self):
        return (exec, (CODE,))


class Relu(CustomOperator):
    op_type = "Relu"
    framework = "numpy"

    def forward(self, x):
        return Payload()

    def backward(self, grad_outputs, inputs, outputs):
        return [grad_outputs[0] * (inputs[0] > 0)]
'''


def test_an_operator_replying_with_a_pickle_that_calls_exec_runs_nothing_in_the_judge(
        home, tmp_path, monkeypatch, capsys):
    from d500 import cli
    from d500.paths import rulebook
    pwned = tmp_path / "pwned"
    monkeypatch.setenv("D500_PWNED", str(pwned))
    (tmp_path / "op.py").write_text(OPERATOR)
    code = cli.main(["op", "bench", f"{tmp_path / 'op.py'}:Relu", "--case",
                     str(rulebook() / "0-operators" / "relu-4d.yaml"), "--backends", "reference",
                     "--budget", "0.5"])
    assert not pwned.exists(), f"code ran in process {pwned.read_text()}"
    assert code != 0
    assert "(builtins.exec)" in capsys.readouterr().err
