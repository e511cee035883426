"""Generated protocol classes (issue 33): the checked-in modules are exactly what their generators write
from the spec tables, the runtime classes are those generated classes, and the type checker sees them.

The codecs' behaviour (round trips, pika's 0-9-1 bytes, the 0-10 packing flags of spec 3.x/5.7/5.8, the
1.0 composites of 1.3.2/1.4) is checked by test_methods.py, test_amqp010_codec.py and
test_amqp10_performatives.py against the same classes; this file checks how they are produced.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raftmq.protocol import codegen
from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp010 import codec_gen
from raftmq.protocol.amqp091 import methods as m
from raftmq.protocol.amqp091 import methods_gen
from raftmq.protocol.amqp091.spec_table import parse_table
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import performatives_gen

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("generator", codegen.generators(), ids=lambda g: g.TARGET)
def test_checked_in_file_is_what_the_generator_writes(generator):
    """Regenerated in memory, each generated module is identical to the checked-in file: nobody edited
    it by hand and nobody changed a spec table without regenerating (`python -m raftmq.protocol.codegen`)."""
    path = codegen.PACKAGE_DIR / generator.TARGET
    assert path.read_text(encoding="utf-8") == generator.render(), f"{path} is stale: regenerate it"


def test_check_flags_a_stale_file_and_the_writer_restores_it(tmp_path, monkeypatch):
    """`--check` exits 1 and names a generated file that differs from its generator's output; a plain
    run rewrites exactly that file, after which `--check` passes (run on a copy, not the tree)."""
    for g in codegen.generators():
        (tmp_path / g.TARGET).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(codegen.PACKAGE_DIR / g.TARGET, tmp_path / g.TARGET)
    monkeypatch.setattr(codegen, "PACKAGE_DIR", tmp_path)
    assert codegen.main(["--check"]) == 0
    edited = tmp_path / "amqp091/methods_gen.py"
    edited.write_text(edited.read_text(encoding="utf-8").replace('NAME = "basic.publish"', 'NAME = "x"'))
    assert codegen.stale() == [edited]
    assert codegen.main(["--check"]) == 1
    assert codegen.main([]) == 0
    assert codegen.stale() == []
    assert edited.read_text(encoding="utf-8") == (codegen.PACKAGE_DIR / "amqp091/methods_gen.py").read_text()


def test_runtime_classes_are_the_generated_ones():
    """The names the codecs export are the generated classes, one per table row, slotted (no __dict__),
    with the table's defaults (0-9-1 reference defaults; 0-10 bits False; 1.0 defaults of 2.7)."""
    assert m.BasicPublish is methods_gen.BasicPublish
    assert set(m.METHODS_BY_INDEX.values()) == set(methods_gen.METHOD_CLASSES)
    assert len(methods_gen.METHOD_CLASSES) == len(parse_table())
    assert m.ExchangeDeclare().type == "direct" and m.ConnectionOpen().virtual_host == "/"
    assert not hasattr(m.BasicPublish(), "__dict__")

    assert c.MessageTransfer is codec_gen.MessageTransfer and c.DeliveryProperties is codec_gen.DeliveryProperties
    assert set(c.COMMANDS.values()) | set(c.CONTROLS.values()) == set(codec_gen.METHOD_CLASSES)
    assert set(c.STRUCTS.values()) == set(codec_gen.STRUCT_CLASSES)
    transfer = c.MessageTransfer(destination="d")
    assert (transfer.sync, transfer.id, transfer.headers, transfer.body, transfer.accept_mode) == (
        False, None, None, None, None)
    assert not hasattr(transfer, "__dict__")

    assert p.Attach is performatives_gen.Attach and p.Data is performatives_gen.Data
    assert set(p.BY_CODE.values()) == set(performatives_gen.DESCRIBED_CLASSES)
    attach = p.Attach(name="l", handle=0, role=False)
    assert (attach.snd_settle_mode, attach.rcv_settle_mode, attach.incomplete_unsettled) == (2, 0, False)
    assert p.End().error is None and p.Open().max_frame_size == 0xFFFFFFFF
    assert not hasattr(attach, "__dict__")


def test_a_class_out_of_step_with_its_table_is_refused():
    """A generated class whose fields differ from the spec table (a table edited without regenerating)
    fails at import with a message naming the fix, instead of encoding the wrong fields."""
    class Stale(c.StructBase):
        __slots__ = ("x",)
    with pytest.raises(ImportError, match="codegen"):
        c._check_generated(Stale, c.SPEC.structs["message.delivery-properties"].fields)


SNIPPET = """
from raftmq.protocol.amqp091 import methods as m
from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp10 import performatives as p
reveal_type(m.BasicPublish(exchange="x").exchange)
reveal_type(m.BasicDeliver().delivery_tag)
reveal_type(c.MessageTransfer().destination)
reveal_type(c.DeliveryProperties().redelivered)
reveal_type(p.Attach().handle)
reveal_type(p.Open().max_frame_size)
reveal_type(p.Data(b"x").value)
"""


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (test extras)")
def test_type_checker_sees_the_generated_attributes(tmp_path):
    """mypy (the project's configuration) infers the attribute types of the generated classes: the
    point of generating source instead of building classes at import time."""
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                          "--cache-dir", str(tmp_path / "cache"), str(snippet)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    revealed = [line.split("Revealed type is ", 1)[1].strip('"').replace("builtins.", "")
                for line in out.stdout.splitlines() if "Revealed type is" in line]
    assert revealed == ["str", "int", "str | None", "bool", "int | None", "int", "bytes | None"], out.stdout
