"""engines/engine_set.py: what the other tests leave (a mutation round of compare and engine_set)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from specrt.errors import UserError

from .conftest import edit_manifest, rewrite_byte


def test_a_folder_whose_path_no_longer_leads_to_a_folder_is_said_removed(tiny_engines, tmp_path):
    """check_still_here: the engines folder's path no longer reaching a folder by any OSError
    (here a file now where its parent folder was: NotADirectoryError) is "removed while this
    ran" (mutant e06: only FileNotFoundError caught, the OSError a traceback out of canary and
    calibrate)."""
    from specrt.engines import load_engines

    eng = tmp_path / "p" / "engines"
    shutil.copytree(tiny_engines, eng)
    with load_engines(eng) as e:
        e.check_still_here("x")  # (the folder loaded: nothing to refuse)
        (tmp_path / "p").rename(tmp_path / "moved")
        Path(tmp_path / "p").write_text("a file where the folder was")
        with pytest.raises(UserError, match=f"{eng}: removed while this ran; x not written$"):
            e.check_still_here("x")


def test_a_folder_removed_while_loaded_is_said_removed_not_replaced(tiny_engines, tmp_path):
    """check_unchanged: a folder gone (nothing in its place) is "removed", not "replaced" by a rebuild."""
    from specrt.engines import load_engines

    eng = tmp_path / "engines"
    shutil.copytree(tiny_engines, eng)
    with load_engines(eng, verify=False) as e:
        e.check_unchanged()
        eng.rename(tmp_path / "moved")
        with pytest.raises(UserError, match=f"^{re.escape(str(eng))}: removed while its engines were being loaded "):
            e.check_unchanged()


def test_a_folder_stat_d_neither_at_load_nor_now_is_said_removed(tiny_engines, tmp_path, monkeypatch):
    """folder_state / check_unchanged: engines whose folder's stat failed at load (identity None:
    the stat falling in a rename's window, `build --force`'s; made here by failing it) and that
    is gone now are "removed"; folder_state said "loaded" (None == None) and check_unchanged
    passed, so check_still_here let a write go on (session 70's review, h74d). A folder there now
    stays "replaced": nothing vouches it is the one read."""
    from specrt.engines import engine_set

    eng = tmp_path / "engines"
    shutil.copytree(tiny_engines, eng)
    with monkeypatch.context() as m:
        m.setattr(engine_set, "_identity", lambda folder: None)
        e = engine_set.load_engines(eng, verify=False)
    assert e.identity is None and e.folder_state() == "replaced"
    eng.rename(tmp_path / "moved")
    assert e.folder_state() == "removed"
    with pytest.raises(UserError, match=f"^{re.escape(str(eng))}: removed while this ran; x not written$"):
        e.check_still_here("x")
    with pytest.raises(UserError, match=f"^{re.escape(str(eng))}: removed while its engines were being loaded "):
        e.check_unchanged()


def test_engines_given_as_the_working_folder_and_rebuilt_are_not_taken_as_unchanged(tiny_engines, tmp_path,
                                                                                     monkeypatch):
    """ENGINES "." while `build --force` renames a new folder into its place and removes the one
    the process stands in: stat(".") still read the removed folder (its inode held), so the
    rebuild went unseen and its files were said "missing". The working folder gone is said."""
    from specrt.engines import load_engines

    eng = tmp_path / "engines"
    shutil.copytree(tiny_engines, eng)
    monkeypatch.chdir(eng)
    with load_engines(Path("."), verify=False) as e:
        e.check_unchanged()
        shutil.copytree(tiny_engines, tmp_path / ".engines.new")
        eng.rename(tmp_path / ".engines.old")
        (tmp_path / ".engines.new").rename(eng)
        shutil.rmtree(tmp_path / ".engines.old")
        with pytest.raises(UserError, match=r"^\.: removed while its engines were being loaded "):
            e.check_unchanged()
        with pytest.raises(UserError, match=r"^\.: removed while this ran; x not written$"):
            e.check_still_here("x")
    from specrt.engines import engine_set

    read = engine_set.read_engines_manifest

    def rebuilt_then_read(folder):  # (`build --force` finishing as the load begins)
        eng.rename(tmp_path / ".engines.old2")
        shutil.copytree(tiny_engines, eng)
        shutil.rmtree(tmp_path / ".engines.old2")
        return read(folder)

    monkeypatch.chdir(eng)
    monkeypatch.setattr(engine_set, "read_engines_manifest", rebuilt_then_read)
    with pytest.raises(UserError, match=r"^\.: removed while its engines were being loaded "):
        load_engines(Path("."), verify=False)


def test_verify_false_loads_engines_whose_files_no_longer_match_their_hashes(engines_copy):
    """``verify=False`` skips re-hashing the files, as its callers ask (the default refuses
    them): mutant E03, the flag ignored, re-hashed every file on every such load."""
    from specrt.engines import load_engines

    rewrite_byte(engines_copy / "target.onnx.data")
    with pytest.raises(UserError, match=r"target\.onnx\.data: content differs"):
        load_engines(engines_copy)
    assert load_engines(engines_copy, verify=False).depths == (1, 2, 4, 8)
    # the embedded export's files too (A73 of session 69's round: the flag not passed on to load_export)
    rewrite_byte(engines_copy / "target.onnx.data")  # (the byte flipped back)
    rewrite_byte(engines_copy / "export" / "draft.onnx")
    with pytest.raises(UserError, match=r"draft\.onnx: content differs"):
        load_engines(engines_copy)
    assert load_engines(engines_copy, verify=False).depths == (1, 2, 4, 8)


def test_a_verify_depth_not_built_names_the_depths_built(tiny_engines):
    """engines.verify(d) for a depth not built names the folder, the depth and the depths
    built (mutant E27: the roles listed instead of the depths)."""
    from specrt.engines import load_engines

    e = load_engines(tiny_engines, verify=False)
    with pytest.raises(UserError, match=f"^{re.escape(str(tiny_engines))}: no verify engine for depth 3 "
                                        r"\(built depths: 1, 2, 4, 8\)$"):
        e.verify(3)
    assert e.verify(4) is e.runners["verify.4"] and e.target(5) is e.verify(4)


def test_a_session_mode_given_at_load_re_derives_prepacking_unless_that_is_given_too(tiny_engines):
    """ort_overrides' "sessions" alone re-derives prepacking from the new mode (per-depth:
    off, so that the target's sessions share one copy of the weights); given beside it, the
    caller's "prepack" is kept (mutant E13: replaced by the derived value, E14: the build's
    kept)."""
    from specrt.engines import load_engines

    assert load_engines(tiny_engines, verify=False).ort_settings.prepack is True  # (built shared)
    e = load_engines(tiny_engines, verify=False, ort_overrides={"sessions": "per-depth"})
    assert (e.ort_settings.sessions, e.ort_settings.prepack) == ("per-depth", False)
    e = load_engines(tiny_engines, verify=False, ort_overrides={"sessions": "per-depth", "prepack": True})
    assert (e.ort_settings.sessions, e.ort_settings.prepack) == ("per-depth", True)


def test_a_portable_view_lets_go_of_its_scratch_buffers_with_the_engine_set(tiny_engines):
    """The portable view's scratch KV buffers (the engine's whole layout, O(context)) go
    with the engine set's deactivation (mutant E60: kept for the life of the view); a view
    of engines not activated is refused, naming what to do (E59: an InternalError at its
    first call); asked again, the view is the same one, left active."""
    import numpy as np

    from specrt import contracts as C
    from specrt.engines import load_engines

    feeds = {C.INPUT_IDS: np.array([[5, 6, 7]]), C.POSITION_IDS: np.array([[0, 1, 2]]),
             **{n: np.zeros((1, 0, 2, 16), np.float32) for i in range(4) for n in (C.past_key(i), C.past_value(i))}}
    e = load_engines(tiny_engines, verify=False)
    with pytest.raises(UserError, match="^engine 'verify.2': activate the engine set before using its portable view$"):
        e.portable("verify.2")
    with e:
        assert e.is_active  # (E39: said inactive)
        view = e.portable("verify.2")
        assert view is not e.runners["verify.2"] and view.infer(feeds)[C.LOGITS].shape == (1, 3, 1000)
        assert len(view._bufs) == 8
        assert e.portable("verify.2") is view  # (E31: activated again, E32: another view each time)
    assert not e.is_active and not view.is_active and view._bufs == {}


@pytest.mark.parametrize("wb", [[1, 2], "1", None])
def test_weight_bytes_of_another_type_are_named(engines_copy, wb):
    """engines.json's 'weight_bytes' not an object of graph -> bytes is named with the fix
    (mutant E51: the type check dropped, an AttributeError traceback from bench's memory check)."""
    from specrt.engines import load_engines

    edit_manifest(engines_copy, lambda m: m.update(weight_bytes=wb))
    e = load_engines(engines_copy, verify=False)
    with pytest.raises(UserError, match=f"{re.escape(str(engines_copy / 'engines.json'))}: field 'weight_bytes' is "):
        e.weight_bytes


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
def test_loaded_engines_keep_their_folder_open_so_its_inode_number_holds(tiny_engines, tmp_path):
    """Overlayfs over two file systems numbers a directory anew each time it comes back into the
    cache: memory pressure dropping the unused folder between load and check_still_here (the end
    of an hour's bench) had the same folder taken for a rebuild, the report refused (shown with a
    tmpfs lower layer and drop_caches). An fd open on the folder, as long as the EngineSet, keeps
    its inode; a rebuild is told as before, and a refused load keeps none open."""
    import gc
    import os

    from specrt.engines import load_engines

    def held() -> list[str]:  # (the folder loaded, wherever it was moved: m70a-35, its fd never closed)
        return [os.readlink(f"/proc/self/fd/{n}") for n in os.listdir("/proc/self/fd")
                if os.path.realpath(f"/proc/self/fd/{n}").startswith(str(tmp_path))]

    eng = tmp_path / "engines"
    shutil.copytree(tiny_engines, eng)
    e = load_engines(eng)
    assert held() == [str(eng)]
    shutil.copytree(eng, tmp_path / "new")
    eng.rename(tmp_path / "old")
    (tmp_path / "new").rename(eng)  # (a rebuild: another folder in its place)
    with pytest.raises(UserError, match="replaced while this ran"):
        e.check_still_here("x")
    del e
    gc.collect()
    assert held() == []
    (eng / "engines.json").write_text("{")
    with pytest.raises(UserError, match=f"^{re.escape(str(eng / 'engines.json'))}: "):  # (not "replaced": m70a-38)
        load_engines(eng)
    assert held() == []


def _rebuild_in_place(folder: Path, change=None) -> None:
    """As `specrt build --force`: another folder renamed into ``folder``'s place (``change``
    applied to it first: another build's files)."""
    new = folder.parent / "new"
    shutil.copytree(folder, new)
    if change is not None:
        change(new)
    folder.rename(folder.parent / "old")
    new.rename(folder)


@pytest.mark.parametrize("then", ["a file differs", "Ctrl-C"])
def test_engines_replaced_while_their_files_are_checked_are_said_replaced(engines_copy, monkeypatch, then):
    """A rebuild landing after engines.json was read, while the files' hashes were checked
    against it: the new build's weights "differ" from the earlier manifest; that is said as the
    rebuild it is, naming the folder (mutant m70a-39: the branch dropped, "content differs";
    m70a-54: the folder's identity taken after the manifest was read, the new folder's; m70a-40:
    the folder named by its last part). A Ctrl-C meanwhile stays a Ctrl-C (m70a-37: a
    KeyboardInterrupt said as the rebuild, a UserError)."""
    from specrt.engines import engine_set

    read = engine_set.read_engines_manifest

    def read_then_rebuilt(folder):
        manifest = read(folder)
        _rebuild_in_place(folder, lambda new: rewrite_byte(new / "target.onnx.data"))
        if then == "Ctrl-C":
            raise KeyboardInterrupt
        return manifest

    monkeypatch.setattr(engine_set, "read_engines_manifest", read_then_rebuilt)
    if then == "Ctrl-C":
        with pytest.raises(KeyboardInterrupt):
            engine_set.load_engines(engines_copy)
        return
    with pytest.raises(UserError, match=f"^{re.escape(str(engines_copy))}: replaced while its engines were being "
                                        "loaded .*nothing was run: run the command again$"):
        engine_set.load_engines(engines_copy)


@pytest.mark.parametrize("rebuilt", ["the same files", "a graph that does not load"])
def test_engines_whose_folder_was_replaced_after_loading_refuse_to_activate(engines_copy, rebuilt):
    """A rebuild between load and activate: the graphs activate reads are the new folder's, the
    manifest the earlier one's. Said as the rebuild, whether the new graphs load (m70a-47: the
    check after activating dropped, the mix run) or not (m70a-46: the new graph's own error
    said, not the rebuild), and every runner activated before is let go again (m70a-48)."""
    from specrt.engines import load_engines

    e = load_engines(engines_copy)
    _rebuild_in_place(engines_copy, None if rebuilt == "the same files" else
                      lambda new: (new / "target.onnx").write_bytes(b"not a graph"))
    with pytest.raises(UserError, match=f"^{re.escape(str(engines_copy))}: replaced while its engines were being "
                                        "loaded"):
        e.activate()
    assert not e.is_active and not any(r.is_active for r in e.runners.values())


def test_a_ctrl_c_while_engines_activate_lets_go_of_those_activated(engines_copy):
    """A KeyboardInterrupt (or MemoryError) activating the last runner: the runners activated
    before it are deactivated again (m70a-49: only on a UserError; the sessions kept)."""
    from specrt.engines import load_engines

    e = load_engines(engines_copy)
    last = list(e.runners.values())[-1]

    def interrupted():
        raise KeyboardInterrupt

    last.activate = interrupted
    with pytest.raises(KeyboardInterrupt):
        e.activate()
    assert not e.is_active and not any(r.is_active for r in e.runners.values())
