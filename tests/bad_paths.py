"""Paths the Python entry points refuse (specrt.paths.path_problem) before any work, each with
the end of its message: an empty one (Path('') is '.', the working folder), and what is not a
str or os.PathLike giving one (bytes, an int, None: pathlib's TypeError, a traceback)."""

from __future__ import annotations


class BytesPathLike:
    """An os.PathLike whose path is bytes (Path() refuses it as it refuses bytes)."""

    def __fspath__(self) -> bytes:
        return b"out"

    def __repr__(self) -> str:
        return "BytesPathLike()"


def bad_paths(expected: str, optional: bool = False) -> list[tuple[object, str]]:
    """(path, regex of the UserError's text after "NAME: ") for an argument naming ``expected``
    ("a folder", "a file"); None among them unless the argument is ``optional`` (None: none)."""
    not_a_path = r"; expected a path \(str or os\.PathLike\)$"
    return [("", f"an empty path; expected {expected}$"),
            *([] if optional else [(None, f"None; expected {expected}$")]),
            (b"", "b'' is bytes" + not_a_path),
            (b"out/engines", "b'out/engines' is bytes" + not_a_path),
            (3, "3 is int" + not_a_path),
            (BytesPathLike(), r"BytesPathLike\(\) is BytesPathLike" + not_a_path)]
