import json
import math
from dataclasses import replace

import pandas as pd
from conftest import ledger_event, save_model

from mnist_dp.privacy import statement
from mnist_dp.report import display
from mnist_dp.report.results import Record


def record(run, round_idx, org, eps_by_org, dp=True, accuracy=0.5):
    worst = max(eps_by_org.values())
    return Record(run=run, framework=run.split("-")[0], round=round_idx, organization=org, dp=dp,
                  train_accuracy=accuracy, test_accuracy=accuracy, epsilon=worst,
                  epsilon_rdp=worst + 0.3, epsilon_by_organization=eps_by_org, delta=1e-5,
                  accountant="PLD", noise_multiplier=1.0, sample_rate=0.1, steps=10,
                  epsilon_in_substra=worst)


RECORDS = [
    record("torch", 1, "Org1", {"Org1": 1.5, "Org2": 0.0}),
    record("torch", 1, "Org2", {"Org1": 1.5, "Org2": 1.5}),
    record("torch-baseline", 1, "Org1", {"Org1": math.inf, "Org2": 0.0}, dp=False, accuracy=0.9),
]
PERFORMANCES = pd.DataFrame({
    "task_key": ["a", "b"], "worker": ["Org1", "Org2"], "round": [1, 1],
                             "identifier": ["performance", "epsilon"], "performance": [0.5,
                    math.inf], "run": ["torch", "torch"], "metric": ["test_accuracy", "epsilon"],
    "train_task": ["t", "t"], "trained_at": ["Org1", "Org1"]})


def test_table_shows_round_organisation_and_epsilon_per_organisation():
    text = display.table(RECORDS)
    header = text.splitlines()[0]
    assert ("round" in header and "trained at" in header and "ε Org1" in header
            and "ε Org2" in header)
    assert text.splitlines()[2].split()[6:9] == ["1.500", "1.500", "0.000"]  # worst, Org1, Org2
    assert "∞" in text.splitlines()[4]
    single = display.table([record("tf", 1, "Org1", {"Org1": 2.0})])
    assert "round" not in single and "ε Org1" not in single and "max ε" not in single
    budget = display.table([replace(record("tf", 1, "Org1", {"Org1": 2.0}), max_epsilon=2.0,
                                    stopped_by_budget=True)])
    assert budget.splitlines()[0].endswith("max ε") and budget.splitlines()[2].endswith(
        "2 (stopped)")
    assert display.table([]) == "(no train task finished)"


def with_model_files(records, folder):
    """Give each record a real model file whose ledger matches it."""
    folder.mkdir()
    out = []
    for i, r in enumerate(records):
        event = ledger_event(r.framework, n=100, batch_size=10, sigma=1.0 if r.dp else 0.0,
                             epochs=2, steps=10 if r.dp else None,
                             library_epsilon=(("Opacus PRV (this run only)", 1.49),))
        path = save_model(folder / f"{i}.model", [event], max_epsilon=2.0)
        out.append(replace(r, model_file=str(path)))
    return out


def test_reports_are_written(tmp_path):
    records = with_model_files(RECORDS, tmp_path / "models")
    written = display.write_reports(tmp_path, "title", ["fact one"], records, PERFORMANCES,
                                    failure="task X failed")
    assert sorted(p.name for p in written) == ["results.json", "results.png", "summary.md"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results[2]["epsilon"] is None and results[2][
        "epsilon_by_organization"] == {"Org1": None, "Org2": 0.0}
    summary = (tmp_path / "summary.md").read_text()
    assert ("- fact one" in summary and "task X failed" in summary
            and "![test accuracy and ε](results.png)" in summary)
    # Substra's performances, pivoted by metric and worker
    assert "| torch | 1 | Org1 | ∞ | 0.5000 |" in summary
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name
                  for p in tmp_path.iterdir()) == ["models", "results.json", "results.png",
                                                   "summary.md"]
    # one privacy statement per run, from its last model: per organisation,
    # with the library's figure
    assert summary.count("### torch\n") == 1 and "### torch-baseline" in summary
    assert ("- Per organisation (the worst ε of the examples it holds): Org1: 1.500, Org2: "
            "1.500" in summary)
    assert "Opacus PRV (this run only): ε = 1.490" in summary and "**Not private**" in summary
    assert "max_epsilon = 2 at δ = 1e-05; training stopped after 10 of 20 planned steps" in summary
    # what holds for every model is said once per report, after the statements
    assert summary.count(statement.THREAT_MODEL) == 1 and summary.count("- Not covered: ") == 1
    assert summary.index("### What every statement above assumes") > summary.index("### torch\n")


def test_the_trade_off_panel_puts_each_private_model_at_its_epsilon_and_each_baseline_as_a_line():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [record("torch", 1, "Org1", {"Org1": 1.0}, accuracy=0.8),
               record("torch", 2, "Org1", {"Org1": 2.0}, accuracy=0.9),
               record("torch-baseline", 1, "Org1", {"Org1": math.inf}, dp=False, accuracy=0.95)]
    fig, ax = plt.subplots()
    display.plot_trade_off(ax, records, {"torch": "C0", "torch-baseline": "C1"})
    curve, baseline = ax.get_lines()
    assert list(curve.get_xdata()) == [1.0, 2.0] and list(curve.get_ydata()) == [0.8, 0.9]
    assert list(baseline.get_ydata()) == [0.95, 0.95] and baseline.get_color() == curve.get_color()
    plt.close(fig)


def test_the_table_says_which_accountant_made_each_epsilon_and_nothing_of_dp_for_a_baseline():
    searched = replace(record("torch", 1, "Org1", {"Org1": 2.0}),
                       accountant=statement.SEARCHED_ACCOUNTANT)
    plain = replace(record("tf", 1, "Org1", {"Org1": 2.0}), accountant="PLD (Google dp_accounting)")
    baseline = record("tf-baseline", 1, "Org1", {"Org1": math.inf}, dp=False)
    headers, rows = display._rows([searched, plain, baseline])
    column = {name: [row[headers.index(name)] for row in rows]
              for name in ("ε", "accountant", "δ", "σ")}
    # short, and true of every ε beside it
    assert column["accountant"] == ["PLD or RDP (search)", "PLD", "-"]
    # a baseline has no δ, accountant, σ
    assert column["ε"][2] == "∞" and column["δ"][2] == column["σ"][2] == "-"
    assert "ε (PLD)" not in headers


def test_the_pictures_neither_magnify_noise_nor_run_labels_together(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    close = [replace(record("torch", 1, "Org1", {"Org1": 2.0}), test_accuracy=a)
             for a in (0.958, 0.962)]
    ax = plt.figure().gca()
    display.plot_trade_off(ax, close, {"torch": "C0"})
    low, high = ax.get_ylim()
    assert high == 1.0 and low == 0.9  # a tenth of accuracy at least, from a round tenth
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at its labels
    stages = [record("torch", k, org, {"Org1": 1.0, "Org2": 1.0}) for k in (1, 2)
              for org in ("MyOrg1MSP", "MyOrg2MSP")]
    display.plot(tmp_path / "p.png", stages)
    accuracy_axis = figures[0].axes[1]
    assert {label.get_rotation() for label in accuracy_axis.get_xticklabels()} == {35.0}
    # Two frameworks at one ε and close accuracies: each accuracy in the legend, no label on the
    # points to run into the other.
    close = [replace(record(run, 1, "Org1", {"Org1": 2.999}), test_accuracy=accuracy)
             for run, accuracy in (("torch", 0.959), ("tf", 0.957))]
    display.plot(tmp_path / "p.png", close)
    trade_off = figures[-1].axes[0]
    assert not trade_off.texts
    assert [t.get_text() for t in trade_off.get_legend().get_texts()] == ["torch: 0.959",
                                                                          "tf: 0.957"]


def test_the_picture_shows_what_the_data_has_spent_beside_each_models_epsilon(tmp_path,
                                                                              monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    models = [replace(record(run, 1, "Org1", {"Org1": 2.999}), data_epsilon_by_organization={
        "Org1": 5.549}) for run in ("torch", "tf")]
    display.plot(tmp_path / "p.png", models)
    epsilon_axis = figures[0].axes[2]
    [line] = epsilon_axis.get_lines()
    assert list(line.get_ydata()) == [5.549, 5.549] and epsilon_axis.get_ylim()[1] > 5.549
    assert "data's ε (every model from it): 5.55" in [
        t.get_text() for t in epsilon_axis.get_legend().get_texts()]
    # rounds: the line beside each organisation's bars, in the bars' legend
    rounds = [replace(record("torch", k, display.FEDAVG, {"Org1": k, "Org2": k}),
                      data_epsilon_by_organization={"Org1": 2.5, "Org2": 2.0} if k == 2 else {})
              for k in (1, 2)]
    display.plot(tmp_path / "p.png", rounds)
    legend = [t.get_text() for t in figures[1].axes[2].get_legend().get_texts()]
    assert "data's ε Org1 (every model from it): 2.50" in legend and (
        "data's ε Org2 (every model from it): 2.00" in legend)


def test_the_statement_under_the_table_names_persons_where_a_record_is_per_person():
    record = Record(run="torch", round=1, organization="MyOrg1MSP", framework="torch", dp=True,
                    epsilon=1.0, epsilon_rdp=1.2, epsilon_by_organization={}, delta=1e-5,
                    accountant="pld", noise_multiplier=1.0, sample_rate=0.1, steps=10)
    assert display.statement_for([record]) == display.STATEMENT
    per_person = display.statement_for([replace(record, privacy_unit="person")])
    assert per_person.startswith("ε: each model's own, for adding or removing one person (all "
                                 "their images), Poisson sampling and per-person clipping "
                                 "(subjects.npy)") and "example" not in per_person
    assert "as if each person were in every one" in per_person
    # short sentences, one line each
    assert all(len(line) < 250 for line in display.STATEMENT.splitlines())
    assumptions = statement.shared_assumptions(False, per_person=True)
    assert "add or remove one person, with all their images" in assumptions
    assert "- Privacy unit: a person" in assumptions and "add or remove one example" not in (
        assumptions)
