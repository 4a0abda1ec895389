"""The data's own ledger (privacy/data_ledger.py): a journal per data sample folder, appended under
a lock, read as a union; a model's ledger absorbs the runs it lacks; a damaged record is refused; a
replaced dataset never loses it."""
import dataclasses
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
from conftest import fill_disk, ledger_event

from mnist_dp.data import dataset
from mnist_dp.privacy import data_ledger, journal
from mnist_dp.privacy.events import new_run_id
from mnist_dp.privacy.examples import Examples
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.utils.errors import UserError

IDS = np.arange(1, 101, dtype=np.uint64)


def run(data=("fp-a",), framework="torch", **changes):
    """A ledger of one run on `data` (its examples named) and that run, as a train task records
    them."""
    event = dataclasses.replace(ledger_event(framework, data, n=100 * len(data)),
                                run_id=new_run_id(), **changes)
    ledger = Ledger([event], {d: Examples.of("ab" * 8, IDS + 1000 * k) for k, d in enumerate(data)})
    return ledger, event


def recorded(folders, ledger, event):
    with data_ledger.held(folders) as spent:
        spent.record(ledger, event)


def test_each_run_is_recorded_in_every_folder_it_read_and_read_back_once(tmp_path):
    first, second = tmp_path / "0", tmp_path / "1"
    first.mkdir(), second.mkdir()
    both, alone = run(("fp-a", "fp-b")), run(("fp-a",))
    recorded([first, second], *both)
    recorded([first], *alone)
    assert [e.run_id
            for e in data_ledger.read([first, second]).events] == [both[1].run_id, alone[1].run_id]
    assert [e.run_id for e in data_ledger.read([second]).events] == [both[1].run_id]
    again = data_ledger.read([first, second])
    assert again.events == [both[1], alone[1]] and again.examples == {
        **alone[0].examples, **both[0].examples}


def test_a_line_cut_short_by_a_crash_is_dropped_and_the_next_run_recorded_after_it(tmp_path):
    kept, cut = run(), run()
    recorded([tmp_path], *kept)
    line = json.dumps(journal.line_of(*cut)).encode()
    with open(data_ledger.path_of(tmp_path), "ab") as f:
        f.write(line[: len(line) // 2])  # killed half-way: its model was never saved
    assert data_ledger.read([tmp_path]).events == [kept[1]]
    after = run()
    recorded([tmp_path], *after)
    assert data_ledger.read([tmp_path]).events == [kept[1], after[1]]


@pytest.mark.parametrize("edit, message", [
    (lambda line: line.replace(b'"steps": 10', b'"steps": 0'), "line 1 is not a run record"),
    (lambda line: b"{}\n", "line 1 is not a run record"),
    (lambda line: line.replace(b'"run_id": "', b'"run_id": null, "x": "'),
     "line 1 is not a run record"),
])
def test_an_edited_record_is_refused_naming_the_file_and_line(tmp_path, edit, message):
    recorded([tmp_path], *run())
    path = data_ledger.path_of(tmp_path)
    path.write_bytes(edit(path.read_bytes()))
    with pytest.raises(UserError, match=message) as caught:
        data_ledger.read([tmp_path])
    assert str(path) in str(caught.value)


def test_a_run_recorded_twice_differently_is_refused(tmp_path):
    ledger, event = run()
    recorded([tmp_path], ledger, event)
    recorded([tmp_path], ledger, dataclasses.replace(event, noise_multiplier=5.0))
    with pytest.raises(UserError, match="recorded twice, differently"):
        data_ledger.read([tmp_path])


def test_a_model_absorbs_the_runs_its_ledger_lacks_in_every_framework():
    model, earlier = run()
    own, lacking = run()
    _, other_framework = run(framework="tf")
    data = Ledger([earlier, lacking, other_framework], {**model.examples})
    added = data_ledger.absorb(model, data)
    assert added == [lacking, other_framework]
    assert model.events == [lacking, other_framework, earlier]
    assert data_ledger.absorb(model, data) == []  # the union: nothing twice
    doctored = Ledger([dataclasses.replace(earlier, noise_multiplier=9.0)], dict(model.examples))
    with pytest.raises(UserError, match="records training run .* differently"):
        data_ledger.absorb(doctored, data)


def _append_slowly(folder, seconds):
    ledger, event = run()
    with data_ledger.held([folder]) as spent:
        before = [e.run_id for e in spent.ledger.events]
        time.sleep(seconds)  # a training run, holding the lock
        spent.record(ledger, event)
    return before, event.run_id


def test_two_tasks_on_the_same_data_at_once_lose_neither_spend_and_the_second_sees_the_first(
        tmp_path):
    # SIGTERM as the OS has it: a test before this one in the process may have run a script's
    # run_cli, whose handler a forked worker would inherit. The pool is closed, not terminated: its
    # workers end by themselves.
    pool = multiprocessing.get_context("fork").Pool(2, signal.signal,
                                                    (signal.SIGTERM, signal.SIG_DFL))
    try:
        results = [pool.apply_async(_append_slowly, (tmp_path, 0.5)) for _ in range(2)]
        (seen_a, run_a), (seen_b, run_b) = sorted((r.get(timeout=60) for r in results),
                                                  key=lambda r: len(r[0]))
    except BaseException:
        pool.terminate()
        raise
    pool.close()
    pool.join()
    assert {e.run_id for e in data_ledger.read([tmp_path]).events} == {run_a, run_b}
    assert seen_a == [] and seen_b == [run_a]  # the lock held from the budget check to the record


def test_a_dataset_whose_samples_record_runs_is_never_replaced(tmp_path):
    dest = tmp_path / "data"
    dataset.generate(dest, train_size=100, test_size=20, train_samples=2, seed=1)
    recorded([dataset.sample_folders(dest, "train")[1]], *run())
    with pytest.raises(UserError, match=r"own ledgers record the runs released from them "
                                        r".*privacy_ledger.jsonl"):
        dataset.generate(dest, train_size=100, test_size=20, train_samples=2, seed=2, force=True)
    assert data_ledger.read(dataset.sample_folders(dest, "train")).events  # kept


def test_joined_folders_share_one_file_that_a_task_holds_and_appends_to_once(tmp_path):
    first, second = tmp_path / "0", tmp_path / "1"
    first.mkdir(), second.mkdir()
    before = [run(("fp-a",)), run(("fp-b",))]
    recorded([first], *before[0])
    recorded([second], *before[1])
    assert data_ledger.join([first, second]) == 2
    assert data_ledger.read([first]).events == data_ledger.read([second]).events
    assert {e.run_id
            for e in data_ledger.read([first]).events} == {before[0][1].run_id, before[1][1].run_id}
    # one inode: one lock (a second would wait for the first)
    with data_ledger.held([second, first]) as spent:
        assert len(spent.files) == 1
        spent.record(*run(("fp-b",)))
    assert len(data_ledger.read([first]).events) == 3
    assert data_ledger.path_of(first).read_bytes().count(b"\n") == 3  # appended once
    assert not list(tmp_path.rglob(".privacy_ledger*"))  # no work file left


def test_a_task_waiting_while_the_ledger_is_joined_records_in_the_joined_file(tmp_path):
    first, second = tmp_path / "0", tmp_path / "1"
    first.mkdir(), second.mkdir()
    waiting = run(("fp-a",))
    with data_ledger.held([first]) as holder:
        joiner = threading.Thread(target=data_ledger.join, args=([first, second],))
        joiner.start()  # waits for the lock, then replaces the file
        time.sleep(0.5)
        thread = threading.Thread(target=recorded, args=([first], *waiting))
        thread.start()  # opens the file the join replaces, then waits for its lock
        time.sleep(0.5)
        holder.record(*run(("fp-a",)))
    thread.join(10), joiner.join(10)
    # neither run lost to the file the join replaced
    assert len(data_ledger.read([second]).events) == 2


def big_run():
    """A run on 3,000 examples: its record (about 5 kB) is larger than a memory page, so a full
    tmpfs takes only part of it."""
    event = dataclasses.replace(ledger_event("torch", ("fp-big",), n=3000), run_id=new_run_id())
    ids = np.arange(1, 3001, dtype=np.uint64)
    return Ledger([event], {"fp-big": Examples.of("ab" * 8, ids)}), event


@pytest.mark.parametrize("make, message", [
    (lambda path: path.symlink_to(path.parent / "gone" / "ledger"), "is a symbolic link"),
    (lambda path: path.symlink_to("/dev/null"), "is a symbolic link"),
    (lambda path: path.mkdir(), "is a folder, not a privacy ledger"),
    (lambda path: os.mkfifo(path), "is not a regular file"),
])
def test_a_ledger_that_could_forget_is_refused_in_one_line_naming_it(tmp_path, make, message):
    make(data_ledger.path_of(tmp_path))
    for attempt in (lambda: recorded([tmp_path], *run()), lambda: data_ledger.read([tmp_path])):
        with pytest.raises(UserError, match=message) as caught:
            attempt()
        assert str(data_ledger.path_of(tmp_path)) in str(caught.value)
        assert "\n" not in str(caught.value)


def test_a_whole_last_record_that_lost_its_newline_is_kept_and_the_next_follows_it(tmp_path):
    first, second = run(), run()
    recorded([tmp_path], *first)
    path = data_ledger.path_of(tmp_path)
    path.write_bytes(path.read_bytes()[:-1])
    assert data_ledger.read([tmp_path]).events == [first[1]]
    recorded([tmp_path], *second)
    assert data_ledger.read([tmp_path]).events == [first[1], second[1]]
    assert path.read_bytes().count(b"\n") == 2


def test_a_last_line_that_begins_no_record_is_refused_not_dropped(tmp_path):
    recorded([tmp_path], *run())
    path = data_ledger.path_of(tmp_path)
    path.write_bytes(path.read_bytes() + b'{"steps": 3')
    with pytest.raises(UserError, match=r"its last line \(2\) is neither a run record nor the "
                                        r"beginning of one"):
        recorded([tmp_path], *run())
    assert path.read_bytes().endswith(b'{"steps": 3')  # nothing dropped


def test_on_a_full_disk_a_record_is_refused_and_nothing_of_it_stays(tmpfs):
    folder = tmpfs("size=256k")
    recorded([folder], *run())
    path = data_ledger.path_of(folder)
    before = path.read_bytes()
    fill_disk(folder)
    with pytest.raises(UserError, match=r"privacy_ledger.jsonl: could not record this run in the "
                                        r"data's privacy ledger \(No space left on device\); the "
                                        r"model was not saved: free space"):
        recorded([folder], *big_run())
    assert path.read_bytes() == before
    (folder / "filler").unlink()
    recorded([folder], *big_run())  # with room again, it goes in whole
    assert len(data_ledger.read([folder]).events) == 2


def test_read_only_samples_need_a_ledger_output_or_the_task_is_refused(tmpfs):
    folder = tmpfs("size=1m")
    recorded([folder], *run())
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    with pytest.raises(UserError, match=r"the data samples are read-only here and this task has no "
                                        r"ledger output, so its run would be recorded nowhere"):
        with data_ledger.held([folder]):
            pass
    with data_ledger.held([folder], passes_on=True) as spent:  # its ledger output carries the run
        assert not spent.files and len(spent.ledger.events) == 1
    with pytest.raises(UserError, match=r"cannot record the released runs in .* read-only"):
        data_ledger.record_released({"fp-a": folder}, [run()[0]])


def test_in_substras_subprocess_mode_the_ledger_is_the_registered_folders(tmp_path):
    """Substra's subprocess mode gives a task a folder of symbolic links to the sample's files: the
    run goes to the registered folder's ledger, not to a file of the task's own."""
    registered, task = tmp_path / "registered", tmp_path / "task"
    registered.mkdir()
    (registered / "identity.key").write_text("00" * 32)
    shutil.copytree(registered, task, copy_function=os.symlink)
    recorded([task], *run())
    assert not (task / data_ledger.LEDGER_FILE).exists()
    assert len(data_ledger.read([registered]).events) == 1


def test_a_released_models_run_is_recorded_with_the_examples_of_the_data_folders(tmp_path):
    """A model file's ledger names no example: the data's own ledger names them from its folders
    (samples.named), as the task that ran would have; without them, the run may have touched any."""
    from mnist_dp.data import samples

    dataset.generate(tmp_path / "data", train_size=40, test_size=10, train_samples=2, seed=3)
    folders = sorted((tmp_path / "data" / "train").iterdir())
    own = {samples.sample_identity(f): f for f in folders}
    truth = samples.named(folders)
    event = dataclasses.replace(ledger_event("torch", tuple(own), n=40), run_id=new_run_id())
    released = Ledger([event], truth.examples).released()
    assert data_ledger.record_released(own, [released], name=samples.named) == 1
    record = data_ledger.read(folders)
    assert record.events == [event] and record.examples == truth.examples
    # the data's figure is per example again: a run on one folder alone does not touch the other's
    alone = dataclasses.replace(ledger_event("torch", tuple(own)[:1], n=20), run_id=new_run_id())
    data_ledger.record_released(own, [Ledger([alone], truth.examples).released()],
                                name=samples.named)
    assert sorted(len(account.events)
                  for account in data_ledger.read(folders).accounts()) == [1, 2]
    # with no namer the record says the run's samples, not their examples
    other = tmp_path / "other"
    shutil.copytree(folders[0], other)
    (other / data_ledger.LEDGER_FILE).unlink()
    assert data_ledger.record_released({tuple(own)[0]: other}, [released]) == 1
    assert not data_ledger.read([other]).examples[tuple(own)[0]].named
