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


def test_a_progress_bar_in_a_log_says_how_far_the_run_is(capsys, monkeypatch):
    """rich draws a bar on no terminal only when it stops: a long run's log (or mpiexec's
    ranks, whose stderr is a pipe) showed nothing until its end; now a line every SAY_EVERY s."""
    from d500.training import console
    monkeypatch.setattr(console, "SAY_EVERY", 0.0)
    with console.progress_bar("digits-mlp / sgd-momentum / torch seed 3") as bar:
        bar({"step": 37, "total": 370, "loss": 0.5, "val_accuracy": 0.9, "epoch": 1})
        monkeypatch.setattr(console, "SAY_EVERY", 3600.0)
        bar({"step": 74, "total": 370, "loss": 0.25, "val_accuracy": 0.95, "epoch": 2})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == "digits-mlp / sgd-momentum / torch seed 3: started, 0 s"
    # mid-run, no validation figure (a log file is one the entry's code may read)
    assert lines[1].startswith("digits-mlp / sgd-momentum / torch seed 3: step 37 of 370, "
                               "epoch 1, loss 0.5000, ") and "val" not in lines[1], lines
    # its end: that plain line, not the bar squeezed to 80 columns ("7… loss 0.2500, val a…")
    assert lines[2].startswith("digits-mlp / sgd-momentum / torch seed 3: step 74 of 370, "
                               "epoch 2, loss 0.2500, val acc 0.9500, "), lines
    with console.progress_bar("digits-mlp / adamw / torch seed 0"):
        pass  # interrupted before its first step
    assert capsys.readouterr().err == "digits-mlp / adamw / torch seed 0: started, 0 s\n" \
                                      "digits-mlp / adamw / torch seed 0: before its first " \
                                      "step, 0 s\n"
