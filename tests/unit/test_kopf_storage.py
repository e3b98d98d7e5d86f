"""kopf's state on a policy bound to the uid it was written for (controller/kopf_storage.py):
a policy created again from its own export is handled as new, values written by the
previous version (no uid) keep working, and an older operator still reads the new values."""

from __future__ import annotations

import copy
import json
import logging

import kopf
import pytest
from kopf._cogs.structs import diffs
from kopf._core.intents import causes

from stalledpolicy.controller.kopf_storage import UidDiffBaseStorage, UidProgressStorage, annotation_owners

PREFIX = "operator.queues.emq.dev"
DIFFBASE_KEY = f"{PREFIX}/last-handled-configuration"
MARKER = f"{PREFIX}/kopf-managed"
UID_A = "11111111-1111-1111-1111-111111111111"
UID_B = "22222222-2222-2222-2222-222222222222"


def policy(uid: str = UID_A, annotations=None, managed=None, spec=None) -> dict:
    meta = {"name": "nc", "namespace": "demo", "uid": uid, "annotations": dict(annotations or {})}
    if managed is not None:
        meta["managedFields"] = managed
    return {"apiVersion": "queues.emq.dev/v1alpha1", "kind": "StalledPolicy", "metadata": meta,
            "spec": spec or {"queue": "nc", "maxStalled": 1}, "status": {"deadLetters": 0}}


def owns(manager: str, *keys: str, operation: str = "Update") -> dict:
    return {"manager": manager, "operation": operation, "apiVersion": "queues.emq.dev/v1alpha1",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, **{f"f:{k}": {} for k in keys}}}}}


def applied(raw: dict, patch: kopf.Patch) -> dict:
    """The object after the API server merged kopf's patch (annotations only here)."""
    out = copy.deepcopy(raw)
    for key, value in (patch.get("metadata") or {}).get("annotations", {}).items():
        if value is None:
            out["metadata"]["annotations"].pop(key, None)
        else:
            out["metadata"]["annotations"][key] = value
    return out


def handled(raw: dict, storage: UidDiffBaseStorage) -> dict:
    """``raw`` after kopf stored its essence, as kopf does when handlers finish."""
    patch = kopf.Patch()
    storage.store(body=kopf.Body(raw), patch=patch, essence=storage.build(body=kopf.Body(raw)))
    return applied(raw, patch)


def exported(raw: dict, new_uid: str, manager: str = "kubectl-create") -> dict:
    """``raw`` exported (uid, managed fields, status dropped, annotations kept) and
    created again: a new uid, every field set by the creator."""
    out = copy.deepcopy(raw)
    out.pop("status", None)
    out["metadata"]["uid"] = new_uid
    out["metadata"]["managedFields"] = [owns(manager, *out["metadata"]["annotations"])]
    return out


def legacy(raw: dict, storage: UidDiffBaseStorage) -> dict:
    """``raw`` as the previous version (kopf's own AnnotationsDiffBaseStorage) left it."""
    patch = kopf.Patch()
    kopf.AnnotationsDiffBaseStorage(prefix=PREFIX).store(
        body=kopf.Body(raw), patch=patch, essence=storage.build(body=kopf.Body(raw)))
    out = applied(raw, patch)
    out["metadata"]["managedFields"] = [owns("kubectl-create"),
                                        owns("kopf", DIFFBASE_KEY, MARKER)]
    return out


def cause_reason(raw: dict, diffbase, progress) -> causes.Reason:
    """The reason kopf's cause detection gives, with these storages, as in
    kopf._core.reactor.processing (fetch, build, clear, diff)."""
    body = kopf.Body(raw)
    old = diffbase.fetch(body=body)
    new = diffbase.build(body=body)
    old = progress.clear(essence=old) if old is not None else None
    new = progress.clear(essence=new)
    return causes.detect_changing_cause(
        finalizer="x", raw_event={"type": "MODIFIED", "object": raw}, body=body, old=old, new=new,
        diff=diffs.diff(old, new), initial=False, resource=None, indices=None,
        logger=logging.getLogger("t"),
        patch=kopf.Patch(), memo=None).reason


@pytest.fixture
def diffbase() -> UidDiffBaseStorage:
    return UidDiffBaseStorage(prefix=PREFIX, key="last-handled-configuration")


@pytest.fixture
def progress() -> UidProgressStorage:
    return UidProgressStorage(prefix=PREFIX)


# -- diff base -------------------------------------------------------------------

def test_the_stored_essence_records_the_uid_and_reads_back_without_it(diffbase):
    raw = handled(policy(), diffbase)
    stored = json.loads(raw["metadata"]["annotations"][DIFFBASE_KEY])
    assert stored["metadata"]["annotations"] == {f"{PREFIX}/handled-uid": UID_A}
    assert raw["metadata"]["annotations"][MARKER] == "yes"
    fetched = diffbase.fetch(body=kopf.Body(raw))
    assert fetched == {"spec": {"queue": "nc", "maxStalled": 1}}
    assert fetched == diffbase.build(body=kopf.Body(raw))  # no change: nothing to handle


def test_the_same_object_is_no_change_and_an_edit_is_an_update(diffbase, progress):
    raw = handled(policy(), diffbase)
    assert cause_reason(raw, diffbase, progress) == causes.Reason.NOOP
    raw["spec"]["maxStalled"] = 3
    assert cause_reason(raw, diffbase, progress) == causes.Reason.UPDATE


def test_a_policy_created_again_from_its_export_is_a_creation(diffbase, progress, caplog):
    copy_of = exported(handled(policy(), diffbase), UID_B)
    with caplog.at_level(logging.INFO, logger="stalledpolicy.operator"):
        assert diffbase.fetch(body=kopf.Body(copy_of)) is None
        assert cause_reason(copy_of, diffbase, progress) == causes.Reason.CREATE
    lines = [r.getMessage() for r in caplog.records if "written for" in r.getMessage()]
    assert len(lines) == 1 and UID_A in lines[0], lines  # once per object, naming the other uid
    # Once handled, the new object's own essence is stored, and it is no longer new.
    rehandled = handled(copy_of, diffbase)
    assert cause_reason(rehandled, diffbase, progress) == causes.Reason.NOOP
    stored = json.loads(rehandled["metadata"]["annotations"][DIFFBASE_KEY])
    assert stored["metadata"]["annotations"][f"{PREFIX}/handled-uid"] == UID_B


def test_even_managed_fields_kept_in_the_export_do_not_fool_the_uid(diffbase, progress):
    raw = handled(policy(), diffbase)
    raw["metadata"]["managedFields"] = [owns("kopf", DIFFBASE_KEY, MARKER)]
    copy_of = copy.deepcopy(raw)
    copy_of["metadata"]["uid"] = UID_B  # restored with its managed fields as they were
    assert cause_reason(copy_of, diffbase, progress) == causes.Reason.CREATE


# -- the previous version's values (no uid) ---------------------------------------

def test_a_value_the_previous_version_wrote_is_trusted_no_creation_no_write(diffbase, progress):
    old = legacy(policy(), diffbase)
    assert json.loads(old["metadata"]["annotations"][DIFFBASE_KEY]) == {
        "spec": {"queue": "nc", "maxStalled": 1}}
    assert diffbase.fetch(body=kopf.Body(old)) == {"spec": {"queue": "nc", "maxStalled": 1}}
    assert cause_reason(old, diffbase, progress) == causes.Reason.NOOP  # a resume at start-up
    old["spec"]["maxStalled"] = 2
    assert cause_reason(old, diffbase, progress) == causes.Reason.UPDATE


@pytest.mark.parametrize("managed", [
    None,                                          # no managed fields at all
    [owns("kubectl-create")],                      # managed fields that do not name it
    [owns("kopf", DIFFBASE_KEY)],                   # kopf set it: the usual case
    [owns("argocd-controller", DIFFBASE_KEY, operation="Apply"),
     owns("kopf", DIFFBASE_KEY)],                   # shared with an applier: kopf set it too
], ids=["no-managed-fields", "not-named", "kopf", "shared"])
def test_an_old_value_is_trusted_unless_managed_fields_name_only_others(diffbase, managed):
    raw = legacy(policy(), diffbase)
    if managed is None:
        del raw["metadata"]["managedFields"]
    else:
        raw["metadata"]["managedFields"] = managed
    assert diffbase.fetch(body=kopf.Body(raw)) is not None


@pytest.mark.parametrize("creator", ["kubectl-create", "velero-server", "argocd-controller"])
def test_an_old_value_copied_before_the_upgrade_is_a_creation(diffbase, progress, creator):
    """An export made by the previous version, restored after the upgrade."""
    copy_of = exported(legacy(policy(), diffbase), UID_B, manager=creator)
    assert diffbase.fetch(body=kopf.Body(copy_of)) is None
    assert cause_reason(copy_of, diffbase, progress) == causes.Reason.CREATE


def test_annotation_owners():
    raw = policy(managed=[owns("kopf", DIFFBASE_KEY), owns("kubectl-edit"),
                          {"manager": "x", "operation": "Update"}])
    assert annotation_owners(raw, DIFFBASE_KEY) == {"kopf"}
    assert annotation_owners(raw, "other/key") == frozenset()
    assert annotation_owners(policy(), DIFFBASE_KEY) is None


def test_an_older_operator_reads_the_new_value_as_no_change(diffbase):
    """A rollback: kopf's own storages (same prefix) see the same spec, not an update."""
    raw = handled(policy(), diffbase)
    old_diffbase = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX, key="last-handled-configuration")
    old_progress = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    assert cause_reason(raw, old_diffbase, old_progress) == causes.Reason.NOOP


# -- progress --------------------------------------------------------------------

RECORD = {"started": "2026-12-03T10:00:00.000000", "delayed": "2026-12-03T10:04:00.000000",
          "purpose": "create", "retries": 7}


def stored_progress(raw: dict, storage, key: str = "reconcile-create") -> dict:
    patch = kopf.Patch()
    storage.store(key=key, record=dict(RECORD), body=kopf.Body(raw), patch=patch)
    return applied(raw, patch)


def test_a_progress_record_records_the_uid_and_reads_back_without_it(progress):
    raw = stored_progress(policy(), progress)
    stored = json.loads(raw["metadata"]["annotations"][f"{PREFIX}/reconcile-create"])
    assert stored == {**RECORD, "uid": UID_A}
    assert progress.fetch(key="reconcile-create", body=kopf.Body(raw)) == RECORD


def test_a_copied_progress_record_is_absent_so_no_retry_count_or_delay_is_inherited(progress):
    copy_of = exported(stored_progress(policy(), progress), UID_B)
    assert progress.fetch(key="reconcile-create", body=kopf.Body(copy_of)) is None
    # kopf still purges it once the handler is done: purge reads the body, not fetch.
    patch = kopf.Patch()
    progress.purge(key="reconcile-create", body=kopf.Body(copy_of), patch=patch)
    assert patch["metadata"]["annotations"][f"{PREFIX}/reconcile-create"] is None


def test_an_old_progress_record_is_trusted_unless_set_by_another_manager(progress):
    patch = kopf.Patch()
    kopf.AnnotationsProgressStorage(prefix=PREFIX).store(
        key="reconcile-create", record=dict(RECORD), body=kopf.Body(policy()), patch=patch)
    old = applied(policy(managed=[owns("kopf", f"{PREFIX}/reconcile-create")]), patch)
    assert progress.fetch(key="reconcile-create", body=kopf.Body(old)) == RECORD
    copy_of = exported(old, UID_B, manager="velero-server")
    assert progress.fetch(key="reconcile-create", body=kopf.Body(copy_of)) is None


def test_an_older_operator_reads_a_new_progress_record(progress):
    raw = stored_progress(policy(), progress)
    old = kopf.AnnotationsProgressStorage(prefix=PREFIX).fetch(key="reconcile-create", body=kopf.Body(raw))
    assert {k: v for k, v in old.items() if k != "uid"} == RECORD


def test_the_progress_storage_still_clears_our_annotations_from_essences(diffbase, progress):
    raw = stored_progress(handled(policy(), diffbase), progress)
    essence = progress.clear(essence=diffbase.build(body=kopf.Body(raw)))
    assert essence == {"spec": {"queue": "nc", "maxStalled": 1}}


# -- a value the previous version wrote is bound to its uid at the resume -----------

def test_a_trusted_old_value_is_bound_to_its_uid_once_essence_unchanged(diffbase, progress):
    old = legacy(policy(), diffbase)
    patch = kopf.Patch()
    assert diffbase.bind_uid(body=kopf.Body(old), patch=patch) is True
    assert set(patch["metadata"]["annotations"]) <= {DIFFBASE_KEY, MARKER}
    bound = applied(old, patch)
    stored = json.loads(bound["metadata"]["annotations"][DIFFBASE_KEY])
    assert stored["metadata"]["annotations"] == {f"{PREFIX}/handled-uid": UID_A}
    assert diffbase.fetch(body=kopf.Body(bound)) == diffbase.fetch(body=kopf.Body(old))
    assert cause_reason(bound, diffbase, progress) == causes.Reason.NOOP  # no handler runs for it
    # once: the bound value is left alone
    again = kopf.Patch()
    assert diffbase.bind_uid(body=kopf.Body(bound), patch=again) is False and not again


def test_an_old_policy_exported_with_its_managed_fields_after_the_resume_is_a_creation(diffbase, progress):
    """The uid-less value stayed for ever (kopf stores the diff base only on a
    change), and managed fields naming kopf kept it trusted: such an export,
    created again, was a no-op: no sweeper until a restart."""
    old = legacy(policy(), diffbase)
    patch = kopf.Patch()
    diffbase.bind_uid(body=kopf.Body(old), patch=patch)
    copy_of = applied(old, patch)
    copy_of["metadata"]["uid"] = UID_B  # restored with its managed fields as they were (kopf's)
    assert cause_reason(copy_of, diffbase, progress) == causes.Reason.CREATE


@pytest.mark.parametrize("case", ["bound", "copied", "absent", "no-uid"])
def test_nothing_else_is_rewritten(diffbase, case):
    raw = {"bound": lambda: handled(policy(), diffbase),
           "copied": lambda: exported(legacy(policy(), diffbase), UID_B),
           "absent": lambda: policy(),
           "no-uid": lambda: legacy(policy(uid=""), diffbase)}[case]()
    patch = kopf.Patch()
    assert diffbase.bind_uid(body=kopf.Body(raw), patch=patch) is False
    assert not patch


def test_the_resume_handler_binds_the_old_value_in_its_patch(monkeypatch, diffbase):
    from stalledpolicy.controller import main

    resumed = []
    monkeypatch.setattr(main, "_diffbase_storage", diffbase)
    monkeypatch.setattr(main, "_request_apply", lambda body, why, **kw: resumed.append(kw))
    old = legacy(policy(), diffbase)
    patch = kopf.Patch()
    main.on_resume(body=kopf.Body(old), retry=0, patch=patch)
    assert resumed == [{"resume": True}]
    assert UID_A in patch["metadata"]["annotations"][DIFFBASE_KEY]


@pytest.mark.parametrize("extra_fields", [None, set(), {("status", "deadLetters")}])
def test_the_essence_is_kopfs_own_without_copying_what_it_drops(diffbase, extra_fields):
    managed = [owns("kubectl-create", "team"), owns("kopf", DIFFBASE_KEY, MARKER)]
    raw = policy(annotations={"team": "a", DIFFBASE_KEY: "{}", "kubectl.kubernetes.io/last-applied-configuration": "x",
                              "other.example/kopf-managed": "yes", "other.example/last-handled-configuration": "{}"},
                 managed=managed, spec={"queue": "nc", "maxStalled": 1, "lanes": [{"name": "a", "maxStalled": 2}]})
    raw["metadata"]["labels"] = {"app": "x"}
    raw["metadata"]["ownerReferences"] = [{"kind": "Thing", "name": "t", "uid": "u"}]
    before = copy.deepcopy(raw)
    kopfs = kopf.AnnotationsDiffBaseStorage.build(diffbase, body=kopf.Body(copy.deepcopy(raw)),
                                                  extra_fields=extra_fields)
    ours = diffbase.build(body=kopf.Body(raw), extra_fields=extra_fields)
    assert ours == kopfs
    assert raw == before  # the body is left as it was
    ours["spec"]["lanes"][0]["maxStalled"] = 9  # and the essence is a copy
    assert raw["spec"]["lanes"][0]["maxStalled"] == 2
