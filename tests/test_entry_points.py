"""Every entry point (scripts, the substrafl example, benchmarks) on hostile input: a number out of
bounds, a list with nothing in it, an option its mode would ignore, a JSON integer too long for
Python, is one `error:` line and exit 2, before anything is written; and a valid value at each bound
is accepted."""
import importlib.util
import json
import shutil
import zipfile

import pytest
from conftest import REPO

from mnist_dp.privacy import model_file
from mnist_dp.utils.errors import run_cli

HUGE = "9" * 5000  # past Python's 4,300-digit limit of int()


def entry_point(relative: str):
    spec = importlib.util.spec_from_file_location(f"entry_{relative.replace('/', '_')[:-3]}",
                                                  REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused(relative: str, argv: list, capsys) -> str:
    """Run the entry point as its command line does (run_cli), with `argv`; its one error line."""
    with pytest.raises(SystemExit) as exit_:
        run_cli(entry_point(relative).main, [str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# (entry point, argv, what the line says). Each would otherwise start work or run on nothing.
CASES = [
    ("scripts/run_local.py", ["--rounds", "0"], "--rounds: 0 is not an integer from 1 to 10,000"),
    ("scripts/run_local.py", ["--rounds", HUGE], "--rounds: '9999999999"),
    ("scripts/run_local.py", ["--organizations", "1001"],
     "1,001 is not an integer from 1 to 1,000"),
    ("scripts/run_local.py", ["--rounds", "2000", "--organizations", "2"],
     "3 runs make 36,000 tasks"),
    ("scripts/run_local.py", ["--frameworks", ","], "--frameworks: ',': give at least 1"),
    ("scripts/run_local.py", ["--frameworks", "torch,torch"], "torch given twice"),
    ("scripts/run_local.py", ["--strategy", "fedavg", "--score-train"],
     "--score-train has no effect with --strategy fedavg"),
    ("scripts/run_local.py", ["--client-name", "nobody"],
     "--client-name nobody with --backend subprocess: no URL"),
    ("scripts/generate_data.py", ["--seed", "-1"], "--seed: -1 is not an integer from 0"),
    ("scripts/generate_data.py", ["--train-size", HUGE], "--train-size: '9999"),
    ("scripts/generate_data.py", ["--organizations", "0"], "--organizations: 0 is not"),
    ("scripts/generate_data.py", ["--add-key", "x", "--output", "y"],
     "--output has no effect with --add-key"),
    ("scripts/add_dataset_objective.py", ["--folds", "0"], "--folds: 0 is not an integer from 1"),
    ("scripts/add_dataset_objective.py", ["--client-name", "nobody"], "no URL is set for it"),
    ("scripts/add_train_algo_cnn_dp.py", ["--rounds", "-3"], "--rounds: -3 is not"),
    ("scripts/add_train_algo_cnn_dp.py", ["--strategy", "fedavg", "--score-train"],
     "--score-train has no effect"),
    ("scripts/add_train_algo_cnn_dp.py", ["--client-name", "nobody"], "no URL is set for it"),
    ("scripts/privacy_report.py", [], "give model files, --reconcile KEYS_FILE, or both"),
    ("examples/substrafl_fedavg.py", ["--rounds", "1000000"],
     "--rounds: 1,000,000 is not an integer from 1"),
    ("examples/substrafl_fedavg.py", ["--rounds", "5000"],
     "--rounds 5000 with --organizations 2 make 25,002 tasks"),
    ("examples/substrafl_fedavg.py", ["--organizations", "0"], "--organizations: 0 is not"),
    ("benchmarks/benchmark.py", ["--steps", "0"], "--steps: 0 is not"),
    ("benchmarks/benchmark.py", ["--skip-run", "--skip-steps"], "nothing would be measured"),
    ("benchmarks/benchmark.py", ["--skip-steps", "--frameworks", "tf"],
     "--frameworks has no effect with --skip-steps"),
    ("benchmarks/benchmark.py", ["--skip-run", "--set", "optimizer=adam"],
     "--set optimizer: the step timings use"),
    ("benchmarks/utility.py", ["--seeds", "0"], "--seeds: 0 is not"),
    ("benchmarks/utility.py", ["--epsilons", "1e999"],
     "--epsilons: inf is not a number in (0, 100]"),
    ("benchmarks/utility.py", ["--epsilons", "nan"], "--epsilons: nan is not a number"),
    ("benchmarks/utility.py", ["--epsilons", "1,2", "--seeds", "3"],
     "--seeds-at 3: not one of --epsilons"),
    ("benchmarks/utility.py", ["--ablation", "a;b", "--epsilons", "2"],
     "--epsilons has no effect with --ablation"),
    ("benchmarks/utility.py", ["--set", "dp=false"], "--set dp: the benchmark sets it"),
    ("benchmarks/utility.py", ["--set", f"noise_seed={HUGE}"],
     "--set noise_seed: an integer of 5,000 digits"),
    ("benchmarks/federated.py", ["--epsilon", "0"], "--epsilon: 0 is not a number in (0, 100]"),
    ("benchmarks/federated.py", ["--schedules", "0x3"], "--schedules: 0 is not an integer from 1"),
    ("benchmarks/substrafl_fedavg.py", ["--rounds", "5000"], "make 25,002 tasks"),
    ("benchmarks/substrafl_fedavg.py", ["--frameworks", ""], "--frameworks: '': give at least 1"),
    ("benchmarks/audit.py", ["--frameworks", ""], "--frameworks: '': give at least 1"),
    ("benchmarks/audit.py", ["--epsilons", ","], "--epsilons: ',': give at least 1"),
    ("benchmarks/audit.py", ["--seed", "-1"], "--seed: -1 is not"),
    ("benchmarks/audit.py", ["--white-box", "--epochs", "3"],
     "--epochs has no effect with --white-box"),
    ("benchmarks/docker_images.py", ["--functions", ""], "--functions: '': give at least 1"),
    ("benchmarks/tuning.py", ["--seeds", "0"], "--seeds: 0 is not"),
    ("benchmarks/tuning.py", ["--datasets", "mnist60k"], "--datasets: unknown"),
    ("benchmarks/tuning.py", ["--report-only", "--seeds", "2"],
     "--seeds has no effect with --report-only"),
    ("benchmarks/per_person.py", ["--splits", "3"], "--splits: unknown"),
    ("benchmarks/per_person.py", ["--report-only", "--seeds", "2"],
     "--seeds has no effect with --report-only"),
    ("benchmarks/public_size.py", ["--ratios", "1.5"],
     "--ratios: 1.5 is not a number in [0.9, 1.1]"),
    ("benchmarks/public_size.py", ["--frameworks", "jax"], "--frameworks: unknown"),
    ("benchmarks/same_noise.py", ["--seeds", "0"], "--seeds: 0 is not an integer from 1 to 100"),
    ("benchmarks/same_noise.py", ["--set", "noise_seed=3"],
     "--set noise_seed: the benchmark sets it"), ("benchmarks/same_noise.py", ["--train-size", "5"],
     "--train-size: 5 is not an integer from 10"),
]


@pytest.mark.parametrize("relative, argv, says", CASES,
                         ids=[f"{c[0]} {' '.join(c[1])[:40]}" for c in CASES])
def test_a_bad_option_is_one_line_and_exit_2_before_anything_is_written(
        relative, argv, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert says in refused(relative, argv, capsys)
    assert list(tmp_path.iterdir()) == []


def test_every_entry_point_is_covered():
    covered = {relative for relative, _, _ in CASES}
    assert covered == {str(p.relative_to(REPO)) for folder in ("scripts", "benchmarks", "examples")
                       for p in (REPO / folder).glob("*.py")}


def huge_integer_files(folder):
    """Each JSON file a user gives the bundle, with an integer past Python's limit: (entry point,
    argv)."""
    (folder / "hp.json").write_text(f'{{"epochs": {HUGE}}}')
    (folder / "keys.json").write_text(f'{{"dataset_key": {HUGE}}}')
    (folder / "results.jsonl").write_text(f'{{"label": {HUGE}}}\n')
    (folder / "audit.json").write_text(f'[{{"framework": {HUGE}}}]')
    with zipfile.ZipFile(folder / "huge.model", "w") as archive:
        archive.writestr(model_file._META, f'{{"format": {HUGE}}}')
    return [("scripts/run_local.py",
             ["--hyperparameters", folder / "hp.json", "--output", folder / "out"]),
            ("scripts/add_train_algo_cnn_dp.py",
             ["--keys-file", folder / "keys.json", "--output", folder / "out"]),
            ("examples/substrafl_fedavg.py",
             ["--hyperparameters", folder / "hp.json", "--output", folder / "out"]),
            ("benchmarks/utility.py", ["--results", folder / "results.jsonl", "--report-only"]),
            ("benchmarks/audit.py", ["--output", folder]),
            ("scripts/privacy_report.py", [folder / "huge.model"])]


def test_an_integer_too_long_for_python_in_any_json_file_is_one_line_naming_the_file(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for relative, argv in huge_integer_files(tmp_path):
        line = refused(relative, argv, capsys)
        assert "an integer of 5,000 digits" in line and str(tmp_path) in line, line
    assert not (tmp_path / "out").exists()


def test_a_manifest_with_an_integer_too_long_is_named(tmp_path, capsys, tiny_data):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    manifest = json.loads((data / "manifest.json").read_text())
    (data / "manifest.json").write_text(json.dumps(manifest)[:-1] + f', "extra": {HUGE}}}')
    line = refused("scripts/run_local.py",
                   ["--data", data, "--output", tmp_path / "out", "--organizations", "3"], capsys)
    assert line.startswith(f"error: {data / 'manifest.json'}: an integer of 5,000 digits")


def test_a_utility_label_holds_one_setting(tmp_path, capsys):
    results = tmp_path / "utility.jsonl"
    results.write_text(json.dumps({"label": "mine", "changes": {"epochs": 2}}) + "\n")
    line = refused("benchmarks/utility.py",
                   ["--results", results, "--label", "mine", "--set", "epochs=3"], capsys)
    assert line == (f'error: --label \'mine\': {results} holds its points with other --set changes '
                    f'({{"epochs": 2}}); '
                    "give the same --set, or another label")
