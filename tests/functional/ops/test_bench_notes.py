"""scripts/bench_training.py --write replaces the Training section of BENCHMARKS.md with the new run's figures; the
hand-written reading of them (history across sessions, what was tried) lives in notes blocks that it must carry over."""
import importlib.util

from opsutil import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("bench_training", ROOT / "scripts" / "bench_training.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_write_section_keeps_the_hand_written_notes_and_the_other_sections(tmp_path):
    b = _bench()
    path = tmp_path / "BENCHMARKS.md"
    notes = "across runs: 1.06-1.12, tried X\n"
    path.write_text("# Benchmarks\n\n## Input (issue 3)\n\nother engineers' table\n\n"
                    f"{b.SECTION}\n\nold figures 1.10x\n\n{b.notes_block('fed', notes)}\n\n"
                    "## Fault tolerance (issue 6)\n\nkept too\n")
    new = f"{b.SECTION}\n\nnew figures 1.03x\n\n{b.notes_block('fed')}\n\n{b.notes_block('launch')}\n"
    b.write_section(new, path)
    out = path.read_text()
    assert "new figures 1.03x" in out and "old figures" not in out
    assert b.notes_block("fed", notes) in out                                          # carried over
    assert b.notes_block("launch") in out                                              # a new, empty block
    assert "other engineers' table" in out and "## Fault tolerance (issue 6)\n\nkept too" in out
