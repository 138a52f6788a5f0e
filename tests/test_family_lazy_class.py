"""``pai_zoo.family.LazyClass``: a plugin's reference model class, imported only when asked for."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pai_zoo.families.family import LazyClass
from pai_zoo.plugin.errors import PluginError

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)


def test_lazy_class_imports_on_call_and_ignores_the_model_type():
    from collections import OrderedDict

    lazy = LazyClass("collections:OrderedDict")
    assert lazy("any-model-type") is OrderedDict and lazy() is OrderedDict


def test_lazy_class_rejects_a_malformed_target():
    for bad in ("collections.OrderedDict", ":OrderedDict", "collections:", "collections:Ordered Dict"):
        with pytest.raises(PluginError, match="expected 'package.module:ClassName'"):
            LazyClass(bad)


def test_lazy_class_of_a_missing_name_says_which():
    with pytest.raises(AttributeError, match="NoSuchClass"):
        LazyClass("collections:NoSuchClass")()


def test_families_with_reference_models_import_them_only_when_asked():
    code = """
import json
import sys
import pai_zoo
fams = pai_zoo.get_registry().families
heavy = [m for m in ("torch", "transformers", "pai_zoo_qwen.modeling_qwen", "pai_zoo_baichuan.modeling_baichuan",
                     "pai_zoo_chatglm.modeling") if m in sys.modules]
assert not heavy, heavy
names = {f: fams[f].hf_model_class("x").__name__ for f in ("qwen", "baichuan", "chatglm") if f in fams}
print(json.dumps(names))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = {
        "qwen": "QWenLMHeadModel",
        "baichuan": "BaichuanForCausalLM",
        "chatglm": "ChatGLMForConditionalGeneration",
    }
    assert found == {k: v for k, v in expected.items() if k in found} and found
