"""A private hyperparameter search, run (Papernot & Steinke 2022): K candidates, K drawn at random
and never released; each draws its hyperparameters from the search space, trains from scratch with
`training.fit` (the train task's DP-SGD run) on the examples outside the validation split, and
is scored by its noisy count of correct predictions on the examples inside it. Only the best
candidate leaves: its model, with a ledger whose one event is the whole search (privacy/search.py);
the other candidates' weights and every score stay in this process. With the search file's
recipe_candidate, the algo's own hyperparameters are one more candidate, run first whatever K is.
With its search_epsilon, the best candidate's hyperparameters are trained once more on all the
examples (`final_run`) and that model leaves instead, its ledger the search then that run.

`tune` is the substratools function body; `run_search` the search itself, which benchmarks call in
memory.
"""
from __future__ import annotations

import contextlib
import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnist_dp import hyperparameters, search_space
from mnist_dp.learning import features as feature_maps
from mnist_dp.learning import model_io, skeleton, training
from mnist_dp.learning.interface import Framework, Network, Ran
from mnist_dp.privacy import budgets, data_ledger, model_file, provenance, statement
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.privacy.search import (
    SearchPlan,
    draw_count,
    plan_search,
    public_validation,
    validation_split,
)
from mnist_dp.privacy.task_plan import TaskPlan
from mnist_dp.privacy.units import IMAGE, PrivacyUnit
from mnist_dp.utils.errors import UserError

log = logging.getLogger("substratools.mnist_dp")


@dataclass
class Searched:
    """What a search released (the best candidate: its model, its plan and what it ran), and, for
    benchmarks only, what it did not: how many candidates it trained."""

    model: object
    plan: TaskPlan
    ran: Ran
    candidates: int  # K: never logged, saved or returned by a task
    seconds: float


def run_search(framework: Framework, images: np.ndarray, labels: np.ndarray, held_out: np.ndarray,
               search: SearchPlan, randomness: RunRandomness, where: str,
               unit: PrivacyUnit = IMAGE) -> Searched | None:
    """The search of `search` by `framework`.

    Args:
      framework: the algo's Framework.
      images: the images [n, 28, 28].
      labels: their labels [n].
      held_out: [n], marking the validation examples (all of a person's, or none).
      search: the search's privacy plan (its space, σ by profile, the score's noise).
      randomness: draws K, the candidates, their runs and the scores' noise.
      where: what names the hyperparameters in errors.
      unit: the privacy unit, bound to the images (units.of): a person's images are all held out
        or none.

    Returns:
      What the search released (Searched); None when K = 0 (possible with the Poisson distribution
      only): nothing to release.
    """
    start = time.perf_counter()
    rng, score_noise = randomness.numpy("search"), randomness.numpy("score noise")
    count = draw_count(rng, search.search.mean, search.search.shape)
    train_y, validation_y = labels[~held_out], labels[held_out]
    # each side's persons, indices 0..P-1 of its own
    train_unit, validation_unit = unit.within(~held_out), unit.within(held_out)
    recipe = search.recipe  # what a candidate does not draw
    # Every features value the space may draw, made before the first candidate: which ones the
    # candidates drew would otherwise show in the work done (and its progress bars).
    drawn = search.search.space.get("features", (recipe.features,))
    inputs = {features: (feature_maps.transform(images[~held_out], features),
                         feature_maps.transform(images[held_out], features)) for features in drawn}
    # the recipe's head start, in the score's units and a function of the plan alone: no
    # validation example moves it, so the score keeps its sensitivity of 1
    head_start = (search.search.recipe_margin
                  + search.search.recipe_margin_noise * search.score_noise_multiplier)
    best, best_score = None, -np.inf
    # with a recipe candidate, it runs first, whatever K is, on streams no other candidate uses
    fixed = int(search.search.recipe_candidate)
    with silenced():
        for index in range(fixed + count):
            hp = recipe if index < fixed else search.search.draw(recipe, rng)
            plan = search.candidate(framework.name, hp, where)
            model = framework.new_model(hp.seed, Network.of(hp))
            ran = training.fit(framework, model, inputs[hp.features][0], train_y, plan,
                               randomness.candidate(index), progress=False,
                               persons=train_unit.groups)
            score = noisy_count(correct(framework, model, inputs[hp.features][1], validation_y,
                                        validation_unit.groups),
                                search.score_noise_multiplier, score_noise)
            # a diverged candidate never wins; the recipe starts ahead (both functions of the
            # candidate's output)
            if model_io.non_finite(framework, model)[0]:
                score = -np.inf
            elif hp == recipe:
                score += head_start
            if best is None or score > best_score:
                best, best_score = Searched(model, plan, ran, count, 0.0), score
    if best is None:
        return None
    best.seconds = time.perf_counter() - start
    return best


def _no_run_time(record: logging.LogRecord) -> bool:
    """substratools' "… ran in N s" line after a function, which for a tune task grows with K."""
    return " ran in " not in record.getMessage()


# substratools' log format without its time: a line written after the candidates would carry a
# time that grows with K
UNTIMED_FORMAT = "%(levelname)-6s %(name)s - %(message)s"
UNTIMED = "search: log lines carry no time from here on (the number of candidates is secret)"


def untimed_logs() -> None:
    """Drop the time from every log line the task writes from now on (substratools' handlers)."""
    for handler in logging.getLogger("substratools").handlers:
        handler.setFormatter(logging.Formatter(UNTIMED_FORMAT))
    log.debug(UNTIMED)


@contextlib.contextmanager
def silenced():
    """No log record and no Python warning while the candidates train: their number is K, which is
    secret (a library's warning may come from some candidates only). What a run warns about is said
    once before (training.say_notices); progress bars are off (training.fit's `progress`)."""
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def released_ledger(framework: Framework, data: dict, plan: SearchPlan, searched: Searched,
                    code: dict | None
                    ) -> Ledger:
    """The ledger of the model a search released.

    Args:
      framework: the algo's Framework (not used).
      data: the opener's data, whose samples' examples the ledger records.
      plan: the search's privacy plan.
      searched: what the search released.
      code: the running function's provenance, None in memory.

    Returns:
      A Ledger of the examples of `data` and the search as one event.
    """
    ledger = Ledger()
    identities = ledger.add_samples(data["samples"])
    ledger.add(plan.event(searched.plan, identities, searched.ran, code))
    return ledger


def released(framework: Framework, data: dict, plan: SearchPlan, searched: Searched,
             randomness: RunRandomness, where: str, unit: PrivacyUnit = IMAGE,
             code: dict | None = None) -> tuple:
    """What a search's task releases: the best candidate, or with a search_epsilon the final run on
    its hyperparameters (`final_run`), and that model's ledger.

    Args:
      framework, data, plan, searched, randomness, where, unit, code: as `final_run` takes them.

    Returns:
      (the released Searched, its Ledger).
    """
    ledger = released_ledger(framework, data, plan, searched, code)
    if plan.search.search_epsilon is not None:
        searched = final_run(framework, data, plan, searched, ledger, randomness, where, unit,
                             code)
    return searched, ledger


def final_run(framework: Framework, data: dict, plan: SearchPlan, searched: Searched,
              ledger: Ledger, randomness: RunRandomness, where: str,
              unit: PrivacyUnit = IMAGE, code: dict | None = None) -> Searched:
    """The best candidate's hyperparameters trained once more, from scratch, on all the examples
    (the validation split too) at what the search left of target_epsilon (SearchPlan.final); the
    run's event is added to `ledger`, whose last event is the search's.

    Args:
      framework: the algo's Framework.
      data: the opener's data.
      plan: the search's privacy plan, with a search_epsilon.
      searched: what the search released.
      ledger: the released ledger so far (released_ledger's).
      randomness: the search's: the run draws from its run streams ("batches", "gradient noise"),
        which neither the search's own draws nor its candidates' (RunRandomness.candidate) use.
      where: what names the hyperparameters in errors.
      unit: the privacy unit, bound to the data (Budget.unit).
      code: the running function's provenance, None in memory.

    Returns:
      What leaves the task instead: the final run's model, plan and what it ran.
    """
    start = time.perf_counter()
    final = plan.final(framework.name, searched.plan.hp, ledger.events[-1], where)
    model = framework.new_model(final.hp.seed, Network.of(final.hp))
    with silenced():  # its start, and so its records' times, follow the K candidates
        ran = training.fit(framework, model, feature_maps.transform(data["images"],
                                                                    final.hp.features),
                           data["labels"], final, randomness, progress=False,
                           persons=unit.groups)
    ledger.add(final.event(ran, code))
    return Searched(model, final, ran, searched.candidates,
                    searched.seconds + time.perf_counter() - start)


def correct(framework: Framework, model, inputs: np.ndarray, labels: np.ndarray,
            persons: np.ndarray | None = None) -> float:
    """How many of the validation examples the model classifies right: the score's count, of
    sensitivity 1 (one example more or less changes it by at most 1); per person, the sum over the
    persons of the fraction of their images it classifies right (one person more or less changes it
    by at most 1).

    Args:
      framework: the algo's Framework.
      model: the candidate's model.
      inputs: the validation examples' network inputs.
      labels: their labels.
      persons: each one's person, an index 0..P-1, or None: per example.

    Returns:
      The count of right predictions (per person, of persons' fractions).
    """
    right = np.argmax(model_io.logits(framework, model, inputs), axis=1) == labels
    if persons is None:
        return int(np.sum(right))
    return float(np.sum(np.bincount(persons, right) / np.bincount(persons)))


def noisy_count(count: int, noise_multiplier: float, rng: np.random.Generator) -> float:
    """A candidate's score: what the accountant's score face composes.

    Args:
      count: its count of correct validation predictions.
      noise_multiplier: the std of the Gaussian noise added (the count's sensitivity is 1).
      rng: draws the noise.

    Returns:
      `count` plus Gaussian noise of std `noise_multiplier`.
    """
    return count + rng.normal(0.0, noise_multiplier)


def tune(framework: Framework, inputs: dict, outputs: dict, hyperparameters_path: Path) -> dict:
    """The substratools `tune` function body: a private search on the organisation's data -> the
    best candidate's model, its ledger holding the search, and ε. Logs and writes nothing that
    depends on the number of candidates: no progress bar per candidate, warnings once before them,
    no time or memory line (both grow with K), and no time in its log lines.

    Args:
      framework: the algo's Framework.
      inputs: the task's inputs: "datasamples" (the opener's data), and "ledger" when given (the
        organisation's previous task's ledger output).
      outputs: the task's output paths: "model", "epsilon", and "ledger" when given.
      hyperparameters_path: the hyperparameters file; the search file beside it
        (search_space.FILE_NAME) gives the search, the default search without one.

    Returns:
      The released model's privacy summary (statement.privacy_summary). Raises UserError when the
      search drew no candidate, or every candidate diverged.
    """
    model_io.check_outputs_writable(outputs)
    untimed_logs()
    logging.getLogger("substratools.function").addFilter(_no_run_time)
    data = inputs["datasamples"]
    where = str(hyperparameters_path)
    base = hyperparameters.load(hyperparameters_path)
    search_file = Path(hyperparameters_path).with_name(search_space.FILE_NAME)
    search = search_space.load(search_file if search_file.is_file() else None)
    # held only to read (a lock held while K candidates train would time them for other tasks), and
    # to refuse a task whose run would be recorded nowhere before it trains
    chain = data_ledger.Chain.of(inputs.get("ledger"), data)
    with data_ledger.held(skeleton.sample_folders(data), chain,
                          passes_on=outputs.get("ledger") is not None) as first:
        earlier = first.ledger
    # a run's checks are plan_search's, for each privacy profile on the training split
    budget = budgets.of_search(framework.name, framework.per_person, earlier, data, base)
    held_out = validation_split(data, search.validation_permille)
    plan = plan_search(framework.name, base, search, budget.n,
                       public_validation(budget.n, search.validation_permille), where,
                       budget.unit.clipping)
    randomness = RunRandomness.for_run(base.noise_seed, 0, budget.identities)
    # the candidates' too (the space searches no such key)
    training.say_notices(framework, base, randomness)
    searched = run_search(framework, data["images"], data["labels"], held_out, plan, randomness,
                          where, budget.unit)
    if searched is None:
        raise UserError(f"{where}: the search drew no candidate (the Poisson distribution allows "
                        "it, with probability exp(-mean)); nothing is released: run the task again")
    model_io.check_finite(framework, searched.model, "every candidate of the search diverged",
                          "nothing was saved; lower learning_rate or max_grad_norm in the search "
                          f"space or {where}")
    code = provenance.running_code(Path(hyperparameters_path).parent, "tune")
    searched, ledger = released(framework, data, plan, searched, randomness, where, budget.unit,
                                code)
    if plan.search.search_epsilon is not None:
        model_io.check_finite(framework, searched.model, "the final run on all the data diverged",
                              "nothing was saved; lower learning_rate or max_grad_norm in the "
                              f"search space or {where}")
    # before the model leaves
    with data_ledger.held(skeleton.sample_folders(data), chain,
                          passes_on=outputs.get("ledger") is not None) as spent:
        for event in ledger.events:  # the search's, and the final run's
            spent.record(ledger, event)
        spent.pass_on(outputs.get("ledger"))
        # for the data's figure below: the organisation's other keys' runs too
        spent.ledger.link(data["samples"])
    model_file.save(outputs["model"],
                    model_file.ModelFile(framework.name, framework.dump_model(searched.model),
                                         ledger, searched.plan.metadata()))
    summary = statement.privacy_summary(ledger.released(), base.delta)
    model_io.save_epsilon(outputs["epsilon"], summary["epsilon"])
    log.info("search: released the %s: %s", "best candidate" if len(ledger.events) == 1
             else "final run on the best candidate's hyperparameters", statement.describe(summary))
    if spent.ledger.events:
        log.info("%s", statement.data_spent(spent.ledger, ledger.events[-1].data, base.delta,
                                            budget.owner.budgets))
    return summary
