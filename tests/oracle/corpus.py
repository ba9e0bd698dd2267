"""Fixed inputs for the tokenizer and chat-template oracles (data only, kept out of assets.py)."""

# Each string targets a known tokenizer hazard; the comment says which.
TOKENIZER_CORPUS: list[str] = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "你好，世界！今天天气很好。",  # Chinese, full-width punctuation
    "こんにちは、世界。カタカナとひらがな。",  # Japanese kana + kanji
    "안녕하세요 세계, 반갑습니다.",  # Korean Hangul
    "Emoji: 😀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵🇺🇸",  # skin tone, ZWJ family, ZWJ flag, regional-indicator flags
    "def f(x):\n    if x > 0:\n        return x * 2\n\treturn -x\n",  # Python: 4/8-space indents and a tab
    "function add(a, b) {\n  return a + b;\n}\nconst x = add(1, 2); // 3\n",  # JS
    "a    b\n\n\n  c",  # runs of spaces and newlines
    "   leading and trailing   ",
    "\n\nnewlines first",
    "12345678",  # digit grouping is a pre-tokenizer rule
    "Pi is 3.14159, 1e-9 and 1,000,000.",
    "Café naïve résumé façade Ångström",  # accents (composed)
    "don't won't I'm you'll they've WE'RE",  # contraction rules in the split regex
    "non\u00a0breaking\u2003em-space\u3000ideographic",  # non-ASCII whitespace
    "𝟙𝟚𝟛 ℌ𝔢𝔩𝔩𝔬 ﬁ",  # astral-plane letters/digits; would change under NFKC
    "<|im_start|>user\nhi<|im_end|>\n",  # Qwen/SmolLM special tokens written as text
    "<start_of_turn>user\nhi<end_of_turn>\n",  # Gemma special tokens written as text
    "Mixed: hello世界123 🎉\t\ttabs",
    " ",
    "",
]

# Two function tools with JSON-schema parameters (OpenAI shape).
TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]

# name -> (messages, tools, kwargs overriding add_generation_prompt=True).
# Non-ASCII in tool arguments checks tojson(ensure_ascii=False).
CONVERSATIONS: dict[str, tuple[list[dict], list[dict] | None, dict]] = {
    "plain": ([{"role": "user", "content": "What is the capital of France?"}], None, {}),
    "multi_turn": (
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name a primary color."},
            # Qwen3's template strips <think> blocks from earlier assistant turns.
            {"role": "assistant", "content": "<think>\nAny of three works.\n</think>\n\nRed."},
            {"role": "user", "content": "Another one?"},
        ],
        None,
        {},
    ),
    "tools_offer": ([{"role": "user", "content": "What's the weather in Paris?"}], TOOLS, {}),
    "tool_call": (
        [
            {"role": "system", "content": "Use tools when helpful."},
            {"role": "user", "content": "Weather in Zürich, in celsius?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": {"city": "Zürich", "unit": "celsius"},
                        },
                    }
                ],
            },
            {"role": "tool", "content": '{"temperature": 21, "sky": "clear"}'},
        ],
        TOOLS,
        {},
    ),
    # Ends on an assistant turn after the last user query: Qwen3 keeps its reasoning_content here.
    "assistant_last": (
        [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi!", "reasoning_content": "Greet briefly."},
        ],
        None,
        {"add_generation_prompt": False},
    ),
}
