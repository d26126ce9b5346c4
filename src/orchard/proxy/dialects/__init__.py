"""The model APIs harnesses speak, one module each: parse_request, render_reply, render_stream, error_body."""

from orchard.proxy.dialects import anthropic_messages, openai_chat, openai_responses

DIALECTS = {m.NAME: m for m in (openai_chat, openai_responses, anthropic_messages)}
