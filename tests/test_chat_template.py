"""ChatTemplate renders exactly what transformers' apply_chat_template(tokenize=False) renders."""

from __future__ import annotations

import copy
import json
import time
import types

import gguf
import pytest
from oracle.corpus import CONVERSATIONS, TOOLS
from tokenizer_helpers import hf_dir_tokenizer, hf_gguf_tokenizer, qwen3_gguf, strata_tokenizer

from strata.errors import TemplateError
from strata.gguf import GGUFFile
from strata.text.chat_template import ChatTemplate, load_default_template

_CALL = {
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}},
}
_ADD = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 40}}}
EXTRA_CONVERSATIONS: dict[str, tuple[list[dict], list[dict] | None]] = {
    "reasoning_field": (
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
        ],
        None,
    ),
    "parallel_tools_then_answer": (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Zürich and 2+40?"},
            {"role": "assistant", "content": "", "tool_calls": [_CALL, _ADD]},
            {"role": "tool", "content": '{"temperature": 21}'},
            {"role": "tool", "content": "42"},
            {"role": "assistant", "content": "<think>\nsum it\n</think>\n\n21 °C, and 42."},
            {"role": "user", "content": "Thanks!"},
        ],
        TOOLS,
    ),
    "assistant_last_with_think": (
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello!"},
        ],
        None,
    ),
}
# The shared corpus may carry per-case render overrides after (messages, tools); we render every
# case both with and without the generation prompt instead.
ALL_CONVERSATIONS = {**{k: (v[0], v[1]) for k, v in CONVERSATIONS.items()}, **EXTRA_CONVERSATIONS}


def _hf_render(hf, messages, tools, **kwargs) -> str:
    return hf.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir):
    directory = str(qwen3_tokenizer_dir)
    path = qwen3_gguf(directory)
    return ChatTemplate.from_gguf(GGUFFile(path), strata_tokenizer(path)), hf_dir_tokenizer(directory)


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return ChatTemplate.from_gguf(
        GGUFFile(smollm2_path), strata_tokenizer(str(smollm2_path))
    ), hf_gguf_tokenizer(str(smollm2_path))


@pytest.mark.parametrize("name", sorted(ALL_CONVERSATIONS))
@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_matches_transformers(qwen3, name, thinking):
    ours, hf = qwen3
    messages, tools = ALL_CONVERSATIONS[name]
    for gen in (True, False):
        expected = _hf_render(hf, messages, tools, add_generation_prompt=gen, enable_thinking=thinking)
        assert ours.render(messages, tools, add_generation_prompt=gen, enable_thinking=thinking) == expected


def test_qwen3_without_enable_thinking_kwarg(qwen3):
    ours, hf = qwen3
    messages, tools = ALL_CONVERSATIONS["plain"]
    assert ours.render(messages, tools) == _hf_render(hf, messages, tools, add_generation_prompt=True)


def test_qwen3_json_string_arguments_render_like_dicts(qwen3):
    """OpenAI clients send arguments as a JSON string; Qwen3's template wants a mapping."""
    ours, hf = qwen3
    messages, tools = ALL_CONVERSATIONS["tool_call"]
    as_strings = copy.deepcopy(messages)
    for m in as_strings:
        for call in m.get("tool_calls", []):
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"], separators=(",", ":"))
    before = copy.deepcopy(as_strings)
    expected = _hf_render(hf, messages, tools, add_generation_prompt=True)
    assert ours.render(as_strings, tools) == expected
    assert as_strings == before  # the caller's messages are not modified


def test_qwen3_content_none_on_tool_call_turn(qwen3):
    ours, hf = qwen3
    messages, tools = ALL_CONVERSATIONS["tool_call"]
    with_none = copy.deepcopy(messages)
    with_none[2]["content"] = None
    assert ours.render(with_none, tools) == _hf_render(hf, messages, tools, add_generation_prompt=True)


@pytest.mark.parametrize("name", sorted(ALL_CONVERSATIONS))
def test_smollm2_matches_transformers(smollm2, name):
    ours, hf = smollm2
    messages, tools = ALL_CONVERSATIONS[name]
    for gen in (True, False):
        assert ours.render(messages, tools, add_generation_prompt=gen) == _hf_render(
            hf, messages, tools, add_generation_prompt=gen
        )


# ---- environment semantics ------------------------------------------------------------------
def test_raise_exception_is_template_error():
    t = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('Roles must alternate') }}{% endif %}"
    )
    with pytest.raises(TemplateError, match="^Roles must alternate$"):
        t.render([{"role": "assistant", "content": "x"}])
    assert t.render([{"role": "user", "content": "x"}]) == ""


def test_template_bugs_are_template_errors():
    with pytest.raises(TemplateError, match="parse"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages[0].content.nope() }}").render([{"role": "user", "content": "x"}])
    with pytest.raises(TemplateError):
        ChatTemplate("{% set ns = namespace(_x=1) %}").render([])


def test_tojson_has_hf_semantics():
    value = {"b": "é<>&'", "a": [1, 2.5, None, True]}
    src = (
        "{{ v | tojson }}\n{{ v | tojson(indent=2) }}\n{{ v | tojson(separators=(',', ':')) }}\n"
        "{{ v | tojson(sort_keys=true) }}\n{{ v | tojson(ensure_ascii=true) }}"
    )
    out = ChatTemplate(src).render([], v=value)
    assert out == "\n".join(
        [
            json.dumps(value, ensure_ascii=False),
            json.dumps(value, ensure_ascii=False, indent=2),
            json.dumps(value, ensure_ascii=False, separators=(",", ":")),
            json.dumps(value, ensure_ascii=False, sort_keys=True),
            json.dumps(value),
        ]
    )


def test_globals_and_extensions():
    src = (
        "{{ strftime_now('%Y') }}|{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content }}{% endfor %}|"
        "{% generation %}gen{% endgeneration %}|{{ bos_token }}{{ eos_token }}|{{ add_generation_prompt }}"
    )
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "user", "content": "X"},
    ]
    out = ChatTemplate(src, "<s>", "</s>").render(msgs)
    assert out == f"{time.strftime('%Y')}|U|gen|<s></s>|True"


def test_trim_and_lstrip_blocks():
    src = "{% for m in messages %}\n    {% if m.content %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}"
    assert (
        ChatTemplate(src).render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        == "a\nb\n"
    )


def test_reasoning_fields_are_aliased():
    src = "{{ messages[0].reasoning_content }}|{{ messages[0].thinking }}"
    assert ChatTemplate(src).render([{"role": "assistant", "content": "", "reasoning": "r"}]) == "r|r"


# ---- defaults -------------------------------------------------------------------------------
def test_gemma3_default_template(gemma3_path):
    g = GGUFFile(gemma3_path)
    assert g.get("tokenizer.chat_template") is None
    tok = strata_tokenizer(str(gemma3_path))
    t = ChatTemplate.from_gguf(g, tok)
    msgs = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": " Hi! "},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": [{"type": "text", "text": "Bye"}]},
    ]
    text = t.render(msgs)
    assert text == (
        "<bos><start_of_turn>user\nBe kind.\n\nHi!<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    ids = tok.encode_chat(text)
    assert ids.count(tok.bos_id) == 1 and ids[0] == tok.bos_id
    assert ids.count(tok.encode("<start_of_turn>", add_special=False)[0]) == 4
    assert tok.encode("<end_of_turn>", add_special=False)[0] in tok.eot_ids


def _tiny_gguf(path, arch: str, templates=None):
    w = gguf.GGUFWriter(str(path), arch)
    if templates is not None:
        w.add_chat_template(templates)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return GGUFFile(path)


_TOK = types.SimpleNamespace(bos_token="<s>", eos_token="</s>")


def test_chatml_default_for_other_architectures(tmp_path):
    t = ChatTemplate.from_gguf(_tiny_gguf(tmp_path / "m.gguf", "llama"), _TOK)
    assert t.source == load_default_template("llama")
    msgs = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}],
        },
    ]
    assert t.render(msgs) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n\n"
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}}'
        "\n</tool_call><|im_end|>\n<|im_start|>assistant\n"
    )


def test_named_tool_use_variant_is_picked_with_tools(tmp_path):
    g = _tiny_gguf(
        tmp_path / "m.gguf",
        "llama",
        [
            {"name": "default", "template": "plain"},
            {"name": "tool_use", "template": "tools:{{ tools | length }}"},
        ],
    )
    t = ChatTemplate.from_gguf(g, _TOK)
    assert t.render([{"role": "user", "content": "x"}]) == "plain"
    assert t.render([{"role": "user", "content": "x"}], tools=TOOLS) == "tools:2"


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_engine_and_server_encode_a_chat_alike(name, request):
    """One BOS rule: Engine.chat_ids (the CLI's and the Python API's prompt) gives the server's ids for the
    same conversation, starting with one BOS where the model asks for one (add_bos_token) or the template
    writes it (gemma3's does), never two."""
    from strata.api.prompt import Chat, build_prompt
    from strata.engine import Engine

    path = str(request.getfixturevalue(f"{name}_path"))
    tok = strata_tokenizer(path)  # gemma3 has no model class here: its tokenizer and template are enough
    template = ChatTemplate.from_gguf(GGUFFile(path), tok)
    eng = types.SimpleNamespace(tokenizer=tok, template=template, n_ctx=4096)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    ids = Engine.chat_ids(eng, msgs)  # type: ignore[arg-type]
    wants_bos = tok.add_bos or eng.template.render(msgs, add_generation_prompt=True).startswith(tok.bos_token)
    assert (ids[0] == tok.bos_id) == wants_bos and ids[1] != tok.bos_id  # SmolLM2's BOS is <|im_start|>
    assert build_prompt(eng, Chat(msgs)).ids == ids
