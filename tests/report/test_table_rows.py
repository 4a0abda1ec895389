"""Every kind of results table, read back as a user reads it: each row's σ, q and steps give the ε
printed beside them, recomputed with dp_accounting alone, or the row says which figure they give
("+ search"). What the data has spent, in a real plan: tests/scripts/test_run_local.py."""
import dataclasses
import re

import dp_accounting
import pytest
from conftest import independent_epsilon, ledger_event, save_model
from search_events import dp_sgd, search_event, search_then_run

from mnist_dp.privacy.events import PER_PERSON, Candidate, new_run_id
from mnist_dp.privacy.examples import Examples
from mnist_dp.report import display, results
from mnist_dp.report.results import Record

KEYS = {"fp-a": Examples("aaaaaaaaaaaaaaaa"), "fp-b": Examples("bbbbbbbbbbbbbbbb")}
DELTA = 1e-5  # save_model's


def run(data="fp-a", epochs=1, **changes):
    """A run of q = 0.1 (100 examples, batch 10) at σ 2.0: both printed exactly."""
    return dataclasses.replace(ledger_event("torch", data=(data,), n=100, batch_size=10,
                                            sigma=2.0, epochs=epochs), run_id=new_run_id(),
                               **changes)


def table(tmp_path, models: list, organizations: dict) -> list:
    """The printed table of models with the ledgers `models` ([(round, events)]), as {header:
    cell} per row, with the rows' Records."""
    made = []
    for i, (round_idx, events) in enumerate(models):
        path = save_model(tmp_path / f"{i}.model", events, examples=KEYS)
        made.append(Record(run="torch", round=round_idx, organization=display.FEDAVG,
                           **results.model_record(path, "torch", organizations)))
    header, _, *rows = display.table(made).splitlines()[:len(made) + 2]
    cells = [dict(zip(re.split(r"\s{2,}", header.strip()), re.split(r"\s{2,}", row.strip()),
                      strict=True)) for row in rows]
    return list(zip(cells, made, strict=True))


def recomputed(cells: dict) -> str:
    steps = int(cells["steps"])
    return f"{independent_epsilon(float(cells['σ']), float(cells['q']), steps, DELTA):.3f}"


@pytest.mark.parametrize("kind", ["one run", "two runs on the same data", "per person"])
def test_a_rows_sigma_q_and_steps_give_its_epsilon(tmp_path, kind):
    models = {"one run": [(1, [run()])],
              "two runs on the same data": [(1, [run(), run(epochs=2)])],
              "per person": [(1, [run(clipping=PER_PERSON)])]}[kind]
    for cells, _ in table(tmp_path, models, {"Org1": ["fp-a"]}):
        assert cells["ε"] == recomputed(cells)


@pytest.mark.parametrize("later", ["another σ", "another q", "a decaying noise"])
def test_a_row_whose_steps_differ_in_sigma_or_q_says_so(tmp_path, later):
    """A continued model's runs of other settings, or a decaying noise: σ, q and steps alone do
    not give ε, and the row says so."""
    second = {"another σ": lambda: run(noise_multiplier=3.0),
              "another q": lambda: dataclasses.replace(ledger_event(
                  "torch", data=("fp-a",), n=100, batch_size=20, sigma=2.0), run_id=new_run_id()),
              "a decaying noise": lambda: run(noise_decay=0.95, decay_steps=3)}[later]()
    [(cells, record)] = table(tmp_path, [(1, [second, run()])], {"Org1": ["fp-a"]})
    assert cells["σ"].endswith(display.MIXED) and not record.one_noise
    assert display.MIXED_LINE in display.statement_for([record]).splitlines()
    [(cells, record)] = table(tmp_path, [(1, [run(), run()])], {"Org1": ["fp-a"]})
    assert record.one_noise and display.MIXED_LINE not in display.statement_for([record])


def test_a_federated_tables_rows_give_the_model_and_each_organisations_epsilon(tmp_path):
    """Two organisations, two rounds: each row's steps are its worst organisation's, and each
    organisation's ε is its own steps at the same σ and q."""
    first = [run("fp-a"), run("fp-b", epochs=2)]
    rounds = [(1, first), (2, [*first, run("fp-a"), run("fp-b", epochs=2)])]
    rows = table(tmp_path, rounds, {"Org1": ["fp-a"], "Org2": ["fp-b"]})
    assert [cells["steps"] for cells, _ in rows] == ["20", "40"]
    for cells, record in rows:
        assert cells["ε"] == recomputed(cells)
        for org in ("Org1", "Org2"):
            assert cells[f"ε {org}"] == recomputed(
                {**cells, "steps": record.steps_by_organization[org]})
    assert [r.steps_by_organization["Org1"] for _, r in rows] == [10, 20]


def test_a_search_row_says_its_steps_are_the_final_runs_and_its_epsilon_counts_the_search(
        tmp_path):
    searched = dataclasses.replace(search_event((Candidate(0.1, 10, 2.0),), n=100, validation_n=10),
                                   data=("fp-a",), run_id=new_run_id())
    [(cells, record)] = table(tmp_path, [(1, [searched, run(epochs=3)])], {"Org1": ["fp-a"]})
    assert cells["steps"] == "30 + search" and cells["accountant"] == "PLD or RDP (search)"
    # a training example's face of the search and a validation example's, the worse reported
    candidate, how = searched.search.candidates[0], searched.search
    faces = [dp_sgd(candidate.sample_rate, candidate.steps, candidate.noise_multiplier),
             dp_accounting.GaussianDpEvent(how.score_noise_multiplier)]
    worst = max(search_then_run(dp_accounting.dp_event.RepeatAndSelectDpEvent(
        face, how.mean, how.shape), 0.1, 30, 2.0)[0] for face in faces)
    assert cells["ε"] == f"{worst:.3f}"
    assert float(cells["ε"]) > float(recomputed({**cells, "steps": "30"}))
    statement = display.statement_for([record])
    assert display.SEARCH_LINE in statement.splitlines()
    assert display.SEARCH_LINE not in display.statement_for([dataclasses.replace(
        record, accountant="PLD (Google dp_accounting)")])
