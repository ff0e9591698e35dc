"""A run's result line (train, tune, level 3 under mpiexec) reaches a log or a pipe whole: rich
wrapped it at 160 columns there, and 'samples_per_second 4462' fell apart from its unit."""

from __future__ import annotations

from d500.training.console import print_whole


def test_a_long_result_line_is_one_line_in_a_pipe(capsys):
    text = ("run 14, seed 1439854278, succeeded, time_to_accuracy 2.32 s, epochs 8, val_accuracy "
            "0.9700, test_accuracy 0.9867, final_test_accuracy 0.9867, samples_per_second 4230 "
            "samples/s, bytes_per_step 1.034e+05 B, comm_share 0.912 (exploration: a seed the "
            "rules did not choose, never scored)")
    assert len(text) > 200
    print_whole(text)
    assert capsys.readouterr().out == text + "\n"
