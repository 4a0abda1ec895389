"""The data owner's privacy policy, kept with the data like its identity key: what may be released
from the data, whoever writes the algo.

A JSON file POLICY_FILE in a train data sample folder, written by the organisation that owns the
data (`generate_data.py --budget ...`, `add_dataset_objective.py --budget ...`) before the samples
are registered, after which Substra never lets them change:

    {
      "max_epsilon": 3.0,            # the data's budget: ε over every run released from it ...
      "delta": 1e-5,                 # ... at this δ (null with it: no budget)
      "privacy_unit": "example",     # or "person": every run must clip per person (subjects.npy)
      "allow": ["baseline"],         # the opt-ins its data allows, of OPT_INS (none if omitted)
      "public_size": 4000            # the sample's public size (below)
    }

Every train and tune task on the data, and the substrafl algos, enforce it whatever the algo's
hyperparameters say: a train task stops at the last step within the budget (the algo's max_epsilon
can only lower it), a run that cannot stop early is refused when it would pass it, and an opt-in the
policy does not allow is refused before anything trains. The scripts check the same before they
register anything. A task on samples of several policies takes the strictest of each. A folder
without the file has no policy: the algo's hyperparameters alone decide.

**The public size.** `public_size` is how many privacy units the sample is declared to hold (its
images; its persons where subjects.npy names them), chosen without looking at who is in it:
`generate_data.py` declares what it was asked to write, an owner of other data a round figure or a
bound (`--public-size`). A train task's sampling rate, steps and normaliser come from the sum of its
samples' declared sizes, never from how many units they really hold, so that adding or removing one
example changes nothing the mechanism does but through the noisy gradients. A task on a sample with
no declared size is refused; the scripts refuse, before registering anything, a sample whose real
count is more than SIZE_TOLERANCE away from its declaration (a task does not: its refusal would
depend on the data).
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from mnist_dp.privacy import units
from mnist_dp.utils.errors import UserError
from mnist_dp.utils.words import counted

POLICY_FILE = "privacy_policy.json"  # in each train data sample folder, beside identity.key
# The opt-ins a policy may allow: what releases an un-noised or replayable function of the data.
OPT_INS = {
    "baseline": "a non-private model (dp false, --baseline)",
    "noise_seed": "replayable noise (noise_seed, which lets its holder replay the noise)",
    "score_train": "scores on the training data (--score-train, not covered by ε)",
}
UNITS = ("example", "person")
KEYS = ("max_epsilon", "delta", "privacy_unit", "allow", "public_size")
# How far from its declared size, as a fraction of it, data's real count may be when registered: a
# run's mean update is scaled by real / declared, so beyond it the run is a different recipe.
SIZE_TOLERANCE = 0.1
MAX_SIZE = 10**9  # a declared size past it is a typo


@dataclass(frozen=True)
class Policy:
    """What a data owner allows of its data (its folders' POLICY_FILE), or no limit at all.

    Attributes:
      budgets: the budgets, each (ε, δ): ε at δ over every run released from the data; every one
        holds (a file sets one; samples of several policies may set more).
      privacy_unit: "person" when every run must clip per person, else None or "example".
      allow: the opt-ins of OPT_INS the data allows.
      source: the file(s) that set it (errors name them); "" without one.
      public_size: the privacy units one sample's file declares it to hold (None: none, or a
        policy of several samples; `public_size` sums theirs).
    """

    budgets: tuple = ()
    privacy_unit: str | None = None
    allow: frozenset = frozenset(OPT_INS)
    source: str = ""
    public_size: int | None = None

    def to_json(self) -> dict:
        """The policy file's JSON (of a policy of at most one budget)."""
        epsilon, delta = self.budgets[0] if self.budgets else (None, None)
        return {"max_epsilon": epsilon, "delta": delta, "privacy_unit": self.privacy_unit,
                "allow": sorted(self.allow), "public_size": self.public_size}

    def refuse(self, opt_in: str, todo: str) -> None:
        """Refuse (UserError) opt-in `opt_in` (a key of OPT_INS) unless the policy allows it; `todo`
        says what to do instead."""
        if opt_in not in self.allow:
            raise UserError(f"{self.source}: the data's owner does not allow {OPT_INS[opt_in]} on "
                            f"this data; {todo} (nothing was trained or registered)")

    def check_allowed(self, dp: bool, noise_seed, per_person: bool) -> None:
        """Refuse a run the policy does not allow: without DP, with a noise_seed, or per example
        where it asks for persons."""
        if not dp:
            self.refuse("baseline", "train with DP")
        if noise_seed is not None:
            self.refuse("noise_seed", "set noise_seed to null")
        if self.privacy_unit == "person" and dp and not per_person:
            raise UserError(f"{self.source}: the data's owner asks for privacy per person, and "
                            "this run would clip per image: give each train sample its "
                            "subjects.npy (generate_data.py --images-per-subject), or train data "
                            "whose policy allows per image")


def parse(values, where: str) -> Policy:
    """A Policy from a policy file's JSON value; UserError naming `where` for anything else."""
    if not isinstance(values, dict) or set(values) - set(KEYS):
        raise UserError(f"{where}: must be an object with the keys {', '.join(KEYS)}"
                        + (f" (unknown: {', '.join(sorted(set(values) - set(KEYS)))})"
                           if isinstance(values, dict) else ""))
    epsilon, delta = values.get("max_epsilon"), values.get("delta")
    unit, allow = values.get("privacy_unit"), values.get("allow", [])
    if epsilon is not None and not (_number(epsilon) and 0 < epsilon < math.inf):
        raise UserError(f"{where}: max_epsilon = {json.dumps(epsilon)} must be a positive number "
                        "or null")
    if (epsilon is None) != (delta is None) or delta is not None and not (
            _number(delta) and 0 < delta < 1):
        raise UserError(f"{where}: delta = {json.dumps(delta)} must be a number in (0, 1) with "
                        "max_epsilon, and null without it")
    if unit is not None and unit not in UNITS:
        raise UserError(f"{where}: privacy_unit = {json.dumps(unit)} must be null or one of "
                        f"{', '.join(UNITS)}")
    if not isinstance(allow, list) or any(a not in OPT_INS for a in allow):
        raise UserError(f"{where}: allow must be a list of opt-ins among {', '.join(OPT_INS)}")
    size = values.get("public_size")
    if size is not None and not (_number(size) and isinstance(size, int) and 0 < size <= MAX_SIZE):
        raise UserError(f"{where}: public_size = {json.dumps(size)} must be null or an integer "
                        f"from 1 to {MAX_SIZE:,}: the images (persons) the sample is declared to "
                        "hold")
    return Policy(() if epsilon is None else ((float(epsilon), float(delta)),), unit,
                  frozenset(allow), where, size)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read(folder) -> Policy | None:
    """The policy of data sample folder `folder`, or None where it has none."""
    path = Path(folder) / POLICY_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the data owner's privacy policy ({exc}); restore "
                        "it") from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON ({exc.msg}, line {exc.lineno}); restore the data "
                        "owner's privacy policy") from None
    return parse(values, str(path))


def of_folders(folders) -> Policy:
    """What the policies of data sample folders `folders` allow together: every budget of each, a
    person unit if any asks for it, and only the opt-ins every one allows. No limit where none has a
    policy."""
    found = [p for p in map(read, folders) if p is not None]
    if not found:
        return Policy()
    units = {p.privacy_unit for p in found}
    return Policy(tuple(sorted({b for p in found for b in p.budgets})),
                  "person" if "person" in units else ("example" if "example" in units else None),
                  frozenset.intersection(*(p.allow for p in found)),
                  ", ".join(sorted({p.source for p in found})))


def of_data(data: dict) -> Policy:
    """The policy of the opener's `data` (its samples' folders; none for data made in memory)."""
    return of_folders([s["folder"] for s in data.get("samples", ()) if s.get("folder")])


def plan_size(data: dict, unit: units.PrivacyUnit, images: int) -> int:
    """What a run's plan counts on the opener's `data` of `images` images in `unit` (bound to
    them, units.of): its samples' declared public size. Data made in memory (no sample folder on
    disk: tests, benchmarks) declares its own count in the unit. UserError where a sample folder
    declares no size."""
    folders = [s["folder"] for s in data.get("samples", ())
               if s.get("folder") and Path(s["folder"]).is_dir()]
    return public_size(folders) if folders else unit.count(images)


def public_size(folders) -> int:
    """The public size data sample folders `folders` declare together; UserError naming those that
    declare none."""
    declared = {str(f): (p.public_size if (p := read(f)) else None) for f in folders}
    missing = [f for f, size in declared.items() if size is None]
    if missing:
        raise UserError(f"{', '.join(missing)}: no public size declared for this data (the number "
                        "of images, or persons, a sample may be said to hold, chosen without "
                        "looking at them); the sampling rate and steps of DP-SGD are set from it. "
                        "Declare it before registering: generate_data.py writes it; for other "
                        "data, run_local.py or add_dataset_objective.py --public-size N")
    return sum(declared.values())


def write(folder, policy: Policy) -> None:
    """Write `policy` into data sample folder `folder` (before it is registered), keeping the public
    size the folder declares unless `policy` declares one."""
    from mnist_dp.utils import atomic

    kept = read(folder) if policy.public_size is None else None
    if kept is not None:
        policy = dataclasses.replace(policy, public_size=kept.public_size)
    atomic.write_text(Path(folder) / POLICY_FILE, json.dumps(policy.to_json(), indent=2) + "\n")


def declared_size(folders, real: int, where: str, unit: str = "images") -> int:
    """The public size train sample folders `folders` declare together, refused (UserError naming
    `where`) where one declares none or where their `real` count of units is far from it
    (check_size): what the scripts ask before registering a plan's tasks."""
    size = public_size(folders)
    check_size(size, real, where, unit)
    return size


def add_arguments(parser) -> None:
    """The data owner's options that write a policy into its train data sample folders."""
    from mnist_dp.utils import options

    group = parser.add_argument_group(
        "the data owner's privacy policy (privacy_policy.json in each train sample folder; any of "
        "these writes it, and every task on the data enforces it whatever the algo says)")
    group.add_argument("--budget", type=options.number(0, 1e6, low_open=True), metavar="EPSILON",
                       help="ε that everything released from the data may spend, over every run "
                            "(the algo's max_epsilon can only lower it); needs --budget-delta")
    group.add_argument("--budget-delta", type=options.number(0, 1, low_open=True, high_open=True),
                       metavar="DELTA", help="the δ the budget is at")
    group.add_argument("--privacy-unit", type=options.choice(UNITS), default=None,
                       help="example (each image), or person: every run must clip per person "
                            "(the samples' subjects.npy)")
    group.add_argument("--allow", type=options.names(OPT_INS), default=None, metavar="OPT-INS",
                       help="comma-separated opt-ins the data allows, of "
                            f"{', '.join(OPT_INS)} (default with a policy: none)")


def add_size_argument(parser) -> None:
    """The data owner's option that declares its train samples' public size (generate_data.py
    declares what it writes, so only the scripts that register data offer it)."""
    from mnist_dp.utils import options

    parser.add_argument("--public-size", type=options.integer(1, MAX_SIZE), default=None,
                        metavar="N",
                        help="declare N the public size of every train sample folder (written "
                             "into its privacy_policy.json before it is registered): the images "
                             "(persons, with subjects.npy) each may be said to hold, chosen "
                             "without looking at them (a round figure). DP-SGD's sampling rate, "
                             "steps and normaliser come from it; each sample's real count must be "
                             f"within {SIZE_TOLERANCE:.0%}% of it. Default: what "
                             "each folder declares (generate_data.py declares what it wrote)")


def from_arguments(args) -> Policy | None:
    """The policy the options of `add_arguments` give, or None where none was given (UserError for
    a budget without its δ or a δ without a budget)."""
    given = (args.budget, args.budget_delta, args.privacy_unit, args.allow)
    if all(v is None for v in given):
        return None
    if (args.budget is None) != (args.budget_delta is None):
        raise UserError("--budget and --budget-delta: give both, the budget ε and the δ it is at")
    return parse({"max_epsilon": args.budget, "delta": args.budget_delta,
                  "privacy_unit": args.privacy_unit, "allow": args.allow or []}, "the options")


def write_into(folders, policy: Policy) -> str:
    """Write `policy` into every data sample folder of `folders` (before they are registered), each
    keeping the public size it declares (`write`); returns what was written, in one line."""
    folders = list(folders)
    for folder in folders:
        write(folder, policy)
    budget = ("no budget" if not policy.budgets else
              "a budget of ε = {:g} at δ = {:g}".format(*policy.budgets[0]))
    return (f"privacy policy written to "
            f"{counted(len(folders), 'train sample folder')}: {budget}, unit "
            f"{policy.privacy_unit or 'example'}, allowing "
            f"{', '.join(sorted(policy.allow)) or 'no opt-in'}")


def declare_size(folder, size: int) -> None:
    """Declare `size` as the public size of data sample folder `folder` (before it is registered),
    its policy otherwise as it was (none: no limit)."""
    write(folder, dataclasses.replace(read(folder) or Policy(), public_size=size))


def check_size(declared: int, real: int, where: str, unit: str = "images") -> None:
    """Refuse (UserError naming `where`) a sample whose `real` count of units is more than
    SIZE_TOLERANCE of its `declared` public size away from it. Only the owner's scripts ask, before
    registering: a task never refuses on its data's real count."""
    if abs(real - declared) > SIZE_TOLERANCE * declared:
        raise UserError(f"{where}: holds {real:,} {unit} but declares a public size of "
                        f"{declared:,}, more than {SIZE_TOLERANCE:.0%} away; DP-SGD samples and "
                        f"normalises by the declared size, so declare one near the data's (a round "
                        f"figure) with run_local.py or add_dataset_objective.py --public-size")
