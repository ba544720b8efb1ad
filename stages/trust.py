"""Host-side trust: folders another local user could plant files or links in.

In: a folder spade reads its own state back from (the resident trainer's jobs folder), a run
directory it writes into, and each destination it is about to write.
Out: Untrusted (exit 77, sysexits' EX_NOPERM) before anything is read or written there: one
line, `path: what is wrong`.
Guarantees:
- `private_dir` makes a folder 0700 and refuses one that is not private: owned (or, as a
  link, planted) by another user, or writable by its group or by everyone. Whoever can write
  a folder can put files in it that spade then reads as its own;
- `check_tree_owned` refuses a folder, or any folder or link under it, of another user;
- while a write root is set (`confine`; `spade run` and `spade report` set their run
  directory, and child processes inherit it as $SPADE_WRITE_ROOT), no write follows a link out
  of it: `check_write` refuses a destination under the root that is itself a symlink, or that
  resolves outside the root. It is a rule about where a write lands, not a list of names, and
  it holds for every writer that calls it (stages/shards.py's atomic writes and folders, the
  run's logs, checkpoints, the report). A destination outside the root (an absolute model
  path) is the user's own choice and passes.
"""

from __future__ import annotations

import os
import pwd
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

# the folder writes are confined to, for this process and the processes it starts
WRITE_ROOT = "SPADE_WRITE_ROOT"


class Untrusted(Exception):
    """A folder or destination another local user owns or could have planted (exit 77)."""


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def check_owned(path: str | Path) -> os.stat_result:
    """The folder's stat; Untrusted if it, or a link that names it, belongs to another user."""
    me = os.geteuid()
    try:
        found = [os.lstat(path), os.stat(path)]  # a link planted by another, or what it names
    except FileNotFoundError:
        raise Untrusted(f"{path}: does not exist") from None
    for info in found:
        if info.st_uid != me:
            what = "a symlink made by" if stat.S_ISLNK(info.st_mode) else "owned by"
            raise Untrusted(f"{path}: {what} {_user(info.st_uid)}, not by this user "
                            f"({_user(me)}): spade reads and writes only folders of its own user")
    return found[1]


def check_private(path: str | Path) -> None:
    """Untrusted unless the folder is this user's and neither its group nor others can write
    to it (they could plant the files spade reads back)."""
    mode = check_owned(path).st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Untrusted(f"{path}: its group or everyone can write to it (mode "
                        f"{stat.S_IMODE(mode):04o}): `chmod go-w` it, or use a folder of your own")


def private_dir(path: str | Path) -> Path:
    """`path` made 0700 if new (parents as any new folder), then checked by check_private."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(path)
    return path


def check_tree_owned(root: str | Path) -> None:
    """Untrusted if `root`, or any folder or symlink under it, is another user's: the folders
    a run writes into must be its own (links are not followed)."""
    check_owned(root)
    me, folders = os.geteuid(), [str(root)]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                is_dir = entry.is_dir(follow_symlinks=False)
                if not (is_dir or entry.is_symlink()):
                    continue
                if entry.stat(follow_symlinks=False).st_uid != me:
                    check_owned(entry.path)  # raises, naming whose it is
                if is_dir:
                    folders.append(entry.path)


@contextmanager
def confine(root: str | Path) -> Iterator[None]:
    """While inside, writes under `root` must land under it (check_write); child processes
    started meanwhile inherit the rule through the environment."""
    before = os.environ.get(WRITE_ROOT)
    os.environ[WRITE_ROOT] = os.path.abspath(root)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(WRITE_ROOT, None)
        else:
            os.environ[WRITE_ROOT] = before


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_write(path: str | Path) -> None:
    """Untrusted if writing `path` would follow a link out of the write root: `path` is under
    the root (as given, or as the root resolves) and is a symlink, or resolves outside it.
    Nothing to check without a root, for the root itself, or for a path outside it."""
    root = os.environ.get(WRITE_ROOT)
    if not root:
        return
    real_root, given = os.path.realpath(root), os.path.abspath(path)
    if given in (root, real_root) or not (_inside(given, root) or _inside(given, real_root)):
        return
    if os.path.islink(given):
        raise Untrusted(f"{path}: a symlink (to {os.readlink(given)}): spade writes nothing "
                        f"through a link in {root}")
    resolved = os.path.realpath(given)
    if not _inside(resolved, real_root):
        raise Untrusted(f"{path}: leads out of {root} through a symlink (to {resolved}): spade "
                        f"writes nothing through a link out of it")


def open_append(path: str | Path, mode: str = "a", **kwargs: Any) -> IO:
    """`open(path, mode)` for appending a log, never through a symlink (O_NOFOLLOW) nor out of
    the write root; a link there is Untrusted."""
    check_write(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if os.path.islink(path):  # ELOOP: O_NOFOLLOW met a link
            raise Untrusted(f"{path}: a symlink (to {os.readlink(path)}): spade appends to no "
                            f"log through a link") from None
        raise
    return os.fdopen(fd, mode, **kwargs)
