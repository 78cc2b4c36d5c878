"""engines/engine_set.py: what the other tests leave (a mutation round of compare and engine_set)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specrt.errors import UserError


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
