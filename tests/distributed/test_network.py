"""The network for the alpha-beta model: `--network LATENCY,BANDWIDTH` parsed (units, bits or
bytes, decimal or binary prefixes) with one-line refusals, the least-squares fit recovering a known
line, and a measurement refused at one rank. The sweep on real ranks is in mpi_comm_checks.py."""

from __future__ import annotations

import pytest

from d500.distributed.comm import Communicator
from d500.distributed.network import Network, NetworkError, fit, measure, parse_network
from d500.errors import UsageError


@pytest.mark.parametrize("text, alpha, bandwidth", [
    ("2us,12.5GB/s", 2e-6, 12.5e9),
    (" 1.5e-6s , 100Gb/s ", 1.5e-6, 100e9 / 8),
    ("0.8µs,10GiB/s", 0.8e-6, 10 * 2**30),
    ("500ns,400MB/s", 500e-9, 400e6),
    ("3ms,1e3KB/s", 3e-3, 1e6),
    ("0s,25Gbit/s", 0.0, 25e9 / 8),
    (".5us,1.B/s", 0.5e-6, 1.0),
])
def test_parse_network(text, alpha, bandwidth):
    net = parse_network(text)
    assert net.alpha == pytest.approx(alpha, rel=1e-12, abs=0)
    assert net.bandwidth == pytest.approx(bandwidth, rel=1e-12)
    assert net.beta == pytest.approx(1 / bandwidth, rel=1e-12) and net.source == "given"


@pytest.mark.parametrize("text, why", [
    ("2us", "not two comma-separated values"),
    ("2us,12.5GB/s,3", "not two comma-separated values"),
    ("2,12.5GB/s", "latency '2' is not a number with a unit"),
    ("2 hours,12.5GB/s", "latency '2 hours' is not a number with a unit"),
    ("-2us,12.5GB/s", "latency '-2us' is not a number"),
    ("2us,12.5", "bandwidth '12.5' is not a number with a unit"),
    ("2us,12.5GB", "bandwidth '12.5GB' is not a number with a unit"),
    ("2us,0GB/s", "bandwidth must be a finite number > 0"),
    ("2us,1e999GB/s", "bandwidth must be a finite number > 0"),
    ("2us,5iB/s", "'i' without a prefix"),
])
def test_bad_network_values_are_one_line_usage_errors(text, why):
    with pytest.raises(NetworkError) as err:
        parse_network(text)
    message = str(err.value)
    assert why in message and "\n" not in message
    assert message.startswith(f"--network {text!r}: ")
    assert message.endswith("expected LATENCY,BANDWIDTH such as 2us,12.5GB/s")
    assert isinstance(err.value, UsageError)


def test_spec_reads_back():
    net = Network(2.5e-6, 1 / 12.5e9)
    assert net.spec() == "2.5us,12.5GB/s"
    again = parse_network(net.spec())
    assert again.alpha == pytest.approx(net.alpha) and again.beta == pytest.approx(net.beta)
    assert net.time(1e9, messages=4) == pytest.approx(4 * 2.5e-6 + 0.08)


def test_fit_recovers_a_line_and_weighs_small_messages():
    alpha, beta = 3e-6, 1 / 5e9
    sizes = [8 * 4**k for k in range(12)]
    a, b = fit([(n, alpha + beta * n) for n in sizes])
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9)
    noisy = [(n, (alpha + beta * n) * (1.2 if k % 2 else 0.85)) for k, n in enumerate(sizes)]
    a, b = fit(noisy)  # relative errors: the latency stays within the noise
    assert 0.8 * alpha < a < 1.25 * alpha and 0.8 * beta < b < 1.25 * beta
    with pytest.raises(NetworkError, match="at least two message sizes"):
        fit([(8, 1e-6), (8, 2e-6)])


def test_measuring_needs_two_ranks():
    with pytest.raises(NetworkError, match=r"needs at least 2 ranks \(mpiexec -n 2\)"):
        measure(Communicator.single())
