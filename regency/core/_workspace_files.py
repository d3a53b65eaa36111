"""The file side of ``HostMesh.sync_workspace``: manifests of directories, and applying one.

A manifest lists what a directory holds, by path relative to it: directories (mode),
regular files (mode, size, sha256, mtime) and symbolic links (their target, never
followed). Both sides build them the same way (:func:`scan`), skipping the same names
(:func:`skipped`), so a host deletes exactly what the controller's directory no longer
holds. Hashes are cached per file by its ``stat`` (device, inode, size, mtime, ctime):
a file that did not change is not read again.

On a host, :class:`Destination` receives the contents it lacks into a staging directory
inside the destination (same file system, so renames stay renames), and :meth:`commit`
puts every file in place with one ``os.replace`` each, after all of them are ready: a sync
that fails before its commit leaves the old files as they were.

This module also keeps, per host and controller, the list of synced directories that new
procs put on ``sys.path`` (:func:`record_paths`, read by :func:`add_synced_paths` when a
proc starts, from ``regency.core._bootstrap``); it imports nothing heavy for that reason.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

#: Names never synced nor deleted: bytecode caches (each host writes its own) and this
#: module's staging and probe entries.
SKIPPED_DIRS = frozenset({"__pycache__"})
RESERVED_PREFIX = ".regency-sync-"
#: Reading granularity when hashing and sending.
CHUNK = 4 << 20

DIR, FILE, LINK = "d", "f", "l"


class Entry(NamedTuple):
    """One manifest entry. ``sha``/``size``/``mtime_ns`` for files, ``target`` for links."""

    path: str  #: relative, '/'-separated; "" is the directory itself
    kind: str  #: DIR, FILE or LINK
    mode: int  #: permission bits (files and directories)
    size: int = 0
    sha: str = ""
    mtime_ns: int = 0
    target: str = ""


def skipped(name: str) -> bool:
    return name in SKIPPED_DIRS or name.startswith(RESERVED_PREFIX)


class HashCache:
    """sha256 of files by path, valid while their ``stat`` key is unchanged."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[tuple[int, ...], str]] = {}

    def sha(self, path: str, st: os.stat_result) -> str:
        key = _stat_key(st)
        known = self._known.get(path)
        if known is not None and known[0] == key:
            return known[1]
        digest = file_sha(path)
        self._known[path] = (key, digest)
        return digest

    def know(self, path: str, st: os.stat_result, sha: str) -> None:
        """``path`` (as ``st`` describes it) holds ``sha``: written by us, no need to read it."""
        self._known[path] = (_stat_key(st), sha)


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    """What a cached hash stays valid for: the same file, unchanged since."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def scan(root: str, cache: HashCache) -> tuple[list[Entry], list[str]]:
    """The manifest of ``root`` (a directory) and the paths it skipped (sockets, fifos,
    devices: nothing a workspace can carry)."""
    st = os.stat(root)
    entries = [Entry("", DIR, stat.S_IMODE(st.st_mode))]
    odd: list[str] = []
    for path, full, st in walk(root):
        if stat.S_ISLNK(st.st_mode):
            entries.append(Entry(path, LINK, 0, target=os.readlink(full)))
        elif stat.S_ISDIR(st.st_mode):
            entries.append(Entry(path, DIR, stat.S_IMODE(st.st_mode)))
        elif stat.S_ISREG(st.st_mode):
            entries.append(
                Entry(
                    path, FILE, stat.S_IMODE(st.st_mode), st.st_size,
                    cache.sha(full, st), st.st_mtime_ns,
                )
            )
        else:
            odd.append(path)
    return entries, odd


def walk(top: str, rel: str = "") -> Iterator[tuple[str, str, os.stat_result]]:
    """Every entry under ``top`` but :func:`skipped` names, in name order, a directory
    before what it holds: (path relative to ``top``, full path, ``lstat``). Links are
    not followed."""
    directory = os.path.join(top, rel) if rel else top
    with os.scandir(directory) as it:
        found = sorted(it, key=lambda e: e.name)
    for entry in found:
        if skipped(entry.name):
            continue
        path = f"{rel}/{entry.name}" if rel else entry.name
        st = entry.stat(follow_symlinks=False)
        yield path, entry.path, st
        if stat.S_ISDIR(st.st_mode):
            yield from walk(top, path)


def read_verified(path: str, sha: str) -> Iterator[bytes]:
    """The bytes of ``path`` in chunks, checked against ``sha`` at the end (a file that
    changed since it was hashed raises, naming it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            yield chunk
    if h.hexdigest() != sha:
        raise RuntimeError(f"{path} changed while it was being synced; sync again")


def check_relative(path: str, what: str) -> None:
    """Refuse a manifest path that could leave its directory."""
    parts = path.split("/")
    if path.startswith("/") or ".." in parts or "" in parts or "." in parts:
        raise ValueError(f"{what}: {path!r} is not a plain relative path")


_HEX = frozenset("0123456789abcdef")


def check_manifest(root: str, entries: list[Entry]) -> None:
    """Refuse a manifest that :func:`scan` could not have made: a path that leaves the
    directory, an entry under a link or a file (written there, it would land where the
    link points), a name that is never synced, a content name that is not a sha256."""
    what = f"workspace entry for {root}"
    dirs = {""}
    for e in entries:
        if not e.path:
            if e.kind != DIR:
                raise ValueError(f"{what}: the directory itself must be a directory entry")
            continue
        check_relative(e.path, what)
        parent, _, name = e.path.rpartition("/")
        if parent not in dirs:
            raise ValueError(
                f"{what}: {e.path!r} does not lie in a directory of the manifest (its parent "
                "must come first, as a directory: never a link or a file)"
            )
        if skipped(name):
            raise ValueError(f"{what}: {e.path!r} is a name that is never synced")
        if e.kind == DIR:
            dirs.add(e.path)
        elif e.kind == FILE:
            if len(e.sha) != 64 or not _HEX.issuperset(e.sha) or e.size < 0:
                raise ValueError(f"{what}: {e.path!r} has no sha256 and size (got {e.sha!r})")
        elif e.kind != LINK:
            raise ValueError(f"{what}: {e.path!r} has the unknown kind {e.kind!r}")


class Report(NamedTuple):
    """What a host did for one directory."""

    destination: str
    #: The destination was the controller's own directory (a shared file system).
    shared: bool
    written: tuple[str, ...]  #: relative paths whose content changed or appeared
    deleted: tuple[str, ...]  #: relative paths of files and links removed
    files_received: int
    bytes_received: int


class Destination:
    """One directory on a host being brought to a manifest (the host's side of a sync)."""

    def __init__(self, path: str, entries: list[Entry], cache: HashCache, token: str) -> None:
        self.path = path
        self.entries = entries
        check_manifest(path, entries)
        self.cache = cache
        self.staging = os.path.join(path, f"{RESERVED_PREFIX}{token}")
        #: What the destination holds now: relative path -> (kind, sha or target, st).
        self.present: dict[str, tuple[str, str, os.stat_result]] = {}
        #: A local file holding each content we have (copy it rather than receive it).
        self.have: dict[str, str] = {}
        self.received: dict[str, int] = {}  # sha -> bytes written to staging so far
        self.sizes = {e.sha: e.size for e in entries if e.kind == FILE}
        self.bytes_received = 0
        #: Directories made owner-writable for the sync (a read-only tree), their modes.
        self._opened: dict[str, int] = {}
        if os.path.lexists(path) and not os.path.isdir(path):
            raise NotADirectoryError(
                f"the workspace destination {path} exists and is not a directory"
            )
        if os.path.isdir(path):
            for rel, full, st in walk(path):
                if stat.S_ISLNK(st.st_mode):
                    self.present[rel] = (LINK, os.readlink(full), st)
                elif stat.S_ISDIR(st.st_mode):
                    self.present[rel] = (DIR, "", st)
                elif stat.S_ISREG(st.st_mode):
                    sha = self.cache.sha(full, st)
                    self.present[rel] = (FILE, sha, st)
                    self.have.setdefault(sha, full)
                else:
                    self.present[rel] = ("?", "", st)

    def lacking(self) -> list[str]:
        """The contents (sha256) the manifest needs that this host has nowhere here."""
        return sorted({e.sha for e in self.entries if e.kind == FILE} - set(self.have))

    def receive(self, sha: str, offset: int, data: memoryview | bytes) -> None:
        """Part of one content, at ``offset``; checked once all of it is here."""
        size = self.sizes.get(sha)
        if size is None or offset + len(data) > size:
            raise ValueError(f"unexpected workspace content {sha[:12]} for {self.path}")
        self._make_staging()
        blob = os.path.join(self.staging, sha)
        with open(blob, "r+b" if os.path.exists(blob) else "wb") as f:
            f.seek(offset)
            f.write(data)
        self.bytes_received += len(data)
        got = self.received[sha] = self.received.get(sha, 0) + len(data)
        if got == size:
            if file_sha(blob) != sha:
                raise ValueError(f"workspace content {sha[:12]} for {self.path} arrived corrupted")
            self.have[sha] = blob

    def commit(self) -> Report:
        """Bring the destination to the manifest: every changed file staged first, then put
        in place (``os.replace``), then what the manifest lacks deleted."""
        missing = [e.sha[:12] for e in self.entries if e.kind == FILE and e.sha not in self.have]
        if missing:
            raise RuntimeError(f"workspace sync for {self.path}: contents {missing} never arrived")
        self._make_staging()
        for rel, (kind, _, _) in self.present.items():  # what changes inside them
            if kind == DIR:
                self._open_up(os.path.join(self.path, rel))
        staged_blobs = {
            sha for sha, where in self.have.items() if os.path.dirname(where) == self.staging
        }
        users: dict[str, int] = {}
        for e in self.entries:
            if e.kind == FILE:
                users[e.sha] = users.get(e.sha, 0) + 1
        # 1. Stage every file and link that changes (sources are read before anything moves).
        ready: list[tuple[str, str]] = []  # (staged path, relative target)
        written: list[str] = []
        retouch: list[Entry] = []
        for i, e in enumerate(self.entries):
            now = self.present.get(e.path)
            if e.kind == FILE:
                if now is not None and now[0] == FILE and now[1] == e.sha:
                    st = now[2]
                    if stat.S_IMODE(st.st_mode) != e.mode or st.st_mtime_ns != e.mtime_ns:
                        retouch.append(e)
                    continue
                staged = os.path.join(self.staging, f"t{i}")
                source = self.have[e.sha]
                users[e.sha] -= 1
                if e.sha in staged_blobs and users[e.sha] == 0:
                    os.rename(source, staged)
                else:
                    shutil.copyfile(source, staged)
                os.chmod(staged, e.mode)
                os.utime(staged, ns=(e.mtime_ns, e.mtime_ns))
                ready.append((staged, e.path))
                written.append(e.path)
            elif e.kind == LINK:
                if now is not None and now[0] == LINK and now[1] == e.target:
                    continue
                staged = os.path.join(self.staging, f"t{i}")
                os.symlink(e.target, staged)
                ready.append((staged, e.path))
                written.append(e.path)
        # 2. Make way: whatever stands where the manifest wants another kind goes.
        wanted = {e.path: e for e in self.entries}
        deleted: list[str] = []
        removed: list[str] = []
        for rel, (kind, _, _) in sorted(self.present.items()):
            want = wanted.get(rel)
            if want is None or (want.kind == DIR) != (kind == DIR):
                if any(rel.startswith(r + "/") for r in removed):
                    continue  # inside a directory already removed
                removed.append(rel)
                deleted.extend(self._remove(rel, kind))
        # 3. Directories, then files in place, then directory modes (deepest first).
        os.makedirs(self.path, exist_ok=True)
        for e in self.entries:
            if e.kind == DIR and e.path:
                os.makedirs(os.path.join(self.path, e.path), exist_ok=True)
        shas = {e.path: e.sha for e in self.entries if e.kind == FILE}
        for staged, rel in ready:
            target = os.path.join(self.path, rel)
            os.replace(staged, target)
            if rel in shas:  # the next sync need not read it again
                self.cache.know(target, os.stat(target), shas[rel])
                if rel.endswith(".py"):
                    _drop_bytecode(target)
        for e in retouch:
            target = os.path.join(self.path, e.path)
            os.chmod(target, e.mode)
            os.utime(target, ns=(e.mtime_ns, e.mtime_ns))
        self.discard()  # (while the directory may still be written)
        for e in sorted(
            (e for e in self.entries if e.kind == DIR), key=lambda e: -e.path.count("/")
        ):
            os.chmod(os.path.join(self.path, e.path) if e.path else self.path, e.mode)
        received = len(self.received)
        return Report(
            self.path, False, tuple(written), tuple(deleted), received, self.bytes_received
        )

    def _remove(self, rel: str, kind: str) -> list[str]:
        """Remove one entry; the files and links it held (relative paths)."""
        target = os.path.join(self.path, rel)
        if kind != DIR:
            os.unlink(target)
            return [rel]
        gone = [
            p for p, (k, _, _) in self.present.items()
            if p.startswith(rel + "/") and k != DIR
        ]
        shutil.rmtree(target)
        return gone

    def _make_staging(self) -> None:
        if os.path.isdir(self.staging):
            return
        if os.path.isdir(self.path):
            self._open_up(self.path)
        os.makedirs(self.staging, mode=0o700, exist_ok=True)

    def _open_up(self, directory: str) -> None:
        """Let the owner write in ``directory`` for the time of the sync: a tree with
        read-only directories (mode 0555) syncs as any other. Their modes come back at
        :meth:`discard`, and the commit then sets every directory's."""
        mode = stat.S_IMODE(os.stat(directory).st_mode)
        if mode & 0o300 != 0o300:
            self._opened.setdefault(directory, mode)
            os.chmod(directory, mode | 0o300)

    def discard(self) -> None:
        """Remove the staging directory (after a commit, or when the sync is abandoned), and
        give back the modes of the directories opened up for the sync."""
        shutil.rmtree(self.staging, ignore_errors=True)
        for directory, mode in reversed(list(self._opened.items())):
            try:
                os.chmod(directory, mode)
            except OSError:
                pass  # removed by the commit
        self._opened.clear()


def _drop_bytecode(path: str) -> None:
    """Remove the cached bytecode of a replaced module: its recorded mtime and size could
    match the new source's (an edit within a second that keeps the size)."""
    directory, name = os.path.split(path)
    cache = os.path.join(directory, "__pycache__")
    stem = name[:-3] + "."
    try:
        names = os.listdir(cache)
    except OSError:
        return
    for cached in names:
        if cached.startswith(stem) and cached.endswith(".pyc"):
            try:
                os.unlink(os.path.join(cache, cached))
            except OSError:
                pass


# -- synced directories on sys.path of procs started later --------------------------------


def _paths_file(jobdir: str, root: str) -> str:
    key = hashlib.sha256(root.encode()).hexdigest()[:16]
    return os.path.join(jobdir, f"workspace-{key}.json")


def record_paths(jobdir: str, root: str, paths: list[str]) -> None:
    """Procs that the controller at ``root`` starts on this host from now on put ``paths``
    first on ``sys.path`` (kept in the host's job directory, which they share)."""
    file = _paths_file(jobdir, root)
    known = synced_paths(jobdir, root)
    merged = [*paths, *(p for p in known if p not in paths)]
    temporary = f"{file}.{os.getpid()}"
    with open(temporary, "w") as f:
        json.dump(merged, f)
    os.replace(temporary, file)


def synced_paths(jobdir: str, root: str) -> list[str]:
    try:
        with open(_paths_file(jobdir, root)) as f:
            found: Any = json.load(f)
    except (OSError, ValueError):
        return []
    return [p for p in found if isinstance(p, str)] if isinstance(found, list) else []


def add_synced_paths(record: dict[str, Any]) -> None:
    """In a new proc: the synced workspace directories of its host first on ``sys.path``."""
    jobdir, root = record.get("jobdir"), record.get("root_address")
    if not jobdir or not root:
        return
    paths = synced_paths(jobdir, root)
    if paths:
        put_first_on_path(paths)  # (a zygote's child may have listed these directories)


def put_first_on_path(paths: list[str]) -> None:
    """``paths``, in their order, ahead of ``sys.path`` (those not on it yet), and the
    import system's caches of directory listings dropped."""
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    importlib.invalidate_caches()
