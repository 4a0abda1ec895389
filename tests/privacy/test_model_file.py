import zipfile

import pytest
from conftest import ledger_edit, ledger_event, rewrite_member, save_model

from mnist_dp.privacy import model_file
from mnist_dp.privacy.events import new_run_id
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.utils.errors import UserError


def test_round_trip_through_an_extensionless_path(tmp_path):
    events = [ledger_event("torch")]
    # Substra's output paths have no extension
    path = save_model(tmp_path / "model", events, weights=b"\x00weights")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    loaded = model_file.load(path, "torch")
    assert loaded.weights == b"\x00weights" and loaded.ledger.events == events
    assert loaded.hyperparameters["delta"] == 1e-5


def test_wrong_framework_is_refused(tmp_path):
    save_model(tmp_path / "m", [ledger_event("torch")])
    with pytest.raises(UserError, match="trained with 'torch'"):
        model_file.load(tmp_path / "m", "tf")


@pytest.mark.parametrize("framework", ["torch", "tf", "mindspore"])
def test_an_earlier_format_is_read_except_a_mindspore_model_whose_noise_repeated(
        tmp_path, framework):
    path = save_model(tmp_path / "m", [ledger_event(framework)])
    rewrite_member(path, "meta.json", lambda meta: {**meta, "format": "mnist-dp-model/3"})
    if framework != "mindspore":
        assert model_file.load(path, framework).framework == framework
        return
    with pytest.raises(UserError, match="mindspore model of format 'mnist-dp-model/3' drew "
                                        "MindArmour's noise"):
        model_file.load(path, framework)


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04truncated"])
def test_corrupt_file_is_named(tmp_path, content):
    (tmp_path / "m").write_bytes(content)
    with pytest.raises(UserError, match="not a valid model file") as caught:
        model_file.load(tmp_path / "m")
    assert str(tmp_path / "m") in str(caught.value)


def with_digest(edit_ledger):
    """Edit the ledger and then update the metadata's digest too, as a careful forger would."""
    def apply(path):
        rewrite_member(path, "ledger.json", edit_ledger)
        with zipfile.ZipFile(path) as archive:
            ledger = archive.read("ledger.json")
        import hashlib
        rewrite_member(path, "meta.json",
                       lambda meta: {**meta, "ledger_sha256": hashlib.sha256(ledger).hexdigest()})
    return apply


EDITS = [("steps", 1), ("noise_multiplier", 100.0), ("sample_rate", 0.0), ("n", 10**9),
         ("clipping", "per-batch"), ("steps", -5), ("steps", "2"), ("data", []), ("code", None)]


@pytest.mark.parametrize("field, value", EDITS)
def test_a_hand_edited_ledger_is_refused_by_its_digest(tmp_path, field, value):
    path = save_model(tmp_path / "m", [ledger_event(n=100, batch_size=50, epochs=2)])
    rewrite_member(path, "ledger.json", ledger_edit(field, value))
    with pytest.raises(UserError,
                       match="does not match the sha256 recorded in its metadata") as caught:
        model_file.load(path)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("field, value, message", [
    ("steps", 1, "steps 1 of 4 planned .metadata: stopped_by_budget False"),
    ("noise_multiplier", 100.0, "noise_multiplier 100.0 .metadata: 1.0"),
    ("sample_rate", 0.0, "sample_rate = 0.0 must be a number in .0, 1]"),
    ("n", 10**9, "q = 0.5 but 1 / ceil.n / batch_size. = 5e-08"),
    ("clipping", "per-batch", "clipping = \"per-batch\" must be one of"),
    ("steps", -5, "steps = -5 must be a positive integer"),
    ("steps", "2", "steps = \"2\" must be a positive integer"),
    ("batch_size", 60, "batch_size 60 .metadata: 50."),
    ("framework", "tf", "a 'tf' run in a 'torch' model"),
    ("replayable_noise", True, "replayable_noise True .metadata: noise_seed None."),
    ("surprise", 1, "unknown \\['surprise'\\]"),
])
def test_a_ledger_edited_with_its_digest_is_still_caught_by_its_own_fields(
        tmp_path, field, value, message):
    path = save_model(tmp_path / "m", [ledger_event(n=100, batch_size=50, epochs=2)])
    with_digest(ledger_edit(field, value))(path)
    with pytest.raises(UserError, match=message):
        model_file.load(path)


def test_edited_weights_and_metadata_are_refused(tmp_path):
    path = save_model(tmp_path / "m", [ledger_event()])
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members["weights.bin"] = b"other weights"
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    with pytest.raises(UserError, match="its weights does not match"):
        model_file.load(path)
    path = save_model(tmp_path / "n", [ledger_event()])
    rewrite_member(path, "meta.json", lambda meta: {**meta,
                          "hyperparameters": {**meta["hyperparameters"], "noise_multiplier": 9.0}})
    with pytest.raises(UserError, match="ledger disagrees with its metadata: noise_multiplier 1.0 "
                                        ".metadata: 9.0."):
        model_file.load(path)


def test_a_ledger_from_before_public_sizes_loads_and_its_statement_flags_the_size_released(
        tmp_path):
    """A run recorded before public sizes has no `public_size` field: its n counted the examples.
    It still loads, with the same ε, and the statement says the data's size is released."""
    from mnist_dp.privacy import statement

    event = ledger_event(n=100, batch_size=50, epochs=2)
    path = save_model(tmp_path / "m", [event])
    fresh = statement.privacy_statement(model_file.load(path))
    assert "public size 100" in fresh and "size is released" not in fresh

    def without_the_field(ledger):
        for record in ledger["events"]:
            del record["public_size"]
        return ledger

    with_digest(without_the_field)(path)
    older = model_file.load(path)
    assert [e.public_size for e in older.ledger.events] == [False]
    assert older.ledger.epsilon(1e-5) == Ledger([event]).epsilon(1e-5)
    text = statement.privacy_statement(older)
    assert "n = 100 (counted)" in text
    assert "**The data's size is released** by run 1" in text


def test_a_folder_is_not_a_model_file(tmp_path):
    with pytest.raises(UserError, match="is a folder"):
        model_file.load(tmp_path)


def test_adaptive_clipping_and_a_schedule_must_agree_with_the_metadata(tmp_path):
    import dataclasses

    counted = dataclasses.replace(ledger_event(), count_noise_multiplier=5.0)
    # a count not declared
    with pytest.raises(UserError, match=r"count_noise_multiplier 5.0 \(metadata: 0.0\)"):
        model_file.load(save_model(tmp_path / "a", [counted]))
    model_file.load(save_model(tmp_path / "b", [counted], clip_quantile=0.5, clip_count_stddev=2.5))
    with pytest.raises(UserError, match=r"noise_decay 1.0 \(metadata: 0.5\)"):
        model_file.load(save_model(tmp_path / "c", [ledger_event()], noise_decay=0.5))


def averaged_model(path):
    """A model averaged from two organisations' runs, its metadata as skeleton.aggregate writes
    it."""
    import dataclasses


    runs = [dataclasses.replace(ledger_event("torch", data=(org,), n=n, batch_size=10),
                                run_id=new_run_id())
            for org, n in (("fp-a", 100), ("fp-b", 50))]
    inputs = [model_file.load(save_model(path.with_name(f"input-{k}"), [e]),
                              "torch").hyperparameters
              for k, e in enumerate(runs)]
    meta = model_file.aggregate_metadata(inputs, [e.run_id for e in runs], [e.n for e in runs],
                                         {"function": "aggregate", "archive_digest": None})
    model_file.save(path, model_file.ModelFile("torch", b"w", Ledger(runs), meta))
    return path


def test_an_averaged_models_runs_are_each_checked_against_their_inputs_settings(tmp_path):
    saved = model_file.load(averaged_model(tmp_path / "m"), "torch")
    assert [a["planned_steps"] for a in saved.hyperparameters[model_file.AGGREGATED]] == [10, 5]
    averaged_model(tmp_path / "sigma")
    rewrite_member(tmp_path / "sigma", "meta.json", lambda meta: {**meta, "hyperparameters": {
        **meta["hyperparameters"], model_file.AGGREGATED: [meta["hyperparameters"][
            model_file.AGGREGATED][0], {
            **meta["hyperparameters"][model_file.AGGREGATED][1], "noise_multiplier": 9.0}]}})
    with pytest.raises(UserError, match="noise_multiplier 1.0 \\(metadata: 9.0\\)"):
        model_file.load(tmp_path / "sigma", "torch")
    averaged_model(tmp_path / "id")
    rewrite_member(tmp_path / "id", "meta.json", lambda meta: {**meta, "hyperparameters": {
        **meta["hyperparameters"], model_file.AGGREGATED: [{**meta["hyperparameters"][
            model_file.AGGREGATED][0], "run_id": "0" * 32}]}})
    with pytest.raises(UserError,
                       match="names input 1's run '0{32}', which its ledger does not have"):
        model_file.load(tmp_path / "id", "torch")


def test_a_model_file_names_no_example_and_its_epsilon_counts_every_run_of_the_organisation(
        tmp_path, monkeypatch):
    """The model file is released: its ledger names each data sample's key, never an example, so
    nothing in it counts the data; an older file that named them still reads per example."""
    from mnist_dp.privacy.accountant import compose_epsilon
    from mnist_dp.privacy.examples import Examples

    runs = [ledger_event("torch", data=(i,), n=100) for i in ("fp-a", "fp-b")]
    key = "0123456789abcdef"

    def examples(size):
        return {"fp-a": Examples.of(key, range(size)), "fp-b": Examples.of(key, range(500, 600))}

    paths = [save_model(tmp_path / f"m{size}", runs, examples=examples(size)) for size in (100, 99)]
    ledgers = [zipfile.ZipFile(p).read("ledger.json") for p in paths]
    assert ledgers[0] == ledgers[1] and b'"ids"' not in ledgers[0]
    loaded = model_file.load(paths[0]).ledger
    assert loaded.examples == {"fp-a": Examples(key), "fp-b": Examples(key)}
    assert loaded.epsilon(1e-5) == pytest.approx(compose_epsilon(runs, 1e-5), rel=1e-9)
    # a file of format 4 named its examples: per example, as it reported
    monkeypatch.setattr(model_file, "FORMAT", "mnist-dp-model/4")
    monkeypatch.setattr(Ledger, "released", lambda ledger: ledger)  # as version 4 wrote it
    older = save_model(tmp_path / "older", runs, examples=examples(100))
    monkeypatch.undo()
    assert model_file.load(older).ledger.epsilon(1e-5) == pytest.approx(
        compose_epsilon(runs[:1], 1e-5), rel=1e-9)
