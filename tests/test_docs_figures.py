"""The privacy figures the documents quote for the default settings are the code's own: each is
recomputed here from the function that produces it, so a change to the accounting or to the defaults
that moves one fails until the document follows. Measured figures (accuracy, time) are the
benchmarks' and name their commands instead."""
import dataclasses
import functools
import re

import pytest
from conftest import ALGO_ASSETS, REPO

from mnist_dp import hyperparameters, search_space
from mnist_dp.assets import load_asset_module
from mnist_dp.data.dataset import DEFAULT_TRAIN_SIZE
from mnist_dp.privacy import accountant, task_plan
from mnist_dp.privacy.search import plan_search

FASHION_MNIST_TRAIN_SIZE = 60_000


def text(document: str) -> str:
    """The document with every run of white space as one space: a figure's sentence may wrap
    anywhere."""
    return re.sub(r"\s+", " ", (REPO / document).read_text())


@functools.cache
def default_hp():
    return hyperparameters.load(ALGO_ASSETS["torch"] / hyperparameters.FILE_NAME)


@functools.cache
def one_run(n: int):
    """(σ, TaskPlan) of one default run on n examples, as a train task calibrates it."""
    plan = task_plan.fresh("torch", default_hp(), n, "default", ("data",))
    return plan.sigma, plan


def run_epsilon(n: int, runs: int = 1, how: str = "pld", sigma: float | None = None) -> float:
    """ε at the default δ of `runs` default runs on the same n examples (the three frameworks'
    models), at the calibrated σ or `sigma`."""
    calibrated, plan = one_run(n)
    sigma = calibrated if sigma is None else sigma
    plan = dataclasses.replace(plan, sigma=sigma, schedule=plan.schedule.with_sigma(sigma))
    event = plan.event_at(plan.sampling.steps)
    return accountant.compose_epsilon([event] * runs, default_hp().delta, how)


@functools.cache
def search_sigma(n: int, mean: int = 4) -> float:
    """σ of each candidate of a search spending all of ε (the default search's space, every option
    off; `mean` candidates on average) on n examples, a tenth held out, as a tune task calibrates
    it."""
    search = search_space.parse({"space": search_space.DEFAULT["space"], "mean_candidates": mean},
                                "full")
    plan = plan_search("torch", default_hp(), search, n, n // 10, "default")
    (sigma,) = plan.sigmas.values()
    return sigma


def default_run_figures():
    sigma, plan = one_run(DEFAULT_TRAIN_SIZE)
    return (sigma, plan.sampling.sample_rate, plan.sampling.steps, run_epsilon(DEFAULT_TRAIN_SIZE),
            run_epsilon(DEFAULT_TRAIN_SIZE, how="rdp"))


FIGURES = {
    "σ, q, steps and ε of the default run": (
        ["docs/design.md"], "σ = {:.3f}, q = {:.3f}, {} steps, ε = {:.3f} (PLD) and {:.3f} "
                            "(RDP)", default_run_figures), "one run's σ and the default search's": (
        ["docs/privacy.md"], "one run needs σ = {:.3f} (PLD); a search of 4 candidates on average "
                             "needs σ = {:.3f}",
        lambda: (one_run(DEFAULT_TRAIN_SIZE)[0], search_sigma(DEFAULT_TRAIN_SIZE))),
    "the search's σ as one run's ε": (
        ["docs/privacy.md"], "(RDP), the noise of one run at ε ≈ {:.1f}",
        lambda: (run_epsilon(DEFAULT_TRAIN_SIZE, sigma=search_sigma(DEFAULT_TRAIN_SIZE)),)),
    "the same at Fashion-MNIST's size": (
        ["docs/privacy.md"], "it is {:.3f} against {:.3f}",
        lambda: (one_run(FASHION_MNIST_TRAIN_SIZE)[0], search_sigma(FASHION_MNIST_TRAIN_SIZE))),
    "what a search costs on Fashion-MNIST": (
        ["docs/benchmarks.md"],
        "σ = {:.3f} where one run needs {:.3f} (the search's RDP price, about one run at ε ≈ "
        "{:.1f})",
        lambda: (search_sigma(FASHION_MNIST_TRAIN_SIZE), one_run(FASHION_MNIST_TRAIN_SIZE)[0],
                 run_epsilon(FASHION_MNIST_TRAIN_SIZE,
                             sigma=search_sigma(FASHION_MNIST_TRAIN_SIZE)))),
    "a search of 8 candidates on Fashion-MNIST": (
        ["docs/benchmarks.md"], "(8: σ {:.3f} instead of {:.3f} on Fashion-MNIST",
        lambda: (search_sigma(FASHION_MNIST_TRAIN_SIZE, 8),
                 search_sigma(FASHION_MNIST_TRAIN_SIZE))), "the three default models together": (
        ["docs/privacy.md"], "report {:.3f} each; released together they are ε = {:.3f}",
        lambda: (run_epsilon(DEFAULT_TRAIN_SIZE), run_epsilon(DEFAULT_TRAIN_SIZE, 3))),
    "the six models of two default runs": (
        ["README.md"], "each new model is {:.3f} again while the data's ε grows to {:.3f}",
        lambda: (run_epsilon(DEFAULT_TRAIN_SIZE), run_epsilon(DEFAULT_TRAIN_SIZE, 6))),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", FIGURES)
def test_a_privacy_figure_the_documents_quote_is_the_codes(name):
    documents, sentence, compute = FIGURES[name]
    expected = sentence.format(*compute())
    for document in documents:
        assert expected in text(document), f"{document} should say: {expected}"


def test_the_readme_table_quotes_the_default_runs_privacy_figures():
    """Its σ, q, steps, ε, data's ε and RDP ε (accuracies are one run's and vary)."""
    sigma, q, steps, epsilon, rdp = default_run_figures()
    data = run_epsilon(DEFAULT_TRAIN_SIZE, 3)
    table = [line for line in (REPO / "README.md").read_text().splitlines()
             if re.match(r"\s*(torch|tf|mindspore) ", line)]
    assert len(table) == 3
    for row in table:
        cells = row.split()
        assert [cells[3], cells[4], cells[5], cells[8], cells[9], cells[10]] == [
            f"{epsilon:.3f}", f"{data:.3f}", f"{rdp:.3f}", f"{sigma:.3f}", f"{q:.3f}", str(
                steps)], row


def library_figures():
    """Each DP library's own ε for the default run, from each algo's library_epsilon hook
    (torch, tf, MindSpore)."""
    sigma, plan = one_run(DEFAULT_TRAIN_SIZE)
    figures = []
    for framework in ("torch", "tf", "mindspore"):
        algo = load_asset_module(ALGO_ASSETS[framework] / "algo.py", f"algo_{framework}_dp")
        (figure,) = algo.FRAMEWORK.library_epsilon(plan.sampling, plan.hp.delta,
                                                    plan.sampling.steps, sigma).values()
        figures.append(figure)
    return figures


@pytest.mark.slow
def test_the_libraries_own_figures_the_documents_quote_are_theirs():
    prv, tf_privacy, mindarmour = library_figures()
    assert (f"are {prv:.3f} (Opacus PRV), {tf_privacy:.3f} (TF Privacy) and {mindarmour:.3f} "
            "(MindArmour"
            in text("docs/design.md"))
    assert (f"Opacus' own PRV accountant gives {prv:.3f} for the torch run; TF Privacy's "
            "`compute_dp_sgd_privacy_statement` (RDP, Poisson, `used_microbatching=False`) gives "
            f"{tf_privacy:.3f}"
            in text("README.md"))
    assert f"MindArmour's `RDPMonitor` gives {mindarmour:.3f}" in text("README.md")


def audit_rows():
    """The white-box rows of the audit's record (`python benchmarks/audit.py --white-box`), cells by
    name."""
    lines = (REPO / "benchmarks" / "results" / "audit.md").read_text().strip().splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return lines, [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
                   for line in lines[2:]]


def test_the_audit_tables_are_the_audit_record():
    """benchmarks.md copies the record whole; privacy.md's table is its white-box rows, as built
    beside broken."""
    lines, rows = audit_rows()
    assert "\n".join(lines) in (REPO / "docs" / "benchmarks.md").read_text()
    white = [row for row in rows if row["mode"] == "white-box" and row["unit"] == "image"]
    assert len(white) == 12
    # the audit per person, each canary a person: in every framework, as built and broken
    assert len([row for row in rows if row["unit"] == "person"]) == 12
    built = {(row["framework"], row["claimed ε"]): row for row in white
             if row["mechanism"] == "as-built"}
    privacy = (REPO / "docs" / "privacy.md").read_text()
    for row in white:
        if row["mechanism"] != "as-built":
            mine = built[row["framework"], row["claimed ε"]]
            cells = [row["framework"], row["claimed ε"],
                     f"{mine['95% lower bound']} ({mine['% of claim']} %)",
                     f"{row['95% lower bound']} ({row['% of claim']} %)"]
            assert f"| {' | '.join(cells)} |" in privacy
