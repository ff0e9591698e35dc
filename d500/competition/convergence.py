"""Reference convergence (MLPerf's RCPs, for d500): a workload's `reference_convergence` block read
and checked, a result's epochs-to-target tested against it, a run's test accuracy against its own
validation accuracy. Pure: no ledger, no files, no framework; scipy only inside the two tests.

    rules = read(workload_text, "2-training/digits-mlp.yaml")   # .reference, .validation, .test
    rules.reference_in("bf16")      # the block `reference_convergence_bf16`, or None
    check_epochs(rules.reference, [6.0, 7.0, 6.0], batch_size=32)   # -> Verdict
    check_gap(run_figures, rules.validation, rules.test)            # -> Verdict

**Convergence speed.** MLPerf's rcp_checker takes the olympic mean of the submission's runs and
fails it when it lies below the smallest mean that a pooled-variance t-test against the RCP runs
would still accept at 0.05 (one-sided). d500 keeps the question (is the result's mean epochs to
target implausibly low for runs drawn like the reference runs?) and the level, but answers it with
a one-sided permutation test of the mean: epochs to target are small integers with heavy ties
(digits-mlp's reference: 20 runs at 4 to 10 epochs, six of them at 6), so the t-test's normal model
is poor, and a result whose three runs all took the same number of epochs has no variance to put in
Welch's test. Under the null hypothesis the result's runs and the reference runs are exchangeable
(draws of one distribution); the p-value is the share of the ways of choosing the result's n values
out of the pooled n + m whose mean is at most the observed one (exact by enumeration up to
RESAMPLES ways, else RESAMPLES random ones from a fixed seed, so the verdict is reproducible). For
one run this is its empirical lower tail, (1 + #reference runs <= it) / (m + 1): a single run can
only be flagged when it beats every one of at least 19 reference runs, hence MIN_SAMPLES is 10 but
the rulebook records 20. Only the result's succeeded runs count (a missed run has no epochs to
target; it is slow, never implausibly fast). A result at a smaller batch than the reference's is
tested against it all the same (smaller batches take more steps per epoch, so it may legitimately
need fewer epochs): when flagged, the line says a reference at its batch size is missing, as
MLPerf's checker does ("Missing RCP, please submit RCP with BS = ...").

**Scaled to the reference (MLPerf's RCP normalization).** A result that converges in fewer
epochs than the reference gains nothing from it: its score (time to accuracy over its scored seed
runs) is multiplied by rcp_scale's factor, the reference's mean over the result's mean epochs to
target, both olympic means (MLPerf drops the top and bottom of each), when that is above 1; a
result at or above the reference's mean keeps factor 1. MLPerf Training's rules
(training_policies, training_rules.adoc, "Reference Convergence Points"): "Accepted submissions
with mean epochs lower than RCP mean (faster) but within the acceptable speedup range are
normalized to (potentially interpolated) RCP mean epochs for fairness. New normalized score =
Submission-olympic-score * (RCP-mean / olympic-submission-epochs)". A result that check_epochs
flags (implausibly fast: refused by `d500 check`) is scaled all the same where it is shown.

**Test far below validation.** A run's validation and test accuracies (the figures
`val_accuracy` and `final_test_accuracy`, both from its last evaluation; for a succeeded run
that is the evaluation that met the target, so `test_accuracy` is the same number) are the
same model's accuracy on two disjoint samples of one data pool. Given the model's errors on the
two together, how many fall in the test part is hypergeometric under the null hypothesis that
nothing was fitted to the validation samples, so a one-sided Fisher exact test is exact here
(no normal approximation near accuracy 1). "Far below" is p < GAP_ALPHA = 0.001: at the digits
splits (300 + 300) that is a test accuracy of 0.907 or less against validation 0.97 (a gap of
6.3 points), 0.923 or less against 0.98 (the verdict names the threshold). The strict level
leaves room for the stopping rule's own optimism (a run stops at the first evaluation whose
validation accuracy crosses the target, so that accuracy is biased upwards) and keeps false
alarms rare over the dozens of runs a package holds (0.1% each). Measured on the 71 succeeded
digits reference runs: gaps of at most 2.3 points, the smallest p-value 0.11.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d500.errors import ConfigError
from d500.training.precision import PRECISIONS
from d500.workload import Field

ALPHA = 0.05  # the level for "implausibly fast" (MLPerf's rcp_checker uses the same)
GAP_ALPHA = 0.001  # test far below validation: one false alarm in a thousand honest runs
MIN_SAMPLES = 10  # reference runs a block must hold (the rulebook records 20)
RESAMPLES = 100_000  # permutation test: exact up to this many ways to split the pooled runs
METRICS = ("epochs", "steps")  # the figure compared: epochs (or steps) to the target

BLOCK = {
    "metric": Field(str, required=True, choices=METRICS,
                    help="the figure compared: the succeeded runs' epochs (or steps) to target"),
    "entry": Field(str, required=True, help="the entry whose default recipe was measured"),
    "backend": Field(str, required=True, help="the backend it ran on"),
    "command": Field(str, required=True, help="the d500 reference command that measured it"),
    "samples": Field(list, required=True, items=float,
                     help=f"the reference runs' figures (at least {MIN_SAMPLES})"),
    "batch_size": Field(int, help="the reference entry's (global) batch size"),
    "ranks": Field(int, help="level 3: the world size it was measured at"),
    "precision": Field(str, default="fp32", choices=PRECISIONS,
                       help="what the reference runs computed in: runs of another precision "
                            "have no reference (d500.training.precision)"),
}
KEY = "reference_convergence"


def key(precision: str = "fp32") -> str:
    """The workload field holding the reference runs made in `precision`: `reference_convergence`
    for fp32, `reference_convergence_bf16` for bf16, and so on (runs in one precision are no
    reference for another)."""
    return KEY if precision == "fp32" else f"{KEY}_{precision}"


NOT_CHECKED, OK, FLAGGED = "not checked", "ok", "flagged"


@dataclass(frozen=True)
class Reference:
    """A validated `reference_convergence` block."""

    metric: str
    entry: str
    backend: str
    command: str
    samples: tuple[float, ...]
    batch_size: int | None = None
    ranks: int | None = None
    precision: str = "fp32"


@dataclass(frozen=True)
class Rules:
    """What the convergence checks read from one workload file: its references, one per precision
    it has a block for, and its validation and test split sizes (None when the file names
    none)."""

    references: Mapping[str, Reference]  # by precision
    validation: int | None
    test: int | None

    @property
    def reference(self) -> Reference | None:
        """The fp32 reference (the block `reference_convergence`)."""
        return self.references.get("fp32")

    def reference_in(self, precision: str) -> Reference | None:
        """The reference made in `precision` (None: the workload has none)."""
        return self.references.get(precision)


@dataclass(frozen=True)
class Verdict:
    """One check's outcome: `status` is "ok", "flagged" or "not checked"; `reason` one line;
    `test` the test's name; `statistic` (epochs: the result's mean; gap: validation minus test
    accuracy) and `p_value` when a test ran."""

    status: str
    reason: str
    test: str = ""
    statistic: float | None = None
    p_value: float | None = None

    @property
    def flagged(self) -> bool:
        return self.status == FLAGGED


def parse_reference(block: Any, where: str | Path, precision: str = "fp32") -> Reference:
    """A `reference_convergence` block (`reference_convergence_<precision>` for another precision
    than fp32) checked field by field; a problem is a ConfigError naming `where` (the workload
    file) and the field."""
    from d500.workload import validate
    path, field = Path(where), key(precision)
    if not isinstance(block, Mapping):
        raise ConfigError(f"{path}: field '{field}' must be a mapping, got "
                          f"{type(block).__name__}")
    data = validate(block, BLOCK, path, f"{field}.", path.parent)
    if "precision" in block and data["precision"] != precision:
        raise ConfigError(f"{path}: field '{field}.precision' says {data['precision']}: a "
                          f"reference in {data['precision']} goes under '{key(data['precision'])}'")
    samples = data["samples"]
    if len(samples) < MIN_SAMPLES:
        raise ConfigError(f"{path}: field '{field}.samples' holds {len(samples)} run(s); a "
                          f"reference needs at least {MIN_SAMPLES}")
    for i, value in enumerate(samples):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{path}: field '{field}.samples[{i}]' must be a positive finite "
                              f"number of {data['metric']}, got {value!r}")
    for name in ("batch_size", "ranks"):
        if data[name] is not None and data[name] < 1:
            raise ConfigError(f"{path}: field '{field}.{name}' must be at least 1, "
                              f"got {data[name]}")
    return Reference(data["metric"], data["entry"], data["backend"], data["command"],
                     tuple(samples), data["batch_size"], data["ranks"], precision)


def read(text: str | bytes, where: str | Path) -> Rules:
    """The convergence rules of a workload file's text (e.g. a package's member): a malformed
    block or file is a ConfigError naming `where`."""
    from d500.workload import mapping
    data = mapping(text, where)
    references = {p: parse_reference(data[key(p)], where, p) for p in PRECISIONS
                  if data.get(key(p)) is not None}
    split = data.get("dataset")
    sizes = [split.get(k) if isinstance(split, Mapping) else None for k in ("validation", "test")]
    sizes = [n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None
             for n in sizes]
    return Rules(references, sizes[0], sizes[1])


def check_epochs(reference: Reference | None, values: Sequence[float], *,
                 batch_size: int | None = None, alpha: float = ALPHA,
                 precision: str = "fp32") -> Verdict:
    """Whether a result's succeeded runs reached the target implausibly faster than the
    reference runs: a one-sided permutation test of the mean (see the module docstring).
    `values`: their epochs (or the reference's metric) to target; `batch_size`: theirs;
    `precision`: theirs (a reference of another precision is none: not checked)."""
    if reference is None:
        return Verdict(NOT_CHECKED, "the workload has no reference_convergence: not checked")
    if reference.precision != precision:
        return Verdict(NOT_CHECKED, f"no reference convergence in {precision} (the workload's "
                                    f"reference runs are {reference.precision}): not checked")
    what = f"{reference.metric} to target"
    if not values:
        return Verdict(NOT_CHECKED, f"{what}: no succeeded runs to compare: not checked")
    bad = [v for v in values if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)]
    if bad:
        return Verdict(FLAGGED, f"{what}: a succeeded run records {bad[0]!r}, not a positive "
                                f"finite number")
    import numpy as np
    from scipy import stats
    x = np.asarray(values, dtype=float)
    ref = np.asarray(reference.samples, dtype=float)
    if len(x) == 1:  # the permutation test's exact value for one run (scipy wants two)
        p, exact = (1 + int(np.sum(ref <= x[0]))) / (len(ref) + 1), True
    else:
        # the sum of the result's values orders the splits as the difference of the means does
        # (the pooled total is fixed), and sums of whole epochs are exact in floating point
        p = float(stats.permutation_test(
            (x, ref), lambda a, b, axis: np.sum(a, axis=axis), permutation_type="independent",
            vectorized=True, n_resamples=RESAMPLES, alternative="less",
            rng=np.random.default_rng(0)).pvalue)
        exact = math.comb(len(x) + len(ref), len(x)) <= RESAMPLES
    test = f"one-sided permutation test of the mean ({'exact' if exact else 'Monte Carlo'})"
    mean, ref_mean = float(np.mean(x)), float(np.mean(ref))
    text = (f"{what}: mean {mean:.4g} over {len(x)} run(s) against the reference's "
            f"{ref_mean:.4g} over {len(ref)} ({reference.entry} on {reference.backend}"
            f"{_batch(reference.batch_size)}); p = {p:.3g}")
    if p >= alpha:
        return Verdict(OK, f"{text} >= {alpha:g}", test, mean, p)
    text = f"{text} < {alpha:g}: implausibly fast"
    if batch_size is not None and reference.batch_size is not None \
            and batch_size < reference.batch_size:
        text += (f" (at batch {batch_size}, below the reference's {reference.batch_size}: a "
                 f"reference at batch {batch_size} is missing)")
    return Verdict(FLAGGED, text, test, mean, p)


@dataclass(frozen=True)
class Scale:
    """RCP normalization of one result: its score is multiplied by `factor` (>= 1); `reason`
    one line; the two olympic means when they were compared."""

    factor: float
    reason: str
    reference_mean: float | None = None
    result_mean: float | None = None


def rcp_scale(reference: Reference | None, values: Sequence[float], *,
              precision: str = "fp32", verdict: Verdict | None = None) -> Scale:
    """The factor a result's score is multiplied by: RCP olympic mean / the result's olympic mean
    epochs (or steps) to target when that is above 1, else 1. `values`: the scored runs' figures
    (a miss is ∞); `verdict`: its check_epochs verdict, named in the reason."""
    from d500.metrics import aggregate
    if reference is None or reference.precision != precision:
        return Scale(1.0, "no reference convergence for it: not scaled")
    what = f"{reference.metric} to target"
    vals = [math.inf if v is None else float(v) for v in values]
    mean = aggregate(vals, "olympic_mean")
    ref_mean = float(aggregate(list(reference.samples), "olympic_mean") or 0.0)
    if mean is None or not math.isfinite(mean) or mean <= 0:
        return Scale(1.0, f"{what}: its olympic mean is {mean}: not scaled (a miss is already "
                          f"∞)", ref_mean, mean)
    if mean >= ref_mean:
        return Scale(1.0, f"{what}: olympic mean {mean:.4g} at or above the reference's "
                          f"{ref_mean:.4g}: not scaled", ref_mean, mean)
    factor = ref_mean / mean
    how = ("accepted by the convergence check" if verdict is None or not verdict.flagged
           else "flagged as implausibly fast by the convergence check")
    return Scale(factor, f"{what}: olympic mean {mean:.4g} below the reference's {ref_mean:.4g} "
                         f"({how}): score x {factor:.4g} = reference / its mean (MLPerf's RCP "
                         f"normalization)", ref_mean, mean)


def check_gap(figures: Mapping[str, Any], validation: int | None, test: int | None, *,
              alpha: float = GAP_ALPHA) -> Verdict:
    """Whether a run's test accuracy is far below its validation accuracy (same evaluation):
    a one-sided Fisher exact test on the two splits' correct/wrong counts, far = p < alpha.
    `validation`, `test`: the split sizes (Rules.validation, Rules.test)."""
    val = figures.get("val_accuracy")
    tst = figures.get("final_test_accuracy", figures.get("test_accuracy"))
    if not (_accuracy(val) and _accuracy(tst)):
        return Verdict(NOT_CHECKED, "no validation and test accuracy recorded: not checked")
    if not validation or not test:
        return Verdict(NOT_CHECKED, "the workload names no validation and test sizes: "
                                    "not checked")
    from scipy import stats
    k_val, k_test = round(val * validation), round(tst * test)
    table = [[k_val, validation - k_val], [k_test, test - k_test]]
    p = float(stats.fisher_exact(table, alternative="greater").pvalue)
    gap = float(val - tst)
    test_name = "one-sided Fisher exact test (validation vs test counts)"
    text = (f"test accuracy {tst:.4f} ({test} samples) against validation {val:.4f} "
            f"({validation}): gap {gap:+.4f}, p = {p:.3g}")
    if p >= alpha:
        return Verdict(OK, f"{text} >= {alpha:g}", test_name, gap, p)
    limit = _far(k_val, validation, test, alpha)
    return Verdict(FLAGGED, f"{text} < {alpha:g}: test accuracy far below validation (far "
                            f"here: {limit:.4f} or less)", test_name, gap, p)


def _far(k_val: int, validation: int, test: int, alpha: float) -> float:
    """The highest test accuracy that the gap test flags against `k_val` of `validation`."""
    from scipy import stats
    for k in range(test, -1, -1):
        table = [[k_val, validation - k_val], [k, test - k]]
        if stats.fisher_exact(table, alternative="greater").pvalue < alpha:
            return k / test
    return 0.0


def _accuracy(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and 0.0 <= value <= 1.0)


def _batch(batch_size: int | None) -> str:
    return f", batch {batch_size}" if batch_size is not None else ""
