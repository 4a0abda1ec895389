"""How a plan's results are shown: the records of its train tasks (results.py) as a table, and
written as results.json, summary.md and results.png in the output folder. Formatting only."""
from __future__ import annotations

import math
from pathlib import Path

from mnist_dp.privacy import model_file, statement
from mnist_dp.utils import atomic

COLUMNS = [  # (key, header, format)
    ("framework", "framework", "{}"), ("dp", "DP", "{}"), ("round", "round", "{}"),
    ("organization", "trained at", "{}"),  # FEDAVG: averaged from every organisation's models
    ("train_accuracy", "train acc (not covered by ε)", "{:.4f}"),
    ("test_accuracy", "test acc", "{:.4f}"), ("epsilon", "ε", "{:.3f}"),
    ("epsilon_rdp", "ε (RDP)", "{:.3f}"), ("delta", "δ", "{:g}"),
    ("accountant", "accountant", "{}"), ("noise_multiplier", "σ", "{:.3f}"),
    ("sample_rate", "q", "{:.4g}"), ("steps", "steps", "{}"),
]
MULTI_STAGE_ONLY = ("round", "organization")
FEDAVG = "fedavg"  # where an averaged model was "trained": by every organisation
DATA_EPSILON = "data's ε"  # the column of what the data has spent over every model released from it
SEARCHED = "search"  # what a row's accountant and steps add where its ε counts a private search
# With subjects.npy: the same, per person (statement_for).
STATEMENT = "\n".join([
    "ε: each model's own, for adding or removing one example, Poisson sampling and per-example "
    "clipping, by the accountant named beside it (PLD; with a private search, the lower of PLD and "
    "RDP).",
    "σ, q and steps give that ε: steps counts the runs behind it (its worst organisation's).",
    "Each organisation's ε counts every step on its data, as if each example were in every one; "
    "the model's is the worst organisation's. An individual every organisation holds: "
    "epsilon_in_every_organization in results.json.",
    "data's ε: what the training data has spent after this plan over every model released from "
    "it, these and earlier ones, from its own ledger (data_epsilon_by_organization in "
    "results.json).",
])
# Lines for the rows that need them.
SEARCH_LINE = ("+ search: σ, q and steps are the final run's; ε also counts the search's "
               "candidates and scores.")
LAST_ROUND_LINE = "data's ε is on the last round's rows: it counts every round of the plan."
MIXED = "*"  # beside σ where the steps behind ε differ in σ or q
MIXED_LINE = (f"{MIXED}: the steps behind ε differ in σ or q (runs of other settings, a decaying "
              "noise, adaptive clipping): σ and q are the last run's; privacy_report.py lists "
              "each run's.")


def statement_for(records: list) -> str:
    """What the table's figures are: STATEMENT, in persons where a record's unit is a person, with
    SEARCH_LINE, MIXED_LINE and LAST_ROUND_LINE where rows need them."""
    lines = STATEMENT.splitlines()
    if any(_searched(r) for r in records):
        lines.insert(2, SEARCH_LINE)
    if any(not r.one_noise for r in records):
        lines.insert(2, MIXED_LINE)
    if len({r.round for r in records}) > 1 and any(r.data_epsilon_by_organization
                                                   for r in records):
        lines.append(LAST_ROUND_LINE)
    text = "\n".join(lines)
    if not any(getattr(r, "privacy_unit", "image") == "person" for r in records):
        return text
    return (text.replace("one example,", "one person (all their images),")
            .replace("per-example clipping", "per-person clipping (subjects.npy)")
            .replace("as if each example", "as if each person"))


def _searched(record) -> bool:
    return record.accountant == statement.SEARCHED_ACCOUNTANT


NOT_DP = ("delta", "accountant", "noise_multiplier")  # nothing to say of a model trained without DP


def _cell(record, key: str, fmt: str) -> str:
    value = getattr(record, key)
    if key.startswith("epsilon"):
        return _epsilon(value, fmt)
    if key in NOT_DP and not record.dp:
        return "-"
    # the table's short form; results.json and the statement name it in full
    if key == "accountant":
        return value.split(" (")[0] + (f" ({SEARCHED})" if _searched(record) else "")
    if key == "steps" and _searched(record):
        return f"{value} + {SEARCHED}"
    if key == "noise_multiplier" and not record.one_noise:
        return fmt.format(value) + MIXED
    if value is None:
        return "-"
    if key == "dp":
        return "yes" if value else "no"
    return fmt.format(value)


def _epsilon(value: float | None, fmt: str = "{:.3f}") -> str:
    """Infinity, one rule: ∞ in tables for people, null in results.json (JSON has none), and
    Substra's performance file holds JSON's non-standard Infinity (what substratools writes and
    Substra reads)."""
    if value is None:
        return "-"
    return "∞" if math.isinf(value) else fmt.format(value)


def _rows(records: list) -> tuple:
    organizations = sorted({org for r in records for org in r.epsilon_by_organization})
    multi = len(organizations) > 1 or any(r.round > 1 for r in records)
    # A column no record has a value for (train accuracy in federated averaging) is left out.
    columns = [c for c in COLUMNS if (multi or c[0] not in MULTI_STAGE_ONLY)
               and any(getattr(r, c[0]) is not None for r in records)]
    headers = [header for _, header, _ in columns]
    rows = [[_cell(r, key, fmt) for key, _, fmt in columns] for r in records]
    # the budget, and whether it stopped training
    if any(r.max_epsilon is not None for r in records):
        headers.append("max ε")
        for row, r in zip(rows, records):
            row.append("-" if r.max_epsilon is None else
                       f"{r.max_epsilon:g}{' (stopped)' if r.stopped_by_budget else ''}")
    if len(organizations) > 1:
        at = headers.index("ε") + 1
        headers[at:at] = [f"ε {org}" for org in organizations]
        for row, record in zip(rows, records):
            row[at:at] = [_epsilon(record.epsilon_by_organization.get(org))
                          for org in organizations]
    spent = sorted({org for r in records for org in r.data_epsilon_by_organization})
    if spent:  # what each organisation's data has spent over every model released from it
        at = headers.index("ε") + 1 + (len(organizations) if len(organizations) > 1 else 0)
        headers[at:at] = [DATA_EPSILON if len(spent) == 1 else f"{DATA_EPSILON} {org}"
                          for org in spent]
        for row, record in zip(rows, records):
            row[at:at] = [_epsilon(record.data_epsilon_by_organization.get(org)) for org in spent]
    return headers, rows


def table(records: list) -> str:
    """A plain-text table for the terminal, and a line per warning (what ε does not cover)."""
    if not records:
        return "(no train task finished)"
    headers, rows = _rows(records)
    return "\n".join([text_table(headers, rows), *warnings(records)])


def warnings(records: list) -> list:
    """One line per distinct warning of the records, naming the runs it concerns."""
    runs_of = {}
    for record in records:
        for warning in record.warnings:
            runs_of.setdefault(warning, {})[record.run] = None  # runs in order, once
    return [f"warning ({', '.join(runs)}): {warning}" for warning, runs in runs_of.items()]


def text_table(headers: list, rows: list) -> str:
    rows = [headers] + rows
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(headers))]
    lines = ["  ".join(str(cell).rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(headers: list, rows: list) -> str:
    lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def _json_safe(value):
    """JSON has no infinity: a non-private model's ε is written as null."""
    if isinstance(value, float) and math.isinf(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def write_results(path: Path, records: list) -> None:
    atomic.write_json(path, [_json_safe(r.to_json()) for r in records])


def performance_table(frame) -> tuple:
    """Substra's performances (from get_performances): one row per run, round and model (where it
    was trained), one column per metric and the organisation that computed it. Returns
    (headers, rows)."""
    if frame.empty:
        return ["run"], []
    wide = frame.pivot_table(index=["run", "round", "trained_at"], columns=["metric", "worker"],
                             values="performance", aggfunc="first").sort_index()
    headers = ["run", "round", "model trained at"] + [f"{metric} @ {worker}" for metric,
               worker in wide.columns]
    rows = [[run, rnd, trained] + [_number(v) for v in values]
            for (run, rnd, trained), values in zip(wide.index, wide.itertuples(index=False))]
    return headers, rows


def _number(value) -> str:
    if value is None or math.isnan(value):
        return "-"
    return "∞" if math.isinf(value) else f"{value:.4f}"


def write_summary(path: Path, title: str, facts: list, records: list, performances,
                  plot: Path | None, failure: str | None = None) -> None:
    """summary.md: what ran, the results table, the privacy statement, the plot, Substra's
    performances.

    Args:
      path: where summary.md is written.
      title: its heading.
      facts: what ran, one item each.
      records: the Records.
      performances: Substra's performances (execution.performances).
      plot: results.png, shown if given.
      failure: the plan's failure message, if it failed.
    """
    headers, rows = _rows(records)
    lines = [f"# {title}", ""] + [f"- {fact}" for fact in facts] + [""]
    if failure:
        lines += ["## The plan failed", "", "```", failure, "```", "",
                  "The results below are those of the tasks that finished.", ""]
    lines += ["## Accuracy and privacy", "", markdown_table(headers, rows), "",
              statement_for(records), ""]
    lines += [f"**{line}**" for line in warnings(records)] + ([""] if warnings(records) else [])
    if plot:
        lines += [f"![test accuracy and ε]({plot.name})", ""]
    lines += ["## Privacy statements", ""]
    models = [(record, model_file.load(record.model_file, record.framework))
              for record in _last_record_per_run(records)]
    for record, saved in models:
        by_org = record.epsilon_by_organization if len(record.epsilon_by_organization) > 1 else None
        scored_train = any(r.train_accuracy is not None for r in records if r.run == record.run)
        lines += [f"### {record.run}", "",
                  statement.privacy_statement(saved, by_org, scored_train, assumptions=False,
                                              data_spent=record.data_epsilon_by_organization),
                  ""]
    if any(any(e.is_private for e in saved.ledger.events) for _, saved in models):
        lines += ["### What every statement above assumes", "",
                  statement.shared_assumptions(any(statement.is_federated(saved) for _,
                                                   saved in models),
                                             any(statement.has_search(saved) for _,
                                                 saved in models),
                                             any(statement.is_per_person(saved) for _,
                                                 saved in models)), ""]
    lines += ["## Performances as recorded by Substra (`get_performances`)", "",
              markdown_table(*performance_table(performances)), ""]
    atomic.write_text(path, "\n".join(lines))


def write_reports(output: Path, title: str, facts: list, records: list, performances,
                  failure: str | None = None) -> list:
    """results.json, results.png and summary.md in `output`.

    Args:
      output: the folder they are written in.
      title: summary.md's heading.
      facts: what ran, one item each.
      records: the Records.
      performances: Substra's performances (execution.performances).
      failure: the plan's failure message, if it failed.

    Returns:
      Their paths (results.png only when drawn).
    """
    results = output / "results.json"
    write_results(results, records)
    png = plot(output / "results.png", records)
    summary = output / "summary.md"
    write_summary(summary, title, facts, records, performances, png, failure)
    return [p for p in (results, summary, png) if p]


def _last_record_per_run(records: list) -> list:
    return list({r.run: r for r in records}.values())


def plot_trade_off(ax, records: list, colours: dict) -> None:
    """Test accuracy against ε: each private run's models in training order (one point per train
    task, at the model's ε), each non-private baseline as a dashed line at its last accuracy, in its
    framework's colour.

    Args:
      ax: the matplotlib axes drawn on.
      records: the Records.
      colours: {run: colour}; each framework is drawn in its first run's colour.
    """
    runs = list(dict.fromkeys(r.run for r in records))
    framework_colour = {}
    for r in records:
        framework_colour.setdefault(r.framework, colours[r.run])
    for run in runs:
        points = [r for r in records if r.run == run and r.test_accuracy is not None]
        if not points:
            continue
        if all(r.dp for r in points):
            # the accuracy in the legend: beside the points, close runs' labels overlap
            ax.plot([r.epsilon for r in points], [r.test_accuracy for r in points], marker="o",
                    color=framework_colour[points[0].framework],
                    label=f"{run}: {points[-1].test_accuracy:.3f}")
        else:
            ax.axhline(points[-1].test_accuracy, linestyle="--",
                       color=framework_colour[points[0].framework],
                       label=f"{run} (ε = ∞): {points[-1].test_accuracy:.3f}")
    private = [r.epsilon for r in records if r.dp and math.isfinite(r.epsilon)]
    ax.set_xlim(0, max(private + [1.0]) * 1.25)
    # At least 0.1 of accuracy, from a round tenth: an axis spanning
    # 0.958-0.962 would magnify noise.
    lowest = min([r.test_accuracy for r in records if r.test_accuracy is not None] + [1.0])
    ax.set_ylim(max(0.0, math.floor(round((lowest - 0.05) * 10, 6)) / 10), 1.0)
    ax.set_xlabel(f"ε at δ = {records[0].delta:g}")
    ax.set_ylabel("test accuracy")
    ax.set_title("privacy–utility trade-off")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")


def draw_data_spent(ax, records: list) -> float:
    """What each organisation's data has spent after the plan, over every model released from it,
    as a dashed line across the ε panel `ax`, labelled for its legend.

    Returns:
      The highest such ε drawn (0 for none).
    """
    spent = {}
    for record in records:
        spent.update(record.data_epsilon_by_organization)
    drawn = [(org, e) for org, e in sorted(spent.items()) if e is not None and math.isfinite(e)]
    for i, (org, epsilon) in enumerate(drawn):
        name = DATA_EPSILON if len(spent) == 1 else f"{DATA_EPSILON} {org}"
        ax.axhline(epsilon, linestyle=["--", ":", "-."][i % 3], color="dimgray",
                   label=f"{name} (every model from it): {epsilon:.2f}")
    return max([e for _, e in drawn] + [0.0])


def plot(path: Path, records: list) -> Path | None:
    """results.png: test accuracy against ε (left), then test accuracy and ε per organisation after
    each train task, as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not records:
        return None
    runs = list(dict.fromkeys(r.run for r in records))
    stages = list(dict.fromkeys((r.round, r.organization) for r in records))
    multi = len(stages) > 1
    labels = [f"round {rnd}\n{org}" for rnd, org in stages]
    organizations = sorted({org for r in records for org in r.epsilon_by_organization})
    fig, (trade_ax, acc_ax, eps_ax) = plt.subplots(1, 3, figsize=(18, 5.2))
    colours = {run: f"C{i}" for i, run in enumerate(runs)}  # a run has one colour in every panel
    plot_trade_off(trade_ax, records, colours)
    hatches = {org: ["", "//", "..", "xx", "\\\\", "++"][i % 6] for i,
               org in enumerate(organizations)}

    def bars(ax, series: list, title: str, ylabel: str, top: float):
        """Grouped bars, the value on top of each.

        Args:
          ax: the axes drawn on.
          series: (legend label, colour, hatch, values per stage).
          title: the panel's title.
          ylabel: its y-axis label.
          top: the top of its y-axis.
        """
        width = 0.8 / max(len(series), 1)
        for i, (name, colour, hatch, values) in enumerate(series):
            xs = [s + (i - (len(series) - 1) / 2) * width for s in range(len(stages))]
            drawn = ax.bar(xs, [v or 0 for v in values], width, label=name, color=colour,
                           hatch=hatch, edgecolor="white")
            ax.bar_label(drawn, labels=["-" if v is None else f"{v:.2f}" for v in values],
                         fontsize=8)
        crowded = len(stages) > 3  # long organisation names would run into each other
        ax.set_xticks(range(len(stages)), labels, rotation=35 if crowded else 0, ha="right"
                      if crowded else "center", fontsize=8 if crowded else None)
        ax.set_ylim(0, top)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if series:
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14),
                      ncol=min(len(series), 3), frameon=False)

    def value(run, stage, key):
        """A field of the record of a run at a stage.

        Args:
          run: the record's run.
          stage: its (round, organisation).
          key: the field.

        Returns:
          The field's value; None without such a record.
        """
        for r in records:
            if r.run == run and (r.round, r.organization) == stage:
                return getattr(r, key)
        return None

    private = [run for run in runs if all(r.dp for r in records if r.run == run)]
    eps_title = f"ε at δ = {records[0].delta:g}" + (" per organisation's data"
                                                    if len(organizations) > 1 else "")
    if len(private) < len(runs):
        eps_title += "\n(non-private baselines: ε = ∞, not drawn)"
    spent = draw_data_spent(eps_ax, records)
    if not multi:  # one train task per run: one bar per run
        for ax, shown, key, title, ylabel in ((acc_ax, runs, "test_accuracy", "test accuracy",
                                               "accuracy"),
                                              (eps_ax, private, "epsilon", eps_title, "ε")):
            values = [value(run, stages[0], key) for run in shown]
            drawn = ax.bar(shown, [v or 0 for v in values], 0.6,
                           color=[colours[run] for run in shown])
            ax.bar_label(drawn, labels=["-" if v is None else f"{v:.3f}" for v in values],
                         fontsize=9)
            ax.set_title(title)
            ax.set_ylabel(ylabel)
            ax.tick_params(axis="x", labelrotation=20)
        acc_ax.set_ylim(0, 1.1)
        eps_ax.set_ylim(0, max([value(run, stages[0], "epsilon") for run in private]
                               + [spent, 1.0]) * 1.15)
        if spent:
            eps_ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14),
                          frameon=False)
    else:
        averaged = any(org == FEDAVG for _, org in stages)  # the evaluated models are averages
        bars(acc_ax, [(run, colours[run], "", [value(run, s, "test_accuracy") for s in stages])
                      for run in runs], "test accuracy after each round's average" if averaged
             else "test accuracy after each train task", "accuracy", 1.1)
        eps_series = [(run if len(organizations) == 1 else f"{run}: data of {org}", colours[run],
                       hatches[org],
                       [(value(run, s, "epsilon_by_organization") or {}).get(org) for s in stages])
                      for run in private for org in organizations]
        highest = max([v for *_, values in eps_series for v in values if v is not None]
                      + [spent, 1.0])
        bars(eps_ax, eps_series, eps_title, "ε", highest * 1.15)
    fig.tight_layout()
    with atomic.replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path
