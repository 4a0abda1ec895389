"""The search file: what a private hyperparameter search tries (its space), how many candidates it
draws, and its validation split. JSON, every key checked as the hyperparameters file's are
(hyperparameters.py):

    {
      "space": {                                   # key -> a list of values, or a range
        "learning_rate": {"low": 0.25, "high": 4.0, "log": true},
        "max_grad_norm": {"low": 0.025, "high": 0.4, "log": true},
        "ema_decay": [0.0, 0.9, 0.99]
      },
      "mean_candidates": 4,        # E[K], K the number of candidates (never released)
      "shape": 0,                  # K's distribution: 0 logarithmic, 1 geometric, "poisson", ...
      "validation_fraction": 0.1,  # of the training examples, held out to score the candidates
      "recipe_weight": 0,          # how often a candidate is the algo's own hyperparameters
      "recipe_margin": 0,          # what another candidate's score must beat the recipe's by,
                                   # in correct validation predictions
      "recipe_margin_noise": 0,    # ... and by that many times the score's noise (below)
      "recipe_candidate": false,   # true: the recipe is also trained and scored once, besides K
      "search_epsilon": null,      # or a part of target_epsilon (below)
      "candidate_epochs": null     # or the candidates' epochs, with a search_epsilon (below)
    }

With "recipe_weight" w, each candidate is the algo's hyperparameters file itself with probability w,
else drawn from the space: still one distribution for every candidate, as the accountant requires,
and one that keeps the recipe in the running. With "recipe_margin" m, a candidate with the algo's
hyperparameters has m added to its score (a count of correct validation predictions; per person, of
persons' fractions right) before the best is chosen: the choice is still a fixed order on what the
candidates output, so the accountant's bound holds, and noisy scores no longer trade the recipe for
a candidate that only looks better. m is a constant, not a share of the validation split: a head
start that grew with the split would let one validation example move the recipe's score by 1 + m.
"recipe_margin_noise" z adds z times the score's noise std (the plan's, a function of
the search's ε and K's distribution alone): where the validation split is small the score is too
noisy to tell candidates apart, and the recipe then stays.

With "recipe_candidate": true, the algo's hyperparameters are also trained and scored once, outside
the K candidates, and compete with their best (recipe_margin applies to it): the search can no
longer release K candidates drawn from the space alone, none of them the recipe. Its run composes
with the repeated selection (one candidate's ε more), and it runs whatever K is.

With "search_epsilon", the candidates and their scores spend that much, and the best candidate's
hyperparameters are trained once more on all the data (the validation split too), σ calibrated so
that the search and that run together end at target_epsilon; only that last model leaves the task.
Without it (null), the best candidate itself leaves, the search spending all of target_epsilon.
With "candidate_epochs" E as well, every candidate trains E epochs (the algo's own if fewer), and
the final run the algo's own epochs with the best candidate's other hyperparameters: short
candidates cost less time, and less noise for the same search_epsilon.

An omitted key is off (OPTIONAL): the best candidate leaves, the search spending all of
target_epsilon. The default search (DEFAULT, `--search default`) turns on the recipe candidate, its
head start of 3 noise stds, a search_epsilon of 0.25 and candidates of 3 epochs.

A range draws uniformly (log-uniformly with "log": true; an integer key: an integer). Every other
hyperparameter is the algo's own. A key that changes a candidate's privacy profile (PRIVACY_KEYS:
its q, steps or noise schedule) takes a list, or an integer range, since the accountant composes
each of its values; the settings of the accounting itself (FIXED) are not searched.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnist_dp import hyperparameters
from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.utils import json_input
from mnist_dp.utils.errors import UserError
from mnist_dp.utils.words import noun_for

FILE_NAME = "search.json"  # in a tune function's archive, beside hyperparameters.json
POISSON = "poisson"  # as events.POISSON
# What a search file's omitted key means: every option off, so the best candidate leaves and the
# search spends all of target_epsilon.
OPTIONAL = {"mean_candidates": 4, "shape": 0, "validation_fraction": 0.1, "recipe_weight": 0.0,
            "recipe_margin": 0.0, "recipe_margin_noise": 0.0, "recipe_candidate": False,
            "search_epsilon": None, "candidate_epochs": None}
# The default search, around the hand-tuned recipe (hyperparameters.json) and wide enough for other
# MNIST-format data: a step size and a clipping norm 4x either way, and the weight average's
# horizon. None of them changes a candidate's privacy profile, so the search is exactly one
# RepeatAndSelectDpEvent. The logarithmic distribution (shape 0) costs the least ε for its mean
# (Papernot & Steinke 2022, Figure 2). Short candidates spend ε 0.25, the recipe runs beside them
# and keeps a head start of 3 score noise stds, and the winner trains again on all the data: the
# search that lost least to the recipe where it fits (docs/benchmarks.md, "Private hyperparameter
# search").
DEFAULT = {
    "space": {
        "learning_rate": {"low": 0.25, "high": 4.0, "log": True},
        "max_grad_norm": {"low": 0.025, "high": 0.4, "log": True}, "ema_decay": [0.0, 0.9, 0.99],
    }, **OPTIONAL, "recipe_candidate": True, "recipe_margin_noise": 3.0, "search_epsilon": 0.25,
    "candidate_epochs": 3,
}
# What changes a candidate's DP event for a given σ: its q (batch_size), steps
# (epochs, batch_size) and schedule.
PRIVACY_KEYS = ("epochs", "batch_size", "noise_decay", "clip_quantile", "clip_count_stddev")
# The accounting's own settings: one value for the whole search (noise: the search
# calibrates σ to target_epsilon).
FIXED = ("dp", "delta", "target_epsilon", "noise_multiplier", "max_epsilon", "noise_seed",
         "secure_mode")
MAX_MEAN = 1_000  # candidates on average: each one a full training
# K's truncated negative binomial: past this shape the accountant's bound is far looser than
# Poisson's (docs/privacy.md)
MAX_SHAPE = 10
MAX_PROFILES = 100  # distinct privacy profiles: each one an RDP curve in every calibration step
MAX_COMBINATIONS = 10_000  # combinations of listed values checked against each other
MAX_MARGIN = 1_000_000  # recipe_margin: more correct predictions than any validation split holds
MAX_NOISE_MARGIN = 10  # recipe_margin_noise: ten noise stds keep the recipe whatever the scores


@dataclass(frozen=True)
class Range:
    """A hyperparameter drawn uniformly from [low, high] (log-uniformly if `log`; an integer key: an
    integer)."""

    low: int | float
    high: int | float
    log: bool = False

    @property
    def integer(self) -> bool:
        return isinstance(self.low, int)

    def values(self) -> list:
        """Every value an integer range may draw."""
        return list(range(self.low, self.high + 1))

    def draw(self, rng: np.random.Generator):
        if self.integer:  # log: the integer part of a log-uniform draw in [low, high + 1)
            if self.log:
                return min(self.high,
                           int(math.exp(rng.uniform(math.log(self.low), math.log(self.high + 1)))))
            return int(rng.integers(self.low, self.high + 1))
        if self.log:
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return float(rng.uniform(self.low, self.high))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SearchSpace:
    """A search, as the search file says it: `space` maps a hyperparameter to a tuple of values or a
    Range."""

    space: dict
    mean: float
    shape: float  # math.inf: Poisson
    validation_fraction: float
    # the part of target_epsilon the candidates spend, the rest the final run's; None: no final run
    search_epsilon: float | None = None
    recipe_weight: float = 0.0  # the probability that a candidate is the base hyperparameters
    # added to such a candidate's score, as a fraction of the score's largest value
    recipe_margin: float = 0.0
    candidate_epochs: int | None = None  # None: the base's (or the space's)
    # the base also trained and scored once, outside the K candidates
    recipe_candidate: bool = False
    recipe_margin_noise: float = 0.0  # added to the recipe's score too, in score noise stds

    @property
    def validation_permille(self) -> int:
        return round(self.validation_fraction * 1000)

    def for_candidates(self, base: Hyperparameters) -> Hyperparameters:
        """`base` as a candidate trains it: candidate_epochs epochs when set, or base's own if
        fewer (a candidate is never longer than the final run)."""
        if self.candidate_epochs is None:
            return base
        return dataclasses.replace(base, epochs=min(self.candidate_epochs, base.epochs))

    def draw(self, base: Hyperparameters, rng: np.random.Generator) -> Hyperparameters:
        """One candidate: `base` itself with probability recipe_weight, else every searched key
        drawn (a list: uniformly among its values), the rest `base`'s."""
        if self.recipe_weight and rng.random() < self.recipe_weight:
            return base
        values = {}
        for name, choice in sorted(self.space.items()):
            values[name] = choice.draw(rng) if isinstance(choice, Range) else choice[
                int(rng.integers(len(choice)))]
        return dataclasses.replace(base, **values)

    def profile_count(self) -> int:
        """How many combinations `profiles` makes, counted without making them."""
        return math.prod(self.space[k].high - self.space[k].low + 1
                         if isinstance(self.space[k], Range)
                         else len(self.space[k]) for k in self.space if k in PRIVACY_KEYS)

    def profiles(self, base: Hyperparameters) -> list:
        """`base` with every combination of the values of the searched PRIVACY_KEYS, and `base`
        itself with a recipe_weight or recipe_candidate: one per privacy profile a candidate may
        have (some may coincide)."""
        keys = sorted(k for k in self.space if k in PRIVACY_KEYS)
        options = [self.space[k].values() if isinstance(self.space[k], Range) else self.space[k]
                   for k in keys]
        return [base] * bool(self.recipe_weight or self.recipe_candidate) + [
            dataclasses.replace(base, **dict(zip(keys, values)))
            for values in itertools.product(*options)]

    def to_json(self) -> dict:
        space = {name: choice.to_json() if isinstance(choice, Range) else list(choice)
                 for name, choice in self.space.items()}
        shape = POISSON if math.isinf(self.shape) else self.shape
        return {"space": space, "mean_candidates": self.mean, "shape": shape,
                "validation_fraction": self.validation_fraction,
                "recipe_weight": self.recipe_weight, "recipe_margin": self.recipe_margin,
                "recipe_margin_noise": self.recipe_margin_noise,
                "recipe_candidate": self.recipe_candidate, "search_epsilon": self.search_epsilon,
                "candidate_epochs": self.candidate_epochs}


def parse(values, where: str) -> SearchSpace:
    """A search file's object, every key checked; `where` names its source in errors."""
    if not isinstance(values, dict):
        raise UserError(f"{where}: must hold a JSON object with \"space\" (and optionally "
                        f"{', '.join(map(json.dumps, OPTIONAL))})")
    values = {**OPTIONAL, **values}
    unknown = set(values) - {"space", *OPTIONAL}
    if unknown:
        raise UserError(f"{where}: unknown {noun_for(len(unknown), 'key')} {sorted(unknown)}; "
                        "known: "
                        f"{sorted(['space', *OPTIONAL])}")
    mean, shape, fraction, spent, weight, margin, noise_margin, epochs, fixed = (
        values[k] for k in ("mean_candidates", "shape", "validation_fraction", "search_epsilon",
                            "recipe_weight", "recipe_margin", "recipe_margin_noise",
                            "candidate_epochs", "recipe_candidate"))
    if not _number(mean) or not 1 <= mean <= MAX_MEAN:
        raise UserError(f"{where}: mean_candidates = {json.dumps(mean)} must be a number from 1 to "
                        f"{MAX_MEAN:,}")
    if shape != POISSON and (not _number(shape) or not 0 <= shape <= MAX_SHAPE):
        raise UserError(f"{where}: shape = {json.dumps(shape)} must be a number from 0 to "
                        f"{MAX_SHAPE} (0: logarithmic, 1: geometric, else a truncated negative "
                        f"binomial) or \"{POISSON}\": a larger shape is nearly Poisson, whose own "
                        f"bound (\"{POISSON}\") is far tighter")
    if not _number(fraction) or not 0.001 <= fraction <= 0.5:
        raise UserError(f"{where}: validation_fraction = {json.dumps(fraction)} must be a number "
                        "from 0.001 to 0.5")
    if not _number(weight) or not 0 <= weight < 1:
        raise UserError(f"{where}: recipe_weight = {json.dumps(weight)} must be a number from 0 "
                        "(never the algo's own hyperparameters) up to, not including, 1")
    if not _number(margin) or not 0 <= margin <= MAX_MARGIN:
        raise UserError(f"{where}: recipe_margin = {json.dumps(margin)} must be a number from 0 to "
                        f"{MAX_MARGIN:,} (correct validation predictions: 20 is 5 points of "
                        "accuracy on a 400-example split)")
    if not isinstance(fixed, bool):
        raise UserError(f"{where}: recipe_candidate = {json.dumps(fixed)} must be true or false")
    if not _number(noise_margin) or not 0 <= noise_margin <= MAX_NOISE_MARGIN:
        raise UserError(f"{where}: recipe_margin_noise = {json.dumps(noise_margin)} must be a "
                        f"number from 0 to {MAX_NOISE_MARGIN:g} (times the score's noise std)")
    for name, value in (("recipe_margin", margin), ("recipe_margin_noise", noise_margin)):
        if value and not (weight or fixed):
            raise UserError(f"{where}: {name} = {json.dumps(value)} needs a recipe_weight above 0 "
                            "or recipe_candidate: without either no candidate is the algo's own "
                            "hyperparameters")
    if spent is not None and (not _number(spent) or not 0 < spent <= hyperparameters.MAX_EPSILON):
        raise UserError(f"{where}: search_epsilon = {json.dumps(spent)} must be null or a number "
                        f"above 0 (at most {hyperparameters.MAX_EPSILON:g}), below the "
                        "hyperparameters' target_epsilon")
    if "space" not in values or not isinstance(values["space"], dict) or not values["space"]:
        raise UserError(f"{where}: \"space\" must be a non-empty object of hyperparameter -> list "
                        "of values or range "
                        "{\"low\": ..., \"high\": ..., \"log\": true|false}")
    if epochs is not None:
        _check_candidate_epochs(epochs, spent, values["space"], where)
    space = {name: _choice(name, choice, f"{where}: space.{name}") for name,
             choice in values["space"].items()}
    search = SearchSpace(space, float(mean), math.inf if shape == POISSON else float(shape),
                         float(fraction), None if spent is None else float(spent), float(weight),
                         float(margin), epochs, fixed, float(noise_margin))
    # counted before any is made: wide ranges would make millions
    if search.profile_count() > MAX_PROFILES:
        raise UserError(f"{where}: the space has {search.profile_count():,} privacy profiles "
                        f"(values of {', '.join(PRIVACY_KEYS)} combined), more than "
                        f"{MAX_PROFILES}; list fewer values of them")
    return search


def _check_candidate_epochs(epochs, spent, space, where: str) -> None:
    if isinstance(epochs, bool) or not isinstance(epochs, int) or not (
            1 <= epochs <= hyperparameters.MAX_EPOCHS):
        raise UserError(f"{where}: candidate_epochs = {json.dumps(epochs)} must be null or an "
                        f"integer from 1 to {hyperparameters.MAX_EPOCHS:,}")
    if spent is None:
        raise UserError(f"{where}: candidate_epochs needs a search_epsilon: without a final run "
                        "the best candidate leaves as it trained; set epochs in the "
                        "hyperparameters instead")
    if "epochs" in space:
        raise UserError(f"{where}: candidate_epochs and space.epochs both set the candidates' "
                        "epochs; give one")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _choice(name: str, choice, where: str):
    if name not in hyperparameters.KEYS:
        raise UserError(f"{where}: unknown hyperparameter; known: {sorted(hyperparameters.KEYS)}")
    if name in FIXED:
        raise UserError(f"{where}: {name} is one setting for the whole search (the search "
                        "calibrates σ so that it ends at target_epsilon); set it in the "
                        "hyperparameters, not in the space")
    if isinstance(choice, list):
        if not choice:
            raise UserError(f"{where}: an empty list; give at least one value")
        for value in choice:
            hyperparameters.check_value(name, value, where)
        if len(set(map(json.dumps, choice))) < len(choice):
            raise UserError(f"{where}: a value is listed twice (it would be drawn twice as often); "
                            "list it once")
        return tuple(choice)
    if not isinstance(choice, dict) or not {"low", "high"} <= set(choice) <= {"low", "high", "log"}:
        raise UserError(f"{where}: must be a list of values or a range {{\"low\": ..., \"high\": "
                        "..., \"log\": "
                        "true|false}")
    if hyperparameters.kind(name) not in (int, float):
        raise UserError(f"{where}: a range of a non-numeric hyperparameter; give a list of values")
    low, high, log = choice["low"], choice["high"], choice.get("log", False)
    integer = hyperparameters.kind(name) is int
    for bound in (low, high):
        hyperparameters.check_value(name, bound, f"{where} (a bound)")
    if not isinstance(log, bool):
        raise UserError(f"{where}: log = {json.dumps(log)} must be true or false")
    if not low < high:
        raise UserError(f"{where}: low = {low} must be below high = {high}")
    if log and low <= 0:
        raise UserError(f"{where}: a log range needs low > 0")
    if name in PRIVACY_KEYS and not integer:
        raise UserError(f"{where}: {name} changes a candidate's noise, which the accountant "
                        "composes value by value; give a list of values")
    return Range(low, high, log) if integer else Range(float(low), float(high), log)


def check_with(search: SearchSpace, base: Hyperparameters, where: str) -> list:
    """The search checked against the algo's hyperparameters: DP with target_epsilon (a search is
    calibrated as a whole), no max_epsilon, every combination of listed values a valid
    hyperparameters file, at most MAX_PROFILES privacy profiles.

    Args:
      search: the search.
      base: the algo's hyperparameters.
      where: names the search's source in error messages.

    Returns:
      Its profiles (SearchSpace.profiles).
    """
    if not base.dp:
        raise UserError(f"{where}: a private search needs dp = true (without DP, ε = ∞)")
    if base.target_epsilon is None:
        raise UserError(f"{where}: a search needs target_epsilon (null noise_multiplier): its σ is "
                        "calibrated so that the whole search, not one run, ends at the target")
    if base.max_epsilon is not None:
        raise UserError(f"{where}: max_epsilon stops one run early; a search runs every candidate "
                        "in full: set max_epsilon to null")
    if search.search_epsilon is not None and not search.search_epsilon < base.target_epsilon:
        raise UserError(f"{where}: the search's search_epsilon = {search.search_epsilon:g} must "
                        f"be below target_epsilon = {base.target_epsilon:g}: the final run spends "
                        "the rest; raise target_epsilon, or give a search file with a smaller "
                        "search_epsilon")
    listed = {name: choice for name, choice in search.space.items()
              if not isinstance(choice, Range)}
    ranged = {name: choice for name, choice in search.space.items() if isinstance(choice, Range)}
    if math.prod(len(values) for values in listed.values()) > MAX_COMBINATIONS:
        raise UserError(f"{where}: the listed values make more than {MAX_COMBINATIONS:,} "
                        "combinations; list fewer")
    # each with every range at its low, then its high end
    for combination in itertools.product(*listed.values()):
        for end in ("low", "high"):
            chosen = {**{name: getattr(r, end) for name, r in ranged.items()},
                      **dict(zip(listed, combination))}
            hyperparameters.parse({**base.to_json(), **chosen},
                                  f"{where}: the candidate {json.dumps(chosen)}")
    return search.profiles(base)


def load(path: Path | None) -> SearchSpace:
    """The search file at `path` (None: the default search)."""
    if path is None:
        return parse(DEFAULT, "the default search")
    return parse(json_input.read(Path(path), "search file"), str(path))


def add_argument(parser) -> None:
    """--search, the same on every script that trains."""
    parser.add_argument("--search", metavar="FILE", default=None,
                        help="instead of training once, a private hyperparameter search on each "
                             "organisation's data (a tune task releasing one model: the best "
                             "candidate's, or with a search_epsilon, as the bundle's search has, "
                             "its hyperparameters trained again on all the data): FILE is a search "
                             "file (docs/privacy.md, \"Private hyperparameter search\") or "
                             "`default` for the bundle's; target_epsilon is then the whole "
                             "search's (default: no search)")


def from_option(value: str | None) -> SearchSpace | None:
    """The search --search names (None: no search)."""
    return None if value is None else load(None if value == "default" else Path(value))
