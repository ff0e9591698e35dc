"""Six operator files' cheats written against the call check's shift (d500.operators.host), as
an entry submits them: the file is imported in the operator host, and on import it replaces the
host's loop of checked calls with one that answers each call's checksum from algebra on what the
judge sent, without running the call (tests/operators/test_shift_cheats.py,
benchmarks/shift_cheats.py). Each class's honest twin is beside it.

- CachedMatMul: MatMul is linear in its first input, so (x + u) B = x B + u B. When every call's
  offsets u were s times one of PERIOD rolls of one pattern p and the weights w were one vector
  per timed call, a call's checksum was w.(x B) + s C[r], C[r] = (w B^T).roll_r(p tiled): one
  matmul and a circular correlation of length PERIOD once, then two numbers per call.
- PrefixRelu: element j's offset was s p[(j + r) % PERIOD], one shift for all j of a residue
  class mod PERIOD, so a class's Relu outputs are a prefix of its elements sorted once: the
  checksum is PERIOD binary searches and prefix sums per call, not a pass over the data.

- WindowMatMul: a call's offsets are a window of one pattern as long as x, so a row of x + u is
  x's row plus a window of the pattern, and (x + u) B is x B plus rows of a table of every
  window times B, one matmul once: a call is a gather and an add, no matmul.
- GradientWindowMatMul: the same on the backward, whose output gradient alone is shifted: its
  (g + u) B^T and A^T (g + u) gathered from tables made once.
- GradientWeightsMatMul: on the backward, the checksum's side: w.L(g') = L^T(w).g' for a linear
  backward L, and with w a window of one pattern, L^T of every window is a table made once:
  a call is its shift and a pass over g' per output, whatever the shift.

The first two are written against the shift as it was before each call got its own window of a
65,521-number pattern (host.PATTERN) and of the weights, WindowMatMul against the shift before
a forward's second float input got its own window too ((x + u)(B + v) has a term u v only a
matmul gives), the last two against a backward's shift and weights before each window was
multiplied by a window of signs at a start of its own (host._signs: a pair of starts, too many
to tabulate); run on today's judge all six answer wrong."""

import numpy as np

from d500.operators import CustomOperator, host

PERIOD = 1021  # the shift's period then (host.PERIOD, now gone)
_plans: dict[str, object] = {}  # the cheat's precomputation for the timed call, by its kind


def _pattern(key):
    p = np.random.default_rng([key, 2]).uniform(0.0, 1.0, PERIOD)
    return np.concatenate([p, p])


def _weights(key, y):
    return np.random.default_rng([key, 1]).standard_normal(y.size, dtype=np.float32)


def _shifts(seed, calls, scale):
    return (np.random.default_rng([seed, 0]).uniform(0.05, 0.5, calls) * scale,
            np.random.default_rng([seed, 3]).integers(0, PERIOD, calls))


class MatMulPlan:
    """w.(x B) and C[r] for every roll r: a call's checksum is then c0 + s C[r]."""

    def __init__(self, inputs, key):
        x, b = (np.asarray(a, np.float64) for a in inputs)
        y = x @ b
        w = _weights(key, y).astype(np.float64)
        self.c0 = float(w @ y.ravel())
        g = (w.reshape(y.shape) @ np.swapaxes(b, -1, -2)).ravel()  # w B^T, shaped as x
        folded = np.bincount(np.arange(g.size) % PERIOD, weights=g, minlength=PERIOD)
        p = _pattern(key)[:PERIOD]
        # C[r] = sum_c folded[c] p[(c + r) % PERIOD], all r at once
        self.c = np.real(np.fft.ifft(np.conj(np.fft.fft(folded)) * np.fft.fft(p)))

    def sums(self, seed, calls, scale):
        s, r = _shifts(seed, calls, scale)
        return (self.c0 + s * self.c[r])[:, None]


class ReluPlan:
    """x sorted once within each residue class mod PERIOD (a row, padded with +inf), with running
    sums of w x and w: a call's checksum is, class by class, the sums over its elements above
    -v_c, found by a binary search of the row (9 steps), for all of a round trip's calls at once."""

    def __init__(self, inputs, key):
        x = np.asarray(inputs[0], np.float64).ravel()
        w = _weights(key, x).astype(np.float64)
        m = -(-x.size // PERIOD)
        rows = np.full((PERIOD, m), np.inf)
        wx, ws = np.zeros((PERIOD, m + 1)), np.zeros((PERIOD, m + 1))
        for c in range(PERIOD):
            xc, wc = x[c::PERIOD], w[c::PERIOD]
            order = np.argsort(xc)
            rows[c, :xc.size] = xc[order]
            wx[c, 1:xc.size + 1] = np.cumsum((wc * xc)[order])
            ws[c, 1:xc.size + 1] = np.cumsum(wc[order])
            wx[c, xc.size + 1:], ws[c, xc.size + 1:] = wx[c, xc.size], ws[c, xc.size]
        self.rows, self.wx, self.ws, self.m = rows.ravel(), wx, ws, m
        self.p = _pattern(key)

    def sums(self, seed, calls, scale):
        s, r = _shifts(seed, calls, scale)
        out = np.empty((calls, 1))
        for i in range(0, calls, 16):  # 16 calls at a time: the arrays stay in cache
            out[i:i + 16, 0] = self._sums(s[i:i + 16], r[i:i + 16])
        return out

    def _sums(self, s, r):
        cols = np.arange(PERIOD)
        v = (s[:, None] * self.p[cols[None, :] + r[:, None]]).astype(np.float32)
        q = -v.astype(np.float64)  # element x of class c is active when x > -v_c
        k = np.zeros(q.shape, np.int64)  # elements of the row <= q
        step = 1 << int(np.ceil(np.log2(self.m)))
        base = cols * self.m - 1
        while step:
            cand = np.minimum(k + step, self.m)
            k = np.where(self.rows[base + cand] <= q, cand, k)
            step >>= 1
        end_wx, end_w = self.wx[:, -1], self.ws[:, -1]
        part = (end_wx - self.wx[cols, k]) - q * (end_w - self.ws[cols, k])
        return part.sum(axis=1)


class WindowPlan:
    """Against the shift of the first input only: a call's offsets are a window of one pattern
    p as long as x, at roll r, so row k of x + u is x's row plus p[r + kK : r + kK + K], K the
    row's length, and (x + u) B = x B + rows of a table T[a] = p[a : a + K] B over every start
    a (L rows of N, one matmul of L x K by K x N once per scale). A call is then a gather of M
    rows, an add and the dot with its turned weights: passes over the output, no matmul."""

    def __init__(self, inputs, key):
        self.x, self.b = (np.asarray(a, np.float32) for a in inputs)
        self.key, self.scale = key, None
        self.y0 = self.x @ self.b
        (self.w,) = host._weights(key, [self.y0])

    def sums(self, seed, calls, scale):
        m, k = self.x.shape[-2:]
        rows = self.x.size // k
        if scale != self.scale:
            self.scale = scale
            p = host._pattern(self.key, scale, self.x.dtype)
            windows = np.lib.stride_tricks.sliding_window_view(p, k)[:p.size // 2]
            self.table = windows @ self.b
            self.starts = np.arange(rows) * k
        length = self.table.shape[0]
        rolls, turns = host._rolls(seed, calls)
        out = np.empty((calls, 1))
        y0 = self.y0.reshape(rows, -1)
        for i in range(calls):
            y = y0 + self.table[(rolls[i] + self.starts) % length]
            out[i, 0] = np.einsum("i,i->", host._turned(self.w, turns[i], y.size), y.ravel())
        return out


class GradientWindowPlan:
    """Against the backward's shift, its first output gradient's only: a call's g + u has rows
    g's plus windows of the pattern, so (g + u) B^T = g B^T + rows of a table of every window
    times B^T, and A^T (g + u) = A^T g + columns of a table T2[k, s] = sum_i A[i, k] p[s + iN]
    (one matmul of A^T by the pattern's strided windows, once per scale): a call is gathers
    and adds, no matmul."""

    def __init__(self, inputs, grads, key):
        a, self.b = (np.asarray(x, np.float32) for x in inputs)
        self.g = np.asarray(grads[0], np.float32)
        self.n = self.g.shape[-1]
        self.a = a.reshape(-1, a.shape[-1])  # (R, K), the batch's rows stacked
        g = self.g.reshape(-1, self.n)
        self.ga0, self.gb0 = g @ self.b.T, self.a.T @ g
        self.key, self.scale = key, None
        self.w = host._weights(key, [self.ga0, self.gb0])

    def sums(self, seed, calls, scale):
        rows = self.a.shape[0]
        if scale != self.scale:
            self.scale = scale
            p = host._pattern(self.key, scale, np.float32)
            length = p.size // 2
            windows = np.lib.stride_tricks.sliding_window_view(p, self.n)[:length]
            self.t1 = windows @ self.b.T  # (L, K)
            strided = p[(np.arange(length)[None, :] + np.arange(rows)[:, None] * self.n)
                        % length]  # (R, L): p[s + iN]
            self.t2 = self.a.T @ strided  # (K, L)
            self.starts, self.cols, self.length = np.arange(rows) * self.n, np.arange(self.n), \
                length
        rolls, turns = host._rolls(seed, calls)
        out = np.empty((calls, 2))
        for i in range(calls):
            r = int(rolls[i])
            ga = self.ga0 + self.t1[(r + self.starts) % self.length]
            gb = self.gb0 + self.t2[:, (r + self.cols) % self.length]
            for k, (w, y) in enumerate(zip(self.w, (ga, gb))):
                out[i, k] = np.einsum("i,i->", host._turned(w, turns[i], y.size), y.ravel())
        return out


class GradientWeightsPlan:
    """Against the backward's weights, windows of one pattern per output at a call's turn: a
    linear backward's checksum w.L(g') is L^T(w).g', and L^T of every window is a table made
    once, whatever the shift g' = g + u. For a MatMul, dA = g' B^T's checksum is
    sum_i g'_i . T1[t + iK], T1[s] = w[s : s + K] B (every start s, one matmul), and
    dB = A^T g''s is sum_in g'_in T2[i, t + n], T2 = A times the weights' windows strided by N
    (one matmul): a call is its shift and two passes over g', no matmul."""

    def __init__(self, inputs, grads, key):
        a, b = (np.asarray(x, np.float32) for x in inputs)
        self.g = np.asarray(grads[0], np.float32)
        self.m, self.n = self.g.reshape(-1, self.g.shape[-1]).shape
        self.a, self.k = a.reshape(-1, a.shape[-1]), b.shape[0]
        self.key, self.scale = key, None
        wa, wb = host._weights(key, [np.empty((self.m, self.k)), np.empty((self.k, self.n))])
        self.sizes = (wa.size, wb.size)
        half = wa.size // 2  # the weights are given twice over: windows of a periodic pattern
        windows = np.lib.stride_tricks.sliding_window_view(wa, self.k)[:half]
        self.t1 = windows @ b  # (M_A, N): T1[s] = w[s : s + K] B
        half = wb.size // 2
        cols = (np.arange(half + self.n)[None, :] + np.arange(self.k)[:, None] * self.n) % half
        self.t2 = self.a @ wb[cols]  # (R, M_B + N): T2[i, m] = sum_k A[i, k] w[m + kN]
        self.halves = (wa.size // 2, half)

    def sums(self, seed, calls, scale):
        from d500.operators.adapters import turned
        if scale != self.scale:
            self.scale = scale
            self.p = host._pattern(self.key, scale, np.float32)
        rolls, turns = host._rolls(seed, calls)
        rows = np.arange(self.m) * self.k
        out = np.empty((calls, 2))
        for i in range(calls):
            g = host._shifted(self.g, host._offsets(self.p, rolls[i], self.g.size))
            g = g.reshape(self.m, self.n)
            t = turned(self.sizes[0], self.m * self.k, turns[i])
            out[i, 0] = np.einsum("ij,ij->", g, self.t1[(t + rows) % self.halves[0]])
            t = turned(self.sizes[1], self.k * self.n, turns[i])
            out[i, 1] = np.einsum("ij,ij->", g, self.t2[:, t:t + self.n])
        return out


_real_answer = host._answer


def _answer(cls, state, message):
    """The host's request handler: a checked forward's inputs and key seen when prepared."""
    if message[0] == "prepare" and message[1] == "forward" and len(message) > 4:
        plan = getattr(cls, "plan", None)
        _plans["forward"] = plan(message[2], message[4]) if plan else None
    if message[0] == "prepare" and message[1] == "backward" and len(message) > 4:
        plan = getattr(cls, "backward_plan", None)
        _plans["backward"] = plan(message[2], message[3], message[4]) if plan else None
    if message[0] == "repeat" and message[4] is not None and _plans.get(message[1]):
        t = __import__("time").perf_counter()
        sums = _plans[message[1]].sums(message[3], message[2], message[4])
        return __import__("time").perf_counter() - t, sums
    return _real_answer(cls, state, message)


host._answer = _answer


class CachedMatMul(CustomOperator):
    op_type = "MatMul"
    framework = "numpy"
    plan = MatMulPlan

    def forward(self, a, b):
        return a @ b


class WindowMatMul(CustomOperator):
    op_type = "MatMul"
    framework = "numpy"
    plan = WindowPlan

    def forward(self, a, b):
        return a @ b


class GradientWindowMatMul(CustomOperator):
    op_type = "MatMul"
    framework = "numpy"
    backward_plan = GradientWindowPlan

    def forward(self, a, b):
        return a @ b

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (a, b) = grad_outputs, inputs
        return [g @ b.T, a.reshape(-1, a.shape[-1]).T @ g.reshape(-1, g.shape[-1])]


class GradientWeightsMatMul(GradientWindowMatMul):
    backward_plan = GradientWeightsPlan


class HonestGradMatMul(CustomOperator):
    op_type = "MatMul"
    framework = "numpy"

    def forward(self, a, b):
        return a @ b

    def backward(self, grad_outputs, inputs, outputs):
        (g,), (a, b) = grad_outputs, inputs
        return [g @ b.T, a.reshape(-1, a.shape[-1]).T @ g.reshape(-1, g.shape[-1])]


class HonestMatMul(CustomOperator):
    op_type = "MatMul"
    framework = "numpy"

    def forward(self, a, b):
        return a @ b


class PrefixRelu(CustomOperator):
    op_type = "Relu"
    framework = "numpy"
    plan = ReluPlan

    def forward(self, x):
        return np.maximum(x, 0)


class HonestRelu(CustomOperator):
    op_type = "Relu"
    framework = "numpy"

    def forward(self, x):
        return np.maximum(x, 0)
