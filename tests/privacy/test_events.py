"""mnist_dp/privacy/events.py: a ledger event read from a file is checked field by field."""
import pytest
from conftest import dp_event

from mnist_dp.privacy.events import DpEvent
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.utils.errors import UserError


def test_a_ledger_event_with_less_noise_than_any_task_allows_is_refused():
    record = Ledger([dp_event(4000, 250, 3, sigma=0.05)]).to_json()  # PLD would take hours on it
    with pytest.raises(UserError,
                       match="noise multiplier 0.05 is below 0.3, the least a train task allows"):
        Ledger.from_json(record)


@pytest.mark.parametrize("field, value, message", [
    # its sensitivity is not one example's C
    ("clipping", "per-batch", "clipping = .per-batch. must be one of"),
    ("sample_rate", 0, "sample_rate = 0 must be a number in"),
    ("noise_multiplier", -1, "noise_multiplier = -1 must be a number >= 0"),
    ("noise_multiplier", float("nan"), "noise_multiplier = NaN must be"),
    ("steps", 2.0, "steps = 2.0 must be a positive integer"),
    ("data", ["a", "a"], "distinct data sample identities"),
    ("n", 10**9, "is inconsistent: q = 0.0625 but 1 / ceil.n / batch_size. = 2.5e-07"),
    ("steps", 10**6, "steps 1000000 > planned_steps 48"),
])
def test_every_ledger_field_is_checked_when_read(field, value, message):
    record = dp_event(4000, 250, 3).to_json()
    record[field] = value
    with pytest.raises(UserError, match=message):
        Ledger.from_json([record])


def test_ledger_json_missing_field_is_a_user_error():
    record = dp_event().to_json()
    del record["steps"]
    with pytest.raises(UserError, match="steps"):
        Ledger.from_json([record])


def test_a_ledger_written_before_schedules_and_adaptive_clipping_reads_as_neither():
    record = dp_event(4000, 500, 4).to_json()
    for name in ("noise_decay", "decay_steps", "count_noise_multiplier"):
        del record[name]
    assert DpEvent.from_json(record) == dp_event(4000, 500, 4)
    with pytest.raises(UserError, match="decay_steps"):
        DpEvent.from_json({**record, "decay_steps": -1})


@pytest.mark.parametrize("changes, message", [
    # a schedule read as constant: ε too low
    ({"noise_decay": 0.5}, "noise_decay 0.5 with decay_steps 0"),
    ({"decay_steps": 8}, "noise_decay 1.0 with decay_steps 8"),
    ({"noise_decay": 0.5, "decay_steps": 3}, "decay_steps 3 but the schedule has 4 blocks"),
])
def test_an_edited_schedule_is_refused(changes, message):
    with pytest.raises(UserError, match=message):
        DpEvent.from_json({**dp_event(4000, 500, 4).to_json(), **changes})
