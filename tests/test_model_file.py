import pytest

from mnist_dp import model_file
from mnist_dp.errors import UserError
from mnist_dp.privacy import DpEvent, Ledger


def test_round_trip_through_an_extensionless_path(tmp_path):
    ledger = Ledger([DpEvent("torch", ("abc",), 100, 0.1, 1.0, 10, "per-example", 1.0)])
    path = tmp_path / "model"  # Substra's output paths have no extension
    model_file.save(path, model_file.ModelFile("torch", b"\x00weights", ledger, {"delta": 1e-5}))
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    loaded = model_file.load(path, "torch")
    assert loaded.weights == b"\x00weights" and loaded.ledger.events == ledger.events
    assert loaded.hyperparameters == {"delta": 1e-5}


def test_wrong_framework_is_refused(tmp_path):
    model_file.save(tmp_path / "m", model_file.ModelFile("torch", b""))
    with pytest.raises(UserError, match="trained with 'torch'"):
        model_file.load(tmp_path / "m", "tf")


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04truncated"])
def test_corrupt_file_is_named(tmp_path, content):
    (tmp_path / "m").write_bytes(content)
    with pytest.raises(UserError, match="not a valid model file") as caught:
        model_file.load(tmp_path / "m")
    assert str(tmp_path / "m") in str(caught.value)
