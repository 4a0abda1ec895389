import dataclasses

from mnist_dp.privacy import accountant, model_file, replace_one, statement
from mnist_dp.privacy.events import PER_EXAMPLE, PER_PERSON, DpEvent
from mnist_dp.privacy.examples import Examples
from mnist_dp.privacy.ledger import Ledger

EVENT = DpEvent("tf", ("fp-a", "fp-b"), 300, 0.2, 1.0, 5, PER_EXAMPLE, 1.0,
                        (("TF Privacy statement, RDP, Poisson (this run only)", 4.5),))


def saved(events, examples=None, **hyperparameters):
    return model_file.ModelFile("tf", b"", Ledger(events, examples),
                                {"delta": 1e-4, **hyperparameters})


def named(samples: dict) -> dict:
    """Data sample identity -> its examples' ids (ranges stand for keyed ids), under one key."""
    return {identity: Examples.of("0123456789abcdef", list(ids)) for identity,
            ids in samples.items()}


def test_statement_gives_epsilon_with_delta_relation_sampling_clipping_and_exclusions():
    model = saved([EVENT])
    text = statement.privacy_statement(model)
    assert text.startswith(f"**(ε, δ) = ({model.ledger.epsilon(1e-4):.3f}, 0.0001)** by PLD")
    assert f"RDP (Google dp_accounting): ε = {model.ledger.epsilon(1e-4, 'rdp'):.3f}" in text
    assert (f"Replace one example by another (neighbouring data sets of the same size): ε = "
            f"{replace_one.of_ledger(model.ledger, 1e-4):.3f} at δ = 0.0001, the group-of-two "
            "bound" in text)
    assert "add or remove one example" in text and "Poisson" in text
    assert ("2 data samples (fp-a…), public size 300, q = 0.2, σ = 1, 5 steps, clipping "
            "per-example to C = 1" in text)
    assert "TF Privacy statement, RDP, Poisson (this run only): ε = 4.500" in text
    assert ("Not covered: hyperparameter tuning" in text
            and "floating-point-attack-resistant noise): off" in text)
    assert "256 fresh bits of the operating system's entropy per run, stored nowhere;" in text
    assert "Threat model:" in text and "HMAC under a secret key kept with the data" in text
    assert "Replayable noise" not in text and "not covered by ε" not in text


def test_replayable_noise_and_training_data_scores_are_flagged_once_in_the_card():
    replayed = DpEvent("tf", ("fp-a",), 300, 0.2, 1.0, 5, PER_EXAMPLE, 1.0, replayable_noise=True)
    text = statement.privacy_statement(saved([EVENT, replayed], noise_seed=7), train_scores=True)
    assert ("**Replayable noise**: its noise was drawn from noise_seed: its ε holds only while "
            "that seed stays secret" in text and "for experiments, not for release" in text)
    assert "except run 2, drawn from noise_seed 7 (replayable)" in text
    assert ("**Training-data accuracy was published** (--score-train)" in text
            and "**not covered by ε**" in text)
    card = text.split("\n\n")[0]
    assert text.count("**Replayable noise**") == card.count("**Replayable noise**") == 1
    assert text.count("**Training-data accuracy") == card.count("**Training-data accuracy") == 1


def test_statement_shows_the_budget_and_epsilon_per_data_group():
    other = DpEvent("tf", ("fp-c",), 300, 0.2, 2.0, 3, PER_EXAMPLE, 1.0)
    # fp-c holds 100 of EVENT's examples (another split of the same data): trained on by both runs
    examples = named({"fp-a": range(150), "fp-b": range(150, 300), "fp-c": range(200, 500)})
    model = saved([EVENT, other], examples, max_epsilon=9.0, planned_steps=5,
                  stopped_by_budget=True, secure_mode=True)
    text = statement.privacy_statement(model)
    assert "max_epsilon = 9 at δ = 0.0001; training stopped after 3 of 5 planned steps" in text
    assert f"those of run 1: {accountant.compose_epsilon([EVENT], 1e-4):.3f}; " in text
    assert ("those of runs 1, 2: "
            f"{accountant.compose_epsilon([EVENT, other], 1e-4):.3f}" in text)
    assert f"those of run 2: {accountant.compose_epsilon([other], 1e-4):.3f}" in text
    assert "example(s) of" not in text  # how many examples a group holds is not said
    assert text.startswith(f"**(ε, δ) = ({accountant.compose_epsilon([EVENT, other], 1e-4):.3f}, "
                           "0.0001)**")
    assert "resistant noise): on" in text
    by_org = statement.privacy_statement(model, {"Org1": 1.25, "Org2": 0.5})
    assert ("Per organisation (the worst ε of the examples it holds): Org1: 1.250, Org2: "
            "0.500" in by_org)


def test_a_non_private_model_says_so():
    baseline = DpEvent("tf", ("fp-a",), 300, 0.2, 0.0, 5, "none", 1.0)
    assert statement.privacy_statement(saved([baseline])).startswith("**Not private**")


def test_each_run_names_the_code_that_made_it_and_what_data_checks_cover():
    from conftest import ledger_event

    made = ledger_event("tf", archive_digest="sha256:abc")
    text = statement.privacy_statement(saved([made, ledger_event("tf", data=("fp-b",))]))
    assert "ran 'train' from function archive sha256:abc" in text
    assert ("ran 'train' from the repository, not a function archive (or its files changed)"
            in text)
    substrafl = ledger_event("tf", data=("fp-b",))
    substrafl = dataclasses.replace(substrafl, code={"function": "substrafl train",
                                                     "archive_digest": None})
    assert ("ran 'substrafl train' in the function substrafl builds (its digest not recorded)"
            in statement.privacy_statement(saved([substrafl])))
    assert "code not recorded" in statement.privacy_statement(saved([EVENT]))
    assert "Accounting unit: one organisation's record" in text
    assert ("samples under different keys, unless one names the other in its organisation's "
            "keys, are different organisations' records" in text)
    assert "as if each example were in every one (an upper bound)" in text
    assert "Across organisations" not in text  # one organisation's model


def test_an_older_ledger_that_names_its_examples_is_flagged():
    examples = named({"fp-a": range(150), "fp-b": range(150, 300)})
    assert ("**The data's size is released**: this ledger, written before"
            in statement.privacy_statement(saved([EVENT], examples)))
    released = model_file.ModelFile("tf", b"", Ledger([EVENT], examples).released(),
                                    {"delta": 1e-4})
    assert "size is released" not in statement.privacy_statement(released)


def test_an_averaged_models_statement_explains_the_averaging():
    runs = [DpEvent("tf", (org,), 300, 0.2, 1.0, 5, PER_EXAMPLE, 1.0) for org in ("fp-a", "fp-b")]
    model = saved(runs, max_epsilon=9.0, stopped_by_budget=False,
                  aggregate_of=[{"examples": 300}, {"examples": 300}])
    text = statement.privacy_statement(model, {"Org1": 1.25, "Org2": 1.25})
    assert ("Federated averaging: this model is the average of 2 models" in text
            and "(300, 300)" in text)
    assert "post-processing of those models and spends no privacy" in text
    assert "Each organisation's ε composes the runs on its own data" in text
    assert ("Across organisations: the other organisations and the aggregator are adversaries "
            "too" in text)
    assert "every organisation's training ran every planned step within it" in text
    assert ("Per organisation (the worst ε of the examples it holds): Org1: 1.250, Org2: "
            "1.250" in text)
    # per person, in the words of the unit
    persons = saved([dataclasses.replace(EVENT, clipping=PER_PERSON)])
    text = statement.privacy_statement(persons, {"Org1": 1.25, "Org2": 1.25})
    assert "Per organisation (the worst ε of the persons it holds): Org1: 1.250" in text


def test_two_organisations_keys_give_the_worst_organisation_and_the_individual_in_both():
    small = DpEvent("tf", ("fp-a",), 300, 0.2, 1.0, 5, PER_EXAMPLE, 1.0)
    large = DpEvent("tf", ("fp-b",), 300, 0.2, 1.0, 15, PER_EXAMPLE, 1.0)
    examples = {"fp-a": Examples.of("0123456789abcdef", range(300)),
                "fp-b": Examples.of("fedcba9876543210", range(300))}
    text = statement.privacy_statement(saved([small, large], examples))
    worst, both = accountant.compose_epsilon([large],
                                             1e-4), accountant.compose_epsilon([small, large], 1e-4)
    # The headline covers the other organisation's examples in these weights
    # too, not only the first's.
    assert text.startswith(f"**(ε, δ) = ({worst:.3f}, 0.0001)**")
    assert ("every organisation here holds (under each of the 2 identity keys): ε = "
            f"{both:.3f}" in text)
    assert ("Per organisation (identity key id; the worst ε of its examples): 0123456789abcdef: "
            f"{accountant.compose_epsilon([small], 1e-4):.3f}, fedcba9876543210: "
            f"{worst:.3f}") in text
    assert ("Across organisations: the other organisations and the aggregator are adversaries "
            "too" in text)


def test_the_statement_opens_with_a_card_and_leaves_the_assumptions_to_the_report_if_asked():
    model = saved([EVENT])
    card = statement.privacy_statement(model, train_scores=True).split("\n\n")[0].splitlines()
    assert card[0].startswith(f"**(ε, δ) = ({model.ledger.epsilon(1e-4):.3f}, 0.0001)** by PLD")
    assert card[1] == ("- Covered: the 1 training run and 5 steps listed below, on the data "
                       "samples they name (by keyed identity); the initialisation is "
                       "data-independent (seeded) and costs nothing.")
    assert card[2] == ("- Flagged: **Training-data accuracy was published** (--score-train): it is "
                       "computed on the training data without noise, so it is **not covered by "
                       "ε**.")
    assert len(card) == 3 and "- Flagged: nothing." in statement.privacy_statement(model)
    alone, in_a_report = statement.privacy_statement(model), statement.privacy_statement(
        model, assumptions=False)
    assert statement.THREAT_MODEL in alone and statement.THREAT_MODEL not in in_a_report
    assert alone == in_a_report + "\n" + statement.shared_assumptions(federated=False)

