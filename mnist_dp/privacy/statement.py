"""The privacy statement of a trained model, from its ledger alone: what ε means and what it covers.

Needs only the standard library, numpy and dp_accounting (no ML framework): an auditor can run
`python scripts/privacy_report.py MODEL` wherever the model file is.
"""
from __future__ import annotations

from mnist_dp.assets import ALGO_ASSETS, capabilities
from mnist_dp.privacy import replace_one
from mnist_dp.privacy.accountant import (
    ACCOUNTANT_NAMES,
    REPORTED_ACCOUNTANT,
    compose_epsilon,
)
from mnist_dp.privacy.events import PER_PERSON
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.privacy.model_file import AGGREGATED, ModelFile
from mnist_dp.privacy.randomness import ENTROPY_BITS, REPLAYABLE_WARNING
from mnist_dp.privacy.units import IMAGE, PERSON
from mnist_dp.utils.words import counted, noun_for

# the algos whose library draws no secure noise, and those that do with secure_mode (assets.py)
_NO_SECURE_NOISE = [name for name in ALGO_ASSETS if capabilities(name).secure_noise]
NOT_COVERED = [
    "hyperparameter tuning, model selection or training on the same data outside this model's runs "
    "(each try spends privacy that this ledger does not see; the data's figure counts every model "
    "this bundle released from the data)", "the test data (its accuracy is published)",
    f"timing side channels, and floating-point attacks on the noise in "
    f"{' and '.join(_NO_SECURE_NOISE)}, and in "
    f"{' and '.join(n for n in ALGO_ASSETS if n not in _NO_SECURE_NOISE)} without secure_mode",
]

THREAT_MODEL = (
    "- Threat model: ε bounds what anyone learns about one training example from everything "
    "released, for an adversary who has the code, the hyperparameters, this model file and every "
    "other example. What each released artefact reveals: the weights are the mechanism's output "
    "(covered by ε); the ledger and metadata give the public size S that the data's owner "
    "declared (not a count of the data), q = 1/⌈S/batch_size⌉, σ, C, the number of steps, each "
    "run's random id and framework, each data sample's identity as an HMAC under a secret key "
    "kept with the data, and the ids of its organisation's keys; no example's id and nothing that "
    "counts the data. Substra's performances give ε and the test accuracy (by default nothing "
    "computed on the training data); the logs give timings and step counts. The batches and the "
    "noise are not released.")
SIZE_RELEASED = ("**The data's size is released** by {}: trained before public sizes, its n "
                 "counts the training examples and drove q and the steps, so ε holds for an "
                 "adversary who knows n, not one who must learn it")
IDS_RELEASED = ("**The data's size is released**: this ledger, written before model files left "
                "the examples' ids out, names each example by a keyed id, and how many there are "
                "is the data's size; ε holds for an adversary who knows it, not one who must learn "
                "it")
TRAIN_SCORES = ("**Training-data accuracy was published** (--score-train): it is computed on the "
                "training data without noise, so it is **not covered by ε**")


SHARED_EXAMPLES = (
    "one organisation's record: an example is what the model sees (the image after the opener's "
    "conversion, with its label), whatever the file stored. Each organisation's ε composes every "
    "run on any of its data samples, as if each example were in every one (an upper bound); "
    "samples under different keys, unless one names the other in its organisation's keys, are "
    "different organisations' records. The organisation keeps with its data a record naming each "
    "example by a 64-bit HMAC under its own identity key, which never leaves it: there an "
    "example's runs are composed alone, whichever data samples held it (a task refuses data "
    "holding an example twice), and the data's figure, and its budget, come from it.")

FEDERATED_THREAT_MODEL = (
    "- Across organisations: the other organisations and the aggregator are adversaries too. Each "
    "organisation, and anyone holding a released model, receives the averaged (or passed-on) "
    "models with this ledger, and the performances; the aggregator also receives every "
    "organisation's model or weight update, and each one's public size. The weights and updates "
    "are DP outputs, covered by each organisation's ε; the ledger gives every run's public size, "
    "q, σ and steps; its sample ids are HMACs under each organisation's own key, which never "
    "leaves it, and it names no example.")


DATA_SPENT = ("- This model's ε counts the runs in its ledger. What the training data has spent "
              "over every model released from it so far, this one and the others (its own ledger, "
              "kept with the data by its organisation; on a node, every run the node ran on it as "
              "of the organisation's last reconciliation: a plan another party built from an "
              "earlier ledger after it is counted at the next), at the same δ: ")


def _schedule(event) -> str:
    if not event.decay_steps:
        return ""
    return f" decaying ×{event.noise_decay:g} every {event.decay_steps} steps"


def _code(code: dict | None) -> str:
    if not code:
        return "code not recorded"
    if code["archive_digest"]:
        return f"ran {code['function']!r} from function archive {code['archive_digest']}"
    if code["function"].startswith("substrafl"):
        return (f"ran {code['function']!r} in the function substrafl builds (its digest not "
                "recorded)")
    return (f"ran {code['function']!r} from the repository, not a function archive (or its files "
            "changed)")


MECHANISM = [
    f"- Neighbouring datasets: {IMAGE.neighbouring_relation}; the data's size is not released (q, "
    "the steps and the normaliser come from the public size its owner declared).",
    f"- Sampling: {IMAGE.sampling}, as the accountant assumes.",
    "- Mechanism: DP-SGD; each step adds Gaussian noise of standard deviation σ·C to the sum of "
    "clipped gradients; the accountant composes PoissonSampled(Gaussian(σ)) over the steps really "
    "run (with a decaying noise schedule, each block of steps at its own σ; with adaptive "
    "clipping, the noisy count of unclipped examples released at each step is part of that step's "
    "Gaussian mechanism, Andrew et al. 2021).",
]


SEARCH = (
    "- Private hyperparameter search (Papernot & Steinke, ICLR 2022): the number of candidates K "
    "is drawn at random and never released; each candidate draws its hyperparameters from the "
    "search space, trains with DP-SGD on the examples outside the validation split (a function of "
    "each example's keyed id alone) and is scored by its count of correct validation predictions "
    "plus Gaussian noise; only the best candidate's model is released. The accountant composes "
    "RepeatAndSelect(candidate, mean, shape) by RDP, which is the only one of its accountants that "
    "can (PLD cannot); a ledger holding a search reports the lower of RDP of the whole and PLD of "
    "its runs with each search as the (ε, δ) pair its RDP gives. A recipe "
    "candidate, where the search has one (the algo's own hyperparameters, run once whatever K "
    "is), is composed with it as one more run and score. A training example "
    "pays for the candidates' training (their privacy profiles' worst Rényi divergence at each "
    "order), a validation example for their scores only. The search's run time grows with K: ε "
    "assumes whoever ε is claimed against does not see how long the task ran (Substra records its "
    "start and end).")
# NOT_COVERED's first line where a search ran: the search is covered,
# anything tried besides it is not.
SEARCHED_NOT_COVERED = ("model selection or training on the same data besides the private search "
                        "(each such try spends privacy that this ledger does not see; the data's "
                        "figure counts every model this bundle released from the data)")


PERSON_MECHANISM = [
    f"- Neighbouring datasets: {PERSON.neighbouring_relation}; the number of persons is not "
    "released (q, the steps and the normaliser come from the public size its owner declared).",
    f"- Sampling: {PERSON.sampling}, as the accountant assumes.",
    "- Privacy unit: a person, as the data's subjects.npy names them: the sum of a person's "
    "images' gradients is clipped to C as one, and q, n and the ledger's ids count persons.",
]


def shared_assumptions(federated: bool, searched: bool = False, per_person: bool = False) -> str:
    """What holds for every model's statement, said once in a report: the relation, the mechanism
    (with a private search's when `searched`, per person when `per_person`), the threat model
    (across organisations too when `federated`), the accounting unit and what ε does not cover."""
    not_covered = [SEARCHED_NOT_COVERED, *NOT_COVERED[1:]] if searched else NOT_COVERED
    mechanism = [*PERSON_MECHANISM, *MECHANISM[2:]] if per_person else MECHANISM
    return "\n".join([*mechanism, *([SEARCH] if searched else []), THREAT_MODEL,
                      *([FEDERATED_THREAT_MODEL] if federated else []),
                      "- Accounting unit: " + SHARED_EXAMPLES,
                      "- Not covered: " + "; ".join(not_covered) + "."])


def is_per_person(saved: ModelFile) -> bool:
    return any(e.clipping == PER_PERSON for e in saved.ledger.events)


def has_search(saved: ModelFile) -> bool:
    return any(e.search is not None for e in saved.ledger.events)


def reported_accountant(ledger: Ledger) -> str:
    """The name of the accountant that composed the ledger's ε: PLD, or with a search the lower of
    two bounds (accountant.compose_epsilon)."""
    if any(e.search is not None for e in ledger.events):
        return SEARCHED_ACCOUNTANT
    return ACCOUNTANT_NAMES[REPORTED_ACCOUNTANT]


SEARCHED_ACCOUNTANT = ("PLD or RDP (Google dp_accounting), whichever is lower, as the ledger holds "
                       "a private search: PLD of the runs with each search as the (ε, δ) pair its "
                       "RDP gives, or RDP of the whole")


def _search(event) -> str:
    """A search event's own line: the search, then the released candidate's run."""
    search = event.search
    shape = {0.0: "logarithmic", 1.0: "geometric"}.get(
        search.shape,
        "Poisson" if search.shape == float("inf") else "truncated negative binomial, shape "
                                                       f"{search.shape:g}")
    profiles = "; ".join(_profile(c) for c in search.candidates)
    recipe = "" if search.recipe is None else (
        f", and the recipe's hyperparameters run once besides them ({_profile(search.recipe)})")
    return (f"private search of {search.mean:g} candidates on average ({shape} distribution, K "
            f"never released){recipe}; a validation split of public size {search.validation_n} (id "
            f"mod 1000 < {search.validation_permille}) scored with noise σ = "
            f"{search.score_noise_multiplier:.4g}; "
            f"{noun_for(len(search.candidates), 'candidate profile')}: {profiles}; the released "
            f"candidate trained on the rest (public size {event.trained_n}), ")


def _profile(candidate) -> str:
    return (f"q = {candidate.sample_rate:.4g}, σ = {candidate.noise_multiplier:.4g}, "
            f"{candidate.steps} steps")


def is_federated(saved: ModelFile) -> bool:
    """Whether the model holds several organisations' runs (several identity keys) or is an
    average."""
    return len(saved.ledger.keys()) > 1 or bool(saved.hyperparameters.get(AGGREGATED))


def privacy_statement(saved: ModelFile, per_organization: dict | None = None,
                      train_scores: bool = False, assumptions: bool = True,
                      data_spent: dict | None = None) -> str:
    """The privacy statement of a model, in Markdown. First a card: ε at δ and the accountant, what
    is covered, what is flagged. Then the details: RDP and each library's own figure, the runs
    behind it, the budget, ε per organisation, the noise's source; then the neighbouring relation,
    the mechanism, the threat model and what is not covered.

    Args:
      saved: the model file.
      per_organization: {organisation: its ε}, as a report computed it (None: per identity
        key, or per group of examples, when the ledger has several).
      train_scores: whether the plan published accuracies on the training data (--score-train).
      assumptions: False for a report that says the shared assumptions once (`shared_assumptions`):
        they are then left out.
      data_spent: {organisation: what its data has spent over every run released from it so far,
        this model's among them}, from the data's own ledger (data_ledger.py).

    Returns:
      The statement; a paragraph saying so for a model trained without DP.
    """
    ledger, hp = saved.ledger, saved.hyperparameters
    delta = hp["delta"]
    if not any(e.is_private for e in ledger.events):
        return (f"**Not private**: this {saved.framework} model was trained without DP (no "
                "clipping, no noise); ε = ∞. It must not leave the organisations that hold its "
                "training data.")
    epsilon = ledger.epsilon(delta, REPORTED_ACCOUNTANT)
    unit = "person" if is_per_person(saved) else "example"
    searches = sum(e.search is not None for e in ledger.events)
    keys = ledger.keys()
    sized = [str(i) for i, e in enumerate(ledger.events, 1) if not e.public_size]
    flagged = ([f"**Replayable noise**: {REPLAYABLE_WARNING}"]
               if any(e.replayable_noise for e in ledger.events)
               else []) + ([TRAIN_SCORES] if train_scores else []) + (
        [SIZE_RELEASED.format(f"{noun_for(len(sized), 'run')} {', '.join(sized)}")] if sized
         else []) + (
        [IDS_RELEASED] if ledger.names_examples else [])
    lines = [
        f"**(ε, δ) = ({epsilon:.3f}, {delta:g})** by {reported_accountant(ledger)} (reported), the "
        "worst case over every example whose influence is in these weights, whichever organisation "
        "holds it (the unit: one organisation's record).",
        f"- Covered: the {counted(len(ledger.events), 'training run')} and "
        f"{sum(e.steps for e in ledger.events):,} steps listed below, on the data samples they "
        "name (by keyed identity)"
        + (f", and the whole of the {searches} private hyperparameter search(es) that chose them: "
           "every candidate trained and scored, not only the one released" if searches else "")
        + "; the initialisation is data-independent (seeded) and costs nothing.",
        f"- Flagged: {'; '.join(flagged) if flagged else 'nothing'}.", "",
        f"- {ACCOUNTANT_NAMES['rdp']}: ε = {ledger.epsilon(delta, 'rdp'):.3f}, "
        + ("the whole ledger by RDP, the reported figure where it is the lower." if searches
           else "beside it (a looser bound)."),
        f"- Replace one {unit} by another (neighbouring data sets of the same size): ε = "
        f"{replace_one.of_ledger(ledger, delta):.3f} at δ = {delta:g}, the group-of-two bound of "
        f"the figure above, which is for adding or removing one {unit}.",
        *(["- An individual whose records every organisation here holds (under each of the "
           f"{len(keys)} identity keys): ε = "
           f"{ledger.epsilon_in_every_organization(delta, REPORTED_ACCOUNTANT):.3f}, every run "
           "composed."]
          if len(keys) > 1 else []), *([DATA_SPENT + ", ".join(f"{org}: ε = {value:.3f}" for org,
                                  value in data_spent.items()) + "."]
          if data_spent else []), "- Training runs in the ledger (in order):",
    ]
    for i, e in enumerate(ledger.events, 1):
        library = "; ".join(f"{name}: ε = {value:.3f}" for name, value in e.library_epsilon)
        lines.append(f"  {i}. {e.framework}: {counted(len(e.data), 'data sample')} "
                     f"({sorted(e.data)[0][:8]}…), "
                     + (f"public size {e.n}, " if e.public_size else f"n = {e.n} (counted), ")
                     + (_search(e) if e.search
                        else "") + f"q = {e.sample_rate:.4g}, σ = "
                                   f"{e.noise_multiplier:.4g}{_schedule(e)}, {e.steps} steps, "
                                   f"clipping {e.clipping} "
                     + (f"adaptive from C = {e.max_grad_norm:g} (count noise multiplier "
                        f"{e.count_noise_multiplier:.4g})"
                        if e.count_noise_multiplier else f"to C = {e.max_grad_norm:g}")
                     + (f" ({library}; a library's figure covers its own run only, with its own "
                        "conventions)"
                        if library else "") + f"; {_code(e.code)}")
    averaged = hp.get(AGGREGATED)
    if averaged:
        lines.append(
            f"- Federated averaging: this model is the average of {len(averaged)} models, each "
            "trained from the same global model with DP-SGD on one organisation's data, weighted "
            "by the public size of that training's data "
            f"({', '.join(str(a['examples']) for a in averaged)}). Averaging is post-processing of "
            "those models and spends no privacy; each training run above is counted once (the "
            "global model's runs, shared by every input, included). Each organisation's ε composes "
            "the runs on its own data; the averaging organisation sees every input model, each "
            "covered by its organisation's ε.")
    if hp.get("max_epsilon") is not None:
        if averaged:
            stopped = ("an organisation's training stopped early to stay within it (its run above "
                       "has fewer steps)"
                       if hp.get("stopped_by_budget")
                       else "every organisation's training ran every planned step within it")
        elif hp.get("stopped_by_budget"):
            stopped = (f"training stopped after {ledger.events[-1].steps} of {hp['planned_steps']} "
                       "planned steps to stay within it")
        else:
            stopped = "training ran every planned step within it"
        lines.append(f"- Budget: max_epsilon = {hp['max_epsilon']:g} at δ = {delta:g}; {stopped}.")
    accounts = ledger.accounts()
    if per_organization:
        lines.append(f"- Per organisation (the worst ε of the {unit}s it holds): " + ", ".join(
            f"{org}: {value:.3f}" for org, value in per_organization.items()))
    elif len(keys) > 1:
        lines.append(
            f"- Per organisation (identity key id; the worst ε of its {unit}s): " + ", ".join(
            f"{key}: {ledger.epsilon(delta, data=ledger.samples_under(key)):.3f}" for key in keys))
    elif len(accounts) > 1:
        # the groups, not how many examples each holds: a count would be the data's size
        lines.append("- Per group of examples trained on by the same runs: " + "; ".join(
            f"those of {noun_for(len(account.runs), 'run')} "
            f"{', '.join(_part(k, e) for k, e in zip(account.runs, account.events))}: "
            f"{compose_epsilon(account.events, delta):.3f}" for account in accounts))
    replayed = [i for i, e in enumerate(ledger.events, 1) if e.replayable_noise]
    secure = "on" if hp.get("secure_mode") else "off"
    lines.append(f"- Noise and batches: drawn from {ENTROPY_BITS} fresh bits of the operating "
                 "system's entropy per run, stored "
                 "nowhere" + (f", except {noun_for(len(replayed), 'run')} "
                              f"{', '.join(map(str, replayed))}, drawn from "
                              f"noise_seed {hp.get('noise_seed')!r} (replayable)" if replayed
                                          else "")
                 + f"; secure_mode (floating-point-attack-resistant noise): {secure}.")
    if assumptions:
        lines.append(shared_assumptions(is_federated(saved), has_search(saved),
                                        is_per_person(saved)))
    return "\n".join(lines)


def _part(run: int, event) -> str:
    """Run number `run` (0-based) of a per-group line, with the face of a search an example saw."""
    if event.search is None:
        return str(run + 1)
    used = "its validation scores" if event.search.face == "score" else "its candidates trained"
    return f"{run + 1} ({used})"


def privacy_summary(ledger: Ledger, delta: float) -> dict:
    """The figures a task logs and a results record keeps: ε (PLD, reported; RDP with a search), RDP
    beside it, δ, the accountant."""
    return {
        "epsilon": ledger.epsilon(delta, REPORTED_ACCOUNTANT),
        "epsilon_rdp": ledger.epsilon(delta, "rdp"), "delta": delta,
        "accountant": reported_accountant(ledger),
    }


def data_spent(spent: Ledger, identities: tuple, delta: float, budgets: tuple = ()) -> str:
    """What a task's data has spent over every run its own ledger records, in a line.

    Args:
      spent: the data's own ledger (data_ledger.py).
      identities: the keyed identities of the task's data samples.
      delta: δ.
      budgets: its owner's budgets, each (ε, δ) (policy.Policy.budgets).

    Returns:
      The line: how many runs, ε at δ over all of them, and what is left of each budget.
    """
    return (f"this data's own ledger: {counted(len(spent.events), 'run')} released from it, ε = "
            f"{spent.epsilon(delta, data=identities):.3f} at δ = {delta:g} over all of them"
            + "".join(budget_left(spent, identities, budget) for budget in budgets))


def budget_left(spent: Ledger, identities: tuple, budget: tuple) -> str:
    """'; of its owner's budget ε = B at δ = D, L is left' for the data's ledger `spent`."""
    epsilon, delta = budget
    used = spent.epsilon(delta, data=identities)
    return (f"; of its owner's budget ε = {epsilon:g} at δ = {delta:g}, "
            f"{max(epsilon - used, 0.0):.3f} is left")


def describe(summary: dict) -> str:
    """A privacy_summary in one line, with the DP library's own ε where the task added it."""
    text = (f"ε = {summary['epsilon']:.3f} at δ = {summary['delta']:g} ({summary['accountant']}; "
            f"RDP {summary['epsilon_rdp']:.3f})")
    for name, value in summary.get("library_epsilon", {}).items():
        text += f"; {name}: {value:.3f}"
    return text
