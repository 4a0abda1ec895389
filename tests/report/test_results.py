import json

import pytest
from conftest import report_files
from test_display import RECORDS, with_model_files

from mnist_dp.privacy import model_file
from mnist_dp.report import results
from mnist_dp.utils.errors import UserError


def test_model_record_is_recomputed_from_the_model_file(tmp_path):
    [with_file] = with_model_files(RECORDS[:1], tmp_path / "models")
    record = results.model_record(with_file.model_file, "torch",
                                  {"Org1": ["fp-a"], "Org2": ["fp-b"]})
    saved = model_file.load(with_file.model_file)
    assert record["epsilon"] == saved.ledger.epsilon(1e-5) and record[
        "epsilon_by_organization"]["Org2"] == 0.0
    assert record["max_epsilon"] == 2.0 and record[
        "stopped_by_budget"] is True and record["steps"] == 10
    assert record["library_epsilon"] == {"Opacus PRV (this run only)": 1.49}


def earlier_reports(output):
    output.mkdir()
    for name in ("results.json", "summary.md"):
        (output / name).write_text(f"the earlier run's {name}")
    (output / "models").mkdir()
    (output / "models" / "torch.model").write_bytes(b"earlier model")
    return report_files(output)


def test_a_run_finds_its_output_folder_with_no_earlier_reports_and_they_are_kept_aside(
        tmp_path, capsys):
    before = earlier_reports(tmp_path / "out")
    with results.run_output(tmp_path / "out") as folder:
        assert not any((folder / name).exists() for name in results.REPORTS)
        (folder / "results.json").write_text("this run's")
    [aside] = (tmp_path / "out" / results.EARLIER).iterdir()
    assert report_files(aside) == before
    assert (tmp_path / "out" / "results.json").read_text() == "this run's"
    assert ("moved the earlier run's results.json, summary.md, models to "
            f"{aside}" in capsys.readouterr().out)


def test_a_run_that_stops_before_writing_a_report_puts_the_earlier_ones_back(tmp_path, capsys):
    before = earlier_reports(tmp_path / "out")
    with pytest.raises(UserError), results.run_output(tmp_path / "out",
                                                      tmp_path / "out" / "substra"):
        (tmp_path / "out" / "substra").mkdir()
        raise UserError("refused")
    assert report_files(tmp_path / "out") == before
    assert not (tmp_path / "out" / results.EARLIER).exists()
    assert "put the earlier run's reports back" in capsys.readouterr().out


def test_the_earlier_results_name_their_model_files_where_they_went(tmp_path):
    out = tmp_path / "out"
    earlier_reports(out)
    written = [{"run": "torch", "model_file": str(out / "models/torch.model")},
               {"run": "baseline", "model_file": None}]
    (out / "results.json").write_text(json.dumps(written))
    # a run refused before it wrote anything puts them back, naming the models where they are
    with pytest.raises(UserError), results.run_output(out):
        raise UserError("refused")
    assert json.loads((out / "results.json").read_text()) == written
    with results.run_output(out):
        pass
    [aside] = (out / results.EARLIER).iterdir()
    records = json.loads((aside / "results.json").read_text())
    assert [r["model_file"] for r in records] == [str(aside / "models" / "torch.model"), None]
    assert (aside / "models" / "torch.model").read_bytes() == b"earlier model"


def test_a_run_that_fails_after_writing_a_report_keeps_the_earlier_ones_aside(tmp_path, capsys):
    before = earlier_reports(tmp_path / "out")
    with pytest.raises(RuntimeError), results.run_output(tmp_path / "out") as folder:
        (folder / "models").mkdir()
        raise RuntimeError("a task failed")
    [aside] = (tmp_path / "out" / results.EARLIER).iterdir()
    assert report_files(aside) == before
    assert f"to {aside}" in capsys.readouterr().out


def replaced(path, make):
    """`path` unlinked if a file is there, then made again by `make(path)`."""
    path.unlink(missing_ok=True)
    make(path)


@pytest.mark.parametrize("make, what", [
    # a data folder where a run keeps its model files: the user's data, never moved
    (lambda out: (out / "models" / "train").mkdir(), "models"),
    (lambda out: replaced(out / "results.json", lambda p: p.mkdir()), "results.json"),
    (lambda out: replaced(out / "summary.md", lambda p: p.symlink_to(out / "notes.md")),
     "summary.md"),
    (lambda out: (out / results.EARLIER).write_text("a user's notes"), results.EARLIER),
])
def test_a_path_of_a_reports_name_that_is_not_a_report_is_refused_and_nothing_moves(
        tmp_path, make, what):
    out = tmp_path / "out"
    earlier_reports(out)
    make(out)
    def everything():  # the run's lock aside
        return sorted(p.relative_to(out) for p in out.rglob("*") if p.name != ".lock")

    before = everything()
    with pytest.raises(UserError, match=f"^{out / what}: is not a"), results.run_output(out):
        pytest.fail("the run went on")
    assert everything() == before
