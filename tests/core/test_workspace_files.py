"""The host's side of ``HostMesh.sync_workspace`` on its own (``core/_workspace_files.py``):
what a ``Destination`` refuses, and a tree with read-only directories synced twice, by a
process that permissions bind (root's overrides dropped). The whole sync between hosts is
tests/multihost/test_workspace.py."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from regency.core import _workspace_files as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: A local sync of argv[1] to argv[2], as a host does it: the manifest, the contents the
#: destination lacks (read from the source), the commit.
SYNC = textwrap.dedent(
    """
    import os, secrets, sys
    from regency.core import _workspace_files as F

    src, dest = sys.argv[1], sys.argv[2]
    entries, _ = F.scan(src, F.HashCache())
    where = {e.sha: e.path for e in entries if e.kind == F.FILE}
    d = F.Destination(dest, entries, F.HashCache(), secrets.token_hex(4))
    for sha in d.lacking():
        with open(os.path.join(src, where[sha]), "rb") as f:
            d.receive(sha, 0, f.read())
    print(d.commit().written)
    """
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _refused(tmp_path: Path, entries: list[F.Entry], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        F.Destination(str(tmp_path / "dest"), entries, F.HashCache(), "t")


def test_a_manifest_scan_could_not_make_is_refused(tmp_path: Path) -> None:
    """A file under a link would be written where the link points: outside the directory."""
    outside = tmp_path / "outside"
    outside.mkdir()
    top = F.Entry("", F.DIR, 0o755)
    data = b"escaped\n"
    through_link = [
        top,
        F.Entry("out", F.LINK, 0, target=str(outside)),
        F.Entry("out/x", F.FILE, 0o644, len(data), _sha(data)),
    ]
    _refused(tmp_path, through_link, r"'out/x' does not lie in a directory of the manifest")
    assert list(outside.iterdir()) == []
    under_a_file = [top, F.Entry("f", F.FILE, 0o644, 0, _sha(b"")), F.Entry("f/g", F.DIR, 0o755)]
    _refused(tmp_path, under_a_file, r"'f/g' does not lie in a directory")
    parent_later = [top, F.Entry("a/b", F.DIR, 0o755), F.Entry("a", F.DIR, 0o755)]
    _refused(tmp_path, parent_later, r"'a/b' does not lie in a directory")
    _refused(tmp_path, [top, F.Entry("../x", F.DIR, 0o755)], r"'\.\./x' is not a plain relative")
    bad_sha = [top, F.Entry("f", F.FILE, 0o644, 1, "../../etc/passwd")]
    _refused(tmp_path, bad_sha, r"'f' has no sha256 and size \(got '\.\./\.\./etc/passwd'\)")
    reserved = [top, F.Entry(f"{F.RESERVED_PREFIX}t", F.DIR, 0o755)]
    _refused(tmp_path, reserved, r"'\.regency-sync-t' is a name that is never synced")
    _refused(tmp_path, [top, F.Entry("p", "p", 0)], r"'p' has the unknown kind 'p'")
    _refused(tmp_path, [F.Entry("", F.FILE, 0o644)], "the directory itself must be a directory")
    # What scan makes is accepted.
    (tmp_path / "src" / "d").mkdir(parents=True)
    (tmp_path / "src" / "d" / "f").write_text("x")
    os.symlink("d/f", tmp_path / "src" / "l")
    entries, _ = F.scan(str(tmp_path / "src"), F.HashCache())
    F.check_manifest(str(tmp_path / "src"), entries)



def test_contents_that_do_not_fit_the_manifest_are_refused(tmp_path: Path) -> None:
    """A content the manifest does not name, or longer than its size, or whose bytes do
    not hash to its name, is refused; a commit with a content missing names it, and the
    destination stays as it was."""
    data = b"payload\n"
    sha = _sha(data)
    entries = [F.Entry("", F.DIR, 0o755), F.Entry("f", F.FILE, 0o644, len(data), sha)]
    dest = F.Destination(str(tmp_path / "dest"), entries, F.HashCache(), "t")
    assert dest.lacking() == [sha]
    with pytest.raises(ValueError, match=f"unexpected workspace content {_sha(b'x')[:12]}"):
        dest.receive(_sha(b"x"), 0, b"x")
    with pytest.raises(ValueError, match=f"unexpected workspace content {sha[:12]}"):
        dest.receive(sha, 1, data)
    with pytest.raises(ValueError, match=f"content {sha[:12]} .* arrived corrupted"):
        dest.receive(sha, 0, b"PAYLOAD\n")
    with pytest.raises(RuntimeError, match=rf"contents \['{sha[:12]}'\] never arrived"):
        dest.commit()
    dest.discard()
    assert list((tmp_path / "dest").iterdir()) == []  # no staging left, nothing written

def _unprivileged() -> list[str]:
    """A command prefix under which permission bits bind this user (root's overrides of
    them dropped), or skip."""
    if os.getuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without util-linux's setpriv: permissions would not bind")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def test_read_only_directories_sync_again(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "ro" / "deep").mkdir(parents=True)
    (src / "ro" / "deep" / "a.txt").write_text("one\n")
    (src / "ro" / "gone.txt").write_text("gone\n")
    (src / "top.txt").write_text("top\n")
    for d in (src / "ro" / "deep", src / "ro", src):
        os.chmod(d, 0o555)
    command = [*_unprivileged(), sys.executable, "-c", SYNC, str(src), str(dest)]
    env = {**os.environ, "PYTHONPATH": ROOT}
    try:
        probe = subprocess.run(
            [*command[:-3], "sh", "-c", f"touch {src}/x"], capture_output=True, env=env
        )
        assert probe.returncode != 0, "permission bits do not bind the sync's process"
        first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert first.returncode == 0, first.stderr
        for d in (src / "ro" / "deep", src / "ro", src):
            os.chmod(d, 0o755)
        (src / "ro" / "deep" / "a.txt").write_text("two\n")
        (src / "ro" / "gone.txt").unlink()
        (src / "ro" / "new").mkdir()
        (src / "ro" / "new" / "b.txt").write_text("b\n")
        os.chmod(src / "ro" / "new", 0o555)
        for d in (src / "ro" / "deep", src / "ro", src):
            os.chmod(d, 0o555)
        second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert second.returncode == 0, second.stderr
        assert (dest / "ro" / "deep" / "a.txt").read_text() == "two\n"
        assert (dest / "ro" / "new" / "b.txt").read_text() == "b\n"
        assert not (dest / "ro" / "gone.txt").exists()
        modes = {
            str(p.relative_to(dest)): oct(p.stat().st_mode & 0o777)
            for p in [dest, *dest.rglob("*")]
            if p.is_dir()
        }
        assert modes == {
            ".": "0o555", "ro": "0o555", "ro/deep": "0o555", "ro/new": "0o555"
        }
        assert sorted(p.name for p in dest.iterdir()) == ["ro", "top.txt"]  # no staging left
    finally:
        for top in (src, dest):
            for d, _, _ in os.walk(top):
                os.chmod(d, 0o755)


def test_a_proc_pays_nothing_to_import_the_synced_paths() -> None:
    """Every proc reads the host's synced paths when it starts: the module that does is
    imported with the bootstrap (a zygote imports it before it forks), not by each proc."""
    code = (
        "import sys; import regency.core._bootstrap; "
        "print('regency.core._workspace_files' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert out.stdout.strip() == "True", out.stderr
