"""`d500 benchmark`: the checkout's benchmark scripts listed and run from any directory."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def d500(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "d500.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_the_list_names_every_script_that_runs_and_only_those(tmp_path):
    done = d500("benchmark", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines()}
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")
               if "__main__" in p.read_text() and not p.name.startswith("_")}
    assert listed == scripts and "compiled_torch" in listed and "ratio" not in listed
    line = next(x for x in done.stdout.splitlines() if x.startswith("compiled_torch "))
    assert "torch:compiled and onnxruntime" in line


def test_a_script_runs_with_its_own_arguments_from_another_directory(tmp_path):
    done = d500("benchmark", "pipeline_bubble.py", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: d500 benchmark pipeline_bubble"), done.stdout
    assert "--micro" in done.stdout


def test_a_wrong_name_is_one_line_with_exit_2(tmp_path):
    typo = d500("benchmark", "compild_torch", cwd=tmp_path)
    helper = d500("benchmark", "ratio", cwd=tmp_path)
    for done in (typo, helper):
        assert done.returncode == 2 and done.stdout == ""
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "did you mean 'compiled_torch'" in typo.stderr
    assert "not a benchmark" in helper.stderr


def test_a_scripts_usage_error_is_one_line_with_the_closest(tmp_path):
    typo = d500("benchmark", "compiled_torch", "--rouns", "3", cwd=tmp_path)
    assert typo.returncode == 2 and typo.stdout == "", typo.stderr
    assert typo.stderr == ("d500 benchmark compiled_torch: error: unrecognized arguments: "
                           "--rouns 3 (did you mean '--rounds'?)\n")  # as typed, not a file
    sizes = d500("benchmark", "allreduce", "--sizes", "0.5,x", cwd=tmp_path)
    assert sizes.returncode == 2 and sizes.stderr == (
        "d500 benchmark allreduce: error: argument --sizes: expected sizes in MB > 0, "
        "comma-separated, got '0.5,x'\n"), sizes.stderr


def test_too_few_repetitions_is_one_line(tmp_path):
    """allreduce --repetitions 1 ran, then ended in statistics' 'must have at least two data
    points' traceback (the quartiles of one ratio); every script's --rounds/--repetitions now
    takes benchmarks/_args.repetitions."""
    for name, option in (("allreduce", "--repetitions"), ("pipeline_bubble", "--rounds")):
        done = d500("benchmark", name, option, "1", cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr == (f"d500 benchmark {name}: error: argument {option}: expected an "
                               f"integer >= 2, got '1'\n")
