"""Atomic writes into a directory another process may have written to first."""

from __future__ import annotations

from rl_config.atomic_write import write_text_atomically


def test_a_planted_symlink_is_replaced_never_written_through(tmp_path):
    """A symlink under the file's own name is replaced by the new file; the file it pointed to
    keeps its bytes, and no temporary file is left behind."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").symlink_to(victim)
    write_text_atomically(out / "summary.json", '{"a": 1}')
    assert victim.read_text() == "keep me"
    assert not (out / "summary.json").is_symlink()
    assert (out / "summary.json").read_text() == '{"a": 1}'
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
