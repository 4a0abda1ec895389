from test_display import RECORDS, with_model_files

from mnist_dp.privacy import model_file
from mnist_dp.report import results


def test_model_record_is_recomputed_from_the_model_file(tmp_path):
    [with_file] = with_model_files(RECORDS[:1], tmp_path / "models")
    record = results.model_record(with_file.model_file, "torch", {"Org1": ["fp-a"], "Org2": ["fp-b"]})
    saved = model_file.load(with_file.model_file)
    assert record["epsilon"] == saved.ledger.epsilon(1e-5) and record["epsilon_by_organization"]["Org2"] == 0.0
    assert record["max_epsilon"] == 2.0 and record["stopped_by_budget"] is True and record["steps"] == 10
    assert record["library_epsilon"] == {"Opacus PRV (this run only)": 1.49}
