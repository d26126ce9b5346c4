"""Turn chat messages and tools into the exact prompt token ids a ChatML model is fed (and token ids back into text).

The format is the model's own ChatML (``<|im_start|>role\\n...<|im_end|>\\n``, its default system line when the
conversation has none) extended with tools the Hermes way: the tool signatures go into the system turn inside
``<tools></tools>``, assistant tool calls are rendered as ``<tool_call>`` blocks (see ``hermes.py``) and tool
results come back in a user turn inside ``<tool_response></tool_response>``. An assistant turn renders exactly
as the server produced it, so a follow-up prompt starts with the earlier prompt plus its completion.

Every turn ends at a special token, so turns tokenize independently: each rendered turn is tokenized once and
cached, and a prompt is the concatenation of its turns' ids.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Iterable

from orchard.errors import ModelError, RequestError
from orchard.inference import hermes

START, END = "<|im_start|>", "<|im_end|>"
_TOOLS_INTRO = (
    "\n\n# Tools\n\nYou can call the functions below. Their signatures, as JSON Schema, are inside <tools></tools>:\n"
    "<tools>\n{tools}\n</tools>\n\nTo call a function, reply with one block per call:\n"
    '<tool_call>\n{{"name": <function name>, "arguments": <arguments as a JSON object>}}\n</tool_call>'
)


class ChatTokenizer:
    """A model's tokenizer plus its chat format: prompt ids from messages, text from ids, per-token text and bytes."""

    def __init__(self, backend: Any, *, default_system: str, name: str = "model"):
        self.backend = backend
        self.name = name
        self.default_system = default_system
        self.end_of_turn_id = self._special_id(END)
        self.stop_ids = frozenset(i for i in (self.end_of_turn_id, backend.token_to_id("<|endoftext|>")) if i is not None)
        self.vocab_size = backend.get_vocab_size()
        self._specials = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
        self._byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        self.encode_turn = functools.lru_cache(maxsize=65536)(self._encode_text)
        self.piece = functools.lru_cache(maxsize=None)(self._piece)
        self._tools_block = functools.lru_cache(maxsize=256)(_render_tools)

    @classmethod
    def from_dir(cls, directory: Path) -> "ChatTokenizer":
        """Load ``tokenizer.json`` and the chat template of a Hugging Face model directory."""
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
        template = _read_template(directory)
        if START not in template:
            raise ModelError(f"{directory}: only ChatML chat templates (<|im_start|>) are supported")
        found = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template, re.DOTALL)
        return cls(backend, default_system=found.group(1) if found else "", name=directory.name)

    # -- prompts -----------------------------------------------------------------------------------

    def render_turns(self, messages: list[dict], tools: list[dict] | None = None,
                     add_generation_prompt: bool = True) -> list[str]:
        """The prompt as text, one string per turn (the generation prompt is the last one)."""
        if not messages:
            raise RequestError("messages must not be empty")
        turns = [self._system_turn(messages, tools)]
        body = messages[1:] if messages[0].get("role") in ("system", "developer") else messages
        turns += _body_turns(body)
        if add_generation_prompt:
            turns.append(f"{START}assistant\n")
        return turns

    def render(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True) -> str:
        """The prompt as one string."""
        return "".join(self.render_turns(messages, tools, add_generation_prompt))

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None,
                   add_generation_prompt: bool = True) -> list[int]:
        """The exact token ids of the prompt (chat format applied, tools included)."""
        ids: list[int] = []
        for turn in self.render_turns(messages, tools, add_generation_prompt):
            ids.extend(self.encode_turn(turn))
        return ids

    def _system_turn(self, messages: list[dict], tools: list[dict] | None) -> str:
        first = messages[0]
        system = _text(first.get("content")) if first.get("role") in ("system", "developer") else self.default_system
        if tools:
            system += self._tools_block(json.dumps(tools, ensure_ascii=False))
        return f"{START}system\n{system}{END}\n"

    # -- tokens ------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens written in the text are recognised; nothing is added)."""
        return self._encode_text(text)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def completion_ids(self, text: str) -> list[int]:
        """What a model emits for an assistant turn whose raw text is ``text``: its tokens and the end of turn."""
        return [*self.encode_turn(text), self.end_of_turn_id]

    def _encode_text(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def _piece(self, token_id: int) -> tuple[str, tuple[int, ...]]:
        """One token's text and raw bytes (byte-level BPE: each character of the token stands for one byte)."""
        if token_id in self._specials:
            raw = self._specials[token_id].encode()
        else:
            token = self.backend.id_to_token(token_id)
            if token is None:
                raise RequestError(f"token id {token_id} is outside the vocabulary")
            raw = bytes(self._byte_of.get(c, 63) for c in token)
        return raw.decode("utf-8", errors="replace"), tuple(raw)

    def _special_id(self, token: str) -> int:
        found = self.backend.token_to_id(token)
        if found is None:
            raise ModelError(f"the tokenizer has no {token} token")
        return found


def _body_turns(messages: list[dict]) -> list[str]:
    turns: list[str] = []
    responses: list[str] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            responses.append(f"<tool_response>\n{_text(message.get('content'))}\n</tool_response>")
            continue
        if responses:
            turns.append(f"{START}user\n" + "\n".join(responses) + f"{END}\n")
            responses = []
        turns.append(_turn(message))
    if responses:
        turns.append(f"{START}user\n" + "\n".join(responses) + f"{END}\n")
    return turns


def _turn(message: dict) -> str:
    role = message.get("role")
    if role == "assistant":
        calls = [(c["function"]["name"], c["function"].get("arguments") or {}) for c in message.get("tool_calls") or []]
        return f"{START}assistant\n{hermes.render_turn(_text(message.get('content')), calls)}{END}\n"
    if role in ("user", "system", "developer"):
        return f"{START}{'system' if role == 'developer' else role}\n{_text(message.get('content'))}{END}\n"
    raise RequestError(f"unsupported message role {role!r}")


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") not in ("text", "input_text", "output_text"):
            raise RequestError(f"content part of type {part.get('type')!r} is not supported (text only)")
        parts.append(part.get("text", ""))
    return "".join(parts)


def _render_tools(tools_json: str) -> str:
    tools = json.loads(tools_json)
    return _TOOLS_INTRO.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def _read_template(directory: Path) -> str:
    jinja = directory / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    config = directory / "tokenizer_config.json"
    template = json.loads(config.read_text()).get("chat_template") if config.exists() else None
    return template if isinstance(template, str) else ""


@functools.lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest are shifted past 255."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in keep:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table
