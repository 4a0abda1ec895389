"""A private hyperparameter search's privacy, decided before its first candidate: the validation
split, σ of every privacy profile a candidate may have (calibrated so that the whole search, not one
run, ends at target_epsilon), the validation score's noise, and the ledger event of the model it
releases (events.Search).

Each example pays for one face of the search: an example outside the validation split for the
candidates' training (repeated and selected), one inside it for their noisy scores; so both are
calibrated to the target, and neither costs the other anything. learning/search.py runs the search.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

import numpy as np

from mnist_dp import search_space
from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.privacy import no_sigma, refusals, search_accountant, task_plan
from mnist_dp.privacy.budgets import Budget
from mnist_dp.privacy.events import (
    PER_EXAMPLE,
    PER_PERSON,
    Candidate,
    DpEvent,
    Search,
    validation_mask,
)
from mnist_dp.privacy.examples import unit_ids
from mnist_dp.privacy.task_plan import SamplingPlan, TaskPlan
from mnist_dp.privacy.units import UNITS
from mnist_dp.search_space import SearchSpace
from mnist_dp.utils.errors import UserError
from mnist_dp.utils.lazy import lazy_import

dp_accounting = lazy_import("dp_accounting")  # loaded at a search's first draw of K
log = logging.getLogger("substratools.mnist_dp")


def profile(hp: Hyperparameters, plan: SamplingPlan) -> tuple:
    """What decides a candidate's DP event besides σ: (q, planned steps, its noise schedule at σ =
    1)."""
    return plan.sample_rate, plan.planned_steps, task_plan.noise_schedule(hp, plan, 1.0)


@dataclass(frozen=True)
class SearchPlan:
    """A search's privacy plan on `n` examples (persons, per person), `validation_n` of them held
    out: σ by profile (`profile`) and the noise multiplier of the validation score (a count of
    correct predictions, or per person the sum of each person's fraction right: sensitivity 1)."""

    search: SearchSpace
    base: Hyperparameters  # the algo's hyperparameters: what the space does not search
    n: int
    validation_n: int
    sigmas: dict  # profile -> σ
    score_noise_multiplier: float
    privacy_unit: str = PER_EXAMPLE

    @property
    def recipe(self) -> Hyperparameters:
        """What a candidate does not draw: the base, as the candidates train it."""
        return self.search.for_candidates(self.base)

    @property
    def trained_n(self) -> int:
        return self.n - self.validation_n

    def recipe_candidate(self) -> Candidate | None:
        """The privacy profile of the recipe candidate (search.recipe_candidate), at its σ; None
        without one."""
        if not self.search.recipe_candidate:
            return None
        key = profile(self.recipe, SamplingPlan.from_hyperparameters(self.trained_n, self.recipe,
                                                                      "the recipe"))
        return search_accountant.candidate(key, self.sigmas[key])

    def candidate(self, framework: str, hp: Hyperparameters, where: str) -> TaskPlan:
        """The plan of a candidate: its run on the training examples at the σ of its profile.

        Args:
          framework: the algo's name.
          hp: the hyperparameters the candidate drew.
          where: what names the hyperparameters in an error.

        Returns:
          The candidate's TaskPlan.
        """
        sampling = SamplingPlan.from_hyperparameters(self.trained_n, hp, where)
        return dataclasses.replace(TaskPlan.of(framework, hp, sampling,
                                               self.sigmas[profile(hp, sampling)]),
                                   privacy_unit=self.privacy_unit)

    def final(self, framework: str, hp: Hyperparameters, search_event: DpEvent, where: str
              ) -> TaskPlan:
        """The plan of the final run (search.search_epsilon set): the winner's hyperparameters (with
        candidate_epochs, the base's epochs) on all n examples (persons), σ calibrated so that the
        search, as either face sees it, and this run end at the base's target_epsilon.

        Args:
          framework: the algo's name.
          hp: the released candidate's hyperparameters.
          search_event: the search's event (`event`).
          where: what names the hyperparameters in an error.

        Returns:
          The final run's TaskPlan.
        """
        epochs = hp.epochs if self.search.candidate_epochs is None else self.base.epochs
        hp = dataclasses.replace(hp, epochs=epochs, target_epsilon=self.base.target_epsilon,
                                 noise_multiplier=None)
        faces = ((search_event,), (dataclasses.replace(search_event,
                                                       search=search_event.search.scored()),))
        return task_plan.for_task(framework, hp, Budget(self.n, UNITS[self.privacy_unit],
                                                        search_event.data, faces), where)

    def event(self, plan: TaskPlan, data: tuple, ran, code: dict | None) -> DpEvent:
        """The ledger event of the released candidate: its run on the training examples, with the
        whole search it won (events.Search).

        Args:
          plan: the released candidate's plan.
          data: the identities of the data samples.
          ran: what the candidate ran (interface.Ran).
          code: the running code's provenance (None in memory).

        Returns:
          The DpEvent, its n all the search's examples, validation ones included.
        """
        candidates = tuple(sorted({search_accountant.candidate(key, sigma)
                                   for key, sigma in self.sigmas.items()}, key=repr))
        search = Search(self.search.mean, self.search.shape, candidates,
                        self.score_noise_multiplier, self.search.validation_permille,
                        self.validation_n, recipe=self.recipe_candidate())
        run = dataclasses.replace(plan, identities=data).event(ran, code)
        return dataclasses.replace(run, n=self.n, search=search)


def draw_count(rng: np.random.Generator, mean: float, shape: float) -> int:
    """K, the number of candidates, drawn from the distribution the accountant composes, with
    dp_accounting's own parameter γ for the mean.

    Args:
      rng: draws K.
      mean: the distribution's mean.
      shape: inf for Poisson (K may be 0); else the shape of the truncated negative binomial
        P(K = k) ∝ (1-γ)^k · C(k+shape-1, k) for k ≥ 1 (0: the logarithmic distribution; 1: the
        geometric).

    Returns:
      K.
    """
    if math.isinf(shape):
        return int(rng.poisson(mean))
    accountant = dp_accounting.rdp.rdp_privacy_accountant
    gamma = accountant._gamma_truncated_negative_binomial(shape, mean)  # noqa: SLF001 - as the accountant
    if gamma >= 1:  # mean 1: always one candidate
        return 1
    if shape == 0:
        return int(rng.logseries(1 - gamma))
    if shape == 1:
        return int(rng.geometric(gamma))
    while True:  # the negative binomial of `shape` successes, conditioned on k ≥ 1
        count = int(rng.negative_binomial(shape, gamma))
        if count > 0:
            return count


def validation_split(data: dict, permille: int) -> np.ndarray:
    """The opener's `data` -> which of its images a search holds out: those whose privacy unit's
    keyed id (a person's, for all their images) is below `permille` modulo 1000
    (events.validation_mask)."""
    return validation_mask(np.concatenate([unit_ids(s) for s in data["samples"]]), permille)


def public_validation(size: int, permille: int) -> int:
    """How many of a public size's units the validation split is said to hold: its expected share
    (the split is a function of each unit's uniform keyed id), so that no count of the data's
    enters the search's plan."""
    return round(size * permille / 1000)


def check_plan(framework: str, hp: Hyperparameters, search: SearchSpace, sizes: list,
               wheres: list, per_person: list) -> None:
    """What each organisation's tune task would refuse, checked by the scripts before anything is
    registered: the search's plan on its own data's public size, the same numbers the task
    computes.

    Args:
      framework: the algo's name.
      hp: the hyperparameters the space searches around.
      search: the search space.
      sizes: per organisation k, the public size its samples declare (policy.declared_size).
      wheres: per organisation k, what its errors name.
      per_person: per organisation k, whether its samples name persons.
    """
    for size, where, persons in zip(sizes, wheres, per_person):
        plan_search(framework, hp, search, size,
                    public_validation(size, search.validation_permille), where,
                    PER_PERSON if persons else PER_EXAMPLE)


def plan_search(framework: str, base: Hyperparameters, search: SearchSpace, n: int,
                validation_n: int, where: str, privacy_unit: str = PER_EXAMPLE) -> SearchPlan:
    """The privacy plan of a search: σ of every profile so that the training examples' ε ends at
    base.target_epsilon, and the score's noise so that the validation examples' does. The task, and
    the scripts before they register anything, ask it.

    Args:
      framework: the algo's name.
      base: the hyperparameters the space searches around.
      search: the search space.
      n: the number of examples (persons).
      validation_n: how many of them are held out.
      where: what an error names.
      privacy_unit: events.PER_EXAMPLE, or PER_PERSON: n and validation_n count persons, and the
        candidates clip per person.

    Returns:
      The SearchPlan. Raises UserError naming `where` for what the task would refuse.
    """
    units = "persons" if privacy_unit == PER_PERSON else "examples"
    # the released model's own check: the whole n
    task_plan.check_delta(base.delta, n, where=f"{where}: delta")
    profiles = search_space.check_with(search, search.for_candidates(base), where)
    if validation_n == 0 or validation_n == n:
        raise UserError(f"{where}: validation_fraction = {search.validation_fraction:g} holds out "
                        f"{validation_n} of the {n} {units}; a search needs {units} on both "
                        "sides: change validation_fraction")
    if search.candidate_epochs is not None:  # the final run's epochs, which no candidate trains
        task_plan.check_run(framework, base, n, where, privacy_unit)
    distinct = {}
    for hp in profiles:
        plan = task_plan.check_run(framework, hp, n - validation_n, where, privacy_unit)
        distinct.setdefault(profile(hp, plan), (hp, plan))
    # with a recipe candidate, profiles[0] is the recipe (SearchSpace.profiles): distinct's first
    recipe = 0 if search.recipe_candidate else None
    # with a final run, the search spends search_epsilon of it
    target = base.target_epsilon if search.search_epsilon is None else search.search_epsilon
    delta = base.delta
    try:
        sigmas = search_accountant.calibrate_search(target, delta, list(distinct), search.mean,
                                                    search.shape, recipe)
        score = search_accountant.calibrate_score_noise(
            target, delta, search.mean, search.shape,
            None if recipe is None else search_accountant.candidate(list(distinct)[recipe],
                                                                    sigmas[recipe]))
    except no_sigma.NoSigma as exc:
        hp, plan = max(distinct.values(),
                       key=lambda pair: pair[1].planned_steps * pair[1].sample_rate)
        raise refusals.refused(exc, hp, plan, f"{where} (a search of {search.mean:g} candidates "
                                              "on average)") from None
    log.info("search: calibrated noise_multiplier %s for a total epsilon of %.3g at delta %.1e "
             "(score noise %.3g)", ", ".join(f"{s:.4f}" for s in sigmas), target, delta, score)
    return SearchPlan(search, base, n, validation_n, dict(zip(distinct, sigmas)), score,
                      privacy_unit)
