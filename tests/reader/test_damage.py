"""Damaged event files named (`reader.damage`): which run, which file, up to which step read; by the check
itself, by `tb-layergrad report` and by `tb_layergrad.load()`. The routes and both real TensorBoards:
tests/reader/test_reliability_logdirs.py (`damage_named`); the tab: tests/tab/test_tab_damage_e2e.py.

"Up to which step" is checked against TensorBoard's own event-file loader: the last step it reads from each
damaged file is the step named. The checksums themselves, with google-crc32c's C extension and without it:
tests/metadata/test_tf_record.py.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

from tb_layergrad.reader import damage, event_files


def _tensorboard_last_step(path: str):
    """The last step TensorBoard's Python event-file loader reads from `path` (None: none)."""
    from tensorboard.backend.event_processing import event_file_loader

    steps = []
    with event_files.tensorflow_free(path):
        try:
            for event in event_file_loader.EventFileLoader(path).Load():
                steps.append(event.step)
        except Exception:  # noqa: BLE001 - what it read before failing is what it read
            pass
    return max(steps[1:]) if len(steps) > 1 else None


def test_each_damage_is_named_with_the_step_tensorboard_read_up_to(tmp_path, reliability_fixtures):
    expect = reliability_fixtures.damaged_logdir(str(tmp_path))
    found = damage.Scanner(str(tmp_path)).scan()
    got = {run: [(d.kind, d.offset, d.step, d.records) for d in ds] for run, ds in found.items()}
    assert got == {run: [e] for run, e in expect.items()}
    for run, (d,) in found.items():
        assert d.file.startswith(run + "/events.out.tfevents.")
        assert d.line().startswith(f"run {run!r}: event file {d.file!r} ")
        if d.kind in (damage.TRUNCATED, damage.CORRUPT) and d.records > 1:
            assert d.step == _tensorboard_last_step(os.path.join(str(tmp_path), d.file))
            assert f"read up to step {d.step}" in d.line()


def test_a_partial_record_or_an_empty_file_is_named_only_once_settled(tmp_path, reliability_fixtures):
    run = str(tmp_path / "live")
    f = reliability_fixtures.write_run(run, reliability_fixtures.DAMAGE_LAYERS, range(3))
    reliability_fixtures.cut(f)
    open(os.path.join(run, "events.out.tfevents.2.next"), "wb").close()
    assert damage.Scanner(str(tmp_path)).scan() == {}  # a writer between two flushes
    named = damage.Scanner(str(tmp_path), settled_s=0).scan()["live"]
    assert [d.kind for d in named] == [damage.TRUNCATED, damage.EMPTY]


def test_the_check_reads_each_appended_byte_once(tmp_path, reliability_fixtures):
    run = str(tmp_path / "growing")
    f = reliability_fixtures.write_run(run, reliability_fixtures.DAMAGE_LAYERS, range(5))
    scanner = damage.Scanner(str(tmp_path))
    assert scanner.scan() == {}
    first = scanner.bytes_read
    assert first == os.path.getsize(f.path)
    assert scanner.scan() == {} and scanner.bytes_read == first  # nothing new: nothing read
    size = os.path.getsize(f.path)
    f.write(5, reliability_fixtures.DAMAGE_LAYERS)
    record = os.path.getsize(f.path) - size
    f.append_raw(b"\x07" * 5)  # the start of the next record, not yet whole
    assert scanner.scan() == {}
    assert scanner.bytes_read == first + record + 5
    f.append_raw(np.random.default_rng(5).bytes(64))  # what follows is no record
    (d,) = scanner.scan()["growing"]
    assert (d.kind, d.step, d.offset) == (damage.CORRUPT, 5, size + record)
    assert scanner.bytes_read == first + record + 5 + 5 + 64  # from the partial record on, once
    scanner.scan()
    assert scanner.bytes_read == first + record + 5 + 5 + 64  # a fault is not read again


def test_report_and_load_name_the_damage_and_serve_the_rest(tmp_path, reliability_fixtures, report_command):
    pytest.importorskip("pandas")
    import tb_layergrad

    expect = reliability_fixtures.damaged_logdir(str(tmp_path))
    code, out, _ = report_command(tmp_path, "--format", "json")
    assert code == 0
    doc = json.loads(out)
    lines = [w for w in doc["warnings"] if w.startswith("run ")]
    assert sorted(line.split(":")[0] for line in lines) == sorted(f"run {r!r}" for r in expect)
    code, _, err = report_command(tmp_path, "--format", "csv")  # the CSV says its warnings on stderr
    assert code == 0 and err.splitlines() == [f"tb-layergrad report: warning: {w}" for w in doc["warnings"]]
    code, text, _ = report_command(tmp_path)
    assert code == 0 and "event file 'truncated/" in text and "read up to step 4" in text
    assert {r["run"] for r in doc["runs"]} == {"intact", "truncated", "garbage", "flipped"}  # the rest as before

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = tb_layergrad.load(str(tmp_path))
    said = [str(w.message) for w in caught if issubclass(w.category, damage.DamageWarning)]
    assert sorted(said) == sorted(lines)
    assert sorted((d["run"], d["kind"], d["step"]) for d in df.attrs["damage"]) == sorted(
        (r, k, s) for r, (k, _, s, _) in expect.items()
    )
    steps = df[df.layer == "net/a"].groupby("run").step.max().to_dict()
    assert steps == {"intact": 5, "truncated": 4, "garbage": 5, "flipped": 2}

    code, out, _ = report_command(tmp_path, "--run", "intact")
    assert code == 0
    assert "event file" not in out  # only the runs asked are checked


def test_the_records_read_are_those_tensorboards_reader_reads(tmp_path, reliability_fixtures):
    """`read_records` (what report and load() read through) against TensorBoard's own pure-Python reader."""
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    reliability_fixtures.damaged_logdir(str(tmp_path))
    compared = 0
    for folder, _, files in os.walk(str(tmp_path)):
        for name in files:
            path = os.path.join(folder, name)
            if not damage.is_event_file(name) or not os.path.exists(path):
                continue
            theirs = []
            reader = pywrap_tensorflow.PyRecordReader_New(path.encode(), 0, b"", None)
            while True:
                try:
                    reader.GetNext()
                except (errors.OutOfRangeError, errors.DataLossError):
                    break
                theirs.append(reader.record())
            assert list(damage.read_records(path)) == theirs, path
            compared += len(theirs)
    assert compared > 20


def test_report_and_load_check_each_bytes_checksums_once(tmp_path, monkeypatch, reliability_fixtures, report_command):
    """Three walks of each file in one read (TensorBoard's multiplexer, the record index, the damage check), one
    check of each record's checksums (`damage.checked_once`): the bytes checksummed are at most the file's."""
    pytest.importorskip("pandas")
    import tb_layergrad

    f = reliability_fixtures.write_run(str(tmp_path / "run"), reliability_fixtures.DAMAGE_LAYERS, range(40))
    checked = []
    real = damage.masked_crc32c_each
    monkeypatch.setattr(damage, "masked_crc32c_each", lambda b, s, n: checked.append(sum(n)) or real(b, s, n))
    size = os.path.getsize(f.path)
    assert len(tb_layergrad.load(str(tmp_path))) > 0
    assert 0 < sum(checked) <= size
    checked.clear()
    code, out, _ = report_command(tmp_path, "--format", "json")
    assert code == 0 and [r["run"] for r in json.loads(out)["runs"]] == ["run"]
    assert 0 < sum(checked) <= size
    checked.clear()
    damage.Scanner(str(tmp_path)).scan()  # outside a read of report or load(): every walk checks
    assert sum(checked) > 0
